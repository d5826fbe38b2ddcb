"""Where a task's wall time goes: the phases a worker's task passes through, timed as it runs,
stored with the task (``tasks.phases``) and printed by ``bench/tuning_time.py``.

The phases, in the order a task meets them (seconds of wall time unless said otherwise):

- ``queued``: from the job's submission to the task's claim (for a job of several shapes,
  the later ones wait for the earlier ones: that wait is counted here);
- ``setup``: reading the task, loading the kernel, moving the worker's measuring child and
  compile pool to this problem (or starting them), registering the device and reading what the
  search starts from;
- ``compile_wait``: the GPU child idle because the next config's compile (in the pool) has not
  finished;
- ``compile_child``: the GPU child loading or compiling a config's binary before timing it
  (a config compiled ahead is a cache load; one not compiled ahead is compiled there);
- ``verifying``: the GPU child running a config once on the batch's inputs and checking its
  outputs against the kernel's reference (the reference computed there too);
- ``measuring``: the GPU child timing a verified config (the quick timing, the warm-up, the
  timed runs, the GPU's state read before and after);
- ``retiming``: the finalists, the stored best, the default and the vendor baseline re-timed
  side by side;
- ``storing``: the database writes (every trial as it is measured, the best, the finish);
- ``search``: the rest of the search loop (the strategy's asks and tells, its model's fits);
- ``total``: from the claim to the finish.

Two counts go with them, CPU work done beside the wall time: ``compile_ahead_cpu`` (the
compile pool's processes' compile seconds, summed over processes working at once) and the
configs ``compiled_ahead`` by the pool, ``reused_compiles`` (configs whose binary an earlier
problem of the same specialisation had compiled: no compile asked).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

#: the wall-time phases, in the order a task meets them (``total`` last)
PHASES = ("queued", "setup", "compile_wait", "compile_child", "verifying", "measuring",
          "retiming", "storing", "search", "total")
#: work counted beside the wall time
COUNTS = ("compile_ahead_cpu", "compiled_ahead", "reused_compiles",
          # full timings by their warm-up (``TimingOptions``): the sustained-state one, the
          # short one (back to back, or a memory-bound problem at quiet power), and those taken
          # again with the long one after the power was found high
          "warmups_long", "warmups_short", "warmups_redone",
          # the measuring child's own seconds timing the trials (``measuring`` less this: the
          # messages, and the parent's own work while the child waited for it)
          "timing_child",
          # the part of ``compile_wait`` while a config of the batch waited in the pool's
          # queue for a free process (the rest: all of them compiling)
          "compile_wait_queued")


#: phases measured outside the claim-to-finish wall time
OUTSIDE = ("queued", "total")


class PhaseClock:
    """Seconds (and counts) accumulated per phase. ``timed(phase)`` times a block, less the
    time of the phases timed or added inside it: a task's phases never overlap (``search``
    is the search loop's own time, its measurements and writes counted in theirs)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        #: for each open ``timed`` block, the seconds of the phases inside it
        self._inner: list[float] = []

    def add(self, phase: str, amount: float) -> None:
        """Add ``amount`` to ``phase``; a wall-time phase inside an open ``timed`` block is
        taken out of that block's."""
        if phase not in PHASES and phase not in COUNTS:
            raise ValueError(f"unknown phase {phase!r}")
        self.seconds[phase] = self.seconds.get(phase, 0.0) + amount
        if self._inner and phase in PHASES and phase not in OUTSIDE:
            self._inner[-1] += amount

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            inner = self._inner.pop()
            self.add(phase, time.perf_counter() - t0 - inner)
            if self._inner:  # the whole block counts as inside the enclosing one
                self._inner[-1] += inner

    def to_dict(self) -> dict[str, float]:
        """Every phase and count measured, rounded to the millisecond, in ``PHASES`` order."""
        return {name: round(self.seconds[name], 3) for name in (*PHASES, *COUNTS)
                if name in self.seconds}


def unaccounted(phases: Mapping[str, float]) -> float:
    """``total`` less the phases after the claim: what no phase names (0 when not recorded)."""
    if "total" not in phases:
        return 0.0
    inside = sum(float(phases.get(p, 0.0)) for p in PHASES if p not in OUTSIDE)
    return float(phases["total"]) - inside
