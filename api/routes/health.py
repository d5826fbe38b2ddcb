"""Liveness (``/healthz``: the process answers, and what the database says of the workers:
each device, each worker process with its GPU, and the queue; under ``tuner serve``, what it
knows of the workers it runs) and readiness (``/readyz``: the database answers, and a SQLite
file is still the one opened: ``db.sqlite_file``).

A worker that is down does not fail either: ``/healthz`` stays 200 (restarting the API would
not bring back a worker that keeps failing) and says ``"status": "degraded"``, and ``/readyz``
stays ready (lookups are served without workers); ``supervisor`` says which worker is down,
why it last exited and when it is restarted."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.orm import Session

from api.routes.devices import worker_public
from db import repo
from db.engine import opened_file
from search_spaces import kernel_names, plugin_errors
from tuner.app.supervision import read_state
from tuner.lifecycle import Status
from tuner.settings import Settings

router = APIRouter(tags=["health"])

_HEALTHZ_EXAMPLE = {
    "status": "ok",
    "workers": {"devices": [{"key": "cuda:NVIDIA H200:sm90", "alive": True,
                             "seen_seconds_ago": 2.1}],
                "workers": [{"id": "gpu0-host-1234", "host": "host", "index": 0,
                             "uuid": "GPU-8d6a2f0c-1111-2222-3333-444455556666",
                             "device": "cuda:NVIDIA H200:sm90", "kind": "cuda",
                             "status": "busy", "alive": True, "task_id": 1, "error": None,
                             "seen_seconds_ago": 2.1}],
                "running": [{"task_id": 1, "job_id": "3f2b9c0e8d7a4b6f9e1d2c3b4a596877",
                             "worker": "gpu0-host-1234", "device": "cuda:NVIDIA H200:sm90",
                             "trials_done": 12, "lease_ok": True}],
                "queued_tasks": 0},
    "supervisor": {"serve_pid": 4242,
                   "workers": [{"device_index": 0, "state": "running", "pid": 4250,
                                "restarts": 0, "exits_in_a_row": 0, "last_exit": None,
                                "restart_in_s": None}]},
    "plugins": {"kernels": ["matmul", "softmax"], "errors": []}}


def _example(example: dict[str, Any], description: str) -> dict[str, Any]:
    """An OpenAPI response with an example body (these routes return plain dicts)."""
    return {"description": description, "content": {"application/json": {"example": example}}}


def worker_health(session: Session, settings: Settings) -> dict[str, Any]:
    """Devices whose workers beat within one lease length, every worker process known (its GPU
    index and UUID, device, status, current task, seconds since it beat, alive: within one
    lease length), the tasks held now (a lease that expired means a dead worker the reaper has
    not re-queued yet) and the queue length."""
    devices = []
    for d in repo.list_devices(session):
        ago = repo.seconds_since(d.last_seen_at)
        alive = ago is not None and ago <= settings.lease_seconds
        devices.append({"key": d.key, "alive": alive,
                        "seen_seconds_ago": round(ago, 1) if ago is not None else None})
    running = [{"task_id": t.id, "job_id": t.job_id, "worker": t.lease_owner,
                "device": t.device_key, "trials_done": t.trials_done,
                "lease_ok": t.lease_expires_at is None
                or (repo.seconds_since(t.lease_expires_at) or 0) < 0}
               for t in repo.running_tasks(session)]
    workers = [_worker(w, settings.lease_seconds) for w in repo.list_workers(session)]
    counts = repo.count_tasks_by_status(session)
    return {"devices": devices, "workers": workers, "running": running,
            "queued_tasks": counts.get(Status.QUEUED, 0)}


def _worker(row: Any, lease_seconds: float) -> dict[str, Any]:
    w = worker_public(row, lease_seconds)
    return {"id": w.id, "host": w.host, "index": w.gpu_index, "uuid": w.gpu_uuid,
            "device": w.device, "kind": w.kind, "status": w.status, "alive": w.alive,
            "task_id": w.task_id, "error": w.error, "seen_seconds_ago": w.seen_seconds_ago}


def supervisor_health() -> dict[str, Any] | None:
    """The workers ``tuner serve`` runs, as it last wrote them (``tuner.app.supervision``): each
    one's state (``running``, or ``restarting`` while none runs), pid, restarts, exits in a
    row right after starting, last exit and seconds until its restart; None when this API
    does not run under ``serve``."""
    state = read_state()
    if state is None:
        return None
    now = time.time()
    workers = []
    for w in state.get("workers", []):
        at = w.get("restart_at")
        workers.append({**{k: v for k, v in w.items() if k != "restart_at"},
                        "restart_in_s": None if at is None else round(max(0.0, at - now), 1)})
    return {"serve_pid": state.get("serve_pid"), "workers": workers}


def degraded(supervisor: dict[str, Any] | None) -> bool:
    """Whether a worker of ``serve`` is down, or has not stayed up since it last failed."""
    return supervisor is not None and any(
        w.get("state") != "running" or w.get("exits_in_a_row") for w in supervisor["workers"])


@router.get("/healthz", responses={200: _example(_HEALTHZ_EXAMPLE, "the process answers")})
def healthz(request: Request) -> dict[str, Any]:
    """Always 200 while the process answers; ``status`` is ``degraded`` while a worker of
    ``tuner serve`` is down or restarting (``supervisor``: each one's state and last exit;
    null when not run by ``serve``); ``workers`` is null when the database is not;
    ``plugins`` lists the registered kernels and the kernel plugins that failed to load."""
    try:
        with request.app.state.session_factory() as session:
            workers: dict[str, Any] | None = worker_health(session, request.app.state.settings)
    except Exception:  # noqa: BLE001 - liveness must not depend on the database
        workers = None
    supervisor = supervisor_health()
    plugins = {"kernels": kernel_names(), "errors": [e.to_dict() for e in plugin_errors()]}
    return {"status": "degraded" if degraded(supervisor) else "ok", "workers": workers,
            "supervisor": supervisor, "plugins": plugins}


def database_file_problem(request: Request) -> str | None:
    """What happened to the service's SQLite file (removed, replaced: ``SqliteFile.problem``);
    None while its path holds the file this process opened, and always on PostgreSQL."""
    opened = opened_file(request.app.state.settings.resolved_database_url)
    return opened.problem() if opened is not None else None


async def require_database_file(request: Request) -> None:
    """A write is refused (503) once the SQLite file is gone: accepted, it would be lost with
    the unlinked file. Retrying does not help, so no Retry-After: the message says restart."""
    problem = database_file_problem(request)
    if problem is not None:
        raise HTTPException(503, [{"loc": ["database"], "msg": problem,
                                   "type": "database_file_gone"}])


DatabaseFileIntact = Depends(require_database_file)


@router.get("/readyz", responses={
    200: _example({"status": "ready"}, "the database answers"),
    503: _example({"status": "unavailable", "error": "could not connect to server"},
                  "the database does not answer, or its SQLite file was removed or replaced")})
def readyz(request: Request) -> Any:
    problem = database_file_problem(request)
    if problem is not None:
        return JSONResponse({"status": "unavailable", "error": problem}, 503)
    try:
        with request.app.state.session_factory() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any database failure means not ready
        return JSONResponse({"status": "unavailable", "error": str(exc)[:500]}, 503)
    return {"status": "ready"}
