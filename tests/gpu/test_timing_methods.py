"""The three timing methods (``tuner/timing.py``) on the GPU, through the measuring child: one
config of a tiny launch-bound vector add timed ``eager-flushed``, ``cuda-graph`` and
``eager-hot`` gives positive, plausible times, each labelled with its method; replayed in a
CUDA graph it runs faster than one eager launch timed alone (no launch gap between kernels);
an add whose inputs fit in L2 runs faster hot than flushed; the re-timing and its torch
baseline are timed the asked way too."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from search_spaces.vector_add import KERNEL as VECTOR_ADD
from tests.gpu.smi import Gpu, state_line
from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.measurement import Measurement
from tuner.timing import TIMING_METHODS

pytestmark = pytest.mark.gpu

#: 4,096 fp32 elements: 48 KB moved, a kernel of a few microseconds (launch-bound)
TINY = {"N": 4096}
#: 2M fp32 elements: 24 MB moved, within the L2 of an H100 or H200 (50 MB)
IN_L2 = {"N": 2 * 1024 * 1024}
TIMING = TimingOptions(warmup_ms=5, rep_ms=20, compile_timeout_s=90, run_timeout_s=60)
ROUNDS = 3


@dataclass
class Timed:
    #: per method, ROUNDS measurements of the default config, the methods interleaved
    tiny: dict[str, list[Measurement]]
    in_l2: dict[str, list[Measurement]]
    #: the tiny config re-timed with its torch baseline under cuda-graph
    retimed: list[Measurement]


def _interleaved(backend: ProcessBackend, shape: dict[str, int]) -> dict[str, list[Measurement]]:
    config = VECTOR_ADD.default_config(shape, "float32")
    out: dict[str, list[Measurement]] = {m: [] for m in TIMING_METHODS}
    for _ in range(ROUNDS):
        for method in TIMING_METHODS:
            assert backend.use_timing(method) == method
            [m] = backend.measure([config])
            out[method].append(m)
    return out


@pytest.fixture(scope="module")
def timed(_gpu_env: list[Gpu]) -> Iterator[Timed]:
    backend = ProcessBackend("cuda", VECTOR_ADD.ref, TINY, "float32", timing=TIMING,
                             compile_workers=0)
    try:
        tiny = _interleaved(backend, TINY)
        backend.use_timing("cuda-graph")
        retimed = backend.retime([VECTOR_ADD.default_config(TINY, "float32")], 3,
                                 baseline=True)
        backend.retarget(IN_L2)
        in_l2 = _interleaved(backend, IN_L2)
        yield Timed(tiny, in_l2, retimed)
    finally:
        backend.close()


def _p50(ms: list[Measurement]) -> float:
    return statistics.median(m.p50_ms for m in ms if m.p50_ms is not None)


def test_each_method_gives_positive_plausible_times_labelled_with_it(timed: Timed):
    for shape, by_method in (("tiny", timed.tiny), ("in L2", timed.in_l2)):
        for method, ms in by_method.items():
            for m in ms:
                assert m.ok, f"{shape} {method}: {m.outcome.value}: {m.error}"
                assert m.extra.get("timing") == method, m.extra
                assert m.p20_ms is not None and m.p80_ms is not None and m.p50_ms is not None
                assert 0 < m.p20_ms <= m.p50_ms <= m.p80_ms, (method, m)
                assert not m.extra.get("quick"), "a method change must reset the quick bar"
    # 48 KB: between 0.5 us and 50 us a launch, whichever way it is timed
    for method, ms in timed.tiny.items():
        assert 0.0005 < _p50(ms) < 0.05, (method, _p50(ms), state_line())
    # 24 MB: no faster than 10 TB/s (above any L2's bandwidth), under 1 ms
    for method, ms in timed.in_l2.items():
        assert 24e6 / 10e12 * 1e3 < _p50(ms) < 1.0, (method, _p50(ms), state_line())


def test_graph_replay_of_a_tiny_launch_bound_kernel_is_faster_than_one_eager_launch(
        timed: Timed):
    graph, flushed = _p50(timed.tiny["cuda-graph"]), _p50(timed.tiny["eager-flushed"])
    hot = _p50(timed.tiny["eager-hot"])
    assert graph < flushed and graph < hot, (
        f"cuda-graph {graph * 1e3:.2f} us, eager-flushed {flushed * 1e3:.2f} us, eager-hot "
        f"{hot * 1e3:.2f} us ({state_line()})")


def test_inputs_left_in_l2_are_faster_hot_than_flushed(timed: Timed):
    hot, flushed = _p50(timed.in_l2["eager-hot"]), _p50(timed.in_l2["eager-flushed"])
    assert hot < flushed, f"eager-hot {hot:.4f} ms, eager-flushed {flushed:.4f} ms"


def test_the_retiming_and_its_baseline_are_replayed_in_a_graph_too(timed: Timed):
    config, baseline = timed.retimed
    assert config.ok and config.extra.get("measured") == "retimed", config
    assert config.extra.get("timing") == "cuda-graph"
    assert baseline.ok and baseline.extra.get("baseline") == "torch", baseline
    assert baseline.extra.get("timing") == "cuda-graph"
    assert baseline.p50_ms is not None and 0.0005 < baseline.p50_ms < 0.05, baseline
