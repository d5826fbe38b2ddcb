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
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import re
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
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
from markupsafe import Markup, escape
from sqlalchemy.orm import Session

from api.deps import ReadAccess, SessionDep, SettingsDep, dispatcher_of, key_mode
from api.routes.jobs import cancel_committed
from api.routes.kernels import registered_verification
from db import repo
from db.models import ACTIVE, TERMINAL, BestConfig, Device, Job, Task, utcnow
from search_spaces import get_kernel, kernel_names
from tuner.config import triton_config_text
from tuner.configs_file import VLLM_NAMES
from tuner.gpu_state import throttle_reasons
from tuner.kernel import TunableKernel, verification_of
from tuner.roofline import Roofline, roofline
from tuner.settings import Settings

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
#: failed trials listed on a job page (the rest are counted)
MAX_FAILURES_LISTED = 200
#: configs drawn in the parallel-coordinates view (the fastest ones)
MAX_PARCOORDS = 300
#: trials in the HTML of a job page's trials table, for browsers without JavaScript (the
#: page's script draws the table from the page's data, every trial, a page at a time)
TRIALS_LISTED = 100
#: the last page a list can be asked for (its offset stays within the database's integers)
MAX_PAGE = 10**6
#: seconds between server-sent progress events
EVENT_INTERVAL_S = 1.0
#: a progress stream ends after this long (the browser's EventSource reconnects by itself)
EVENT_STREAM_MAX_S = 300.0
OUTCOME_COLOURS = {"ok": "#2b7bba", "pruned": "#9e9e9e", "compile_error": "#e08214",
                   "out_of_resources": "#b35806", "wrong_result": "#d7301f", "nan": "#ae017e",
                   "crash": "#67001f", "timeout": "#542788"}

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


# -- formatting helpers for the templates ------------------------------------------------------

def shape_text(shape: Mapping[str, int] | None) -> str:
    return "x".join(str(v) for v in (shape or {}).values())


def ms_text(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return "-"
    return f"{ms:.4f}" if ms < 10 else f"{ms:.1f}"


def ago_text(moment: Any) -> str:
    seconds = repo.seconds_since(moment)
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def ago_tag(moment: Any) -> Markup:
    """``ago_text`` in a ``<time>`` element that the page's script keeps current (it counts
    from the ISO time in ``datetime``); the exact time is its tooltip."""
    if moment is None:
        return Markup("-")
    iso = moment.isoformat()
    return Markup('<time datetime="{0}" title="{0}" data-ago>{1}</time>').format(
        iso, ago_text(moment))


def fixed_text(value: float | None, digits: int = 1) -> str:
    """A number with ``digits`` decimals; "-" for none (not measured, not applicable)."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}"


def config_short(config: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


#: the docstring conventions a page should not show raw: "(None otherwise)" (a constraint's
#: return value, not what it checks) and reST's double-backtick inline code
_RETURNS_NONE = re.compile(r"\s*\((?:and )?None otherwise\)", re.IGNORECASE)
_INLINE_CODE = re.compile(r"``(.+?)``")


def doc_html(text: str | None) -> Markup:
    """A docstring as a line of a page: whitespace joined, "(None otherwise)" left out, and
    ````name```` as ``<code>name</code>`` (the rest escaped)."""
    clean = _RETURNS_NONE.sub("", " ".join((text or "").split()))
    parts = _INLINE_CODE.split(clean)  # odd items are the code
    return Markup("").join(Markup("<code>{}</code>").format(p) if i % 2 else escape(p)
                           for i, p in enumerate(parts))


def is_interpreter(device_key: str | None, device: Device | None = None) -> bool:
    """Whether timings on this device come from Triton's CPU interpreter: not GPU timings, so
    no TFLOP/s, GB/s or ratio to torch means anything there."""
    if device is not None and device.kind:
        return device.kind == "interpret"
    return bool(device_key) and str(device_key).startswith("interpret:")


#: why a search stopped before its budget (``tuner.search``'s stop reasons), in words
STOP_REASONS = {
    "converged": "converged (no faster config in its last trials)",
    "no expected gain": "no expected gain (the model predicts nothing faster)",
    "near roofline": "near the roofline (the best is close to the hardware's floor)",
    "space exhausted": "space exhausted (every valid config was tried)",
    "time": "its time budget was spent",
    "device unhealthy": "the device became unhealthy",
}


def stopped_early(task: Task, budget: int) -> str | None:
    """"stopped early: <why>" for a finished task whose search stopped before its trial
    budget; None otherwise (still running, ran the budget, or no reason recorded)."""
    reason = task.stop_reason
    if task.status in ACTIVE or not reason or reason == "budget" or task.trials_done >= budget:
        return None
    return (f"stopped early: {STOP_REASONS.get(reason, reason)}, after {task.trials_done} of "
            f"{budget} trials")


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


# -- config renderings (what the copy buttons copy) --------------------------------------------

def as_vllm_entry(config: Mapping[str, int], shape: Mapping[str, int]) -> str:
    """An entry of a vLLM tuned-config file (``{"<M>": {"BLOCK_SIZE_M": .., ...}}``): keyed by
    the batch dimension M, which is what vLLM looks up at run time."""
    entry = {VLLM_NAMES.get(k, k): v for k, v in config.items()}
    return json.dumps({str(shape.get("M", 0)): entry})


def config_views(row: BestConfig) -> dict[str, str]:
    """The copy formats of a stored config; the ``triton.Config`` one is ``tuner.config``'s
    ``triton_config_text``, the one rendering the CLI uses too."""
    return {"json": json.dumps(row.config, sort_keys=True),
            "triton": triton_config_text(row.config), "vllm": as_vllm_entry(row.config, row.shape)}


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
                 statuses=("queued", "running", "succeeded", "failed", "cancelled"))


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
                 statuses=("queued", "running", "succeeded", "failed", "cancelled"),
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
            "tasks_done": sum(t.status in ("succeeded", "failed", "cancelled") for t in tasks),
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


def _sig(x: float) -> float:
    """Five significant digits: as precise as a timing is, and a third of the bytes."""
    return float(f"{x:.5g}")


#: the CSV export's columns after the job, shape and trial number and the config's parameters
CSV_COLUMNS = ("outcome", "ms", "measured", "trial_p20_ms", "trial_p50_ms", "trial_p80_ms",
               "retimed_p20_ms", "retimed_p50_ms", "retimed_p80_ms", "tflops", "gbps",
               "compile_s", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle",
               "throttle_reasons", "error")


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


def _csv_values(t: TrialRow, work: Work) -> list[Any]:
    values = [t.outcome, t.ms, t.measured, t.p20_ms, t.p50_ms, t.p80_ms, t.retimed_p20_ms,
              t.retimed_p50_ms, t.retimed_p80_ms, work.tflops(t.ms), work.gbps(t.ms),
              t.compile_s, t.sm_mhz, t.mem_mhz, t.power_w, t.temp_c, t.throttle,
              " ".join(throttle_reasons(t.throttle)), t.error or ""]
    return ["" if v is None else v for v in values]


@dataclass(slots=True)
class TrialRow:
    """A trial as the job page shows it: its own timing (``p*_ms``), a finalist's re-timing
    (``retimed_*``), its compile time and the GPU's state as it was timed."""

    number: int
    config: dict[str, int]
    outcome: str
    p20_ms: float | None
    p50_ms: float | None
    p80_ms: float | None
    error: str | None
    compile_s: float | None = None
    retimed_p20_ms: float | None = None
    retimed_p50_ms: float | None = None
    retimed_p80_ms: float | None = None
    sm_mhz: int | None = None
    mem_mhz: int | None = None
    power_w: float | None = None
    temp_c: int | None = None
    throttle: int | None = None

    @property
    def ms(self) -> float | None:
        """The config's one number: its re-timed p50 where it was a finalist, else its trial
        p50 (``measured`` says which); what the API's best_ms and the CLI report for it."""
        return self.retimed_p50_ms if self.retimed_p50_ms is not None else self.p50_ms

    @property
    def measured(self) -> str | None:
        if self.retimed_p50_ms is not None:
            return "retimed"
        return "trial" if self.p50_ms is not None else None

    @property
    def gpu_text(self) -> str:
        """The GPU state in a cell: "1755/2619 MHz 512 W 61 C sw_power_cap"; "-" without."""
        parts = []
        if self.sm_mhz is not None:
            parts.append(f"{self.sm_mhz}/{self.mem_mhz if self.mem_mhz is not None else '-'} "
                         "MHz")
        if self.power_w is not None:
            parts.append(f"{self.power_w:.0f} W")
        if self.temp_c is not None:
            parts.append(f"{self.temp_c} C")
        parts += throttle_reasons(self.throttle)
        return " ".join(parts) or "-"


@dataclass(frozen=True, slots=True)
class Work:
    """What a shape asks of the device, as the kernel counts it: a time's TFLOP/s and GB/s
    (None where the kernel gives no count, or there is no time)."""

    flops: float
    bytes: float

    def tflops(self, ms: float | None) -> float | None:
        return self.flops / (ms * 1e-3) / 1e12 if ms and self.flops else None

    def gbps(self, ms: float | None) -> float | None:
        return self.bytes / (ms * 1e-3) / 1e9 if ms and self.bytes else None


def work_of(kernel: TunableKernel | None, shape: Mapping[str, int], dtype: str) -> Work:
    if kernel is None:
        return Work(0.0, 0.0)
    try:
        return Work(float(kernel.flops(shape)), float(kernel.bytes(shape, dtype)))
    except Exception:  # noqa: BLE001 - a user's kernel whose counts fail: show times only
        return Work(0.0, 0.0)


def _shapes(session: Session, job: Job) -> list[dict[str, Any]]:
    by_task: dict[int, list[TrialRow]] = defaultdict(list)
    for row in repo.trial_columns(session, [t.id for t in job.tasks]):
        by_task[row.pop("task_id")].append(TrialRow(**row))
    kernel = _registered(job.kernel)
    space_names = list(kernel.space().names) if kernel is not None else []
    devices: dict[str, Device | None] = {}
    shapes = []
    for task in job.tasks:
        key = task.device_key or job.device_key
        if key and key not in devices:
            devices[key] = repo.get_device(session, key)
        trials = by_task.get(task.id, [])
        device = devices.get(key) if key else None
        interpreter = is_interpreter(key, device)
        # the CPU interpreter's times are no GPU's: no TFLOP/s, GB/s, roofline or ratio
        work = Work(0.0, 0.0) if interpreter else work_of(kernel, task.shape, job.dtype)
        view = task_charts(task, trials, space_names, work, interpreter=interpreter)
        view.update(trials=trials, work=work, names=view["data"]["names"],
                    interpreter=interpreter,
                    stats=shape_stats(task, trials, work, kernel, job.dtype, device,
                                      interpreter=interpreter),
                    stopped_early=stopped_early(task, job.budget_trials))
        shapes.append(view)
    return shapes


def task_charts(task: Task, trials: Sequence[TrialRow], names: list[str],
                work: Work | None = None, *, interpreter: bool = False) -> dict[str, Any]:
    """Everything the job page draws for one shape, as compact arrays: each trial's config is
    a row of values in ``names`` order (the page's script writes the hover text).

    Every number says which measurement it is: the best-so-far curve is of the trials' own
    timings; ``final`` is the task's best (its re-timed p50 once the finalists were re-timed,
    drawn as its own point); the fastest-configs table (``top``) shows each trial's own
    timing and, for the finalists, their re-timed p50 in its own column, so the headline best
    is found in the table as the re-timed time of its config."""
    if not names:
        names = sorted({k for t in trials for k in t.config})
    ok = [t for t in trials if t.outcome == "ok" and t.p50_ms is not None]
    best_so_far: list[float | None] = []
    best = math.inf
    for t in trials:
        if t.outcome == "ok" and t.p50_ms is not None:
            best = min(best, t.p50_ms)
        best_so_far.append(_sig(best) if math.isfinite(best) else None)
    by_outcome: dict[str, dict[str, list[Any]]] = {}
    errors: dict[int, str] = {}
    for i, t in enumerate(trials):
        group = by_outcome.setdefault(t.outcome, {"x": [], "y": [], "i": []})
        group["x"].append(t.number)
        y = timeout_ms(t) if t.outcome == "timeout" else t.p50_ms
        group["y"].append(None if y is None else _sig(y))
        group["i"].append(i)
        if t.error:
            errors[i] = t.error[:120]
    failures = [t for t in trials if t.outcome not in ("ok", "pruned")]
    fastest = sorted(ok, key=lambda t: t.p50_ms or 0.0)
    top = fastest[:10]
    # the finalists (re-timed) are listed even where their trial time is not among the ten
    top += [t for t in fastest[10:] if t.retimed_p50_ms is not None]
    return {
        "task": task, "count": len(trials), "ok": len(ok),
        "outcomes": dict(Counter(t.outcome for t in trials)),
        "failures": failures[:MAX_FAILURES_LISTED], "failures_total": len(failures),
        "top": top, "best": best_summary(task, interpreter=interpreter),
        "data": {
            "id": task.id, "numbers": [t.number for t in trials], "best": best_so_far,
            "final": ({"ms": _sig(task.best_ms), "measured": task.best_measured,
                       "x": trials[-1].number if trials else 0}
                      if task.best_ms is not None else None),
            "outcomes": by_outcome, "colours": OUTCOME_COLOURS, "names": names,
            "configs": [[t.config.get(n) for n in names] for t in trials], "errors": errors,
            "importance": importance(ok, names),
            "parcoords": parcoords(fastest[:MAX_PARCOORDS], names),
            "table": trial_table(task, trials, work or Work(0.0, 0.0)),
        },
    }


#: a timeout's limit in its error ("run timed out: no answer within 30 s")
_TIMEOUT_LIMIT = re.compile(r"(?:within|after) (\d+(?:\.\d+)?) s\b")


def timeout_ms(t: TrialRow) -> float | None:
    """Where a timed-out trial belongs on a time axis: its measured p50 where it has one, else
    the run's time limit it hit (it ran at least that long); None for a compile that timed out
    (it never ran) or a limit the error does not state."""
    if t.p50_ms is not None:
        return t.p50_ms
    error = t.error or ""
    match = _TIMEOUT_LIMIT.search(error)
    if match is None or error.lstrip().lower().startswith("compile"):
        return None
    return float(match.group(1)) * 1000.0


def trial_table(task: Task, trials: Sequence[TrialRow], work: Work) -> dict[str, Any]:
    """The trials table's columns beyond ``numbers``, ``configs`` and ``errors``, one entry per
    trial: the outcome, the config's one number (``ms``; ``retimed`` 1 where it is the
    re-timed p50, 0 where it is the trial's own), compile seconds and GPU state (an index into
    ``gpus``, the distinct texts); ``trial_p50``: the trial's own p50 where ``ms`` is the
    re-timed one; ``flops`` and ``bytes`` turn a time into TFLOP/s and GB/s; ``best``: the rows
    of the task's best config. Compact: a shape may have thousands of trials."""
    gpus: dict[tuple[Any, ...], int] = {}
    texts: list[str] = []
    gpu_index = []
    for t in trials:
        state = (t.sm_mhz, t.mem_mhz, t.power_w, t.temp_c, t.throttle)
        if state not in gpus:
            gpus[state] = len(texts)
            texts.append(t.gpu_text)
        gpu_index.append(gpus[state])
    return {
        "outcome": [t.outcome for t in trials],
        # to the nanosecond: finer than any timing, and cheaper than _sig for thousands
        "ms": [None if t.ms is None else round(t.ms, 6) for t in trials],
        "retimed": [int(t.retimed_p50_ms is not None) for t in trials],
        "trial_p50": {i: t.p50_ms for i, t in enumerate(trials)
                      if t.retimed_p50_ms is not None},
        "compile": [None if t.compile_s is None else round(t.compile_s, 3) for t in trials],
        "gpu": gpu_index, "gpus": texts,
        "best": [i for i, t in enumerate(trials) if task.best_config is not None
                 and t.config == task.best_config],
        "flops": work.flops, "bytes": work.bytes,
    }


def best_summary(task: Task, *, interpreter: bool = False) -> dict[str, Any]:
    """The task's headline: its best time and which measurement it is, the baseline's ratio
    (only from the baseline timed interleaved with the finalists in the same process; none on
    the CPU interpreter, where it means nothing), the stored best's re-timed time and what
    became of it, and the default's re-timed time and whether it is what is served
    (``vs_default_text``)."""
    measured = {"retimed": "re-timed beside the other finalists",
                "trial": "its trial timing: not re-timed"}.get(task.best_measured or "",
                                                               "as stored")
    ratio = None if interpreter else task.vs_baseline
    return {"ms": task.best_ms, "measured": task.best_measured, "measured_text": measured,
            "vs_baseline": ratio, "baseline_name": task.baseline_name,
            "baseline_ms": task.baseline_ms,
            "vs_text": f"{ratio:.2f}x vs {task.baseline_name}" if ratio else None,
            "incumbent_ms": task.incumbent_ms, "note": task.best_note,
            "default_ms": task.default_ms, "basis": task.best_basis,
            "vs_default_text": vs_default_text(task)}


def vs_default_text(task: Task) -> str | None:
    """The task's best against the kernel's default, both re-timed beside the finalists, and
    what is served for it (``best_basis``): None without a re-timed default."""
    if not task.default_ms or not task.best_ms:
        return None
    gain = 1 - task.best_ms / task.default_ms
    text = (f"the search's best is {100 * abs(gain):.1f}% {'faster' if gain >= 0 else 'slower'}"
            f" than the default ({task.default_ms:.4f} ms)")
    margin = (f"noise margin {100 * task.noise_margin:.1f}%"
              if task.noise_margin is not None else "noise margin")
    if task.best_basis == "default":
        return f"served: the default; {text}, within the {margin}"
    if task.best_basis == "search":
        return f"served: a tuned config; {text} ({margin})"
    return text


def shape_stats(task: Task, trials: Sequence[TrialRow], work: Work,
                kernel: TunableKernel | None, dtype: str,
                device: Device | None, *, interpreter: bool = False) -> dict[str, Any]:
    """A shape's numbers a kernel engineer asks first, all of the task's best time (the
    headline: re-timed once the finalists were): TFLOP/s and GB/s, the share of the roofline
    floor it reaches (``tuner.roofline``, the floor the workers stop at), the baseline (torch)
    and the ratio (only from the baseline timed beside the re-timed finalists), and the
    compile times of the trials. ``*_note`` says why a number is missing. On the CPU
    interpreter (``interpreter``) only the times: its throughput, roofline share and ratio to
    torch mean nothing."""
    ms = task.best_ms
    roof: Roofline | None = None
    if kernel is not None and device is not None and not interpreter:
        roof = roofline(kernel, task.shape, dtype, device.copy_gbps, device.matmul_tflops)
    if roof is not None:
        roof_note = None
    elif interpreter:
        roof_note = "not GPU timings"
    elif device is None:
        roof_note = "no device yet"
    elif not (device.copy_gbps or device.matmul_tflops):
        roof_note = "device not calibrated"
    else:
        roof_note = "the kernel counts no FLOPs or bytes"
    ratio = None if interpreter else task.vs_baseline
    if interpreter:
        baseline_note = None  # shown as "-": the interpreter's ratio means nothing
    elif ratio is not None:
        baseline_note = None
    elif task.baseline_ms is not None:
        baseline_note = "no ratio: the best was not re-timed beside it"
    elif task.status in ACTIVE:
        baseline_note = "timed beside the finalists at the end"
    else:
        baseline_note = "not timed"
    compiles = sorted(t.compile_s for t in trials if t.compile_s is not None)
    return {
        "ms": ms, "measured": task.best_measured,
        "tflops": work.tflops(ms), "gbps": work.gbps(ms),
        "floor_ms": roof.floor_ms if roof else None, "bound": roof.bound if roof else None,
        "compute_applies": roof is not None and roof.compute_ms is not None,
        "of_roof": roof.of_roof(ms) if roof else None, "roof_note": roof_note,
        "baseline_name": task.baseline_name or "torch", "baseline_ms": task.baseline_ms,
        "vs_baseline": ratio, "baseline_note": baseline_note,
        "compiles": len(compiles),
        "compile_median_s": statistics.median(compiles) if compiles else None,
        "compile_max_s": compiles[-1] if compiles else None,
        "compile_total_s": sum(compiles) if compiles else None,
    }


def importance(ok: Sequence[Any], names: Iterable[str]) -> list[dict[str, Any]]:
    """Per parameter, the share of the variance of log(time) over the successful trials that
    its value explains on its own (one-way eta squared): 0 = no effect seen, 1 = it decides.
    Largest first. Empty with fewer than 3 successful trials."""
    if len(ok) < 3:
        return []
    logs = [math.log(t.p50_ms or 1e-9) for t in ok]
    mean = statistics.fmean(logs)
    total = sum((x - mean) ** 2 for x in logs)
    out = []
    for name in names:
        groups: dict[Any, list[float]] = defaultdict(list)
        for t, x in zip(ok, logs, strict=True):
            groups[t.config.get(name)].append(x)
        between = sum(len(g) * (statistics.fmean(g) - mean) ** 2 for g in groups.values())
        out.append({"param": name, "share": round(between / total, 4) if total > 0 else 0.0})
    return sorted(out, key=lambda d: -d["share"])


def parcoords(fastest: Sequence[Any], names: list[str]) -> dict[str, Any]:
    """Axes (the parameters, then log time) with the values seen on each, and each config as a
    row of axis positions in [0, 1]; drawn as SVG lines by the page's script."""
    if not fastest:
        return {"axes": [], "rows": [], "ms": []}
    axes: list[tuple[str, list[int]]] = []
    for name in names:
        axes.append((name, sorted({int(t.config[name]) for t in fastest if name in t.config})))
    ms = [t.p50_ms or 0.0 for t in fastest]
    lo, hi = math.log(min(ms)), math.log(max(ms))
    rows = []
    for t, m in zip(fastest, ms, strict=True):
        row = []
        for name, vals in axes:
            value = t.config.get(name)
            i = vals.index(value) if value in vals else 0
            row.append(round(i / (len(vals) - 1), 4) if len(vals) > 1 else 0.5)
        row.append(round((math.log(m) - lo) / (hi - lo), 4) if hi > lo else 0.5)
        rows.append(row)
    return {"axes": [{"name": n, "values": v} for n, v in axes]
            + [{"name": "time (ms, log)", "values": [round(min(ms), 4), round(max(ms), 4)]}],
            "rows": rows, "ms": [round(m, 5) for m in ms]}


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


def _registered(name: str) -> TunableKernel | None:
    try:
        return get_kernel(name)
    except Exception:  # noqa: BLE001 - a kernel no longer registered has no known floor
        return None


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
