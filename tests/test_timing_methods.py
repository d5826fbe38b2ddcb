"""Timing methods (issue 29, ``tuner/timing.py``): how every result was timed (eager-flushed,
cuda-graph, eager-hot), carried to the measuring child and named with every measurement. The
GPU side (the three methods timing a real kernel) is tests/gpu/test_timing_methods.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner import gpu_timer
from tuner.backends.child import ChildState, _time_fn
from tuner.backends.replay import ReplayBackend, ReplayTableError, load_table, parse_table

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests/data/replay/matmul_16x4096x4096_float16_h200.json"


# -- the measuring child and the backends ------------------------------------------------------

def test_the_interpreter_child_refuses_to_time_a_cuda_graph():
    from tuner.backends import TimingOptions

    state = ChildState("interpret")
    calls: list[int] = []
    p20, p50, p80, quick = _time_fn(state, lambda: calls.append(1),
                                    TimingOptions(method="eager-hot"))
    assert len(calls) == 3 and 0 <= p20 <= p50 <= p80 and not quick
    with pytest.raises(RuntimeError, match="cannot replay CUDA graphs"):
        _time_fn(state, lambda: calls.append(1), TimingOptions(method="cuda-graph"))


def test_a_replay_answers_as_its_table_was_timed_whatever_is_asked(tmp_path: Path):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({**json.loads(TABLE.read_text()), "timing_method": "cuda-graph"}))
    for table, method in ((load_table(TABLE), "eager-flushed"), (load_table(path), "cuda-graph")):
        backend = ReplayBackend(table)
        assert backend.use_timing("eager-hot") == method == backend.timing_method
        config = next(c for c, v in table.results.items() if isinstance(v, float))
        [trial] = backend.measure([config])
        [retimed] = backend.retime([config], 1)
        assert trial.extra["timing"] == retimed.extra["timing"] == method


def test_a_replay_table_with_an_unknown_method_is_refused():
    data = json.loads(TABLE.read_text())
    with pytest.raises(ReplayTableError, match="timing_method"):
        parse_table({**data, "timing_method": "graphs"})


def test_a_backend_without_the_notion_times_the_default():
    from tuner.backends.base import use_timing

    assert use_timing(object(), "cuda-graph") == "eager-flushed"


# -- gpu_timer (its timings need a GPU: tests/gpu/test_timing_methods.py) ----------------------

def test_a_graph_captures_enough_launches_for_a_replay_of_a_twentieth_of_rep():
    assert gpu_timer.graph_launches(0.005, 40.0) == 400  # 2 ms replays of 5 us launches
    assert gpu_timer.graph_launches(1e-6, 40.0) == gpu_timer.GRAPH_MAX_LAUNCHES
    assert gpu_timer.graph_launches(50.0, 40.0) == 1  # a launch longer than the budget


def test_an_unknown_method_is_not_timed():
    with pytest.raises(ValueError, match="timing method 'graph'"):
        gpu_timer.bench("graph", lambda: None)
