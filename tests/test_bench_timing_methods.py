"""bench/timing_methods.py on the CPU interpreter: its plumbing (two jobs through the worker
path, each storing its best under its method, the winners timed every way in one child, the
table); on a GPU it compares eager-flushed and cuda-graph (the interpreter cannot replay
graphs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import timing_methods


def test_a_problem_is_named_kernel_dims_dtype():
    assert timing_methods.parse_problem("matmul:M=16,N=4096,K=4096:float16") == (
        "matmul", {"M": 16, "N": 4096, "K": 4096}, "float16")
    with pytest.raises(SystemExit, match="KERNEL:DIM=V"):
        timing_methods.parse_problem("matmul:float16")


@pytest.mark.timeout(600)
def test_each_method_tunes_and_stores_its_own_winner_then_both_are_timed_every_way(
        tmp_path: Path):
    out, raw = tmp_path / "table.md", tmp_path / "raw.json"
    status = timing_methods.main([
        "--backend", "interpret", "--tuned", "eager-flushed,eager-hot",
        "--compared", "eager-hot,eager-flushed", "--problem", "matmul:M=16,N=16,K=16:float16",
        "--trials", "2", "--rounds", "2", "--out", str(out), "--json", str(raw),
        "--db", str(tmp_path / "t.db")])
    assert status == 0
    [problem] = json.loads(raw.read_text())
    assert [(t["method"], t["stored_timing"], t["status"]) for t in problem["tuned"]] == [
        ("eager-flushed", "eager-flushed", "succeeded"), ("eager-hot", "eager-hot", "succeeded")]
    times = problem["compared"]["times"]
    # every entry timed with every method in each round (torch: the kernel's baseline)
    for label in problem["compared"]["labels"]:
        assert sorted(times[label]) == ["eager-flushed", "eager-hot"], label
        assert all(len(v) == 2 and min(v) > 0 for v in times[label].values()), times[label]
    assert "torch" in problem["compared"]["labels"]
    table = out.read_text()
    assert "| config | eager-hot | eager-flushed |" in table
    for method in ("eager-flushed", "eager-hot"):
        assert f"| {method} | succeeded | 2 |" in table
