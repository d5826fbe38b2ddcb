"""Tuning jobs: submit, list, inspect, cancel."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, cast

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from api.deps import ReadAccess, SessionDep, SettingsDep, WriteAccess, dispatcher_of
from api.routes.health import DatabaseFileIntact
from api.routes.kernels import registered_verification
from api.schemas import (
    INT32_MAX,
    Basis,
    JobCreate,
    JobCreated,
    JobPublic,
    JobsPublic,
    JobStatus,
    Measured,
    TaskPublic,
    Timing,
    TrialsPublic,
    trial_public,
)
from api.validation import (
    INTERPRETER_KEY,
    check_dtype,
    check_fits_gpu,
    check_interpreter_size,
    check_job_interpreter_dtype,
    check_job_interpreter_timing,
    check_shape,
    check_strategy,
    kernel_or_error,
)
from db import repo
from db.models import BASES, MEASURED, Job, Task
from db.transient import retry_within
from tuner.errors import InvalidRequest
from tuner.identity import DeviceKind
from tuner.job_spec import JobSpec
from tuner.kernel import TunableKernel
from tuner.lifecycle import TERMINAL, Status
from tuner.settings import DatabaseBounds, Settings
from tuner.timing import TIMING_METHODS

router = APIRouter(prefix="/jobs", tags=["jobs"])

#: a job named in a path: its id, or the first characters of it (the 8 the dashboard and the CLI
#: show) when no other job's id starts with them
JobId = Annotated[str, Path(description=f"the job's id, or a prefix of it of at least "
                                        f"{repo.JOB_ID_MIN_PREFIX} characters that no other "
                                        "job's id starts with")]
#: what a path naming a job by prefix may be answered besides 200
JOB_ID_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no job's id is or starts with it"},
    409: {"description": "the prefix starts the ids of several jobs: ``candidates`` lists "
                         "them"},
}


def job_url(job_id: str) -> str:
    return f"/api/v1/jobs/{job_id}"


def task_public(t: Task, budget_trials: int) -> TaskPublic:
    return TaskPublic(id=t.id, shape=t.shape, status=t.status, trials_done=t.trials_done,
                      budget_trials=budget_trials, best_ms=t.best_ms,
                      best_measured=cast(Measured | None, t.best_measured
                                         if t.best_measured in MEASURED else None),
                      best_config=t.best_config, baseline_ms=t.baseline_ms,
                      baseline_name=t.baseline_name, vs_baseline=t.vs_baseline,
                      incumbent_ms=t.incumbent_ms, best_note=t.best_note,
                      default_config=t.default_config, default_ms=t.default_ms,
                      best_basis=cast(Basis | None, t.best_basis
                                      if t.best_basis in BASES else None),
                      noise_margin=t.noise_margin,
                      outcome_counts=t.outcome_counts or {}, device=t.device_key,
                      attempts=t.attempts, error=t.error,
                      timing=cast(Timing | None, t.timing if t.timing in TIMING_METHODS
                                  else None),
                      stop_reason=t.stop_reason, phases=t.phases)


def job_public(job: Job, waiting: str | None = None) -> JobPublic:
    tasks = [task_public(t, job.budget_trials) for t in job.tasks]
    return JobPublic(id=job.id, kernel=job.kernel, kernel_version=job.kernel_version,
                     dtype=job.dtype, status=job.status, strategy=job.strategy,
                     budget_trials=job.budget_trials, budget_seconds=job.budget_seconds,
                     device=job.device_key, created_at=job.created_at,
                     started_at=job.started_at, finished_at=job.finished_at, error=job.error,
                     reason=job.reason, url=job_url(job.id), waiting=waiting,
                     verification=registered_verification(job.kernel),
                     timing=cast(Timing, job.timing), tasks=tasks)


def waiting_note(session: Session, job: Job, settings: Settings) -> str | None:
    """Why a queued job has not started (no live worker has its device), once it has waited
    one lease length: a worker that is alive beats within that."""
    return repo.waiting_note(session, job, after_s=settings.lease_seconds,
                             seen_within_s=settings.lease_seconds)


def only_interpreter(session: Session, body: JobCreate, settings: Settings) -> bool:
    """Whether only the CPU interpreter can run the job: it asks for it, or it targets no
    device and every live worker is an interpreter worker."""
    if body.backend == "interpret" or body.device == INTERPRETER_KEY:
        return True
    if body.device is not None or body.backend == "cuda":
        return False
    live = repo.live_device_keys(session, settings.lease_seconds)
    kinds = {d.key: d.kind for d in repo.list_devices(session)}
    return bool(live) and all(kinds.get(key, "") == DeviceKind.INTERPRET for key in live)


def gpu_memory_for(session: Session, body: JobCreate, settings: Settings) -> int | None:
    """The most GPU memory a worker that could run the job has: its target device's, else the
    largest of the live GPU workers' devices; None when unknown (no GPU registered yet)."""
    if body.device is not None:
        device = repo.get_device(session, body.device)
        return (device.memory_bytes if device is not None and device.kind == DeviceKind.CUDA
                else None)
    live = repo.live_device_keys(session, settings.lease_seconds)
    sizes = [d.memory_bytes for d in repo.list_devices(session)
             if d.key in live and d.kind == DeviceKind.CUDA and d.memory_bytes]
    return max(sizes) if sizes else None


def check_known_device(session: Session, body: JobCreate) -> None:
    """A target ``device`` no worker has registered is refused (a typo such as ``interpret``
    for ``interpret:cpu`` would otherwise sit queued for good), naming the known devices;
    ``future_device`` queues it for a worker yet to come."""
    if body.device is None or body.future_device or repo.get_device(
            session, body.device) is not None:
        return
    known = ", ".join(sorted(d.key for d in repo.list_devices(session))) or "none yet"
    raise InvalidRequest(f"device {body.device!r} is not a device any worker has registered "
                         f"(known devices: {known}); set future_device: true to queue it for "
                         "a worker yet to come", field="device")


def _validated_shapes(kernel: TunableKernel, body: JobCreate,
                      max_shapes: int) -> list[dict[str, int]]:
    if len(body.shapes) > max_shapes:
        raise InvalidRequest(f"a job takes at most {max_shapes} shapes", field="shapes")
    shapes = [check_shape(kernel, s, f"shapes.{i}") for i, s in enumerate(body.shapes)]
    return list({repo.shape_key_of(s): s for s in shapes}.values())


@router.post("", status_code=202, response_model=JobCreated,
             dependencies=[WriteAccess, DatabaseFileIntact],
             responses={200: {"model": JobCreated, "description": "an identical queued or "
                              "running job, or every shape answered from the store"},
                        503: {"description": "the SQLite file was removed or replaced: "
                              "restart the service"}})
def submit_job(body: JobCreate, session: SessionDep, settings: SettingsDep,
               response: Response, request: Request) -> JobCreated:
    """Queue a tuning job (one task per shape): 202.

    An identical queued or running job is returned instead of a new one (200,
    ``deduplicated``). Unless ``force``, shapes already tuned for the target device (``device``,
    or the only GPU this service knows) are answered from the store: their tasks are created
    as succeeded with the stored best; when that covers every shape the job is ``succeeded``
    at once and the status is 200. Its configs are then at ``GET /configs``.

    ``timing`` says how configs are timed (``eager-flushed``, the default; ``cuda-graph``;
    ``eager-hot``) and is part of the stored bests' identity: a shape tuned one way is not
    answered from the store for another. A ``cuda-graph`` job that only the CPU interpreter
    could run is refused (422 naming ``timing``). A ``device`` no worker has registered is
    refused (422 naming ``device``, listing the known devices) unless ``future_device``."""
    kernel = kernel_or_error(body.kernel)
    check_dtype(kernel, body.dtype)
    check_known_device(session, body)
    interpreter = only_interpreter(session, body, settings)
    check_job_interpreter_dtype(kernel, body.dtype, interpreter)
    check_job_interpreter_timing(body.timing, interpreter)
    check_strategy(body.strategy)
    if body.budget.trials > settings.max_trials:
        raise InvalidRequest(f"budget.trials {body.budget.trials} is above this service's "
                             f"limit of {settings.max_trials}", field="budget.trials")
    shapes = _validated_shapes(kernel, body, settings.max_shapes_per_job)
    if interpreter:
        check_interpreter_size(kernel, shapes, body.dtype, settings.interpreter_trial_limit_s,
                               body.budget.seconds)
    else:
        check_fits_gpu(kernel, shapes, body.dtype, gpu_memory_for(session, body, settings))
    job, created = repo.submit_job(session, JobSpec(
        kernel=kernel.name, kernel_version=kernel.version, dtype=body.dtype, shapes=shapes,
        budget_trials=body.budget.trials, budget_seconds=body.budget.seconds,
        strategy=body.strategy, force=body.force, seed=body.seed, backend=body.backend,
        device_key=body.device, timing=body.timing))
    if not created:
        session.commit()
        response.status_code = 200
        return JobCreated(id=job.id, status=job.status, url=job_url(job.id), deduplicated=True)
    answered = 0 if body.force else repo.answer_tuned_tasks(session, job)
    session.commit()
    dispatcher_of(request.app).enqueue_job(job.id)
    if job.status == Status.SUCCEEDED:
        response.status_code = 200
    return JobCreated(id=job.id, status=job.status, url=job_url(job.id),
                      answered_from_store=answered)


@router.get("", response_model=JobsPublic, dependencies=[ReadAccess])
def list_jobs(session: SessionDep, settings: SettingsDep, status: JobStatus | None = None,
              kernel: str | None = Query(None, max_length=100),
              limit: int = Query(50, ge=1, le=500),
              offset: int = Query(0, ge=0, le=INT32_MAX)) -> JobsPublic:
    jobs, total = repo.list_jobs(session, status=status, kernel=kernel, limit=limit,
                                 offset=offset)
    return JobsPublic(data=[job_public(j, waiting_note(session, j, settings)) for j in jobs],
                      count=total)


#: the longest a request may wait for a job to change (``wait_s``; the client's own cap is
#: ``tuner.client.MAX_WAIT_S``), and how often it looks
MAX_WAIT_S = 60.0
WAIT_LOOK_S = 0.05


@router.get("/{job_id}", response_model=JobPublic, dependencies=[ReadAccess],
            responses=JOB_ID_RESPONSES)
async def get_job(request: Request, job_id: JobId, settings: SettingsDep,
                  wait_s: float = Query(0.0, ge=0.0, le=MAX_WAIT_S, description=(
                      "answer once the job has changed (its status, a task's progress or "
                      "best) or finished, or after this many seconds, whichever comes first; "
                      "a finished job is answered at once. 0: at once. A client waiting for "
                      "a job asks again with it instead of polling on a timer, and hears of "
                      "the finish within ~50 ms"))) -> JobPublic:
    """A job and its tasks; ``waiting`` says why a queued job has not started (no live worker
    has its device). ``job_id``: the id or a unique prefix of it."""
    factory = request.app.state.session_factory
    public = await run_in_threadpool(_read_job, factory, job_id, settings)
    deadline = time.monotonic() + wait_s
    seen = public.model_dump_json()
    while public.status not in TERMINAL and time.monotonic() < deadline:
        await asyncio.sleep(min(WAIT_LOOK_S, max(0.0, deadline - time.monotonic())))
        if await request.is_disconnected():
            break
        public = await run_in_threadpool(_read_job, factory, job_id, settings)
        if public.model_dump_json() != seen:
            break
    return public


def _read_job(factory: Any, job_id: str, settings: Settings) -> JobPublic:
    with factory() as session:
        job = repo.get_job_by_prefix(session, job_id)
        return job_public(job, waiting_note(session, job, settings))


@router.post("/{job_id}/cancel", response_model=JobPublic,
             dependencies=[WriteAccess, DatabaseFileIntact], responses=JOB_ID_RESPONSES)
def cancel_job(job_id: JobId, session: SessionDep, settings: SettingsDep,
               request: Request) -> JobPublic:
    """Cancel a queued or running job and its unfinished tasks; a finished job is answered as
    it is."""
    job = cancel_committed(session, job_id, settings.database_bounds)
    dispatcher_of(request.app).cancel_job(job.id)
    return job_public(job)


def cancel_committed(session: Session, job_id: str, bounds: DatabaseBounds) -> Job:
    """Cancel the job ``job_id`` (its id or a prefix: ``repo.resolve_job_id``) and commit. A
    lock wait that failed (a process frozen while it holds a row of the job's, until
    PostgreSQL aborts its transaction) is tried again, for ``bounds.frozen_holder_s``."""
    def cancel() -> Job:
        try:
            job = repo.cancel_job(session, repo.resolve_job_id(session, job_id))
            session.commit()
        except BaseException:
            session.rollback()
            raise
        return job

    return retry_within(cancel, bounds.frozen_holder_s)


@router.get("/{job_id}/trials", response_model=TrialsPublic, dependencies=[ReadAccess],
            responses=JOB_ID_RESPONSES)
def job_trials(job_id: JobId, session: SessionDep) -> TrialsPublic:
    """Every trial of every task of the job, by task then trial number (the dashboard's
    convergence plot)."""
    job = repo.get_job_by_prefix(session, job_id)
    data = [trial_public(t) for task in job.tasks for t in repo.trials_for_task(session, task.id)]
    return TrialsPublic(data=data, count=len(data))


@router.get("/{job_id}/tasks/{task_id}/trials", response_model=TrialsPublic,
            dependencies=[ReadAccess], responses=JOB_ID_RESPONSES)
def task_trials(job_id: JobId, session: SessionDep,
                task_id: int = Path(ge=0, le=INT32_MAX)) -> TrialsPublic:
    task = repo.get_task(session, task_id)
    if task.job_id != repo.get_job_by_prefix(session, job_id).id:
        raise repo.NotFound(f"job {job_id} has no task {task_id}")
    data = [trial_public(t) for t in repo.trials_for_task(session, task_id)]
    return TrialsPublic(task_id=task_id, data=data, count=len(data))
