"""bench/matmul_variants.py --table: the picks it re-times from a replay table, and the run
itself on the Triton CPU interpreter (--smoke: every pick built, launched and verified)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.matmul_variants import main, table_picks
from tuner.config import KernelConfig

TILE = {"BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "ALIGN": 0}


def _config(variant: int, m: int, n: int, split: int = 1) -> dict[str, int]:
    return {**TILE, "VARIANT": variant, "SPLIT_K": split, "BLOCK_M": m, "BLOCK_N": n}


def _table(tmp_path: Path) -> Path:
    results = [
        {"config": _config(1, 32, 64), "ms": 1.0,  # persistent: the best
         "constraint": "1 tiles fit on 132 SMs: persistent is the tiled kernel"},
        {"config": _config(0, 32, 32), "ms": 1.5},
        {"config": _config(0, 16, 32), "ms": 1.7},  # tiled, not its best
        {"config": _config(3, 16, 64, 2), "ms": 2.0},
        {"config": _config(4, 32, 32), "ms": 3.0},
        {"config": _config(2, 32, 192), "ms": 4.0},  # a split tile: no tiled twin
        {"config": _config(3, 32, 32, 4), "error": "OutOfResources: smem"},
    ]
    path = tmp_path / "matmul_48x64x32_float16_interpret.json"
    path.write_text(json.dumps({
        "format": "replay-v1", "kernel": "matmul", "device": "interpret",
        "shape": {"M": 48, "N": 64, "K": 32}, "dtype": "float16",
        "params": sorted(results[0]["config"]), "results": results}))
    return path


def test_the_picks_are_the_best_each_variants_best_and_their_tiled_twins(tmp_path: Path):
    shape, dtype, picks = table_picks(str(_table(tmp_path)))
    assert (shape, dtype) == ("M=48,N=64,K=32", "float16")
    twin = {**_config(1, 32, 64), "VARIANT": 0}
    assert picks == [KernelConfig(c) for c in (
        _config(1, 32, 64), twin, _config(0, 32, 32), _config(3, 16, 64, 2),
        {**_config(3, 16, 64, 2), "VARIANT": 0, "SPLIT_K": 1}, _config(4, 32, 32),
        _config(2, 32, 192))]  # stream_k's twin is the tiled best: once


def test_the_picks_run_and_verify_on_the_interpreter(tmp_path: Path):
    lines: list[str] = []
    import bench.matmul_variants as mv

    assert mv.run("", 1, True, lines.append, targets=[
        ("M=48,N=64,K=32", "float16", 0.0, table_picks(str(_table(tmp_path)))[2])],
        keep_pruned=True) == 0
    # all seven picks, the pruned persistent one included (smoke shrinks N to 48 + N % 16)
    assert lines[-1] == "M=48,N=64,K=32 float16: 7 configs right on the interpreter " \
                        "(48x48x32 float16)", lines
    assert main(["--smoke", "--table", str(_table(tmp_path))]) == 0


def test_the_pipeline_mode_measures_the_picks_as_a_search_does_and_retimes_them_with_torch(
        tmp_path: Path):
    import bench.matmul_variants as mv

    shape, dtype, picks = table_picks(str(_table(tmp_path)))
    lines: list[str] = []
    assert mv.run_pipeline([(shape, dtype, 0.0, picks)], 1, lines.append, "interpret") == 0
    assert lines[0].startswith("M=48,N=64,K=32 float16 (pipeline, 1 rounds): torch ")
    timed = [line.split()[-1] for line in lines[1:]]
    # every pick ran on the interpreter and was re-timed, fastest first (ratios descending)
    assert sorted(timed) == sorted(c.key() for c in picks)
    ratios = [float(line.split()[0].rstrip("x")) for line in lines[1:]]
    assert ratios == sorted(ratios, reverse=True)
