"""Checking a request: text and numbers no route can take (``HostileInputGuard``, before any
route runs), then against the kernel registry and what the live workers can run. Errors name
the offending field."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from api.middleware import HttpMiddleware
from search_spaces import get_kernel

# the dtype checks' home is tuner.dtypes; check_dtype is imported from here by the routes
from tuner.dtypes import check_dtype as check_dtype
from tuner.dtypes import check_interpreter_dtype
from tuner.errors import InvalidRequest, InvalidShape
from tuner.interpreter_estimate import interpreter_trial_seconds as interpreter_trial_seconds
from tuner.kernel import TunableKernel
from tuner.shapes import validate_shape
from tuner.strategies import strategy_names
from tuner.timing import interpreter_refusal

#: the device key of the CPU interpreter (tuner.device.DeviceFingerprint.key)
INTERPRETER_KEY = "interpret:cpu"


def kernel_or_error(name: str, field: str = "kernel") -> TunableKernel:
    try:
        return get_kernel(name)
    except InvalidRequest as exc:
        exc.field = field
        raise


#: what a stored best of an external kernel is (``ExternalKernel``): the API's ``verification``
#: and the dashboard's label
CLIENT_MEASUREMENTS_ONLY = "served from client measurements only"
#: a qualified Python name (``module.function``): how ``tuner.install()`` names a hooked kernel
_QUALIFIED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
_DIM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,19}")
#: the most dimensions (autotune key values) an external kernel's problem may have
EXTERNAL_DIMS_MAX = 32


@dataclass(frozen=True)
class ExternalKernel:
    """A kernel this service has no code for: a library's ``triton.autotune`` kernel that a
    model's process hooked (``tuner.install()``), known by its qualified name and the caller's
    ``kernel_version``. Its configs are what clients measured (``POST /configs/measured``); no
    worker tunes it, and it has no default config here."""

    name: str
    version: str


def kernel_for_lookup(name: str, kernel_version: str | None,
                      field: str = "kernel") -> TunableKernel | ExternalKernel:
    """The registered kernel ``name``; else, for a qualified name given with its
    ``kernel_version``, an ``ExternalKernel``; else the unknown kernel's 4xx naming ``field``."""
    try:
        return kernel_or_error(name, field)
    except InvalidRequest as exc:
        if kernel_version and len(name) <= 100 and _QUALIFIED.fullmatch(name):
            return ExternalKernel(name, kernel_version)
        raise InvalidRequest(f"{exc}; a kernel not registered here (one a model's process "
                             "hooked with tuner.install()) is named by its qualified name "
                             "(module.function) and given with its kernel_version",
                             field=field) from None


def check_external_problem(shape: Mapping[str, Any], dtype: str, field: str,
                           dtype_field: str) -> dict[str, int]:
    """An external kernel's shape (its autotune key's values by name: integers, at most
    ``EXTERNAL_DIMS_MAX``) and dtype (a torch dtype's name, or ``none``), checked as a
    registered kernel's are: a 4xx naming the field."""
    if not _DTYPE_NAME.fullmatch(dtype):
        raise InvalidRequest(f"dtype {dtype!r} is not a dtype name (e.g. float16, bfloat16)",
                             field=dtype_field)
    if len(shape) > EXTERNAL_DIMS_MAX:
        raise InvalidShape(f"{len(shape)} dimensions: at most {EXTERNAL_DIMS_MAX}", field=field)
    checked = {}
    for name, value in shape.items():
        where = f"{field}.{name}" if field else name
        if not _DIM_NAME.fullmatch(name):
            raise InvalidShape(f"dimension name {name!r} is not an identifier", field=where)
        if isinstance(value, bool) or not isinstance(value, int) or not (
                -2**63 <= value < 2**63):
            raise InvalidShape(f"{name}={value!r} must be an integer of at most 64 bits",
                               field=where)
        checked[name] = value
    return checked


def check_job_interpreter_dtype(kernel: TunableKernel, dtype: str,
                                only_interpreter: bool) -> None:
    """A job only the CPU interpreter can run (it asks for it, or the only live workers are
    interpreter workers) cannot verify dtypes the interpreter computes wrongly (it would only
    fail on the worker, minutes later)."""
    if only_interpreter:
        check_interpreter_dtype(kernel, dtype, where=", the only backend that can run this job "
                                "here", advice="target a GPU or use another dtype")


def check_job_interpreter_timing(timing: str, only_interpreter: bool) -> None:
    """A job only the CPU interpreter can run cannot be timed in a way it cannot time
    (``cuda-graph``: it cannot replay CUDA graphs); refused now rather than failed on the
    worker."""
    refusal = interpreter_refusal(timing) if only_interpreter else None
    if refusal is not None:
        raise InvalidRequest(f"{refusal}, and it is the only backend that can run this job "
                             "here: target a GPU device", field="timing")


def check_shape(kernel: TunableKernel, shape: Mapping[str, Any], field: str) -> dict[str, int]:
    """The validated shape; errors carry ``field.<dim>`` (or ``<dim>`` when field is "")."""
    try:
        return validate_shape(kernel.dims, shape)
    except InvalidShape as exc:
        dim = (exc.field or "").rpartition(".")[2]
        if dim and dim != "shape":
            exc.field = f"{field}.{dim}" if field else dim
        else:
            exc.field = field
        raise


def check_strategy(name: str) -> None:
    if name not in strategy_names():
        raise InvalidRequest(f"unknown strategy {name!r}; choose one of "
                             f"{', '.join(strategy_names())}", field="strategy")


def check_interpreter_size(kernel: TunableKernel, shapes: list[dict[str, int]], dtype: str,
                           limit_s: float, budget_s: float | None = None) -> None:
    """A job only the interpreter can run must not sit at 0 trials for hours: refuse shapes
    whose one trial would take longer than ``limit_s`` (TUNER_INTERPRETER_TRIAL_LIMIT_S), or
    than the job's time budget ``budget_s`` (its every task would end with no trial: the
    worker stops a task at its budget, ``tuner/app/worker.py``)."""
    for i, shape in enumerate(shapes):
        estimate = interpreter_trial_seconds(kernel, shape, dtype)
        if budget_s is not None and estimate > budget_s:
            raise InvalidRequest(
                f"budget.seconds {budget_s:g} is shorter than one trial of shape {shape} on "
                f"the Triton CPU interpreter, the only backend that can run this job here (at "
                f"least {estimate:.0f} s): give a longer time budget or a smaller shape",
                field="budget.seconds")
        if estimate > limit_s:
            raise InvalidRequest(
                f"shape {shape} is too large for the Triton CPU interpreter, the only backend "
                f"that can run this job here: one trial would take at least {estimate:.0f} s "
                f"(this service's limit: {limit_s:.0f} s); use a smaller shape or target a "
                "GPU", field=f"shapes.{i}")


def check_fits_gpu(kernel: TunableKernel, shapes: list[dict[str, int]], dtype: str,
                   memory_bytes: int | None) -> None:
    """Refuse shapes whose inputs cannot fit in the share of the GPU's memory one task may use
    (``TUNER_GPU_MEMORY_FRACTION`` of it, as the measuring child enforces): the worker would
    only fail the task. ``memory_bytes``: the largest GPU that could run the job (None:
    unknown, nothing is refused)."""
    from tuner.backends.child import DEFAULT_GPU_MEMORY_FRACTION

    if not memory_bytes:
        return
    fraction = float(os.environ.get("TUNER_GPU_MEMORY_FRACTION", DEFAULT_GPU_MEMORY_FRACTION))
    limit = fraction * memory_bytes
    for i, shape in enumerate(shapes):
        need = kernel.bytes(shape, dtype)
        if need > limit:
            raise InvalidRequest(
                f"shape {shape} needs {need / 2**30:.1f} GiB of {dtype} inputs and outputs; "
                f"a task may use {limit / 2**30:.1f} GiB of the largest GPU that could run it "
                f"({memory_bytes / 2**30:.0f} GiB)", field=f"shapes.{i}")


# -- hostile input -----------------------------------------------------------------------------

#: text a database cannot store (PostgreSQL rejects NUL) or UTF-8 cannot encode (lone UTF-16
#: surrogates, which JSON's \ud800 escapes can produce)
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
#: a JSON body needs the full check only if it may hold such text or a non-finite number:
#: an escape, NaN/Infinity (Python's json accepts them), a 3-digit exponent or a mantissa long
#: enough to overflow a float (1e999 and 1000...0.0 parse as inf)
_SUSPECT_JSON = re.compile(rb"\\u|NaN|Infinity|[eE][-+]?\d{3}|\d{300}")
_BAD_TEXT_MSG = ("text with a NUL character or a lone UTF-16 surrogate cannot be stored; send "
                 "valid Unicode")


def _printable(text: str) -> str:
    """Text safe to put in a JSON response (surrogates as backslash escapes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _query_problem(query_string: bytes) -> tuple[list[str | int], str] | None:
    # parsed as Starlette parses it for the routes
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if _BAD_TEXT.search(name) or _BAD_TEXT.search(value):
            return ["query", _printable(name)], f"query parameter {_printable(name)!r}: " \
                + _BAD_TEXT_MSG
    return None


def _json_problem(document: Any) -> tuple[list[str | int], str] | None:
    """The first bad string (value or key) or non-finite number, with its location."""
    stack: list[tuple[list[str | int], Any]] = [(["body"], document)]
    while stack:  # iterative: a deeply nested body must not exhaust the stack
        loc, value = stack.pop()
        if isinstance(value, str) and _BAD_TEXT.search(value):
            return loc, _BAD_TEXT_MSG
        if isinstance(value, float) and not math.isfinite(value):
            return loc, "NaN and infinite numbers are not accepted; send a finite number"
        if isinstance(value, dict):
            for key, item in reversed(value.items()):
                if _BAD_TEXT.search(key):
                    return [*loc, _printable(key)], "a key: " + _BAD_TEXT_MSG
                stack.append(([*loc, key], item))
        elif isinstance(value, list):
            stack.extend(([*loc, i], item) for i, item in reversed(list(enumerate(value))))
    return None


def _body_problem(body: bytes) -> tuple[list[str | int], str] | None:
    if not _SUSPECT_JSON.search(body):
        return None
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the route's own parsing answers it (400 or 422)
    return _json_problem(document)


def _is_json(scope: Scope) -> bool:
    """Whether FastAPI will parse the body as JSON (it does without a content type too)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            kind = value.split(b";")[0].strip().lower()
            return kind.startswith(b"application/") and (kind == b"application/json"
                                                         or kind.endswith(b"+json"))
    return True


class HostileInputGuard(HttpMiddleware):
    """ASGI middleware: a 422 naming the field, before any route runs, for a path, query
    parameter or JSON body field holding a NUL or a lone surrogate, and for NaN or infinite
    numbers in a JSON body. Each would otherwise reach the database or the response encoder
    and end as a 500 (PostgreSQL refuses NUL, UTF-8 refuses surrogates, JSON refuses NaN)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem: tuple[list[str | int], str] | None = None
        if _BAD_TEXT.search(scope.get("path", "")):
            problem = ["path"], "the path: " + _BAD_TEXT_MSG
        problem = problem or _query_problem(scope.get("query_string", b""))
        if problem is None and scope["method"] in ("POST", "PUT", "PATCH") and _is_json(scope):
            body, receive = await _buffered(receive)
            problem = _body_problem(body)
        if problem is None:
            await self.app(scope, receive, send)
            return
        loc, msg = problem
        response = JSONResponse({"detail": [{"loc": loc, "msg": msg, "type": "value_error"}]},
                                status_code=422)
        await response(scope, receive, send)


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body, and a receive that hands it to the app again."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return b"", receive
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay
