"""GPU timing that measures the GPU, not the Python that launches it.

``triton.testing.do_bench`` records a start event, calls ``fn`` and records an end event,
after an L2 flush (a 256 MB memset, ~60 us on an H200). The events time the GPU's stream from
start to end, so if ``fn`` takes longer to *enqueue* than its kernels take to run, the stream
waits on the host between the two events and the time is the host's. This timer rules that
out. Why it was written: a split-row softmax on 16 x 131,072 (two launches and two small
allocations, ~10 us of GPU work) read 14 us in one trial and 60-78 us in the others on the
H200 while a single-launch torch softmax read a steady 31 us. A probe with 16 processes
spinning on the CPU did not reproduce those readings (both timers agreed within 4%,
bench/results/host_bound_timing_h200.md), so their cause is not known; a host-bound timing
is only ruled out here, not shown to have been it.

``do_bench`` here is the same protocol (one call, an estimate of five, warm-up, then flushed
and timed runs; the same quantiles) with one change: before each timed run's start event the
stream also runs a spin kernel (``torch.cuda._sleep``) long enough to cover ``fn``'s host
enqueue time (measured in the estimate: the slowest of five, doubled, plus 50 us), so the host is
ahead of the GPU when the start event is reached and the events bracket only ``fn``'s kernels.
The spin costs GPU time between timed runs, never inside them. With ``flush=False`` (the
``eager-hot`` timing method, ``tuner/timing.py``) the flush is left out: each run finds the inputs
in L2 as the run before left them.

``do_bench_interleaved`` times several callables (a re-timing's finalists) in one pass: each
timed run of one is followed by one of the next, round robin, every run flushed and spun as
``do_bench``'s, so a clock that drifts under the power limiter over the pass (an 8192^3 GEMM's
rounds spread 6-11% on an H200) moves all of them alike. Where the power limiter is engaged
they then share one clock, which is not the clock each reaches alone: the product's
re-timings use it only when asked (``TimingOptions.retime_interleaved`` says why).

``do_bench_graph`` (``cuda-graph``) times what a serving engine's graph replay runs: N launches
of ``fn`` captured in one CUDA graph (N such that one replay lasts about ``rep`` /
``GRAPH_REPLAYS``), the graph replayed back to back and each replay timed with CUDA events; a
sample is a replay's time / N. No flush, no host between the launches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

#: cycles a spin kernel runs per microsecond (an upper bound of the SM clock, so that a
#: lower clock spins longer, never shorter than asked)
SPIN_CYCLES_PER_US = 2100
#: the spin's margin over twice the host's slowest enqueue time
SPIN_MARGIN_US = 50.0
#: the L2 flush's buffer, as triton.testing's (256 MB)
FLUSH_BYTES = 256 * 1024 * 1024


def spin_cycles(host_us: Sequence[float]) -> int:
    """The spin before a timed run: twice the slowest host enqueue time seen, plus a margin,
    in cycles at ``SPIN_CYCLES_PER_US``."""
    return int((2.0 * max(host_us, default=0.0) + SPIN_MARGIN_US) * SPIN_CYCLES_PER_US)


def do_bench(fn: Callable[[], Any], warmup: float = 25.0, rep: float = 100.0,
             quantiles: Sequence[float] = (0.2, 0.5, 0.8), flush: bool = True) -> list[float]:
    """``fn``'s GPU time in ms at ``quantiles``: warm-up for ``warmup`` ms, then timed runs
    for ``rep`` ms, each after an L2 flush (unless not ``flush``) and a spin that lets the host
    get ahead."""
    return do_bench_interleaved([fn], warmup, rep, quantiles, flush)[0]


class _Estimate:
    """A callable's five runs before its timing: its spin, GPU time and the stream cost of one
    timed run (the flush, the spin and the callable: the host stays ahead)."""

    def __init__(self, host_us: list[float], gpu_ms: list[float],
                 flush_ms: list[float]) -> None:
        self.spin = spin_cycles(host_us)
        self.fn_ms = statistics.median(gpu_ms)
        self.per_run_ms = (statistics.median(flush_ms) + self.spin / SPIN_CYCLES_PER_US / 1e3
                           + self.fn_ms)
        # a warm-up call goes back to back: it costs the larger of its GPU and host time
        self.warm_call_ms = max(self.fn_ms, statistics.median(host_us) / 1e3, 1e-3)


def _estimates(fns: Sequence[Callable[[], Any]], cache: Any, flush: bool) -> list[_Estimate]:
    """Five runs of each of ``fns``, in the order they will be timed (round robin): the host's
    enqueue time of one depends on what ran before it (a different kernel's launch path), so
    each spin is sized on the order of the timing itself."""
    import torch

    host_us: list[list[float]] = [[] for _ in fns]
    gpu_ms: list[list[float]] = [[] for _ in fns]
    flush_ms: list[list[float]] = [[] for _ in fns]
    for _ in range(5):
        for i, fn in enumerate(fns):
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            if flush:
                cache.zero_()
            mid.record()
            t0 = time.perf_counter()
            fn()
            host_us[i].append((time.perf_counter() - t0) * 1e6)
            end.record()
            torch.cuda.synchronize()
            flush_ms[i].append(start.elapsed_time(mid))
            gpu_ms[i].append(mid.elapsed_time(end))
    return [_Estimate(*runs) for runs in zip(host_us, gpu_ms, flush_ms, strict=True)]


def do_bench_interleaved(fns: Sequence[Callable[[], Any]], warmup: float = 25.0,
                         rep: float = 100.0, quantiles: Sequence[float] = (0.2, 0.5, 0.8),
                         flush: bool = True) -> list[list[float]]:
    """Each of ``fns``' GPU time in ms at ``quantiles``, taken in one pass: a warm-up of
    ``warmup`` ms calling them in turn, then timed runs round robin (one of each, in order,
    each after an L2 flush unless not ``flush`` and a spin that lets the host get ahead) for
    about ``rep`` ms per callable. One list of quantiles per callable, in order."""
    import torch

    if not fns:
        return []
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    cache = torch.empty(FLUSH_BYTES // 4 if flush else 1, dtype=torch.int32, device="cuda")
    est = _estimates(fns, cache, flush)
    n_warmup = max(1, int(warmup / sum(e.warm_call_ms for e in est)))
    n_repeat = max(1, int(rep * len(fns) / sum(e.per_run_ms for e in est)))
    for _ in range(n_warmup):
        for fn in fns:
            fn()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(n_repeat)] for _ in fns]
    for i in range(n_repeat):
        for fn, e, pairs in zip(fns, est, events, strict=True):
            if flush:
                cache.zero_()
            torch.cuda._sleep(e.spin)
            pairs[i][0].record()
            fn()
            pairs[i][1].record()
    torch.cuda.synchronize()
    q = torch.tensor(list(quantiles))
    out = []
    for pairs in events:
        times = torch.tensor([s.elapsed_time(e) for s, e in pairs])
        out.append([float(v) for v in torch.quantile(times, q)])
    return out


#: timed replays of ``do_bench_graph`` aimed at within ``rep`` (each replay is one sample)
GRAPH_REPLAYS = 20
#: the most launches captured in one graph (capturing costs host time per launch)
GRAPH_MAX_LAUNCHES = 1000


def graph_launches(launch_ms: float, rep: float) -> int:
    """How many launches one graph captures: enough that a replay lasts ``rep`` /
    ``GRAPH_REPLAYS`` ms at ``launch_ms`` a launch, between 1 and ``GRAPH_MAX_LAUNCHES``."""
    wanted = rep / GRAPH_REPLAYS / max(launch_ms, 1e-4)
    return max(1, min(GRAPH_MAX_LAUNCHES, int(wanted)))


class GraphCaptureError(RuntimeError):
    """``fn`` could not be captured in a CUDA graph (it synchronises with the host, or calls
    what a capture does not allow); the message carries the CUDA error."""


def capture_graph(fn: Callable[[], Any], launches: int) -> Any:
    """A ``torch.cuda.CUDAGraph`` of ``launches`` calls of ``fn`` (called once before on a
    side stream, as torch asks, so that lazy initialisation happens outside the capture)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(launches):
                fn()
    except Exception as exc:
        raise GraphCaptureError(f"the launch cannot be captured in a CUDA graph: "
                                f"{type(exc).__name__}: {exc}") from exc
    return graph


def do_bench_graph(fn: Callable[[], Any], warmup: float = 25.0, rep: float = 100.0,
                   quantiles: Sequence[float] = (0.2, 0.5, 0.8)) -> list[float]:
    """``fn``'s time in ms per launch at ``quantiles`` under CUDA graph replay: N launches
    captured in one graph (``graph_launches``, from an eager estimate), replayed for ``warmup``
    ms, then replays timed with CUDA events for ``rep`` ms (each a sample: its time / N)."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    launches = graph_launches(start.elapsed_time(end) / 5, rep)
    graph = capture_graph(fn, launches)
    try:
        start.record()
        graph.replay()  # the first replay uploads the graph: not timed
        end.record()
        torch.cuda.synchronize()
        replay_ms = max(start.elapsed_time(end), 1e-3)
        for _ in range(max(1, int(warmup / replay_ms))):
            graph.replay()
        n_repeat = max(1, min(10 * GRAPH_REPLAYS, int(rep / replay_ms)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        for i in range(n_repeat):
            starts[i].record()
            graph.replay()
            ends[i].record()
        torch.cuda.synchronize()
    finally:
        graph.reset()
    times = torch.tensor([s.elapsed_time(e) / launches
                          for s, e in zip(starts, ends, strict=True)])
    return [float(v) for v in torch.quantile(times, torch.tensor(list(quantiles)))]


def bench(method: str, fn: Callable[[], Any], warmup: float = 25.0, rep: float = 100.0,
          quantiles: Sequence[float] = (0.2, 0.5, 0.8)) -> list[float]:
    """``fn``'s time in ms at ``quantiles`` under a timing method (``tuner/timing.py``):
    ``eager-flushed`` (``do_bench``), ``eager-hot`` (``do_bench`` without the flush) or
    ``cuda-graph`` (``do_bench_graph``). ValueError for any other."""
    from tuner.timing import CUDA_GRAPH, EAGER_FLUSHED, EAGER_HOT

    if method == EAGER_FLUSHED:
        return do_bench(fn, warmup, rep, quantiles)
    if method == EAGER_HOT:
        return do_bench(fn, warmup, rep, quantiles, flush=False)
    if method == CUDA_GRAPH:
        return do_bench_graph(fn, warmup, rep, quantiles)
    raise ValueError(f"timing method {method!r}: expected {EAGER_FLUSHED}, {CUDA_GRAPH} or "
                     f"{EAGER_HOT}")
