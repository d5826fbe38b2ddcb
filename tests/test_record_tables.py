"""bench/record_tables.py on the Triton CPU interpreter: the whole space of a real kernel goes
through the product's pipeline into a replay-v1 table that the replay backend reads; and
bench/search_quality.py replays such a table with every strategy."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import tuner
from bench.record_tables import (
    device_tag,
    distinct_kernels,
    main,
    parse_shape,
    record_shape,
    select_shapes,
    summary_line,
    table_limit,
    table_name,
)
from search_spaces import get_kernel
from tuner.backends import TimingOptions
from tuner.backends.replay import ReplayBackend, load_table, parse_table
from tuner.config import KernelConfig
from tuner.measurement import Outcome
from tuner.space import Param, ProblemContext, SearchSpace

SOFTMAX = get_kernel("softmax")


class SmallSoftmax:
    """softmax with a 12-config space (the measuring child imports the real one by ``ref``):
    on M=1, N=33 its constraints prune BLOCK_N 128 and 256 (wider than the row needs) and
    ROWS=2 (more than M): 10 of the 12."""

    name, ref, description, dims = "softmax", SOFTMAX.ref, SOFTMAX.description, SOFTMAX.dims

    def space(self) -> SearchSpace:
        full = SOFTMAX.space()
        return SearchSpace((Param.pow2("BLOCK_N", 64, 256), Param.ints("ROWS", (1, 2)),
                            Param.pow2("num_warps", 1, 2), Param.ints("num_stages", (1,))),
                           full.constraints)

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        return SOFTMAX.make_inputs(shape, dtype, device, seed)

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        SOFTMAX.torch_baseline(inputs)



@triton.jit
def _double_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)


def _wide_blocks(config: KernelConfig, ctx: ProblemContext) -> str | None:
    if config["BLOCK"] > 256:
        return f"BLOCK={config['BLOCK']} is over 256 (wrong: it prunes the optimum)"
    return None


def _double_inputs(shape: Mapping[str, int], dtype: str, device: str,
                   seed: int) -> dict[str, Any]:
    x = torch.randn(shape["N"], generator=torch.Generator().manual_seed(seed))
    return {"x_ptr": x, "out_ptr": torch.empty_like(x), "N": shape["N"]}


#: out = 2 * x with a constraint that wrongly prunes the fastest configs: on the interpreter a
#: program's cost dominates, so the widest block (fewest programs) is the fastest, and the
#: constraint prunes the two widest
WRONGLY_PRUNED = tuner.Kernel(
    _double_kernel, name="wrongly_pruned", grid=lambda meta: (triton.cdiv(meta["N"],
                                                                          meta["BLOCK"]),),
    make_inputs=_double_inputs, dims={"N": (1, 1 << 20)}, dtypes=("float32",),
    space={"BLOCK": [32, 64, 128, 256, 512, 1024], "num_warps": [1], "num_stages": [1]},
    constraints=[_wide_blocks], reference=lambda args: 2 * args["x_ptr"],
    outputs=["out_ptr"])
WRONGLY_PRUNED.ref = "tests.test_record_tables:WRONGLY_PRUNED"


@pytest.fixture
def wrongly_pruned_registered(monkeypatch: pytest.MonkeyPatch) -> Any:
    """WRONGLY_PRUNED registered as a plugin, as search_quality loads a table's kernel."""
    from search_spaces import reload

    monkeypatch.setenv("TUNER_KERNELS", WRONGLY_PRUNED.ref)
    reload()
    yield WRONGLY_PRUNED
    monkeypatch.delenv("TUNER_KERNELS")
    reload()


def test_a_constraint_that_prunes_the_optimum_is_caught(tmp_path: Path,
                                                         wrongly_pruned_registered: Any):
    """The table holds the pruned configs (with the constraint's reason) and search_quality
    scores every search against the whole space's optimum: no search can reach it, and the
    report says which constraint pruned it. A table of the feasible configs only would have
    scored 1.000 and hidden the wrong constraint."""
    from bench.search_quality import main as quality

    kernel = wrongly_pruned_registered
    shape = {"N": 8192}
    table, name, _summary = record_shape(kernel, shape, "float32", TimingOptions(), 120.0,
                                         backend_kind="interpret", log=lambda line: None)
    results = {r["config"]["BLOCK"]: r for r in table["results"]}
    assert sorted(results) == [32, 64, 128, 256, 512, 1024]
    assert all("ms" in r for r in results.values())
    for block in (512, 1024):
        assert results[block]["constraint"] == (
            f"BLOCK={block} is over 256 (wrong: it prunes the optimum)")
    assert not any("constraint" in results[b] for b in (32, 64, 128, 256))
    optimum = min(results.values(), key=lambda r: r["ms"])
    # the optimum is one of the wrongly pruned blocks (which one: the interpreter's timing,
    # noisy on a loaded machine, decides)
    assert optimum["config"]["BLOCK"] in (512, 1024), {b: r["ms"] for b, r in results.items()}
    best_block = optimum["config"]["BLOCK"]
    kept = min(results[b]["ms"] for b in (32, 64, 128, 256)) / optimum["ms"]
    assert kept > 1.5
    path = tmp_path / name
    path.write_text(json.dumps(table))
    out = tmp_path / "quality.md"
    assert quality(["--kernel", "wrongly_pruned", "--strategies", "tpe,random", "--seeds",
                    "2", "--budgets", "2,4", "--cold-only", "--jobs", "1", "--tables-dir", "",
                    "--out", str(out), str(path)]) == 0
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith(f"| {path.stem} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == "yes" and float(cells[6]) == pytest.approx(optimum["ms"], abs=1e-4)
    assert cells[7] == (f"{kept:.3f} (optimum pruned: BLOCK={best_block} is over 256 (wrong: "
                        "it prunes the optimum))")
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and " | 1x" in line}
    assert set(rows) == {"tpe", "random"}
    for cells in rows.values():  # median and worst at 2 and 4 trials: never the optimum
        assert all(float(cells[i]) >= kept - 1e-3 for i in (2, 3, 5, 6)), cells


def test_the_whole_space_is_recorded_pruned_configs_included():
    kernel = SmallSoftmax()
    shape = {"M": 1, "N": 33}
    table, name, summary = record_shape(kernel, shape, "float32", TimingOptions(), 120.0,
                                        backend_kind="interpret", log=lambda line: None)
    assert name == "softmax_1x33_float32_interpret.json" and "12/12" in summary
    ctx = ProblemContext(shape, "float32")
    space = kernel.space()
    configs = {KernelConfig(r["config"]) for r in table["results"]}
    assert configs == set(space)  # every config, not space.feasible(ctx) (2 of them)
    pruned = [r for r in table["results"] if "constraint" in r]
    assert len(pruned) == 10 and len(space.feasible(ctx)) == 2
    assert all(r["constraint"] == space.violation(KernelConfig(r["config"]), ctx)
               for r in pruned)
    # they ran (masked lanes, a row per program past the end: still right) and were timed
    assert all("ms" in r for r in table["results"])
    assert table["coverage"] == {**table["coverage"], "space": 12, "measured": 12,
                                 "complete": True, "constraint_pruned": 10}
    assert "INCOMPLETE" not in table["timing"] and table["kernel"] == "softmax"
    assert table["coverage"]["stopped"] == "" and "limit" not in summary
    assert list(table["reference_ms"]) == ["torch on the cpu (softmax.torch_baseline)"]
    parsed = parse_table(json.loads(json.dumps(table)))
    assert parsed.kernel == "softmax" and parsed.shape == shape and len(parsed.results) == 12
    some = next(iter(configs))
    assert ReplayBackend(parsed).measure([some])[0].outcome is Outcome.OK


def test_matmul_is_recorded_once_per_distinct_kernel_and_samples_are_one_seeded_prefix():
    kernel = get_kernel("matmul")
    whole = list(kernel.space())
    aligned = distinct_kernels(kernel, whole, {"M": 16, "N": 32, "K": 32}, "float16")
    unaligned = distinct_kernels(kernel, whole, {"M": 16, "N": 33, "K": 30}, "float16")
    # VARIANT 5 x SPLIT_K 5 x BLOCK_M 5 x BLOCK_N 5 x BLOCK_K 4 x GROUP_M 2 x warps 3 x
    # stages 4 x ALIGN 2; SPLIT_K is split_k's alone (4 variants x 2,400 tiles + 5 x 2,400),
    # and ALIGN copies something only on the unaligned problem
    assert (len(whole), len(aligned), len(unaligned)) == (120000, 21600, 43200)
    assert all(c["SPLIT_K"] == 1 or c["VARIANT"] == 3 for c in aligned)
    assert {c["ALIGN"] for c in aligned} == {0} and {c["ALIGN"] for c in unaligned} == {0, 1}
    assert {c["VARIANT"] for c in aligned} == {0, 1, 2, 3, 4}
    tiled_split = KernelConfig({**aligned[0], "VARIANT": 0, "SPLIT_K": 4, "ALIGN": 1})
    assert kernel.same_kernel(tiled_split, {"M": 16, "N": 32, "K": 32}, "float16") == \
        KernelConfig({**tiled_split, "SPLIT_K": 1, "ALIGN": 0})
    assert kernel.same_kernel(tiled_split, {"M": 16, "N": 33, "K": 30}, "float16") == \
        KernelConfig({**tiled_split, "SPLIT_K": 1})
    split = KernelConfig({**tiled_split, "VARIANT": 3, "ALIGN": 0})
    assert kernel.same_kernel(split, {"M": 16, "N": 33, "K": 30}, "float16") is split

    # two aligned problems of one dtype measure the same sample (one set of binaries)
    tables = [record_shape(kernel, shape, "float16", TimingOptions(), 120.0, sample=3,
                           backend_kind="interpret", log=lambda line: None)[0]
              for shape in ({"M": 16, "N": 32, "K": 32}, {"M": 48, "N": 64, "K": 32})]
    samples = [[KernelConfig(r["config"]) for r in t["results"]] for t in tables]
    assert len(samples[0]) == 3 and set(samples[0]) == set(samples[1])
    assert set(samples[0]) <= set(aligned)
    for table in tables:
        assert table["coverage"] == {**table["coverage"], "space": 21600, "measured": 3,
                                     "complete": False, "sample": 3, "space_configs": 120000}
        assert "INCOMPLETE (a sample of 3)" in table["timing"]
        assert "120000 configs are 21600 distinct kernels" in table["kernel_note"]
        line = summary_line("t.json", table)
        assert line.startswith("t.json: 3/21600 configs (INCOMPLETE: a sample of 3, ")
        best = min((r for r in table["results"] if "ms" in r), key=lambda r: r["ms"])
        assert "best by VARIANT: " in line and f"{best['config']['VARIANT']}: " \
            f"{best['ms']:.4f}" in line


def test_the_command_records_a_table_and_says_when_the_limit_cut_it(tmp_path: Path):
    lines: list[str] = []
    code = main(["--kernel", "softmax", "--shapes", "M=4,N=33:float32", "--out-dir",
                 str(tmp_path), "--backend", "interpret", "--limit-seconds", "4",
                 "--batch", "8"], log=lines.append)
    assert code == 0
    path = tmp_path / "softmax_4x33_float32_interpret.json"
    table = json.loads(path.read_text())
    assert table["format"] == "replay-v1" and table["shape"] == {"M": 4, "N": 33}
    cov = table["coverage"]
    whole = math.prod(len(p.values) for p in get_kernel("softmax").space().params)
    # BLOCK_N 11 x ROWS 3 x SPLIT 7 x PROGRAMS_PER_SM 4 x EVICT 2 x SYNC 2 x warps 6 x stages 4
    assert whole == 88704
    assert cov["space"] == whole and 0 < cov["measured"] < whole and not cov["complete"]
    assert "INCOMPLETE (cut at the 4 s limit)" in table["timing"]
    assert cov["stopped"] == "cut at the 4 s limit"
    # on N=33 the constraints prune 2,800 of the 2,835 configs: a random sample holds many
    assert sum("constraint" in r for r in table["results"]) > cov["measured"] // 2
    assert load_table(path).best_ms > 0
    assert any("cut at the 4 s limit" in line for line in lines)
    assert any(line.startswith("[softmax 4x33 float32]") for line in lines)


def test_bad_shapes_are_refused_with_status_2(tmp_path: Path):
    for shapes in ("M=4:float32", "M=4,N=8:int8", "4x8x2:float32"):
        assert main(["--kernel", "softmax", "--shapes", shapes, "--out-dir", str(tmp_path),
                     "--backend", "interpret"], log=lambda line: None) == 2
    lines: list[str] = []
    assert main(["--kernel", "softmax", "--shapes", "M=4,N=8:float32", "--out-dir",
                 str(tmp_path), "--backend", "interpret", "--sample", "0"], log=lines.append) == 2
    assert lines == ["record_tables: --sample must be at least 1 (got 0)"]
    assert not list(tmp_path.iterdir())


def test_shape_specs_names_and_limits():
    dims = ("M", "N")
    assert select_shapes("M=4096,N=8192:float16;M=16,N=131072:float16", dims) == [
        ({"M": 4096, "N": 8192}, "float16"), ({"M": 16, "N": 131072}, "float16")]
    assert select_shapes("N=8,M=2:bfloat16; 3x5:float32", dims) == [
        ({"M": 2, "N": 8}, "bfloat16"), ({"M": 3, "N": 5}, "float32")]
    assert select_shapes("all")[0] == ({"M": 16, "N": 4096, "K": 4096}, "float16")
    with pytest.raises(ValueError):
        parse_shape("M=1,K=2:float16", dims)
    assert table_name({"M": 2, "N": 8}, "bfloat16", "rmsnorm", "h200") == (
        "rmsnorm_2x8_bfloat16_h200.json")

    class Fp:
        kind, name = "cuda", "NVIDIA H200"

    assert device_tag(Fp()) == "h200"
    Fp.name = "NVIDIA H100 80GB HBM3"
    assert device_tag(Fp()) == "h100"
    Fp.kind = "interpret"
    assert device_tag(Fp()) == "interpret"
    assert table_limit(150.0, None, 3) == 150.0
    import time

    # 100 s left, two tables after this one keep 30 s each: this one may use 40 s
    assert 39.0 < table_limit(150.0, time.monotonic() + 100.0, 2, 30.0) <= 40.0
    assert table_limit(20.0, time.monotonic() + 100.0, 2, 30.0) == 20.0
    assert table_limit(150.0, time.monotonic() + 50.0, 2, 30.0) == 0.0


# -- bench/search_quality.py --------------------------------------------------------------------

def synthetic_softmax_table(path: Path) -> Path:
    """softmax's whole space on 4096 x 8192 fp16 with made-up times (fastest: the row in one
    block, 8 warps, one row per program); the configs its constraints prune failed."""
    import math

    shape = {"M": 4096, "N": 8192}
    ctx = ProblemContext(shape, "float16")
    space = SOFTMAX.space()
    results = []
    for c in space:
        if space.violation(c, ctx):
            results.append({"config": dict(c), "error": "compile_error: too many registers"})
            continue
        ms = 0.04 * (1 + 0.3 * abs(math.log2(c["BLOCK_N"] / 8192))) * (
            1 + 0.1 * abs(math.log2(c["num_warps"] / 8))) * (1 + 0.05 * (c["ROWS"] - 1)) * (
            1 + 0.01 * c["num_stages"])
        results.append({"config": dict(c), "ms": round(ms, 6)})
    path.write_text(json.dumps({
        "format": "replay-v1", "kernel": "softmax", "device": "synthetic", "shape": shape,
        "dtype": "float16", "timing": "made up", "reference_ms": {"torch.softmax": 0.13},
        "params": sorted(space.names), "results": results,
        "coverage": {"space": len(results), "measured": len(results), "complete": True}}))
    return path


def test_search_quality_replays_a_kernels_tables_with_every_strategy(tmp_path: Path):
    from bench.search_quality import main as quality
    from tuner.strategies import DEFAULT_STRATEGY_WITHOUT_PRIOR

    synthetic_softmax_table(tmp_path / "softmax_4096x8192_float16_synthetic.json")
    out = tmp_path / "quality.md"
    argv = ["--kernel", "softmax", "--strategies", "tpe,gp,model,random", "--seeds", "2",
            "--slow-seeds", "1", "--budgets", "4,8", "--cold-only", "--jobs", "1",
            "--tables-dir", "", "--out", str(out), str(tmp_path / "softmax_*.json")]
    assert quality(argv) == 0
    text = out.read_text()
    assert text.startswith("# Search quality on softmax replay tables")
    assert "--kernel softmax --strategies tpe,gp,model,random" in text.splitlines()[2]
    table_row = next(line for line in text.splitlines()
                     if line.startswith("| softmax_4096x8192_float16_synthetic |"))
    assert "| yes |" in table_row and "| 1.000 |" in table_row  # the optimum is kept
    assert table_row.endswith(f"| {DEFAULT_STRATEGY_WITHOUT_PRIOR} |")
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and " | 1x" in line}
    assert set(rows) == {"tpe", "gp", "model", "random"}
    assert rows["gp"][1] == "1x1" and rows["tpe"][1] == "1x2"
    for cells in rows.values():  # median and worst at 4 and at 8 trials: ratios >= 1
        ratios = [float(cells[i]) for i in (2, 3, 5, 6)]
        assert all(1.0 <= r < 10 for r in ratios)
        assert float(cells[5]) <= float(cells[2])  # more trials never do worse
    # --kernel selects by the table's kernel: none of these is matmul
    assert quality(["--kernel", "matmul", "--tables-dir", "", str(tmp_path / "*.json")]) == 2
    # without it, each table is searched as its own kernel, and the report sums up per kernel
    matmul = Path(__file__).resolve().parent / "data/replay/matmul_16x4096x4096_float16_h200.json"
    assert quality(["--strategies", "model", "--seeds", "1", "--budgets", "4,8", "--cold-only",
                    "--jobs", "1", "--tables-dir", "", "--out", str(out),
                    str(tmp_path / "softmax_*.json"), str(matmul)]) == 0
    text = out.read_text()
    per_kernel = text[text.index("per kernel"):text.index("per table")]
    assert "| matmul | " in per_kernel and "| softmax | " in per_kernel


def test_tables_without_time_left_of_the_total_are_skipped_not_started(tmp_path: Path):
    lines: list[str] = []
    code = main(["--kernel", "softmax", "--shapes", "M=4,N=33:float32;M=2,N=64:float32",
                 "--out-dir", str(tmp_path), "--backend", "interpret", "--total-seconds", "5"],
                log=lines.append)
    assert code == 1 and not list(tmp_path.iterdir())
    assert sum("skipped, no time left" in line for line in lines) == 2


def test_the_report_says_which_tables_hold_the_feasible_configs_only():
    """Tables recorded before whole-space recording (tests/data/replay/holdout) cannot show a
    constraint that prunes the optimum: the report says so rather than '-'."""
    from bench.search_quality import describe_tables

    holdout = Path(__file__).resolve().parent / "data/replay/holdout"
    rows = describe_tables([str(holdout / "matmul_3000x1000x2000_bfloat16_h200.json"),
                            str(holdout / "matmul_4096x2048x8192_float16_h200.json")])
    whole = [row.split(" | ")[5] for row in rows[2:4]]
    assert whole == ["no: the constraints' feasible configs only, cut",
                     "no: the constraints' feasible configs only"]
