"""The results dashboard: server-rendered pages (Jinja2) at ``/`` from the same app as the API.

Pages: overview (``/``), jobs (``/jobs``, live progress over server-sent events from
``/events/jobs``), one job (``/jobs/{id}``: per shape its best with TFLOP/s, GB/s, share of the
roofline floor, torch ratio and compile times, charts of how its search went, every trial in a
sortable, filterable table; ``/jobs/{id}/live`` renders its parts again as trials arrive,
``/jobs/{id}/trials.csv`` exports every trial), best configs
(``/configs``, filterable, copyable as JSON, ``triton.Config`` and a vLLM-style entry), misses
(``/misses``: lookups clients reported as not served exactly, and their tuning jobs), a kernel
(``/kernels/{name}``) and the roofline (``/roofline``). Every table is in the HTML, so the pages
work without JavaScript; the charts use Plotly.js served from the installed ``plotly`` package
(``/static/plotly.min.js``: no CDN, GPU clusters are often offline) and read their data from
JSON embedded in the page, so a page is one request plus cached static files.

Reads follow the API's rules (an API key only where ``auth_reads`` is on; a browser can present
it as the ``tuner_api_key`` cookie, set at ``/key``); cancelling needs a write key, sent by the
page's script as a header or typed into the form.

This module holds the routes; ``api.dashboard_format`` the templates' formatting helpers and
``api.dashboard_job`` what a job page shows of each shape (both re-exported here).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from sqlalchemy.orm import Session

from api.dashboard_format import (  # noqa: F401 (also re-exported: api.dashboard's names)
    STOP_REASONS,
    _registered,
    _sig,
    ago_tag,
    ago_text,
    as_vllm_entry,
    config_short,
    config_views,
    doc_html,
    fixed_text,
    is_interpreter,
    ms_text,
    shape_text,
    stopped_early,
)
from api.dashboard_job import (  # noqa: F401 (also re-exported: api.dashboard's names)
    CSV_COLUMNS,
    MAX_FAILURES_LISTED,
    MAX_PARCOORDS,
    OUTCOME_COLOURS,
    TrialRow,
    Work,
    _csv_values,
    _shapes,
    best_summary,
    importance,
    parcoords,
    shape_stats,
    task_charts,
    timeout_ms,
    trial_table,
    vs_default_text,
    work_of,
)
from api.deps import ReadAccess, SessionDep, SettingsDep, dispatcher_of, key_mode
from api.routes.jobs import cancel_committed
from api.routes.kernels import registered_verification
from db import repo
from db.models import ACTIVE, TERMINAL, BestConfig, Device, Job, utcnow
from search_spaces import get_kernel, kernel_names
from tuner.config import triton_config_text
from tuner.kernel import TunableKernel, verification_of
from tuner.lifecycle import STATUSES
from tuner.roofline import roofline
from tuner.settings import Settings

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
#: trials in the HTML of a job page's trials table, for browsers without JavaScript (the
#: page's script draws the table from the page's data, every trial, a page at a time)
TRIALS_LISTED = 100
#: the last page a list can be asked for (its offset stays within the database's integers)
MAX_PAGE = 10**6
#: seconds between server-sent progress events
EVENT_INTERVAL_S = 1.0
#: a progress stream ends after this long (the browser's EventSource reconnects by itself)
EVENT_STREAM_MAX_S = 300.0
router = APIRouter(include_in_schema=False, dependencies=[ReadAccess])
#: what must work without a read key: setting the key, and the static script
open_router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES))


def plotly_js() -> Path | None:
    """Plotly.js as shipped inside the installed ``plotly`` Python package, if it is."""
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.include_router(open_router)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")


def _page(request: Request, template: str, status_code: int = 200,
          **context: Any) -> HTMLResponse:
    settings: Settings = request.app.state.settings
    context.setdefault("title", "")
    context["charts"] = plotly_js() is not None
    context["auth"] = bool(settings.parsed_api_keys())
    # the page's script counts "3 s ago" on from the server's clock, not the browser's
    context["server_now"] = utcnow().isoformat()
    return templates.TemplateResponse(request, template, context, status_code=status_code)


# -- the templates' filters and tests (``api.dashboard_format``) --------------------------------

templates.env.filters["shape"] = shape_text
templates.env.filters["ms"] = ms_text
templates.env.filters["ago"] = ago_text
templates.env.filters["ago_tag"] = ago_tag
templates.env.filters["fixed"] = fixed_text
templates.env.filters["config_short"] = config_short
templates.env.filters["doc"] = doc_html
#: a name that may break after its underscores (a narrow table's headings: "num_<wbr>stages")
templates.env.filters["wbr"] = lambda name: Markup("_<wbr>").join(str(name).split("_"))
templates.env.tests["interpreter"] = is_interpreter
templates.env.filters["triton_config"] = triton_config_text
templates.env.filters["tojson_compact"] = lambda v: json.dumps(v, separators=(", ", ":"))


# -- pages --------------------------------------------------------------------------------------

@router.get("/", response_class=HTMLResponse)
def overview(request: Request, session: SessionDep) -> HTMLResponse:
    devices = repo.list_devices(session)
    jobs, total = repo.list_jobs(session, limit=10)
    counts = repo.count_jobs_by_status(session)
    best_counts = repo.count_best_by_kernel(session)
    kernels = []
    for name in kernel_names():
        k = get_kernel(name)
        kernels.append({"name": name, "version": k.version, "dtypes": list(k.dtypes),
                        "space_size": k.space().size(), "tuned": int(best_counts.get(name, 0)),
                        "description": getattr(k, "description", "")})
    trial_count = repo.count_trials(session)
    miss_counts = repo.count_misses_by_status(session)
    return _page(request, "overview.html", title="Overview", devices=devices, jobs=jobs,
                 jobs_total=total, counts=counts, kernels=kernels, trial_count=trial_count,
                 misses_total=sum(miss_counts.values()),
                 misses_active=miss_counts.get("queued", 0) + miss_counts.get("running", 0),
                 lease_seconds=request.app.state.settings.lease_seconds,
                 statuses=STATUSES)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, status: str | None = None,
              kernel: str | None = None,
              page: int = Query(1, ge=1, le=MAX_PAGE)) -> HTMLResponse:
    per_page = 50
    jobs, total = repo.list_jobs(session, status=status or None, kernel=kernel or None,
                                 limit=per_page, offset=(page - 1) * per_page)
    return _page(request, "jobs.html", title="Jobs", jobs=jobs, total=total, page=page,
                 pages=max(1, math.ceil(total / per_page)), status=status or "",
                 kernel=kernel or "", progress={j.id: job_progress(j) for j in jobs},
                 waiting={j.id: _waiting(session, j, request) for j in jobs},
                 statuses=STATUSES,
                 kernels=kernel_names())


def job_progress(job: Job) -> dict[str, Any]:
    """What the progress cells show; also the payload of a progress event (a job page fetches
    its numbers again whenever this changes)."""
    tasks = list(job.tasks)
    done = sum(t.trials_done for t in tasks)
    budget = job.budget_trials * len(tasks)
    # a finished shape is all done, however early its search stopped (the budget is a cap)
    used = sum(job.budget_trials if t.status in TERMINAL else min(t.trials_done,
                                                                  job.budget_trials)
               for t in tasks)
    bests = [t.best_ms for t in tasks if t.best_ms is not None]
    return {"id": job.id, "status": job.status, "trials_done": done, "budget": budget,
            "percent": round(100.0 * used / budget, 1) if budget else 0.0,
            "tasks_done": sum(t.status in TERMINAL for t in tasks),
            "tasks": len(tasks),
            "best_ms": min(bests) if len(tasks) == 1 and bests else None,
            "shapes": [{"id": t.id, "status": t.status, "trials_done": t.trials_done,
                        "best_ms": t.best_ms, "best_measured": t.best_measured,
                        "baseline_ms": t.baseline_ms} for t in tasks]}


def _job_or_http(session: Session, job_id: str) -> Job:
    """The job with this id or id prefix (the 8 characters the pages show), else the API's
    answer as an HTTPException: 404 unknown, 422 too short, 409 ambiguous."""
    try:
        return repo.get_job_by_prefix(session, job_id)
    except repo.NotFound as exc:
        raise HTTPException(404, f"no job {job_id!r}") from exc
    except repo.ShortJobId as exc:
        raise HTTPException(422, str(exc)) from exc
    except repo.AmbiguousJobId as exc:
        raise HTTPException(409, str(exc)) from exc


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str, session: SessionDep) -> HTMLResponse:
    try:
        job = _job_or_http(session, job_id)
    except HTTPException as exc:
        title = {404: "No such job", 409: "Several jobs", 422: "Job id too short"}
        message = (f"There is no job {job_id!r}." if exc.status_code == 404
                   else str(exc.detail))
        return _page(request, "message.html", status_code=exc.status_code,
                     title=title.get(exc.status_code, "No such job"), message=message,
                     back="/jobs")
    return _page(request, "job.html", title=f"Job {job.id[:8]}",
                 **_job_context(session, job, request), outcome_names=list(OUTCOME_COLOURS))


def _job_context(session: Session, job: Job, request: Request) -> dict[str, Any]:
    """What the job page's parts are rendered from (the page, and its live refresh)."""
    stops = [(t, why) for t in job.tasks if (why := stopped_early(t, job.budget_trials))]
    return {"job": job, "shapes": _shapes(session, job), "progress": job_progress(job),
            "stopped_early": stops,
            "active": job.status in ACTIVE, "waiting": _waiting(session, job, request),
            "verification": registered_verification(job.kernel), "trials_listed": TRIALS_LISTED}


#: the parts of a job page that its live refresh renders again: the job's facts and progress,
#: and per shape its headline and statistics, its fastest configs and failures, every trial
JOB_PARTS = {"job": "_job_facts.html"}
SHAPE_PARTS = {"head": "_shape_head.html", "top": "_shape_top.html",
               "trials": "_trials_table.html"}


@router.get("/jobs/{job_id}/live")
def job_live(request: Request, job_id: str, session: SessionDep) -> dict[str, Any]:
    """Everything on a job page that follows its trials, rendered by the same templates as the
    page: the job's parts, each shape's parts and chart data (by task id), and the progress.
    A running job's page swaps these in as trials arrive, so no number on it goes stale."""
    job = _job_or_http(session, job_id)
    context = _job_context(session, job, request)
    settings: Settings = request.app.state.settings
    context["auth"] = bool(settings.parsed_api_keys())

    def render(template: str, **extra: Any) -> str:
        return templates.get_template(template).render(**context, **extra)

    return {"progress": context["progress"],
            "parts": {name: render(t) for name, t in JOB_PARTS.items()},
            "shapes": {str(s["task"].id): {
                "parts": {name: render(t, s=s, t=s["task"]) for name, t in SHAPE_PARTS.items()},
                "data": s["data"]} for s in context["shapes"]}}


def _waiting(session: Session, job: Job, request: Request) -> str | None:
    """Why a queued job has not started (the API's ``waiting``)."""
    settings: Settings = request.app.state.settings
    return repo.waiting_note(session, job, after_s=settings.lease_seconds,
                             seen_within_s=settings.lease_seconds)


@router.get("/jobs/{job_id}/trials.csv")
def job_trials_csv(job_id: str, session: SessionDep,
                   task: int | None = Query(None, ge=0, le=2**31 - 1)) -> Response:
    """Every trial of the job (or of one of its shapes, ``task``) as CSV, one row per trial:
    the config's parameters, the outcome, ``ms`` (the config's one number: re-timed where it
    was a finalist, else its trial p50; ``measured`` says which) and the TFLOP/s and GB/s of
    that time, the trial's own and re-timed percentiles, the compile time and the GPU's clocks,
    power, temperature and throttle reasons as the trial was timed."""
    job = _job_or_http(session, job_id)
    tasks = {t.id: t for t in job.tasks if task is None or t.id == task}
    if not tasks:
        raise HTTPException(404, f"job {job_id} has no task {task}")
    by_task: dict[int, list[TrialRow]] = defaultdict(list)
    for row in repo.trial_columns(session, list(tasks)):
        by_task[row.pop("task_id")].append(TrialRow(**row))
    kernel = _registered(job.kernel)
    names = list(kernel.space().names) if kernel is not None else []
    names += sorted({k for rows in by_task.values() for t in rows for k in t.config} - {*names})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["job_id", "task_id", "kernel", "dtype", "shape", "number", *names,
                     *CSV_COLUMNS])
    for task_id, shape_task in tasks.items():
        work = work_of(kernel, shape_task.shape, job.dtype)
        for t in by_task.get(task_id, []):
            writer.writerow([job.id, task_id, job.kernel, job.dtype, shape_text(shape_task.shape),
                             t.number, *(t.config.get(n, "") for n in names),
                             *_csv_values(t, work)])
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="job-{job.id[:8]}-trials.csv"'})


@router.get("/configs", response_class=HTMLResponse)
def configs_page(request: Request, session: SessionDep, kernel: str | None = None,
                 device: str | None = None, dtype: str | None = None,
                 shape: str | None = None) -> HTMLResponse:
    everything = repo.list_best(session)
    rows = repo.list_best(session, kernel=kernel or None, device_key=device or None,
                          dtype=dtype or None)
    wanted = (shape or "").strip().lower().replace(" ", "")
    if wanted:
        rows = [r for r in rows if wanted in shape_text(r.shape).lower()
                or wanted in r.shape_key.lower()]
    return _page(request, "configs.html", title="Best configs", rows=rows,
                 views={r.id: config_views(r) for r in rows}, total=len(everything),
                 kernel=kernel or "", device=device or "", dtype=dtype or "", shape=shape or "",
                 kernels=sorted({r.kernel for r in everything}),
                 devices=sorted({r.device_key for r in everything}),
                 dtypes=sorted({r.dtype for r in everything}))


@router.get("/misses", response_class=HTMLResponse)
def misses_page(request: Request, session: SessionDep, status: str | None = None,
                kernel: str | None = None,
              page: int = Query(1, ge=1, le=MAX_PAGE)) -> HTMLResponse:
    """Lookups clients reported as not served exactly, most recently reported first, with
    what became of each and a link to its tuning job."""
    per_page = 100
    misses, total = repo.list_misses(session, kernel=kernel or None, status=status or None,
                                     limit=per_page, offset=(page - 1) * per_page)
    return _page(request, "misses.html", title="Misses", misses=misses, total=total, page=page,
                 pages=max(1, math.ceil(total / per_page)), status=status or "",
                 kernel=kernel or "", statuses=repo.MISS_STATUSES, kernels=kernel_names())


@router.get("/kernels/{name}", response_class=HTMLResponse)
def kernel_page(request: Request, name: str, session: SessionDep) -> HTMLResponse:
    if name not in kernel_names():
        rows = repo.list_best(session, kernel=name)
        if not rows:
            raise HTTPException(404, f"no kernel {name!r}; registered: "
                                     f"{', '.join(kernel_names())}")
        # a library kernel only clients measure (tuner.install()): its stored configs
        return _page(request, "external_kernel.html", title=f"Kernel {name}", name=name,
                     rows=rows, views={r.id: config_views(r) for r in rows})
    k = get_kernel(name)
    space = k.space()
    constraints = [(c.__name__.strip("_").replace("_", " "), doc_html(c.__doc__))
                   for c in space.constraints]
    rows = repo.list_best(session, kernel=name)
    names = variant_names(k)
    params = space.describe()
    for p in params:
        if p["name"] == "VARIANT" and names:
            p["values"] = [f"{v} {names[v]}" if 0 <= v < len(names) else str(v)
                           for v in p["values"]]
    return _page(request, "kernel.html", title=f"Kernel {name}", kernel=k, space=params,
                 space_size=space.size(), constraints=constraints, dims=k.dims, rows=rows,
                 views={r.id: config_views(r) for r in rows}, verification=verification_of(k))


def variant_names(kernel: TunableKernel) -> tuple[str, ...] | None:
    """The names of a kernel's VARIANT values (its module's ``VARIANTS``: value i is
    ``VARIANTS[i]``, as matmul's and moe_gemm's are), if its module has them."""
    names = getattr(sys.modules.get(type(kernel).__module__), "VARIANTS", None)
    if isinstance(names, tuple) and names and all(isinstance(n, str) for n in names):
        return names
    return None


@router.get("/roofline", response_class=HTMLResponse)
def roofline_page(request: Request, session: SessionDep,
                  device: str | None = None) -> HTMLResponse:
    devices = repo.list_devices(session)
    panels = []
    for d in devices:
        if device and d.key != device:
            continue
        points = [p for r in repo.list_best(session, device_key=d.key)
                  if (p := roofline_point(r, d)) is not None]
        panels.append({"device": d, "points": points,
                       "ceilings": {"tflops": d.matmul_tflops, "gbps": d.copy_gbps}})
    return _page(request, "roofline.html", title="Roofline", panels=panels,
                 device=device or "", devices=devices)


def roofline_point(r: BestConfig, d: Device) -> dict[str, Any] | None:
    """A stored best on the roofline page: its intensity and achieved TFLOP/s, and its floor
    from ``tuner.roofline`` (the worker's early stop uses the same one): "of roof" is floor /
    achieved time. None when it has no TFLOP/s or GB/s to place it by."""
    if not r.tflops or not r.gbps:
        return None
    roof = None
    if (kernel := _registered(r.kernel)) is not None:
        roof = roofline(kernel, r.shape, r.dtype, d.copy_gbps, d.matmul_tflops)
    roof_tflops = roof.roof_tflops if roof is not None else None
    of_roof = roof.of_roof(r.p50_ms) if roof is not None else None
    return {"kernel": r.kernel, "dtype": r.dtype, "shape": shape_text(r.shape),
            "intensity": round(r.tflops * 1e12 / (r.gbps * 1e9), 3),  # FLOP per byte
            "tflops": round(r.tflops, 3), "gbps": round(r.gbps, 1), "ms": r.p50_ms,
            "measured": r.measured,
            "floor_ms": _sig(roof.floor_ms) if roof is not None else None,
            "roof": round(roof_tflops, 3) if roof_tflops else None,
            "of_roof": round(of_roof, 3) if of_roof else None,
            "bound": roof.bound if roof is not None else None,
            # float32 and other dtypes without a calibrated peak: the bandwidth limit alone
            "compute_applies": roof is not None and roof.compute_ms is not None,
            "config": config_short(r.config)}


async def _form_field(request: Request, name: str) -> str:
    """One field of an urlencoded form body (no python-multipart needed for two small forms)."""
    body = (await request.body()).decode("utf-8", "replace")
    return (parse_qs(body).get(name) or [""])[0]


@router.post("/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def cancel_form(request: Request, job_id: str, settings: SettingsDep) -> Any:
    """The job page's cancel form, for browsers without JavaScript (the script calls the API
    with the key as a header instead)."""
    api_key = await _form_field(request, "api_key")
    return await run_in_threadpool(_cancel, request, job_id, settings, api_key)


def _cancel(request: Request, job_id: str, settings: Settings, api_key: str) -> Any:
    if settings.parsed_api_keys() and key_mode(settings, api_key.strip()) != "rw":
        return _page(request, "message.html", status_code=401 if not api_key else 403,
                     title="Not cancelled", message="Cancelling needs an API key with write "
                     "access; type it into the form on the job page.", back=f"/jobs/{job_id}")
    with request.app.state.session_factory() as session:
        try:
            job_id = cancel_committed(session, job_id, settings.database_bounds).id
        except (repo.NotFound, repo.ShortJobId, repo.AmbiguousJobId):
            return _page(request, "message.html", status_code=404, title="No such job",
                         message=f"There is no job {job_id!r}.", back="/jobs")
    dispatcher_of(request.app).cancel_job(job_id)
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)


@open_router.get("/key", response_class=HTMLResponse)
def key_page(request: Request) -> HTMLResponse:
    return _page(request, "key.html", title="API key")


@open_router.post("/key")
async def set_key(request: Request) -> RedirectResponse:
    """Keep an API key in a cookie, for services that require a key to read (``auth_reads``)."""
    api_key = await _form_field(request, "api_key")
    response = RedirectResponse("/", status_code=303)
    if api_key.strip():
        response.set_cookie("tuner_api_key", api_key.strip(), httponly=True, samesite="strict")
    else:
        response.delete_cookie("tuner_api_key")
    return response


# -- static files and live progress -------------------------------------------------------------

@open_router.get("/static/plotly.min.js")
def plotly_file() -> FileResponse:
    path = plotly_js()
    if path is None:
        raise HTTPException(404, "plotly is not installed: pip install plotly (charts are off; "
                                 "the tables still work)")
    return FileResponse(path, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


def _progress_snapshot(session_factory: Any, ids: list[str],
                       active: bool) -> list[dict[str, Any]]:
    with session_factory() as session:
        return progress_snapshot(session, ids, active)


def progress_snapshot(session: Session, ids: Sequence[str],
                      active: bool = False) -> list[dict[str, Any]]:
    """Progress of the given jobs (those that exist) and, with ``active``, of every queued or
    running job (the newest 200), newest first."""
    return [job_progress(j) for j in repo.jobs_for_progress(session, ids, active=active)]


@router.get("/events/jobs")
async def job_events(request: Request, ids: str = "", active: bool = False,
                     once: bool = False) -> StreamingResponse:
    """Server-sent events: a ``progress`` event with the progress of the listed jobs (``ids``,
    comma separated) and, with ``active=1``, of every queued or running job, whenever it
    changes (checked each second); ``end`` once every listed job has finished (never with
    ``active=1``: the stream then ends after five minutes and the browser reconnects).
    ``once=1``: one event, then the stream closes."""
    wanted = [i for i in ids.split(",") if i][:200]
    factory = request.app.state.session_factory

    async def stream() -> AsyncIterator[str]:
        last, waited = None, 0.0
        yield "retry: 2000\n\n"
        while True:
            snapshot = await run_in_threadpool(_progress_snapshot, factory, wanted, active)
            payload = json.dumps({"jobs": snapshot}, separators=(",", ":"))
            if payload != last:
                yield f"event: progress\ndata: {payload}\n\n"
                last = payload
            finished = not active and all(j["status"] not in ACTIVE for j in snapshot)
            if once or finished or waited >= EVENT_STREAM_MAX_S:
                yield "event: end\ndata: {}\n\n"
                return
            await asyncio.sleep(EVENT_INTERVAL_S)
            waited += EVENT_INTERVAL_S
            if await request.is_disconnected():
                return

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
