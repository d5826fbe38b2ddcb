"""Timing methods: how a config's time was taken, part of what every stored result says.

- ``eager-flushed`` (the default): eager launches, each timed alone after the L2 cache was
  flushed (a 256 MB memset) and a spin that lets the host get ahead (``tuner/gpu_timer.py``'s
  ``do_bench``): the kernel's cold-cache GPU time.
- ``cuda-graph``: N launches captured in one CUDA graph, the graph replayed and timed with CUDA
  events, per launch; no flush (``gpu_timer.do_bench_graph``). How decode-time kernels run in
  serving engines: no launch overhead between kernels, inputs often warm in L2.
- ``eager-hot``: eager launches as ``eager-flushed`` times them, without the flush: the
  inputs stay in L2 from the launch before.

The winner can depend on it: on a peer's MoE kernel at one token, the served config was 2%
faster than the peer's shipped config timed ``eager-flushed`` and 9% slower under graph replay.
So a stored best is keyed by its method, a job says which it wants (``timing``) and a lookup
may ask for one. The CPU interpreter times wall time whatever is asked: it accepts the eager
methods (recorded as asked; its numbers say nothing about a GPU) and cannot replay CUDA graphs
(``cuda-graph`` is refused before it runs). A replay table records the method it was timed
with (``"timing"``, default ``eager-flushed``) and its results are stored as that.
"""

from __future__ import annotations

import os

from tuner.errors import InvalidRequest

EAGER_FLUSHED = "eager-flushed"
CUDA_GRAPH = "cuda-graph"
EAGER_HOT = "eager-hot"
#: every timing method, the default first
TIMING_METHODS = (EAGER_FLUSHED, CUDA_GRAPH, EAGER_HOT)
DEFAULT_TIMING = EAGER_FLUSHED
#: the methods the CPU interpreter accepts (its timing is wall time either way)
INTERPRETER_TIMINGS = (EAGER_FLUSHED, EAGER_HOT)
#: the environment variable a model process names the method of its lookups with
TIMING_ENV = "TUNER_TIMING"


def check_timing(name: str, field: str = "timing") -> str:
    """``name`` when it is a timing method, else InvalidRequest naming ``field``."""
    if name not in TIMING_METHODS:
        raise InvalidRequest(f"{field} {name!r} is not a timing method; choose one of "
                             f"{', '.join(TIMING_METHODS)}", field=field)
    return name


def timing_from_env() -> str:
    """The method ``TUNER_TIMING`` names (InvalidRequest for an unknown one), else the
    default."""
    return check_timing(os.environ.get(TIMING_ENV, "").strip() or DEFAULT_TIMING, TIMING_ENV)


def interpreter_refusal(timing: str) -> str | None:
    """Why the CPU interpreter cannot time with ``timing``, in one sentence; None when it can."""
    if timing in INTERPRETER_TIMINGS:
        return None
    return (f"timing {timing!r} needs a GPU: the CPU interpreter cannot replay CUDA graphs "
            f"(it times {' or '.join(INTERPRETER_TIMINGS)})")
