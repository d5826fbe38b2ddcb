"""Running tuning tasks and persisting them: the code the CLI and the service's workers share.

``execute_task`` takes one claimed task from the database through the whole pipeline: open the
backend, resume from the task's stored trials, warm-start from stored bests, search, write every
trial as it finishes, and store the verified best under the device's key. ``Worker`` is the
long-running loop of ``tuner worker``: claim a task whose target device matches, keep its lease
alive, run it, repeat; a reaper thread re-queues tasks whose workers died.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from db import repo
from db.transient import StoreUnavailable, backoff_delays, describe, retry_transient
from search_spaces import get_kernel
from tuner.app.best_decision import (  # noqa: F401 (also re-exported for the old imports)
    BestDecision,
    StoredBest,
    _noise_margin,
    against_default,
    decide_best,
    stored_best,
)
from tuner.app.keeper import BackendKeeper
from tuner.app.prestart import start_measuring
from tuner.backends import TimingOptions, open_backend
from tuner.backends.base import Interruptible, Retargetable, use_bound, use_timing
from tuner.backends.process import ProcessBackend
from tuner.backends.replay import ReplayTable
from tuner.config import KernelConfig
from tuner.errors import TunerError, WorkerDied, interrupted_by
from tuner.interpreter_estimate import interpreter_time_budget_s
from tuner.job_spec import JobSpec
from tuner.kernel import TunableKernel, listed_configs_hook
from tuner.lifecycle import Handback, Status
from tuner.measurement import Measurement
from tuner.phases import PhaseClock
from tuner.roofline import roofline
from tuner.search import (
    SearchOptions,
    SearchResult,
    known_good_first,
    run_search,
)
from tuner.settings import Settings
from tuner.shapes import nearest_first, shape_key
from tuner.timing import DEFAULT_TIMING

log = logging.getLogger(__name__)

SessionFactory = sessionmaker[Session]
T = TypeVar("T")
#: the error of a task whose run was interrupted (Ctrl-C or SIGTERM of ``tuner tune``)
INTERRUPTED = "interrupted"
#: how often (seconds) a running task checks whether its job was cancelled
CANCEL_POLL_S = 1.0


@dataclass
class TaskOutcome:
    task_id: int
    #: the task's end: succeeded, failed, cancelled; ``lost`` (another worker's now) or
    #: ``requeued`` (the database stayed unreachable: given back to the queue)
    status: str
    result: SearchResult | None
    device_key: str | None
    #: whether the task wrote the stored best: this search's best, or a new one (inserted or
    #: replacing the stored config: its best, or the kernel's default, ``BestDecision``)
    stored: bool
    error: str | None = None
    #: what became of the stored best for the task's identity, in words (``BestDecision``)
    note: str | None = None


def _measurement_of(trial: Any) -> Measurement:
    return Measurement.from_dict(repo.measurement_dict(trial))


def warm_start_configs(session: Session, kernel: TunableKernel, device_key: str, dtype: str,
                       shape: dict[str, int], space: Any) -> list[KernelConfig]:
    """Stored bests first (the nearest shapes on this device: a sweep's shapes seed each
    other; then this shape on other devices), then the kernel's known-good configs and its
    default that its prior ranks best (``known_good_first``)."""
    return _warm_start(repo.list_best(session, kernel=kernel.name, dtype=dtype), kernel,
                       device_key, dtype, shape, space)


def _warm_start(rows: list[Any], kernel: TunableKernel, device_key: str, dtype: str,
                shape: dict[str, int], space: Any) -> list[KernelConfig]:
    """``warm_start_configs`` from the stored bests of the kernel and dtype (``rows``, read)."""
    configs: list[KernelConfig] = []
    here = [r for r in rows if r.device_key == device_key and r.kernel_version == kernel.version]
    for row in nearest_first(here, shape, lambda r: r.shape)[:3]:
        configs.append(KernelConfig(row.config))
    key = shape_key(shape)
    configs += [KernelConfig(r.config) for r in rows
                if r.device_key != device_key and r.shape_key == key][:2]
    # then the known-good configs (and the default) the kernel's prior ranks best on this
    # shape: all of them would cost 10+ trials before the model leads
    configs += known_good_first(kernel, shape, dtype, space)
    return [c for c in dict.fromkeys(configs) if space.contains(c)]


def execute_task(factory: SessionFactory, task_id: int, *, backend_kind: str,
                 replay_table: ReplayTable | None = None, device_index: int = 0,
                 timing: TimingOptions | None = None,
                 on_trial: Callable[[int, Measurement], None] | None = None,
                 heartbeat: Callable[[], bool] | None = None,
                 worker_id: str | None = None,
                 compile_workers: int | None = None,
                 backend: Any = None,
                 keeper: BackendKeeper | None = None,
                 settings: Settings | None = None) -> TaskOutcome:
    """Run one task to its end and persist everything. ``backend``: one already open for this
    kernel and dtype (a sweep's shapes share one GPU child and compile pool, ``tuner.app.sweep``):
    moved to the task's shape (``retarget``) and left open; ``keeper``: a worker's backend
    kept across tasks, reused (moved to this task's problem) or opened, and kept after the
    task unless it failed; else one is opened and closed here. ``heartbeat`` renews the lease and
    returns False when the task is no longer ours (then the search stops). With ``worker_id``
    (the lease owner: the worker's id, ``"cli"`` for ``tuner tune``) every write is made only
    while the task is still that worker's: once it is not (reaped and re-queued, claimed by
    another worker, cancelled), the search stops and the task ends ``lost``, writing nothing.
    Every database access is retried while it fails transiently (``TUNER_DB_RETRY_SECONDS``);
    past that the task is re-queued (``requeued``), never failed: its trials are sound.
    ``settings``: the caller's (a worker reads its environment once); None: read here.
    Where the task's time goes (``tuner.phases``) is stored with it when it finishes."""
    settings = settings if settings is not None else Settings()
    run = _Run(factory, task_id, worker_id, backoff_delays(settings.db_retry_seconds),
               clock=PhaseClock(), started=time.perf_counter())
    try:
        return _execute(run, backend_kind, replay_table, device_index, timing, on_trial,
                        heartbeat, compile_workers, backend, keeper, settings)
    except StoreUnavailable as exc:
        return _requeue(run, f"{exc}; the task was requeued")


def _execute(run: _Run, backend_kind: str, replay_table: ReplayTable | None,
             device_index: int, timing: TimingOptions | None,
             on_trial: Callable[[int, Measurement], None] | None,
             heartbeat: Callable[[], bool] | None, compile_workers: int | None,
             backend: Any, keeper: BackendKeeper | None, settings: Settings) -> TaskOutcome:
    task_id = run.task_id
    with run.clock.timed("setup"):
        job_id, kernel, shape, spec, resume = run.store(
            "reading the task", lambda: _read_task(run))
    if (mismatch := kernel_version_mismatch(job_id, spec, kernel)) is not None:
        return _finish(run, Status.FAILED, None, None, False, mismatch)
    dtype, wanted, options_base = spec.dtype, spec.timing, _search_options(spec, settings)
    if options_base["time_budget_s"] is None and backend_kind == "interpret":
        options_base["time_budget_s"] = interpreter_time_budget_s(
            kernel, shape, dtype, options_base["trials"])
    shared = backend is not None
    kept = keeper is not None and not shared and backend_kind != "replay"
    seed = job_seed(options_base)
    clean = False  # the kept backend ended the task in a known state
    try:
        with run.clock.timed("setup"):
            if shared and isinstance(backend, Retargetable) and not backend.targets(
                    kernel.ref, shape, dtype, seed):
                backend.retarget(shape, kernel_ref=kernel.ref, dtype=dtype, seed=seed)
            elif kept:
                assert keeper is not None
                backend = keeper.acquire(backend_kind, kernel, shape, dtype, seed,
                                         device_index=device_index, timing=timing,
                                         compile_workers=compile_workers)
            elif not shared:
                backend = open_backend(backend_kind, kernel, shape, dtype,
                                       seed=seed, replay_table=replay_table,
                                       device_index=device_index, timing=timing,
                                       compile_workers=compile_workers)
        if isinstance(backend, ProcessBackend):
            backend.clock = run.clock
        try:
            # the method the backend times with: the job's (a replay table: its own)
            run = replace(run, timing=use_timing(backend, wanted))
            outcome = _run_with_backend(run, job_id, kernel, shape, dtype, backend,
                                        options_base, resume, on_trial, heartbeat)
            clean = True
            return outcome
        finally:
            if isinstance(backend, ProcessBackend):
                backend.clock = None
            if kept:
                assert keeper is not None
                keeper.release(clean)
            elif not shared:
                backend.close()
    except repo.LeaseLost as exc:
        return _lost(run, str(exc))
    except StoreUnavailable:  # not the task's fault: ``execute_task`` re-queues it
        raise
    except TunerError as exc:
        return _finish(run, Status.FAILED, None, None, False, str(exc))
    except Exception as exc:  # noqa: BLE001 - whatever broke, the task must not stay running
        if interrupted_by(exc):  # an interrupt a library turned into its own error
            _finish(run, Status.CANCELLED, None, None, False, INTERRUPTED)
            raise KeyboardInterrupt from exc
        log.exception("task %s failed unexpectedly", task_id)
        # a database error's text is its SQL statement and parameters: a sentence instead
        return _finish(run, Status.FAILED, None, None, False, describe(exc, "running the task"))
    except KeyboardInterrupt:  # outside the search loop (which ends as "interrupted" itself)
        _finish(run, Status.CANCELLED, None, None, False, INTERRUPTED)
        raise


def _read_task(run: _Run) -> tuple[str, TunableKernel, dict[str, int], JobSpec,
                                   list[Measurement]]:
    """The task's job id, kernel, problem, the job's spec (with the task's shape) and the
    stored trials (to resume from). The kernel is loaded once the read is over (an import:
    seconds, a user's module any time)."""
    with run.factory() as session:
        task = repo.get_task(session, run.task_id)
        job = task.job
        resume = [_measurement_of(t) for t in repo.trials_for_task(session, run.task_id)]
        job_id, shape, spec = job.id, dict(task.shape), JobSpec.of(job, [task.shape])
        if task.started_at is not None and job.created_at is not None:
            run.clock.add("queued", max(0.0, (task.started_at - job.created_at).total_seconds()))
    return job_id, get_kernel(spec.kernel), shape, spec, resume


def _search_options(spec: JobSpec, settings: Settings) -> dict[str, Any]:
    """The search's options from the job (budget, seed, strategy) and the worker's settings
    (its early-stop rules)."""
    return dict(spec.search_options(), patience=settings.patience or None,
                roofline_stop=settings.roofline_stop or None,
                stop_chance=settings.stop_chance or None,
                in_flight=settings.search_in_flight)


def kernel_version_mismatch(job_id: str, spec: JobSpec, kernel: TunableKernel) -> str | None:
    """Why this worker must not run a task of the job, when the job was submitted for another
    version of the kernel's code than the one it loads (the service or client that submitted
    it runs other code): its configs would be tuned on, and stored for, code the request was
    not made against. None when the versions agree."""
    if spec.kernel_version == kernel.version:
        return None
    return (f"job {job_id} was submitted for {kernel.name} version {spec.kernel_version}, but "
            f"this worker's {kernel.name} is version {kernel.version} (its code differs): "
            "nothing was tuned or stored. Submit the job again to tune the code the service "
            f"runs now, or run it on a worker whose {kernel.name} is version "
            f"{spec.kernel_version}")


def job_seed(options: dict[str, Any]) -> int:
    return int(options.get("seed") or 0)


@dataclass(frozen=True)
class _Run:
    """Where a task's results go: the store, the task, the lease owner writing them, the
    waits between tries of a write that failed transiently (``db.transient``), and the timing
    method its results are stored as (``tuner/timing.py``: what the backend times with)."""

    factory: SessionFactory
    task_id: int
    worker_id: str | None
    delays: tuple[float, ...] = ()
    timing: str = DEFAULT_TIMING
    #: where the task's time goes (``tuner.phases``), and when it started (perf_counter)
    clock: PhaseClock = field(default_factory=PhaseClock)
    started: float = 0.0

    def store(self, doing: str, work: Callable[[], T]) -> T:
        """``work()`` (which opens its own session), retried while the database fails
        transiently; ``StoreUnavailable`` once the retry window is spent."""
        with self.clock.timed("storing"):
            return retry_transient(doing, work, self.delays)

    def phases(self) -> dict[str, float]:
        """The phases so far, with ``total``: from the claim to now."""
        return {**self.clock.to_dict(), "total": round(time.perf_counter() - self.started, 3)}


def _setup(run: _Run, kernel: TunableKernel, fp: Any, dtype: str, shape: dict[str, int],
           space: Any) -> tuple[list[KernelConfig], Any, StoredBest | None]:
    """Register the device (committed at once: no lock is held while anything is computed),
    then read what the search starts from: warm-start configs (ranked once the read is over),
    the roofline and the stored best of this identity."""
    with run.factory() as session:
        repo.upsert_device(session, fp.to_dict())
        repo.set_task_device(session, run.task_id, fp.key, run.timing)
        session.commit()
    with run.factory() as session:
        rows = repo.list_best(session, kernel=kernel.name, dtype=dtype)
        device = repo.get_device(session, fp.key)
        ceilings = (device.copy_gbps, device.matmul_tflops) if device else None
        stored = stored_best(session, kernel, fp, dtype, shape, run.timing)
    warm = _warm_start(rows, kernel, fp.key, dtype, shape, space)
    roof = roofline(kernel, shape, dtype, *ceilings) if ceilings else None
    return warm, roof, stored


def _trial_recorder(run: _Run, on_trial: Callable[[int, Measurement], None] | None
                    ) -> Callable[[int, Measurement], None]:
    """The search's ``on_trial``: store each trial as it is measured (``LeaseLost``: not ours
    any more; the search stops), retried while the database fails transiently."""
    def record(number: int, m: Measurement) -> None:
        tries = 0

        def write() -> None:
            nonlocal tries
            tries += 1
            with run.factory() as session:
                # a retry after a commit whose answer was lost: the trial is stored already
                if tries > 1 and repo.has_trial(session, run.task_id, number):
                    return
                repo.record_trial(session, run.task_id, number, m.to_dict(),
                                  worker_id=run.worker_id)
                session.commit()

        run.store(f"storing trial {number}", write)
        if on_trial is not None:
            on_trial(number, m)
    return record


def _run_with_backend(run: _Run, job_id: str, kernel: TunableKernel,
                      shape: dict[str, int], dtype: str, backend: Any,
                      options_base: dict[str, Any], resume: list[Measurement],
                      on_trial: Callable[[int, Measurement], None] | None,
                      heartbeat: Callable[[], bool] | None) -> TaskOutcome:
    fp = backend.fingerprint
    space = backend.restrict(kernel.space())
    with run.clock.timed("setup"):
        warm, roof, stored = run.store(
            "registering the device", lambda: _setup(run, kernel, fp, dtype, shape, space))
    use_bound(backend, roof is not None and roof.bound == "memory")
    stop = _StopCheck(run, job_id, heartbeat)
    incumbent = stored.config if stored is not None and space.contains(stored.config) else None
    # the roofline stop only where the floor is the copy bandwidth's, a real ceiling. A
    # compute-bound problem's is the vendor GEMM's measured speed, which a tuned kernel can
    # pass (the H200's 8192^3 bf16 runs 1.44 ms, its floor at cuBLAS's 675 TFLOP/s 1.63):
    # there it stopped searches after the model stop's minimum of trials, 1.6-3.0% off a
    # 96-trial search in 4 of the 7 such stops measured (8192^3 and a gelu epilogue's 4096^3,
    # bench/results/tuning_time_33j, 33k), and it saves 0.2 trials a search on the recorded
    # tables (bench/results/roofline_stop_study.md)
    listed_configs = listed_configs_hook(kernel)  # optional: a user's list
    listed = list(listed_configs(shape, dtype)) if listed_configs is not None else []
    options = SearchOptions(**options_base, warm_start=warm, resume=resume, listed=listed,
                            floor_ms=roof.floor_ms if roof and roof.bound == "memory" else None,
                            incumbent=incumbent, default=kernel.default_config(shape, dtype))
    # the backend stops a measurement in flight when the task must stop (a cancel: within
    # about CANCEL_POLL_S, not after a long compile or the finalists' re-timing)
    interruptible = isinstance(backend, Interruptible)
    if interruptible:
        backend.interrupt = _with_deadline(stop, options.time_budget_s)
    stop.start()
    try:
        with run.clock.timed("search"):
            result = run_search(kernel, shape, dtype, backend, options,
                                on_trial=_trial_recorder(run, on_trial), should_stop=stop)
    except WorkerDied as exc:
        return _finish(run, Status.FAILED, None, fp.key, False, str(exc))
    finally:
        stop.close()
        if interruptible:
            backend.interrupt = None
    if result.stop_reason == "cancelled":
        return _finish(run, stop.status, result, fp.key, False, None)
    if result.stop_reason == "interrupted":  # keep what was verified, end the job cancelled
        written, note = _store_best(run, kernel, shape, dtype, fp, result, stored)
        return _finish(run, Status.CANCELLED, result, fp.key, written,
                       f"{INTERRUPTED} after {len(result.trials)} trial(s)", note)
    written, note = _store_best(run, kernel, shape, dtype, fp, result, stored)
    error = None if result.best else _no_best_reason(result)
    status = Status.SUCCEEDED if result.best else Status.FAILED
    return _finish(run, status, result, fp.key, written, error, note)


def _no_best_reason(result: SearchResult) -> str:
    counts = ", ".join(f"{k}: {v}" for k, v in result.counts.items()) or "no trials"
    return f"no config ran correctly ({counts})"


def _times(kernel: TunableKernel, shape: dict[str, int], dtype: str,
           m: Measurement, decision: BestDecision | None = None) -> repo.BestTimes:
    p50 = m.p50_ms or 0.0
    seconds = p50 * 1e-3
    default = decision.default if decision is not None else None
    return repo.BestTimes(
        config=m.config.to_dict(), p20_ms=m.p20_ms or p50, p50_ms=p50, p80_ms=m.p80_ms or p50,
        tflops=kernel.flops(shape) / seconds / 1e12 if seconds else None,
        gbps=kernel.bytes(shape, dtype) / seconds / 1e9 if seconds else None,
        measured=str(m.extra.get("measured", "trial")),
        basis=decision.basis if decision is not None else None,
        default_ms=default.p50_ms if default is not None and default.ok else None,
        search_ms=decision.search_ms if decision is not None else None,
        noise_margin=decision.margin if decision is not None else None)


def _store_best(run: _Run, kernel: TunableKernel, shape: dict[str, int], dtype: str, fp: Any,
                result: SearchResult, stored: StoredBest | None) -> tuple[bool, str | None]:
    """Store the verified best as the task's, with its baseline and the stored best's re-timed
    time, the finalists' re-timed times beside their trials, and (``decide_best``) the
    device's best config, in one transaction, only while the task is still the worker's (else
    LeaseLost, nothing stored). Returns whether the stored best was written, and why."""
    best = result.best
    if best is None or best.p50_ms is None:
        return False, None
    decision = decide_best(best, stored, result.incumbent,
                           _noise_margin(best, result.incumbent), result.default)
    return run.store("storing the best config",
                     lambda: _write_task_best(run, kernel, shape, dtype, fp, result, stored,
                                              decision))


def _write_task_best(run: _Run, kernel: TunableKernel, shape: dict[str, int], dtype: str,
                     fp: Any, result: SearchResult, stored: StoredBest | None,
                     decision: BestDecision) -> tuple[bool, str | None]:
    """``_store_best``'s one transaction (tried again whole when it fails transiently)."""
    best, incumbent, baseline = result.best, result.incumbent, result.baseline
    assert best is not None and best.p50_ms is not None
    with run.factory() as session:
        written = decision.write is not None and _write_best(
            session, run, kernel, shape, dtype, fp, decision, stored)
        note = decision.note if written or decision.write is None else (
            "another worker stored a best for this identity while this search ran: its "
            "config stands (not re-timed here; the next search re-times it)")
        baseline_ok = baseline is not None and baseline.ok and baseline.p50_ms
        default = result.default if result.default is not None and result.default.ok and (
            result.default.extra.get("measured") == "retimed") else None
        if not repo.set_task_best(
                session, run.task_id, best.p50_ms, best.config.to_dict(),
                worker_id=run.worker_id, measured=str(best.extra.get("measured", "trial")),
                baseline_ms=baseline.p50_ms if baseline_ok and baseline else None,
                baseline_name=str(baseline.extra.get("baseline", "baseline"))
                if baseline_ok and baseline else None,
                incumbent_ms=incumbent.p50_ms if incumbent is not None and incumbent.ok
                else None, note=note,
                default_ms=default.p50_ms if default is not None else None,
                default_config=default.config.to_dict() if default is not None else None,
                basis=decision.basis if written else None,
                noise_margin=decision.margin if written else None):
            raise repo.LeaseLost(f"task {run.task_id} is no longer leased to worker "
                                 f"{run.worker_id}: its best was not stored")
        retimed = [m for m in result.finalists if m.extra.get("measured") == "retimed"]
        if default is not None and default.config not in {m.config for m in retimed}:
            retimed.append(default)  # the default's trial, if it had one, gets its time too
        repo.record_retimed(session, run.task_id, [m.to_dict() for m in retimed])
        session.commit()
    # stored: this search's best written, or a new best (its best, or the kernel's default)
    return bool(written and (decision.write is best
                             or decision.verdict in ("inserted", "replaced"))), note


def _write_best(session: Session, run: _Run, kernel: TunableKernel, shape: dict[str, int],
                dtype: str, fp: Any, decision: BestDecision, stored: StoredBest | None) -> bool:
    assert decision.write is not None
    _row, written = repo.write_best(
        session, device_key=fp.key, kernel=kernel.name, kernel_version=kernel.version,
        dtype=dtype, shape=shape, triton_version=fp.triton_version or "",
        times=_times(kernel, shape, dtype, decision.write, decision),
        revision=stored.revision if stored else None,
        torch_version=fp.torch_version, cuda_version=fp.cuda_version, task_id=run.task_id,
        timing=run.timing)
    return written


def _finish(run: _Run, status: str, result: SearchResult | None, device_key: str | None,
            stored: bool, error: str | None, note: str | None = None) -> TaskOutcome:
    def write() -> None:
        with run.factory() as session:
            repo.finish_task(session, run.task_id, status, error=error,
                             worker_id=run.worker_id,
                             stop_reason=result.stop_reason if result else None,
                             phases=run.phases())
            session.commit()

    run.store(f"finishing task {run.task_id} as {status}", write)
    if error:
        log.warning("task %s %s: %s", run.task_id, status, error)
    return TaskOutcome(run.task_id, status, result,
                       None if status == Handback.LOST else device_key, stored, error, note)


def _lost(run: _Run, why: str) -> TaskOutcome:
    """The task stopped being ours mid-run: nothing more is written. Cancelled (by its job)
    says so; otherwise it is another worker's now (or queued again)."""
    def read() -> str:
        with run.factory() as session:
            return repo.get_task(session, run.task_id).status

    status = run.store("reading the task's status", read)
    log.warning("task %s: %s", run.task_id, why)
    return TaskOutcome(run.task_id,
                       Status.CANCELLED if status == Status.CANCELLED else Handback.LOST,
                       None, None, False, why)


def _requeue(run: _Run, why: str) -> TaskOutcome:
    """The database stayed unreachable for the whole retry window: give the task back to the
    queue (one try; if that fails too, its lease expires and the reaper re-queues it), never
    fail it. Either way no attempt is used: the task did nothing wrong."""
    try:
        with run.factory() as session:
            released = run.worker_id is not None and repo.release_task(
                session, run.task_id, run.worker_id, why)
            session.commit()
    except Exception:  # noqa: BLE001 - the lease's expiry re-queues it
        log.exception("task %s: releasing it failed; its lease's expiry re-queues it",
                      run.task_id)
        released = False
    log.warning("task %s requeued (%s): %s", run.task_id,
                "released" if released else "left to its lease", why)
    return TaskOutcome(run.task_id, Handback.REQUEUED, None, None, False, why)


#: how far past its time budget a task's measurement in flight (or its finalists' re-timing)
#: may run before it is stopped, as a share of the budget
TIME_BUDGET_OVERRUN = 0.25


def _with_deadline(stop: Callable[[], bool], budget_s: float | None) -> Callable[[], bool]:
    """The backend's ``interrupt``: ``stop``, and also once the task's time budget is spent
    (with ``TIME_BUDGET_OVERRUN``): a config that hangs (60 s each on the interpreter) must not
    hold the worker past the budget; the search then ends ``time``."""
    if budget_s is None:
        return stop
    deadline = time.monotonic() + budget_s * (1 + TIME_BUDGET_OVERRUN)
    return lambda: stop() or time.monotonic() >= deadline


class _StopCheck:
    """Whether the task must stop: its job was cancelled (``status`` "cancelled"), or the task
    is no longer this worker's ("lost": the heartbeat says so, or the task's row names
    another lease owner or status). This thread reads the task every ``CANCEL_POLL_S``, one
    short read transaction each; calling the check costs nothing, so the search asks it
    between batches and the backend while a measurement is in flight (``interrupt``). A
    failed read is logged and tried at the next poll: the task's writes meet the fault."""

    def __init__(self, run: _Run, job_id: str, heartbeat: Callable[[], bool] | None) -> None:
        self.run, self.job_id = run, job_id
        self.heartbeat = heartbeat
        self.status: str = Status.CANCELLED
        self.stopped = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"stop-check-{run.task_id}")

    def __call__(self) -> bool:
        return self.stopped.is_set()

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        failing = False
        while not self._done.wait(CANCEL_POLL_S):
            try:
                why = self._why()
                failing = False
            except Exception as exc:  # noqa: BLE001 - the next poll tries again
                if not failing:
                    log.warning("task %s: checking for a cancel failed (%s)", self.run.task_id,
                                describe(exc))
                failing, why = True, None
            if why is not None:
                self.status = why
                self.stopped.set()
                return

    def _why(self) -> str | None:
        alive = self.heartbeat is None or self.heartbeat()
        try:
            with self.run.factory() as session:
                task = repo.get_task(session, self.run.task_id)
                status, owner = task.status, task.lease_owner
        except Exception:
            if not alive:  # stopping, or the lease is gone: the row only says which
                return Handback.LOST
            raise
        if status == Status.CANCELLED:  # also where the heartbeat (or a dispatcher's abort) saw it
            return Status.CANCELLED
        if not alive or (self.run.worker_id is not None
                         and (status, owner) != (Status.RUNNING, self.run.worker_id)):
            return Handback.LOST
        return None

    def close(self) -> None:
        self._done.set()


def worker_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


#: the longest a task waits for its worker's imports (``Worker.warmed``)
WARM_WAIT_S = 30.0


class Worker:
    """Claims and runs tasks for one device until stopped."""

    def __init__(self, factory: SessionFactory, *, backend_kind: str, device_key: str,
                 device_index: int = 0, lease_seconds: float = 60.0, poll_seconds: float = 1.0,
                 timing: TimingOptions | None = None, name: str | None = None,
                 compile_workers: int | None = None, keep_seconds: float = 0.0,
                 settings: Settings | None = None) -> None:
        self.factory, self.backend_kind, self.device_key = factory, backend_kind, device_key
        #: read once: every task of this worker runs under the same settings
        self.settings = settings if settings is not None else Settings()
        #: the measuring child kept across tasks (``keep_seconds`` > 0; not for replay)
        self.keeper = (BackendKeeper(keep_seconds)
                       if keep_seconds > 0 and backend_kind != "replay" else None)
        #: compile processes per task (None: the backend's default)
        self.compile_workers = compile_workers
        self.device_index, self.lease_seconds, self.poll_seconds = (
            device_index, lease_seconds, poll_seconds)
        self.timing = timing
        self.id = name or worker_id()
        self.stopping = threading.Event()
        #: how an idle worker waits before it looks at the queue again (at most the seconds
        #: given): on ``stopping``, or the embedded dispatcher's doorbell (rung when a job is
        #: queued: ``tuner.app.dispatch.doorbell``)
        self.idle_wait: Callable[[float], object] = self.stopping.wait
        self.healthy = True
        self.last_error: str | None = None
        #: set once this process imported what tasks need (``tuner.app.service.warm_imports``,
        #: begun beside the child's start; the worker is ready once it is set, or after
        #: ``WARM_WAIT_S``): a task waits for it (``WARM_WAIT_S`` at most) rather than import
        #: beside it, each slowing the other under one GIL
        self.warmed = threading.Event()
        self.warmed.set()

    def run_once(self) -> TaskOutcome | None:
        """Claim one task and run it; None when nothing was queued for this device."""
        with self.factory() as session:
            task = repo.claim_task(session, worker_id=self.id, device_key=self.device_key,
                                   lease_seconds=self.lease_seconds)
            session.commit()
            task_id = task.id if task is not None else None
        if task_id is None:
            return None
        return self.run_claimed(task_id)

    def run_claimed(self, task_id: int, abort: Callable[[], bool] | None = None) -> TaskOutcome:
        """Run a task this worker holds (claimed, or taken from a dispatcher) to its end,
        renewing its lease meanwhile. ``abort``: the dispatcher's own cancel signal (the
        task's status is checked as well); True stops the task at its next check."""
        log.info("worker %s claimed task %s", self.id, task_id)
        if not self.warmed.is_set():
            t0 = time.monotonic()
            self.warmed.wait(WARM_WAIT_S)
            log.info("task %s waited %.2f s for the worker's imports", task_id,
                     time.monotonic() - t0)
        self.report("busy", task_id)
        beat = _Heartbeat(self, task_id)
        beat.start()
        alive = beat.alive if abort is None else (lambda: beat.alive() and not abort())
        try:
            outcome = execute_task(self.factory, task_id, backend_kind=self.backend_kind,
                                   device_index=self.device_index, timing=self.timing,
                                   heartbeat=alive, worker_id=self.id,
                                   compile_workers=self.compile_workers, keeper=self.keeper,
                                   settings=self.settings)
        except BaseException:  # exiting at once (a second signal): give the task back now
            self._release(task_id)
            raise
        finally:
            beat.stop()
        if outcome.status == Handback.LOST and self.stopping.is_set():
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
        try:
            while not self.stopping.is_set():
                try:
                    if self.run_once() is None:
                        if self.keeper is not None:
                            self.keeper.close_if_idle()
                        self.idle_wait(self.poll_seconds)
                except Exception:  # noqa: BLE001 - a worker must outlive one bad task
                    log.exception("worker %s: task failed unexpectedly", self.id)
                    self.stopping.wait(self.poll_seconds)
        finally:
            self.close()

    def prestart(self) -> Any:
        """Start the measuring child and compile pool now, set up for a tiny problem, so that
        the first job does not wait for them (imports, CUDA, the pool); the backend, or None
        without a keeper. Started already: nothing more. A failure is logged and left to the
        first task to meet (None)."""
        if self.keeper is None:
            return None
        if self.keeper.backend is not None and self.keeper.backend.healthy:
            return self.keeper.backend
        self.report("starting")
        try:
            self.keeper.adopt(start_measuring(self.backend_kind, self.device_index,
                                              self.timing, self.compile_workers))
            return self.keeper.backend
        except Exception:  # noqa: BLE001 - the first task opens its own and reports why
            log.exception("worker %s: starting the measuring child ahead failed", self.id)
            return None

    def close(self) -> None:
        """Close the measuring child kept across tasks (if any)."""
        if self.keeper is not None:
            self.keeper.discard()


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
        period = self.worker.lease_seconds / 3
        # a beat retries for one period: the lease has two more before it expires
        delays = backoff_delays(period)
        while not self._done.wait(period):
            try:
                self._ours = retry_transient(f"renewing the lease of task {self.task_id}",
                                             self._renew, delays)
            except Exception:  # noqa: BLE001 - a missed beat is retried; the lease is slack
                log.exception("lease renewal of task %s failed", self.task_id)
            if not self._ours:
                log.warning("task %s is no longer ours; stopping it", self.task_id)
                return

    def _renew(self) -> bool:
        with self.worker.factory() as session:
            ours = repo.renew_lease(session, self.task_id, self.worker.id,
                                    self.worker.lease_seconds)
            session.commit()
        return ours

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
