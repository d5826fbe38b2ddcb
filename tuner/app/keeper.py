"""A worker's measuring backend (GPU child and compile pool), kept from one task to the next
(``BackendKeeper``): only a worker's first task pays their start."""

from __future__ import annotations

import logging
import time
from typing import Any

from tuner.backends import open_backend
from tuner.kernel import TunableKernel

log = logging.getLogger(__name__)


class BackendKeeper:
    """A worker's measuring backend (GPU child and compile pool), kept from one task to the
    next: a task whose problem differs moves it there (``ProcessBackend.retarget``), so that
    only a worker's first task pays their start (about 7 s of imports and CUDA on the H200).
    One that died, failed or sat idle for ``idle_s`` is closed; the next task opens a fresh
    one. Not for replay backends (their table is the task's)."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.backend: Any = None
        self.idle_since = time.monotonic()
        #: backends opened (a test and the logs read it: 1 for a run of tasks = reused)
        self.opened = 0

    def acquire(self, backend_kind: str, kernel: TunableKernel, shape: dict[str, int],
                dtype: str, seed: int, **open_kwargs: Any) -> Any:
        if self.backend is not None and not self.backend.healthy:
            self.discard()
        if self.backend is None:
            self.backend = open_backend(backend_kind, kernel, shape, dtype, seed=seed,
                                        **open_kwargs)
            self.opened += 1
        elif not self.backend.targets(kernel.ref, shape, dtype, seed):
            log.info("reusing the measuring child (pid %s) for %s %s %s",
                     self.backend.child_pids[-1] if self.backend.child_pids else "-",
                     kernel.name, shape, dtype)
            try:
                self.backend.retarget(shape, kernel_ref=kernel.ref, dtype=dtype, seed=seed)
            except BaseException:
                self.discard()
                raise
        return self.backend

    def adopt(self, backend: Any) -> None:
        """Keep ``backend``, opened elsewhere (a worker's start opens it before anything else,
        ``tuner.app.service.run_worker``), as if acquired and released by a task."""
        self.discard()
        self.backend = backend
        self.opened += 1
        self.idle_since = time.monotonic()

    def release(self, ok: bool) -> None:
        """The task is over: keep the backend for the next one when it ended cleanly and is
        healthy, else close it."""
        self.idle_since = time.monotonic()
        if not ok or (self.backend is not None and not self.backend.healthy):
            self.discard()

    def close_if_idle(self) -> None:
        if self.backend is not None and time.monotonic() - self.idle_since >= self.idle_s:
            log.info("closing the idle measuring child after %.0f s", self.idle_s)
            self.discard()

    def discard(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - it is being dropped either way
                log.exception("closing a kept backend")
