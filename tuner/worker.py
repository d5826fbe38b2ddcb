"""Running tuning tasks and persisting them: the code the CLI and the service's workers share.

``execute_task`` takes one claimed task from the database through the whole pipeline: open the
backend, resume from the task's stored trials, warm-start from stored bests, search, write every
trial as it finishes, and store the verified best under the device's key. ``Worker`` is the
long-running loop of ``tuner worker``: claim a task whose target device matches, keep its lease
alive, run it, repeat; a reaper thread re-queues tasks whose workers died.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from db import repo
from search_spaces import get_kernel
from tuner.backends import TimingOptions, open_backend
from tuner.backends.replay import ReplayTable
from tuner.config import KernelConfig
from tuner.errors import TunerError, WorkerDied
from tuner.kernel import TunableKernel
from tuner.measurement import Measurement, Outcome
from tuner.search import SearchOptions, SearchResult, run_search
from tuner.settings import Settings
from tuner.shapes import shape_key

log = logging.getLogger(__name__)

SessionFactory = sessionmaker[Session]
#: the error of a task whose run was interrupted (Ctrl-C or SIGTERM of ``tuner tune``)
INTERRUPTED = "interrupted"
#: how often (seconds) a running search checks whether its job was cancelled
CANCEL_POLL_S = 2.0


@dataclass
class TaskOutcome:
    task_id: int
    status: str
    result: SearchResult | None
    device_key: str | None
    stored: bool
    error: str | None = None


def _measurement_of(trial: Any) -> Measurement:
    return Measurement(
        config=KernelConfig(trial.config), outcome=Outcome(trial.outcome), p20_ms=trial.p20_ms,
        p50_ms=trial.p50_ms, p80_ms=trial.p80_ms, error=trial.error, compile_s=trial.compile_s,
        max_error=trial.max_error)


def warm_start_configs(session: Session, kernel: TunableKernel, device_key: str, dtype: str,
                       shape: dict[str, int], space: Any) -> list[KernelConfig]:
    """Stored bests first (nearest shapes on this device, then this shape on other devices),
    then the kernel's known-good configs and its default."""
    configs: list[KernelConfig] = []
    rows = repo.list_best(session, kernel=kernel.name, dtype=dtype)
    here = [r for r in rows if r.device_key == device_key and r.kernel_version == kernel.version]

    def distance(row: Any) -> float:
        return math.sqrt(sum((math.log2(row.shape.get(k, 1)) - math.log2(v)) ** 2
                             for k, v in shape.items()))

    for row in sorted(here, key=distance)[:3]:
        configs.append(KernelConfig(row.config))
    key = shape_key(shape)
    configs += [KernelConfig(r.config) for r in rows
                if r.device_key != device_key and r.shape_key == key][:2]
    configs += kernel.known_good_configs(shape, dtype)
    configs.append(kernel.default_config(shape, dtype))
    return [c for c in dict.fromkeys(configs) if space.contains(c)]


#: dtypes whose matmul peak the calibration measures (16-bit tensor-core matmul)
_CALIBRATED_DTYPES = ("float16", "bfloat16")


def roofline_floor_ms(kernel: TunableKernel, shape: Mapping[str, int], dtype: str,
                      copy_gbps: float | None, matmul_tflops: float | None) -> float | None:
    """The fastest the device's measured ceilings allow: the larger of the time to move the
    kernel's bytes at the copy bandwidth and (for 16-bit dtypes, which the matmul calibration
    measures) to do its FLOPs at the matmul peak. None without a calibration."""
    if not copy_gbps:
        return None
    floor_s = kernel.bytes(shape, dtype) / (copy_gbps * 1e9)
    if matmul_tflops and dtype in _CALIBRATED_DTYPES:
        floor_s = max(floor_s, kernel.flops(shape) / (matmul_tflops * 1e12))
    return floor_s * 1e3


def execute_task(factory: SessionFactory, task_id: int, *, backend_kind: str,
                 replay_table: ReplayTable | None = None, device_index: int = 0,
                 timing: TimingOptions | None = None,
                 on_trial: Callable[[int, Measurement], None] | None = None,
                 heartbeat: Callable[[], bool] | None = None,
                 worker_id: str | None = None,
                 compile_workers: int | None = None) -> TaskOutcome:
    """Run one task to its end and persist everything. ``heartbeat`` renews the lease and
    returns False when the task is no longer ours (then the search stops). With ``worker_id``
    (the lease owner: the worker's id, ``"cli"`` for ``tuner tune``) every write is made only
    while the task is still that worker's: once it is not (reaped and re-queued, claimed by
    another worker, cancelled), the search stops and the task ends ``lost``, writing nothing."""
    with factory() as session:
        task = repo.get_task(session, task_id)
        job = task.job
        kernel = get_kernel(job.kernel)
        shape, dtype = dict(task.shape), job.dtype
        resume = [_measurement_of(t) for t in repo.trials_for_task(session, task_id)]
        settings = Settings()
        options_base = dict(trials=job.budget_trials, seed=job.seed, strategy=job.strategy,
                            time_budget_s=job.budget_seconds,
                            patience=settings.patience or None,
                            roofline_stop=settings.roofline_stop or None)
        job_id = job.id
    try:
        backend = open_backend(backend_kind, kernel, shape, dtype, seed=job_seed(options_base),
                               replay_table=replay_table, device_index=device_index,
                               timing=timing, compile_workers=compile_workers)
        try:
            return _run_with_backend(_Run(factory, task_id, worker_id), job_id, kernel, shape,
                                     dtype, backend, options_base, resume, on_trial, heartbeat)
        finally:
            backend.close()
    except repo.LeaseLost as exc:
        return _lost(factory, task_id, str(exc))
    except TunerError as exc:
        return _finish(factory, task_id, "failed", None, None, False, str(exc), worker_id)
    except Exception as exc:  # noqa: BLE001 - whatever broke, the task must not stay running
        log.exception("task %s failed unexpectedly", task_id)
        return _finish(factory, task_id, "failed", None, None, False,
                       f"{type(exc).__name__}: {exc}", worker_id)
    except KeyboardInterrupt:  # outside the search loop (which ends as "interrupted" itself)
        _finish(factory, task_id, "cancelled", None, None, False, INTERRUPTED, worker_id)
        raise


def job_seed(options: dict[str, Any]) -> int:
    return int(options.get("seed") or 0)


@dataclass(frozen=True)
class _Run:
    """Where a task's results go: the store, the task, and the lease owner writing them."""

    factory: SessionFactory
    task_id: int
    worker_id: str | None


def _run_with_backend(run: _Run, job_id: str, kernel: TunableKernel,
                      shape: dict[str, int], dtype: str, backend: Any,
                      options_base: dict[str, Any], resume: list[Measurement],
                      on_trial: Callable[[int, Measurement], None] | None,
                      heartbeat: Callable[[], bool] | None) -> TaskOutcome:
    factory, task_id = run.factory, run.task_id
    fp = backend.fingerprint
    with factory() as session:
        repo.upsert_device(session, fp.to_dict())
        repo.set_task_device(session, task_id, fp.key)
        warm = warm_start_configs(session, kernel, fp.key, dtype, shape,
                                  backend.restrict(kernel.space()))
        device = repo.get_device(session, fp.key)
        floor_ms = roofline_floor_ms(kernel, shape, dtype, device.copy_gbps,
                                     device.matmul_tflops) if device else None
        session.commit()
    stop = _StopCheck(factory, job_id, task_id, heartbeat)

    def record(number: int, m: Measurement) -> None:
        with factory() as session:  # LeaseLost: not ours any more; the search stops
            repo.record_trial(session, task_id, number, m.to_dict(), worker_id=run.worker_id)
            session.commit()
        if on_trial is not None:
            on_trial(number, m)

    options = SearchOptions(**options_base, warm_start=warm, resume=resume, floor_ms=floor_ms)
    try:
        result = run_search(kernel, shape, dtype, backend, options, on_trial=record,
                            should_stop=stop)
    except WorkerDied as exc:
        return _finish(factory, task_id, "failed", None, fp.key, False, str(exc),
                       run.worker_id)
    if result.stop_reason == "cancelled":
        return _finish(factory, task_id, stop.status, result, fp.key, False, None,
                       run.worker_id)
    if result.stop_reason == "interrupted":  # keep what was verified, end the job cancelled
        stored = _store_best(run, kernel, shape, dtype, fp, result)
        return _finish(factory, task_id, "cancelled", result, fp.key, stored,
                       f"{INTERRUPTED} after {len(result.trials)} trial(s)", run.worker_id)
    stored = _store_best(run, kernel, shape, dtype, fp, result)
    error = None if result.best else _no_best_reason(result)
    return _finish(factory, task_id, "succeeded" if result.best else "failed", result, fp.key,
                   stored, error, run.worker_id)


def _no_best_reason(result: SearchResult) -> str:
    counts = ", ".join(f"{k}: {v}" for k, v in result.counts.items()) or "no trials"
    return f"no config ran correctly ({counts})"


def _store_best(run: _Run, kernel: TunableKernel, shape: dict[str, int], dtype: str, fp: Any,
                result: SearchResult) -> bool:
    """Store the verified best as the task's and (if faster) the device's best config, in one
    transaction, only while the task is still the worker's (else LeaseLost, nothing stored)."""
    best = result.best
    if best is None or best.p50_ms is None:
        return False
    seconds = best.p50_ms * 1e-3
    with run.factory() as session:
        if not repo.set_task_best(session, run.task_id, best.p50_ms, best.config.to_dict(),
                                  worker_id=run.worker_id):
            raise repo.LeaseLost(f"task {run.task_id} is no longer leased to worker "
                                 f"{run.worker_id}: its best was not stored")
        _row, written = repo.store_best(
            session, device_key=fp.key, kernel=kernel.name, kernel_version=kernel.version,
            dtype=dtype, shape=shape, triton_version=fp.triton_version or "",
            config=best.config.to_dict(), p20_ms=best.p20_ms or best.p50_ms,
            p50_ms=best.p50_ms, p80_ms=best.p80_ms or best.p50_ms,
            tflops=kernel.flops(shape) / seconds / 1e12,
            gbps=kernel.bytes(shape, dtype) / seconds / 1e9,
            torch_version=fp.torch_version, cuda_version=fp.cuda_version, task_id=run.task_id,
            noise_margin=max(0.01, best.noise))
        session.commit()
    return bool(written)


def _finish(factory: SessionFactory, task_id: int, status: str, result: SearchResult | None,
            device_key: str | None, stored: bool, error: str | None,
            worker_id: str | None = None) -> TaskOutcome:
    with factory() as session:
        repo.finish_task(session, task_id, status, error=error, worker_id=worker_id)
        session.commit()
    if error:
        log.warning("task %s %s: %s", task_id, status, error)
    return TaskOutcome(task_id, status, result, None if status == "lost" else device_key,
                       stored, error)


def _lost(factory: SessionFactory, task_id: int, why: str) -> TaskOutcome:
    """The task stopped being ours mid-run: nothing more is written. Cancelled (by its job)
    says so; otherwise it is another worker's now (or queued again)."""
    with factory() as session:
        status = repo.get_task(session, task_id).status
    log.warning("task %s: %s", task_id, why)
    return TaskOutcome(task_id, "cancelled" if status == "cancelled" else "lost", None, None,
                       False, why)


class _StopCheck:
    """Called by the search between batches: stop when the job was cancelled or the lease lost."""

    def __init__(self, factory: SessionFactory, job_id: str, task_id: int,
                 heartbeat: Callable[[], bool] | None) -> None:
        self.factory, self.job_id, self.task_id = factory, job_id, task_id
        self.heartbeat = heartbeat
        self.last = 0.0
        self.status = "cancelled"

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.last < CANCEL_POLL_S:
            return False
        self.last = now
        if self.heartbeat is not None and not self.heartbeat():
            self.status = "lost"
            return True
        with self.factory() as session:
            return repo.get_task(session, self.task_id).status == "cancelled"


def worker_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class Worker:
    """Claims and runs tasks for one device until stopped."""

    def __init__(self, factory: SessionFactory, *, backend_kind: str, device_key: str,
                 device_index: int = 0, lease_seconds: float = 60.0, poll_seconds: float = 1.0,
                 timing: TimingOptions | None = None, name: str | None = None,
                 compile_workers: int | None = None) -> None:
        self.factory, self.backend_kind, self.device_key = factory, backend_kind, device_key
        #: compile processes per task (None: the backend's default)
        self.compile_workers = compile_workers
        self.device_index, self.lease_seconds, self.poll_seconds = (
            device_index, lease_seconds, poll_seconds)
        self.timing = timing
        self.id = name or worker_id()
        self.stopping = threading.Event()
        self.healthy = True
        self.last_error: str | None = None

    def run_once(self) -> TaskOutcome | None:
        """Claim one task and run it; None when nothing was queued for this device."""
        with self.factory() as session:
            task = repo.claim_task(session, worker_id=self.id, device_key=self.device_key,
                                   lease_seconds=self.lease_seconds)
            session.commit()
            task_id = task.id if task is not None else None
        if task_id is None:
            return None
        log.info("worker %s claimed task %s", self.id, task_id)
        self.report("busy", task_id)
        beat = _Heartbeat(self, task_id)
        beat.start()
        try:
            outcome = execute_task(self.factory, task_id, backend_kind=self.backend_kind,
                                   device_index=self.device_index, timing=self.timing,
                                   heartbeat=beat.alive, worker_id=self.id,
                                   compile_workers=self.compile_workers)
        except BaseException:  # exiting at once (a second signal): give the task back now
            self._release(task_id)
            raise
        finally:
            beat.stop()
        if outcome.status == "lost" and self.stopping.is_set():
            self._release(task_id)
        if outcome.error and "died" in outcome.error:
            self.healthy = False
            self.last_error = outcome.error
        self.report("idle" if self.healthy else "unhealthy", error=self.last_error)
        return outcome

    def report(self, status: str, task_id: int | None = None, error: str | None = None) -> None:
        """Say what this worker is doing in its row (``tuner serve``'s workers register one;
        a worker without a row writes nothing). A failed write is only logged."""
        try:
            with self.factory() as session:
                repo.beat_worker(session, self.id, status=status, task_id=task_id, error=error)
                session.commit()
        except Exception:  # noqa: BLE001 - the report is advisory; the task goes on
            log.exception("worker %s: reporting %s failed", self.id, status)

    def _release(self, task_id: int) -> None:
        """Stopped on request mid-task: re-queue the task now rather than after its lease
        expires, so another worker (or this one restarted) resumes it from its stored trials."""
        with self.factory() as session:
            released = repo.release_task(session, task_id, self.id)
            session.commit()
        if released:
            log.info("worker %s stopping: task %s is queued again", self.id, task_id)

    def run_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                if self.run_once() is None:
                    self.stopping.wait(self.poll_seconds)
            except Exception:  # noqa: BLE001 - a worker must outlive one bad task
                log.exception("worker %s: task failed unexpectedly", self.id)
                self.stopping.wait(self.poll_seconds)


class _Heartbeat(threading.Thread):
    """Renews a task's lease every third of its length while the task runs."""

    def __init__(self, worker: Worker, task_id: int) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{task_id}")
        self.worker, self.task_id = worker, task_id
        self._done = threading.Event()
        self._ours = True

    def alive(self) -> bool:
        return self._ours and not self.worker.stopping.is_set()

    def run(self) -> None:
        while not self._done.wait(self.worker.lease_seconds / 3):
            try:
                with self.worker.factory() as session:
                    self._ours = repo.renew_lease(session, self.task_id, self.worker.id,
                                                  self.worker.lease_seconds)
                    session.commit()
            except Exception:  # noqa: BLE001 - a missed beat is retried; the lease is slack
                log.exception("lease renewal of task %s failed", self.task_id)
            if not self._ours:
                log.warning("task %s is no longer ours; stopping it", self.task_id)
                return

    def stop(self) -> None:
        self._done.set()


def reap_forever(factory: SessionFactory, interval_s: float, stopping: threading.Event) -> None:
    """Re-queue tasks whose lease expired (their worker died), every ``interval_s``."""
    while not stopping.wait(interval_s):
        try:
            with factory() as session:
                count = repo.reap_expired(session)
                session.commit()
            if count:
                log.warning("reaper re-queued or failed %d task(s) with expired leases", count)
        except Exception:  # noqa: BLE001
            log.exception("reaper pass failed")
