"""Dashboard pages over the stored results as a whole, beside ``api/dashboard.py``'s:

- ``/dashboard/stale``: stored bests tuned for a kernel source or a Triton minor version that no
  longer runs (``GET /api/v1/configs/stale``), each with a button that queues its re-tune
  through the API (``POST /api/v1/jobs``, after a confirmation; a write key where the service
  asks for one, as the job page's cancel button does);
- ``/dashboard/compare?kernel=..&dtype=..&shape=..``: one shape's stored bests across devices,
  Triton and kernel versions, the jobs that tuned it, and, for a kernel with an M dimension,
  best time against M over the stored shapes that differ from it only in M (a token-count
  sweep).

Tables are in the HTML; the charts use the Plotly.js the dashboard serves from the installed
``plotly`` package, with their data embedded in the page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from api import dashboard
from api.deps import ReadAccess, SessionDep
from api.routes.configs import find_stale, stale_public
from db import views
from db.models import BestConfig
from search_spaces import get_kernel, kernel_names
from tuner.shapes import shape_key

router = APIRouter(prefix="/dashboard", include_in_schema=False, dependencies=[ReadAccess])
#: the dimension of a token-count sweep
SWEEP_DIM = "M"


@router.get("/stale", response_class=HTMLResponse)
def stale_page(request: Request, session: SessionDep, kernel: str | None = None) -> HTMLResponse:
    rows = []
    for stale in find_stale(session, kernel or None):
        public = stale_public(stale)
        rows.append({"stale": stale, "row": stale.row, "reasons": public.reasons,
                     "retune": public.retune.model_dump(mode="json") if public.retune else None,
                     "compare": compare_url(stale.row.kernel, stale.row.dtype, stale.row.shape)})
    return dashboard._page(request, "stale.html", title="Stale configs", rows=rows,
                           kernel=kernel or "", kernels=kernel_names())


def compare_url(kernel: str, dtype: str, shape: Mapping[str, int]) -> str:
    text = ",".join(f"{k}={v}" for k, v in shape.items())
    return "/dashboard/compare?" + urlencode({"kernel": kernel, "dtype": dtype, "shape": text})


dashboard.templates.env.globals["compare_url"] = compare_url


class ShapeError(ValueError):
    """A shape the comparison page cannot read."""


def parse_shape(text: str, kernel: str) -> dict[str, int]:
    """``M=4096,N=4096,K=4096`` (any order, as ``tuner tune --shape``), or ``4096x4096x4096``
    in the order of the kernel's dimensions."""
    text = text.strip().replace(" ", "")
    try:
        if "=" in text:
            pairs = (part.split("=", 1) for part in text.split(",") if part)
            return {name: int(value) for name, value in pairs}
        values = [int(v) for v in text.lower().split("x") if v]
    except ValueError:
        raise ShapeError(f"{text!r} is not a shape such as M=4096,N=4096,K=4096") from None
    if kernel not in kernel_names():
        raise ShapeError(f"give {kernel}'s dimensions by name (M=..,N=..): it is not "
                         "registered here")
    dims = [d.name for d in get_kernel(kernel).dims]
    if len(values) != len(dims):
        raise ShapeError(f"{kernel} has {len(dims)} dimensions ({', '.join(dims)}); "
                         f"{text!r} gives {len(values)}")
    return dict(zip(dims, values, strict=True))


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, session: SessionDep, kernel: str | None = None,
                 dtype: str | None = None, shape: str | None = None) -> HTMLResponse:
    """One shape compared; without a complete choice, the stored shapes to choose from."""
    stored = views.stored_shapes(session)
    context: dict[str, Any] = {"kernel": kernel or "", "dtype": dtype or "", "shape": shape or "",
                               "stored": stored, "kernels": sorted({s.kernel for s in stored}),
                               "dtypes": sorted({s.dtype for s in stored}), "chosen": None,
                               "error": None}
    if kernel and dtype and shape:
        try:
            context["chosen"] = compared(session, kernel, dtype, parse_shape(shape, kernel))
        except ShapeError as exc:
            context["error"] = str(exc)
    status = 400 if context["error"] else 200
    return dashboard._page(request, "compare.html", status_code=status, title="Compare",
                           **context)


def compared(session: Session, kernel: str, dtype: str, shape: dict[str, int]) -> dict[str, Any]:
    """Everything the comparison page shows of one shape, and its charts' data."""
    key = shape_key(shape)
    bests = views.shape_bests(session, kernel=kernel, dtype=dtype, shape_key=key)
    tasks = views.shape_tasks(session, kernel=kernel, dtype=dtype, shape_key=key)
    sweep = views.m_sweep(session, kernel=kernel, dtype=dtype, shape=shape, dim=SWEEP_DIM)
    current = _registered_version(kernel)
    return {"kernel": kernel, "dtype": dtype, "shape": shape, "bests": bests, "tasks": tasks,
            "sweep": sweep, "sweep_m": sorted({m for line in sweep for m in line.m}),
            "current_version": current, "has_m": SWEEP_DIM in shape,
            "charts": {"bests": [_bar(b, current) for b in bests],
                       "sweep": [_line(s, current) for s in sweep],
                       "m": shape.get(SWEEP_DIM), "dim": SWEEP_DIM}}


def _registered_version(kernel: str) -> str | None:
    return get_kernel(kernel).version if kernel in kernel_names() else None


def _identity(device: str, triton: str, version: str, current: str | None) -> str:
    """How a chart names a (device, Triton, kernel version): the version only when it is not
    the registered one's."""
    old = "" if version == current else f" · kernel {version[:8]}"
    return f"{device} · Triton {triton}{old}"


def _bar(b: BestConfig, current: str | None) -> dict[str, Any]:
    return {"label": _identity(b.device_key, b.triton_version, b.kernel_version, current),
            "ms": b.p50_ms, "measured": b.measured or "", "current": b.kernel_version == current,
            "config": " ".join(f"{k}={v}" for k, v in b.config.items())}


def _line(s: views.Series, current: str | None) -> dict[str, Any]:
    return {"name": _identity(s.device, s.triton_version, s.kernel_version, current),
            "m": s.m, "ms": s.ms}
