"""What a job page shows of each shape (``/jobs/{id}`` and its live refresh, and the trials CSV
export): the trials as rows (``TrialRow``), the work a shape asks of the device (``Work``:
TFLOP/s and GB/s of a time), the charts' data (best so far, outcomes, parameter importance,
parallel coordinates), the trials table, the headline best against the baseline and the
kernel's default, and the shape's statistics (roofline share, compile times)."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from api.dashboard_format import _registered, _sig, is_interpreter, stopped_early
from db import repo
from db.models import ACTIVE, Device, Job, Task
from tuner.gpu_state import throttle_reasons
from tuner.kernel import TunableKernel
from tuner.roofline import Roofline, roofline

#: failed trials listed on a job page (the rest are counted)
MAX_FAILURES_LISTED = 200
#: configs drawn in the parallel-coordinates view (the fastest ones)
MAX_PARCOORDS = 300
OUTCOME_COLOURS = {"ok": "#2b7bba", "pruned": "#9e9e9e", "compile_error": "#e08214",
                   "out_of_resources": "#b35806", "wrong_result": "#d7301f", "nan": "#ae017e",
                   "crash": "#67001f", "timeout": "#542788"}

#: the CSV export's columns after the job, shape and trial number and the config's parameters
CSV_COLUMNS = ("outcome", "ms", "measured", "trial_p20_ms", "trial_p50_ms", "trial_p80_ms",
               "retimed_p20_ms", "retimed_p50_ms", "retimed_p80_ms", "tflops", "gbps",
               "compile_s", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle",
               "throttle_reasons", "error")


def _csv_values(t: TrialRow, work: Work) -> list[Any]:
    values = [t.outcome, t.ms, t.measured, t.p20_ms, t.p50_ms, t.p80_ms, t.retimed_p20_ms,
              t.retimed_p50_ms, t.retimed_p80_ms, work.tflops(t.ms), work.gbps(t.ms),
              t.compile_s, t.sm_mhz, t.mem_mhz, t.power_w, t.temp_c, t.throttle,
              " ".join(throttle_reasons(t.throttle)), t.error or ""]
    return ["" if v is None else v for v in values]


class TrialRow:
    """A trial as the job page shows it: an attribute per field of a trial
    (``db.repo.TRIAL_FIELDS``, as ``repo.trial_columns`` reads them) but its task's id: its
    own timing (``p*_ms``), a finalist's re-timing (``retimed_*``), its compile time and the
    GPU's state as it was timed."""

    __slots__ = tuple(f.name for f in repo.TRIAL_FIELDS if f.name != "task_id")

    def __init__(self, **columns: Any) -> None:
        missing = [name for name in self.__slots__ if name not in columns]
        unknown = [name for name in columns if name not in self.__slots__]
        if missing or unknown:
            raise TypeError(f"a trial row's columns: missing {missing}, unknown {unknown}")
        for name, value in columns.items():
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        """Only reached for a name that is no field (the fields are slots)."""
        raise AttributeError(f"a trial row has no field {name!r}")

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

