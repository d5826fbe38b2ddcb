"""A worker's measuring child and compile pool, started before anything else it does.

Only ``tuner.backends.process`` is imported for them (not torch, the kernels or the store), so
``tuner worker`` starts them first and reaches its store, imports its modules and registers
itself while they start (``tuner.app.service.run_worker``); the worker keeps them for its
tasks (``tuner.app.worker.BackendKeeper``)."""

from __future__ import annotations

from tuner.backends.base import TimingOptions
from tuner.backends.process import ProcessBackend

#: the problem the child is set up on before any task: a tiny one whose kernel (named by
#: reference: nothing is imported here) is quick to load
PRESTART_REF = "search_spaces.vector_add:KERNEL"
PRESTART_PROBLEM = ({"N": 4096}, "float32")


def start_measuring(kind: str, device_index: int = 0, timing: TimingOptions | None = None,
                    compile_workers: int | None = None) -> ProcessBackend:
    """A measuring child and compile pool on ``PRESTART_PROBLEM``. Call it from a thread that
    outlives them (the main thread): children die with the thread that spawned them
    (``tuner.backends.child.die_with_parent``)."""
    shape, dtype = PRESTART_PROBLEM
    return ProcessBackend(kind, PRESTART_REF, dict(shape), dtype, device_index=device_index,
                          timing=timing, compile_workers=compile_workers)
