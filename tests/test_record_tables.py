"""bench/record_tables.py on the Triton CPU interpreter: the whole space of a real kernel goes
through the product's pipeline into a replay-v1 table that the replay backend reads; and
bench/search_quality.py replays such a table with every strategy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bench.record_tables import (
    device_tag,
    main,
    parse_shape,
    record_shape,
    select_shapes,
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
    assert "CUT" not in table["timing"] and table["kernel"] == "softmax"
    assert list(table["reference_ms"]) == ["torch.softmax on cpu"]
    parsed = parse_table(json.loads(json.dumps(table)))
    assert parsed.kernel == "softmax" and parsed.shape == shape and len(parsed.results) == 12
    some = next(iter(configs))
    assert ReplayBackend(parsed).measure([some])[0].outcome is Outcome.OK


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
    assert cov["space"] == 405 and 0 < cov["measured"] < 405 and not cov["complete"]
    assert "CUT at the 4 s limit" in table["timing"]
    # on N=33 the constraints prune 360 of the 405 configs: a random sample holds many
    assert sum("constraint" in r for r in table["results"]) > cov["measured"] // 2
    assert load_table(path).best_ms > 0
    assert any("wall-clock limit" in line for line in lines)
    assert any(line.startswith("[softmax 4x33 float32]") for line in lines)


def test_bad_shapes_are_refused_with_status_2(tmp_path: Path):
    for shapes in ("M=4:float32", "M=4,N=8:int8", "4x8x2:float32"):
        assert main(["--kernel", "softmax", "--shapes", shapes, "--out-dir", str(tmp_path),
                     "--backend", "interpret"], log=lambda line: None) == 2
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

    assert 29.0 < table_limit(150.0, time.monotonic() + 90.0, 3) <= 30.0
