"""Tuned configs for clients, matched to the caller's identity (device, kernel source version,
Triton minor version) down a ladder: exact, nearest shape, another Triton minor, another GPU,
the kernel's default. The bulk query can also report what was not exact as misses to tune.

Lookups are answered from the process's serving index (``api/serving.py``): no database query
per lookup; a bulk query's items cost O(candidates of their kernel and dtype) each, the exact
shape found by a dict lookup. Misses are still recorded in the database. While the database is
unreachable, lookups are answered from memory and misses deferred, and the response says so
(``X-Tuner-Database: unavailable``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.models import Example
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from api.deps import ReadAccess, SessionDep, SettingsDep, caller_id, write_refusal
from api.errors import QueryError, as_query_error
from api.schemas import (
    DEVICE_KEY_MAX,
    VERSION_MAX,
    Basis,
    ConfigPublic,
    ConfigQuery,
    ConfigQueryItem,
    ConfigsPublic,
    JobCreate,
    Match,
    MissOutcome,
    StaleConfigPublic,
    StaleConfigsPublic,
    StaleReason,
    Timing,
)
from api.serving import (
    DATABASE_UNAVAILABLE,
    DeferredMiss,
    Group,
    GroupKey,
    ServingIndex,
    serving_index,
)
from api.validation import (
    CLIENT_MEASUREMENTS_ONLY,
    ExternalKernel,
    check_dtype,
    check_external_problem,
    check_shape,
    kernel_for_lookup,
)
from db import repo, views
from db.models import BASES
from search_spaces import get_kernel, kernel_names
from tuner.errors import InvalidRequest
from tuner.identity import Match as MatchKind
from tuner.identity import local_triton_version
from tuner.kernel import TunableKernel, verification_of
from tuner.settings import Settings
from tuner.timing import DEFAULT_TIMING

router = APIRouter(prefix="/configs", tags=["configs"])
IndexDep = Annotated[ServingIndex, Depends(serving_index)]

#: query parameters of GET /configs that are not problem dimensions
_NON_DIMS = {"kernel", "dtype", "device", "kernel_version", "triton_version", "timing"}

#: the example lookup of the OpenAPI document: /docs's "Try it out" starts from it
_EXAMPLE_KERNEL, _EXAMPLE_DIM = "matmul", 4096
DEVICE_EXAMPLE = "cuda:NVIDIA H200:sm90"


def _example(value: str) -> dict[str, Example]:
    """A parameter's example, at the parameter (/docs fills those in, not the schema's)."""
    return {"example": {"value": value}}


def document_dimensions(openapi: dict[str, Any]) -> None:
    """Declare GET /configs's dimensions in the OpenAPI document: they are free-form query
    parameters (each kernel has its own), so the route cannot declare them; here, one optional
    integer parameter per dimension of any registered kernel, so that /docs's "Try it out"
    can send a shape. Only the example kernel's dimensions carry an example (4096): /docs
    fills every example in, and another kernel's dimension would make that lookup a 422."""
    operation = openapi.get("paths", {}).get("/api/v1/configs", {}).get("get")
    if operation is None:
        return
    names = kernel_names()
    example_dims = [d.name for d in get_kernel(_EXAMPLE_KERNEL).dims] if (
        _EXAMPLE_KERNEL in names) else []
    # the example kernel's dimensions first, in its order; then the others as first seen
    users: dict[str, list[TunableKernel]] = {dim: [] for dim in example_dims}
    for name in names:
        kernel = get_kernel(name)
        for d in kernel.dims:
            users.setdefault(d.name, []).append(kernel)
    declared = {p["name"] for p in operation.get("parameters", [])}
    for dim, kernels in users.items():
        if dim in declared:
            continue
        used_by = ", ".join(k.name for k in kernels)
        hi = max(d.hi for k in kernels for d in k.dims if d.name == dim)
        parameter: dict[str, Any] = {
            "name": dim, "in": "query", "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": hi},
            "description": f"dimension {dim} of the problem shape, for {used_by}: give every "
                           "dimension of the kernel and no other (GET /kernels lists them)"}
        if dim in example_dims:
            parameter["example"] = _EXAMPLE_DIM
        operation.setdefault("parameters", []).append(parameter)


#: a kernel a lookup names: registered here, or one only clients measure
LookupKernel = TunableKernel | ExternalKernel


def _verification(kernel: LookupKernel) -> str | None:
    if isinstance(kernel, ExternalKernel):
        return CLIENT_MEASUREMENTS_ONLY
    return verification_of(kernel)


def _public(served: repo.Served, kernel: LookupKernel, dtype: str,
            shape: dict[str, int], timing: str = DEFAULT_TIMING) -> ConfigPublic:
    row = served.row
    distance = None if served.match == MatchKind.EXACT else round(served.distance, 4)
    return ConfigPublic(match=cast(Match, served.match), kernel=kernel.name, dtype=dtype,
                        shape=shape, device=row.device_key, config=row.config, ms=row.p50_ms,
                        tflops=row.tflops, tuned_shape=row.shape, distance=distance,
                        kernel_version=row.kernel_version, triton_version=row.triton_version,
                        timing=cast(Timing, row.timing), timing_fallback=row.timing != timing,
                        measured=row.measured, verification=_verification(kernel),
                        basis=cast(Basis | None, row.basis if row.basis in BASES else None),
                        default_ms=row.default_ms, search_ms=row.search_ms,
                        noise_margin=row.noise_margin)


class Lookup:
    """Answers the lookups of one request from the serving index, taking each (kernel,
    kernel version, dtype)'s group once: a bulk query sees one state of the store."""

    def __init__(self, index: ServingIndex) -> None:
        self.index = index
        self._groups: dict[GroupKey, Group] = {}
        #: whether a group came from memory because the database was unreachable
        self.from_memory = False

    def registered_version(self, kernel: LookupKernel) -> str | None:
        """The version workers tune (None: an external kernel, which no worker tunes)."""
        if isinstance(kernel, ExternalKernel):
            return None
        return self.index.registered_version(kernel)

    def key(self, kernel: LookupKernel, dtype: str, kernel_version: str | None) -> GroupKey:
        if isinstance(kernel, ExternalKernel):
            return kernel.name, kernel.version, dtype
        return kernel.name, kernel_version or self.index.registered_version(kernel), dtype

    def answer(self, kernel: LookupKernel, dtype: str, shape: dict[str, int], device: str | None,
               kernel_version: str | None, triton_version: str | None,
               timing: str = DEFAULT_TIMING) -> ConfigPublic:
        key = self.key(kernel, dtype, kernel_version)
        group = self._groups.get(key)
        if group is None:
            group, from_memory = self.index.lookup(*key)
            self._groups[key] = group
            self.from_memory |= from_memory
        return answer_from(group, kernel, dtype, shape, device, triton_version, timing)


def answer_from(group: Group, kernel: LookupKernel, dtype: str, shape: dict[str, int],
                device: str | None, triton_version: str | None,
                timing: str = DEFAULT_TIMING) -> ConfigPublic:
    """The answer to one lookup from its (kernel, kernel version, dtype)'s candidates, for a
    caller who wants configs timed ``timing`` (``repo.serve_timed``); for an external kernel
    with none, ``match`` ``none`` (no config: its own autotuning decides)."""
    served = group.serve(shape, device, triton_version, timing)
    if served is not None:
        return _public(served, kernel, dtype, shape, timing)
    if isinstance(kernel, ExternalKernel):
        return ConfigPublic(match=cast(Match, MatchKind.NONE), kernel=kernel.name, dtype=dtype,
                            shape=shape, device=device, config={}, kernel_version=kernel.version,
                            verification=CLIENT_MEASUREMENTS_ONLY)
    default = kernel.default_config(shape, dtype).to_dict()
    return ConfigPublic(match=cast(Match, MatchKind.DEFAULT), kernel=kernel.name, dtype=dtype,
                        shape=shape, device=device, config=default,
                        verification=verification_of(kernel))


def _query_shape(request: Request, kernel: LookupKernel, dtype: str) -> dict[str, int]:
    """The problem shape given as query parameters (``M=4096&N=4096&K=4096``)."""
    raw: dict[str, Any] = {}
    for name, value in request.query_params.items():
        if name in _NON_DIMS:
            continue
        try:
            raw[name] = int(value)
        except ValueError:
            raise QueryError(f"{name}={value!r} must be an integer", field=name) from None
    try:
        if isinstance(kernel, ExternalKernel):
            return check_external_problem(raw, dtype, "", "dtype")
        return check_shape(kernel, raw, "")
    except InvalidRequest as exc:
        raise as_query_error(exc) from None


@router.get("", response_model=ConfigPublic, dependencies=[ReadAccess],
            responses={404: {"model": ConfigPublic,
                             "description": "nothing tuned applies: the body carries the "
                                            "kernel's default (``match: default``)"}})
async def get_config(request: Request, response: Response, index: IndexDep,
               kernel: str = Query(max_length=100, openapi_examples=_example("matmul")),
               dtype: str = Query(max_length=20, openapi_examples=_example("float16")),
               device: str | None = Query(None, max_length=DEVICE_KEY_MAX,
                                          openapi_examples=_example(DEVICE_EXAMPLE),
                                          description="the caller's device key"),
               kernel_version: str | None = Query(
                   None, min_length=1, max_length=VERSION_MAX,
                   description="hash of the caller's kernel source; default: the kernel "
                               "registered here"),
               triton_version: str | None = Query(None, min_length=1, max_length=VERSION_MAX,
                                                  openapi_examples=_example("3.6.0"),
                                                  description="the caller's Triton version"),
               timing: Annotated[Timing, Query(
                   description="the timing method to choose configs by (eager-flushed, "
                               "cuda-graph, eager-hot)")] = "eager-flushed",
               ) -> Any:
    """The best config for the caller's kernel, dtype and identity, and the shape given as one
    query parameter per dimension (the kernel's, from GET /kernels), e.g.
    ``?kernel=matmul&dtype=float16&M=4096&N=4096&K=4096`` plus
    ``&device=cuda:NVIDIA%20H200:sm90&triton_version=3.6.0``.

    ``match`` says how the config relates to the caller:

    - ``exact``: tuned on ``device`` for this kernel version, the caller's Triton major.minor
      (when ``triton_version`` is given) and this shape;
    - ``nearest``: the same, for the nearest tuned shape (``tuned_shape``, log2 ``distance``);
    - ``other-triton``: tuned on ``device`` under another Triton minor version (the exact shape
      first, else the nearest);
    - ``other-device``: tuned on another real GPU, named by ``device`` (the same shape first,
      else the nearest). Results of the CPU interpreter and of replay tables are never served
      for another device;
    - ``default``: nothing tuned applies: 404, whose body carries the kernel's default config.

    Without ``device`` the caller's GPU is unknown: ``other-device`` at best. A config tuned
    for another ``kernel_version`` (default: the kernel registered here) is never served.

    ``timing`` (default ``eager-flushed``) picks the configs timed that way (``cuda-graph``:
    replayed in a CUDA graph, as serving engines run decode-time kernels; ``eager-hot``:
    eager, no L2 flush); the answer's ``timing`` says how the served config was timed. Where
    no config timed the asked way matches as well as one timed another way (the exact shape
    on the caller's device timed ``eager-flushed`` against a nearest shape timed
    ``cuda-graph``), the better match is served, labelled ``timing_fallback: true``.

    While the database is unreachable the answer comes from this process's memory (the
    configs as last loaded) with ``X-Tuner-Database: unavailable``; a kernel version and dtype
    never loaded is a 503 that says so.
    """
    try:
        k = kernel_for_lookup(kernel, kernel_version, "kernel")
        if not isinstance(k, ExternalKernel):
            check_dtype(k, dtype)
    except InvalidRequest as exc:
        raise as_query_error(exc) from None
    shape = _query_shape(request, k, dtype)
    # on the event loop: a thread pool's hand-offs cost more than the lookup; the database
    # (a version check every refresh_s, a group's load) is read in the pool
    key = Lookup(index).key(k, dtype, kernel_version)
    found = index.cached(*key)
    if found is None:
        found = await run_in_threadpool(index.lookup, *key)
    group, from_memory = found
    headers = DATABASE_UNAVAILABLE if from_memory else None
    result = answer_from(group, k, dtype, shape, device, triton_version, timing)
    if result.match in (MatchKind.DEFAULT, MatchKind.NONE):
        return JSONResponse(result.model_dump(), status_code=404, headers=headers)
    if headers:
        response.headers.update(headers)
    return result


def _checked(items: Sequence[ConfigQueryItem]) -> list[tuple[LookupKernel, dict[str, int]]]:
    """Each item's kernel and validated shape; the first bad item is a 422 naming it."""
    checked: list[tuple[LookupKernel, dict[str, int]]] = []
    for i, item in enumerate(items):
        k = kernel_for_lookup(item.kernel, item.kernel_version, f"items.{i}.kernel")
        if isinstance(k, ExternalKernel):
            checked.append((k, check_external_problem(item.shape, item.dtype,
                                                      f"items.{i}.shape", f"items.{i}.dtype")))
            continue
        check_dtype(k, item.dtype, f"items.{i}.dtype")
        checked.append((k, check_shape(k, item.shape, f"items.{i}.shape")))
    return checked


def _limits(settings: Settings) -> repo.MissLimits:
    return repo.MissLimits(rate_per_client=settings.miss_rate_per_client,
                           cap_per_kernel=settings.miss_cap_per_kernel,
                           trials=settings.miss_trials)


@router.post("/query", response_model=ConfigsPublic, dependencies=[ReadAccess])
def query_configs(body: ConfigQuery, request: Request, response: Response, session: SessionDep,
                  settings: SettingsDep, index: IndexDep) -> ConfigsPublic:
    """Many lookups in one request (model start-up): 200 with one answer per item, in order,
    each matched to the item's ``device``, ``kernel_version`` and ``triton_version`` as
    GET /configs does (``exact``, ``nearest``, ``other-triton``, ``other-device``, or
    ``default``: never a 404). At most 4,096 items (more: a 422 naming ``items``). A malformed
    item is a 422 naming it (``["body", "items", i, ...]``), and then nothing is recorded. Each
    item's ``timing`` picks configs as GET /configs's does (``timing_fallback``: timed another
    way).

    With ``report_misses``, every item not answered ``exact`` (or answered with a config
    timed another way than it asked: ``timing_fallback``) is recorded as a miss
    (GET /misses) and, when it can be, queued once as a tuning job on the caller's ``device``;
    its answer's ``miss`` says what became of it: ``queued`` (a job was created now),
    ``pending`` (its job is queued or running), ``tuned`` (its job succeeded), ``failed`` (its
    job failed or was cancelled; reported an hour after that, it is queued again), or recorded
    only: ``rate-limited`` (this ``client`` queued ``TUNER_MISS_RATE_PER_CLIENT`` misses in the
    last hour), ``capped`` (the kernel has ``TUNER_MISS_CAP_PER_KERNEL`` misses queued or
    running), ``kernel-version-mismatch`` (the caller's kernel is not the one registered here:
    tuning would tune other code), ``no-device`` (no device to tune on), ``unknown-device``
    (no worker has ever registered the caller's ``device``), ``read-only`` (the caller may
    not queue: when API keys are configured, queueing needs a key with write access; a
    read-only key's or no key's misses are recorded, and still shown on the dashboard), or
    ``deferred`` (the database is unreachable: the report is kept in this process's memory,
    and recorded once the database answers).

    While the database is unreachable, answers come from this process's memory, as GET
    /configs's do, with ``X-Tuner-Database: unavailable``.

    The rate limit counts the caller's API key (a digest of it), else its address;
    ``client`` only names the caller in GET /misses.
    """
    lookup = Lookup(index)
    client = caller_id(settings, request) if body.report_misses else ""
    may_queue = write_refusal(settings, request.headers) is None
    data = []
    for item, (k, shape) in zip(body.items, _checked(body.items), strict=True):
        answer = lookup.answer(k, item.dtype, shape, item.device, item.kernel_version,
                               item.triton_version, item.timing)
        if body.report_misses and (answer.match != MatchKind.EXACT or answer.timing_fallback):
            answer.miss = cast(MissOutcome, index.report_miss(session, DeferredMiss(
                device_key=item.device, kernel=k.name,
                kernel_version=lookup.key(k, item.dtype, item.kernel_version)[1],
                registered_version=lookup.registered_version(k),
                dtype=item.dtype, shape=shape, client=client, limits=_limits(settings),
                label=body.client, may_queue=may_queue, timing=item.timing)))
        data.append(answer)
    if lookup.from_memory or any(answer.miss == "deferred" for answer in data):
        response.headers.update(DATABASE_UNAVAILABLE)
    return ConfigsPublic(data=data, count=len(data))



def registered_versions() -> dict[str, str]:
    """Each registered kernel's version now (the hash of its source)."""
    return {name: get_kernel(name).version for name in kernel_names()}


def stale_public(stale: views.StaleBest) -> StaleConfigPublic:
    """A stale best, with the job body that re-tunes it on its device (the budget of the job
    that tuned it, else the default; ``force``: its stored best must not answer it)."""
    row = stale.row
    retune = None
    if stale.retunable:
        budget = {"trials": stale.budget_trials} if stale.budget_trials else {}
        retune = JobCreate.model_validate({"kernel": row.kernel, "dtype": row.dtype,
                                           "shapes": [row.shape], "device": row.device_key,
                                           "force": True, "budget": budget,
                                           "timing": row.timing})
    return StaleConfigPublic(
        id=row.id, kernel=row.kernel, dtype=row.dtype, shape=row.shape, device=row.device_key,
        config=row.config, ms=row.p50_ms, measured=row.measured,
        kernel_version=row.kernel_version, current_kernel_version=stale.current_kernel_version,
        triton_version=row.triton_version, current_triton_version=stale.current_triton_version,
        reasons=cast(list[StaleReason], list(stale.reasons)), updated_at=row.updated_at,
        retune=retune, timing=cast(Timing, row.timing))


def find_stale(session: Session, kernel: str | None = None) -> list[views.StaleBest]:
    """The stale bests (``views.stale_bests``) against the kernels registered here and, for a
    device whose Triton is not on record, the Triton installed here."""
    return views.stale_bests(session, kernel_versions=registered_versions(),
                             installed_triton=local_triton_version(), kernel=kernel)


@router.get("/stale", response_model=StaleConfigsPublic, dependencies=[ReadAccess])
def stale_configs(session: SessionDep,
                  kernel: str | None = Query(None, max_length=100, examples=["matmul"],
                                             description="only this kernel's")
                  ) -> StaleConfigsPublic:
    """Stored bests that no longer match what runs, one per device, kernel, dtype and shape,
    with why (``reasons``):

    - ``kernel-version``: the kernel's source changed since it was tuned (its stored
      ``kernel_version`` is not the registered kernel's ``current_kernel_version``): GET
      /configs no longer serves it to callers of the current code;
    - ``triton-version``: its device runs another Triton minor version now
      (``current_triton_version``: as the device's workers registered it, else the Triton
      installed here); it is served only as ``other-triton``.

    A shape already tuned again for the current kernel and Triton is not listed. ``retune`` is
    the body of the POST /jobs that tunes it again on its device."""
    data = [stale_public(s) for s in find_stale(session, kernel)]
    return StaleConfigsPublic(data=data, count=len(data))
