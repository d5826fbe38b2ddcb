"""The dashboard's formatting helpers (``api/dashboard.py`` registers them as the templates'
filters and tests): times, shapes, ages, numbers, configs and docstrings as a page shows them,
why a search stopped early, the copy formats of a stored config (JSON, ``triton.Config``, a
vLLM-style entry), and a registered kernel by name (None where it no longer is)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from markupsafe import Markup, escape

from db import repo
from db.models import ACTIVE, BestConfig, Device, Task
from search_spaces import get_kernel
from tuner.config import triton_config_text
from tuner.configs_file import VLLM_NAMES
from tuner.identity import DeviceKind
from tuner.kernel import TunableKernel

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
        return device.kind == DeviceKind.INTERPRET
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


def _registered(name: str) -> TunableKernel | None:
    try:
        return get_kernel(name)
    except Exception:  # noqa: BLE001 - a kernel no longer registered has no known floor
        return None


def _sig(x: float) -> float:
    """Five significant digits: as precise as a timing is, and a third of the bytes."""
    return float(f"{x:.5g}")

