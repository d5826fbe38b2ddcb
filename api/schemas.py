"""Request and response models (FastAPI-template naming: XCreate, XPublic, XsPublic)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from db.repo.trials import GPU_STATE_FIELDS, TRIAL_FIELDS
from tuner.gpu_state import throttle_reasons


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- examples of the OpenAPI document (/docs shows them; "Try it out" starts from them) ----------

_GPU = "cuda:NVIDIA H200:sm90"
_SHAPE = {"M": 4096, "N": 4096, "K": 4096}
_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
           "num_stages": 3}
_JOB_ID = "3f2b9c0e8d7a4b6f9e1d2c3b4a596877"
_WHEN = "2026-11-23T08:00:00Z"
_TASK_EXAMPLE = {"id": 1, "shape": _SHAPE, "status": "succeeded", "trials_done": 48,
                 "budget_trials": 48, "best_ms": 0.1763, "best_measured": "retimed",
                 "best_config": _CONFIG, "baseline_ms": 0.1881, "baseline_name": "torch",
                 "vs_baseline": 1.067, "incumbent_ms": None, "best_note": None,
                 "default_config": {**_CONFIG, "BLOCK_N": 128}, "default_ms": 0.1902,
                 "best_basis": "search", "noise_margin": 0.012,
                 "outcome_counts": {"ok": 41, "pruned": 5, "out_of_resources": 2},
                 "device": _GPU, "attempts": 1, "error": None}
_JOB_EXAMPLE = {"id": _JOB_ID, "kernel": "matmul", "kernel_version": "363e2228ce72",
                "dtype": "float16", "status": "succeeded", "strategy": "auto",
                "budget_trials": 48, "budget_seconds": None, "device": _GPU,
                "created_at": _WHEN, "started_at": "2026-11-23T08:00:02Z",
                "finished_at": "2026-11-23T08:01:40Z", "error": None, "reason": None,
                "url": f"/api/v1/jobs/{_JOB_ID}", "waiting": None, "verification": "reference",
                "tasks": [_TASK_EXAMPLE]}
_TRIAL_EXAMPLE = {"task_id": 1, "number": 7, "config": _CONFIG, "outcome": "ok",
                  "p20_ms": 0.1751, "p50_ms": 0.1768, "p80_ms": 0.1790,
                  "retimed_p20_ms": 0.1755, "retimed_p50_ms": 0.1763, "retimed_p80_ms": 0.1771,
                  "gpu": {"sm_mhz": 1980, "mem_mhz": 3201, "power_w": 612.0, "temp_c": 58,
                          "throttle": 0, "throttle_reasons": []},
                  "error": None, "compile_s": 1.9}
_CONFIG_EXAMPLE = {"match": "exact", "kernel": "matmul", "dtype": "float16", "shape": _SHAPE,
                   "device": _GPU, "config": _CONFIG, "ms": 0.1763, "tflops": 779.6,
                   "tuned_shape": _SHAPE, "distance": None, "kernel_version": "363e2228ce72",
                   "triton_version": "3.6.0", "miss": None, "verification": "reference",
                   "basis": "search", "default_ms": 0.1902, "search_ms": 0.1763,
                   "noise_margin": 0.012}
_MISS_EXAMPLE = {"id": 1, "kernel": "matmul", "kernel_version": "363e2228ce72",
                 "dtype": "float16", "shape": {"M": 384, "N": 4096, "K": 4096}, "device": _GPU,
                 "count": 3, "first_seen_at": _WHEN, "last_seen_at": "2026-11-23T08:05:00Z",
                 "last_client": "vllm-worker-0", "status": "queued", "job_id": _JOB_ID,
                 "job_url": f"/api/v1/jobs/{_JOB_ID}", "note": None}
_KERNEL_EXAMPLE = {"name": "matmul", "version": "363e2228ce72",
                   "description": "C = A @ B, grouped tile order", "source": "builtin",
                   "ref": "search_spaces.matmul:KERNEL",
                   "dims": [{"name": n, "min": 1, "max": 65536, "doc": ""} for n in "MNK"],
                   "dtypes": ["float16", "bfloat16", "float32"],
                   "space": [{"name": "BLOCK_M", "kind": "pow2",
                              "values": [16, 32, 64, 128, 256]}],
                   "space_size": 5120, "verification": "reference"}
_WORKER_EXAMPLE = {"id": "gpu0-host-1234", "host": "host", "pid": 1234, "device": _GPU,
                   "kind": "cuda", "gpu_index": 0,
                   "gpu_uuid": "GPU-8d6a2f0c-1111-2222-3333-444455556666", "status": "busy",
                   "task_id": 1, "error": None, "started_at": _WHEN,
                   "last_seen_at": "2026-11-23T08:01:00Z", "seen_seconds_ago": 2.1,
                   "alive": True}
_DEVICE_EXAMPLE = {"key": _GPU, "kind": "cuda", "name": "NVIDIA H200",
                   "compute_capability": "9.0", "sm_count": 132, "memory_bytes": 150_000_000_000,
                   "triton_version": "3.6.0", "torch_version": "2.11.0", "copy_gbps": 4012.0,
                   "matmul_tflops": 721.0, "copy_gbps_spread": 0.01,
                   "matmul_tflops_spread": 0.02, "calibration_runs": 5, "calibrated_at": _WHEN,
                   "last_seen_at": "2026-11-23T08:01:00Z", "seen_seconds_ago": 2.1,
                   "workers": [_WORKER_EXAMPLE]}


def _examples(*examples: dict[str, Any]) -> ConfigDict:
    """A model's examples in its JSON schema (the OpenAPI document's, shown by /docs)."""
    return ConfigDict(json_schema_extra={"examples": list(examples)})


#: what every ``verification`` field says (its value: ``tuner.kernel.verification_of``)
VERIFICATION_DOC = ("how the kernel's configs were checked: ``reference`` (their outputs were "
                    "compared with the kernel's reference function) or ``unverified: no "
                    "reference`` (a user's kernel without one: its configs were only compared "
                    "with each other and checked for NaN/Inf)")


#: the largest integer a path or query parameter takes (PostgreSQL's ``integer`` columns)
INT32_MAX = 2**31 - 1
#: the longest wall-clock budget per shape: a year (an infinite one is no budget: leave it out)
MAX_BUDGET_SECONDS = 365 * 86400.0


class Budget(Strict):
    trials: int = Field(48, ge=1, le=100_000, description="trials per shape")
    seconds: float | None = Field(None, gt=0, le=MAX_BUDGET_SECONDS, allow_inf_nan=False,
                                  description="wall-clock limit per shape; none: no limit")


JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
#: how a time was taken (``tuner/timing.py``: ``TIMING_METHODS``)
Timing = Literal["eager-flushed", "cuda-graph", "eager-hot"]
#: what every ``timing`` field says
TIMING_DOC = ("how the configs are timed: ``eager-flushed`` (eager launches, the L2 cache "
              "flushed before each: the default), ``cuda-graph`` (launches captured in a CUDA "
              "graph and replayed, as serving engines run decode-time kernels; no flush) or "
              "``eager-hot`` (eager launches back to back, no flush)")
#: the longest device key the database stores (``devices.key``)
DEVICE_KEY_MAX = 200


class JobCreate(Strict):
    model_config = _examples({"kernel": "matmul", "dtype": "float16", "shapes": [_SHAPE],
                              "budget": {"trials": 48}, "device": _GPU})

    kernel: str = Field(max_length=100, examples=["matmul"])
    dtype: str = Field(max_length=20, examples=["float16"])
    shapes: list[dict[str, Any]] = Field(min_length=1, examples=[[{"M": 4096, "N": 4096,
                                                                   "K": 4096}]])
    budget: Budget = Field(default_factory=Budget)  # type: ignore[arg-type]
    strategy: str = Field("auto", max_length=40)
    force: bool = Field(False, description="tune again even where a config is stored")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    device: str | None = Field(None, max_length=DEVICE_KEY_MAX,
                               description="target device key (GET /devices); default: any "
                                           "worker. A key no worker has registered is refused "
                                           "(422 naming ``device``, listing the known ones) "
                                           "unless ``future_device``")
    future_device: bool = Field(False, description="``device`` is meant for a worker that has "
                                "not registered yet: queue the job for it instead of refusing "
                                "the key as a typo")
    backend: Literal["auto", "cuda", "interpret"] = "auto"
    timing: Timing = Field("eager-flushed", description=TIMING_DOC + "; ``cuda-graph`` needs a "
                           "GPU worker (the CPU interpreter cannot replay CUDA graphs)")


class JobCreated(BaseModel):
    """The answer to a submission. ``deduplicated``: an identical queued or running job was
    returned instead of a new one. ``answered_from_store``: shapes already tuned for the target
    device, whose tasks were created as succeeded (all of them: the job is ``succeeded`` and
    the status code is 200)."""

    model_config = _examples({"id": _JOB_ID, "status": "queued", "url": f"/api/v1/jobs/{_JOB_ID}",
                              "deduplicated": False, "answered_from_store": 0})

    id: str
    status: str
    url: str
    deduplicated: bool = False
    answered_from_store: int = 0


#: which measurement a time is (``db.models.MEASURED``)
Measured = Literal["trial", "retimed"]
#: what a stored best is against the kernel's default (``db.models.BASES``)
Basis = Literal["search", "default"]
#: what ``basis`` says, for every field that carries it
BASIS_DOC = ("the config against the kernel's default (its default config, or the best of "
             "the user's config list), both re-timed side by side in one process: ``search`` "
             "(it beat the default by more than the noise margin) or ``default`` (it is the "
             "default: the search found nothing faster beyond the noise); None: never "
             "compared (stored before this was recorded, imported, or an interrupted search)")


class TaskPublic(BaseModel):
    """One shape of a job. ``best_ms`` is the best config's re-timed p50 once the finalists
    were re-timed side by side (``best_measured`` ``retimed``), a trial's own p50 before
    (``trial``). ``vs_baseline``: how many times faster than ``baseline_name`` (torch) the best
    is, ONLY from the baseline timed interleaved with the finalists in the same process
    (``baseline_ms``); None otherwise. ``incumbent_ms``: the stored best re-timed beside the
    finalists; ``best_note``: what became of the stored best. ``default_config`` and
    ``default_ms``: the kernel's default re-timed beside the finalists; ``best_basis``: what
    the task stored against it, judged by ``noise_margin`` (0.02: 2%)."""

    id: int
    shape: dict[str, int]
    status: str
    trials_done: int
    budget_trials: int
    best_ms: float | None
    best_measured: Measured | None = None
    best_config: dict[str, int] | None
    baseline_ms: float | None = None
    baseline_name: str | None = None
    vs_baseline: float | None = None
    incumbent_ms: float | None = None
    best_note: str | None = None
    default_config: dict[str, int] | None = None
    default_ms: float | None = None
    best_basis: Basis | None = Field(default=None, description=BASIS_DOC)
    noise_margin: float | None = None
    outcome_counts: dict[str, int]
    device: str | None
    attempts: int
    error: str | None
    timing: Timing | None = Field(None, description="how its trials were timed (its job's "
                                  "method; a replay table's own); None until it runs")
    stop_reason: str | None = Field(None, description="why its search stopped (budget, time, "
                                    "converged, no expected gain, near roofline, space "
                                    "exhausted, ...); None before it finished")
    phases: dict[str, float] | None = Field(
        None, description="where its wall time went, seconds by phase: queued (submission to "
        "claim), setup, compile_wait (the GPU waiting for the compile pool), compile_child, "
        "verifying (each config's run against the reference), measuring, retiming, storing, "
        "search (the strategy), total (claim to finish); and beside them compile_ahead_cpu "
        "(the pool's compile seconds), compiled_ahead and reused_compiles (configs), "
        "warmups_long/short/redone (timings), timing_child (the child's own timing seconds) "
        "and compile_wait_queued (the part of compile_wait a config spent queued for a "
        "compile process); None before it finished")


class JobPublic(BaseModel):
    model_config = _examples(_JOB_EXAMPLE)

    id: str
    kernel: str
    kernel_version: str
    dtype: str
    status: str
    strategy: str
    budget_trials: int
    budget_seconds: float | None
    device: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    reason: str | None = Field(None, description="why the service queued it on its own (a "
                               "re-tune after a Triton upgrade); None for a submitted job")
    url: str
    waiting: str | None = Field(None, description="why a queued job has not started: no live "
                                "worker has its device (said once it waited a lease length)")
    verification: str | None = Field(None, description=VERIFICATION_DOC + "; None when the "
                                     "job's kernel is not registered here")
    timing: Timing = Field("eager-flushed", description=TIMING_DOC)
    tasks: list[TaskPublic]


class JobsPublic(BaseModel):
    model_config = _examples({"data": [_JOB_EXAMPLE], "count": 1})

    data: list[JobPublic]
    count: int


def _gpu_state_model() -> type[BaseModel]:
    """``GpuStatePublic``: the GPU fields of ``TRIAL_FIELDS`` and their reasons' names."""
    fields: dict[str, Any] = {f.name: (f.type, ...) for f in TRIAL_FIELDS if f.source == "gpu"}
    return create_model(
        "GpuStatePublic", __module__=__name__, **fields, throttle_reasons=(list[str], ...),
        __doc__=("The GPU's state sampled right after a trial's timing (NVML; a field None where "
                 "the\ndriver does not report it). ``throttle``: NVML's clock throttle reasons "
                 "bitmask,\n``throttle_reasons`` its names ([]: not throttled)."))


def _trial_model(gpu_state: type[BaseModel]) -> type[BaseModel]:
    """``TrialPublic``: the public fields of ``TRIAL_FIELDS`` in their order, the GPU's as one
    ``gpu`` object where the first of them stands; the re-timing and the GPU state (added to
    the API after the others) may be left out."""
    fields: dict[str, Any] = {}
    for f in TRIAL_FIELDS:
        if f.source == "gpu":
            fields.setdefault("gpu", (gpu_state | None, None))
        elif f.public:
            fields[f.name] = (f.type, None if f.source == "retimed" else ...)
    return create_model(
        "TrialPublic", __module__=__name__, **fields,
        __doc__=("One trial: ``p20_ms``/``p50_ms``/``p80_ms`` are its own timing; a finalist's "
                 "re-timing\nbeside the other finalists at the end of the search is "
                 "``retimed_*`` (None for the other\ntrials); ``gpu``: the GPU's state as it "
                 "was timed (None on the interpreter)."))


# a trial's fields are declared once, in ``db.repo.trials.TRIAL_FIELDS``: these models are
# made from them
if TYPE_CHECKING:
    class GpuStatePublic(BaseModel):
        def __init__(self, **data: Any) -> None: ...

    class TrialPublic(BaseModel):
        def __init__(self, **data: Any) -> None: ...
else:
    GpuStatePublic = _gpu_state_model()
    TrialPublic = _trial_model(GpuStatePublic)


def gpu_state_public(trial: Any) -> GpuStatePublic | None:
    """The GPU state of a trial (``Trial`` or any object with its columns); None where none
    was recorded (the interpreter, or a trial measured before it was)."""
    values = {name: getattr(trial, name) for name in GPU_STATE_FIELDS}
    if all(v is None for v in values.values()):
        return None
    return GpuStatePublic(**values, throttle_reasons=throttle_reasons(values["throttle"]))


def trial_public(trial: Any) -> TrialPublic:
    """A stored trial (``Trial``) as the API shows it."""
    return TrialPublic(**{name: getattr(trial, name) for name in TrialPublic.model_fields
                          if name != "gpu"}, gpu=gpu_state_public(trial))


class TrialsPublic(BaseModel):
    model_config = _examples({"task_id": 1, "data": [_TRIAL_EXAMPLE], "count": 1})

    task_id: int | None = None  # set when the list is one task's
    data: list[TrialPublic]
    count: int


#: how an answer of GET /configs relates to the caller's identity (best first)
Match = Literal["exact", "nearest", "other-triton", "other-device", "default", "none"]
#: what became of a reported miss (``report_misses``; ``deferred``: kept in memory while the
#: database is unreachable, recorded once it answers)
MissOutcome = Literal["queued", "pending", "tuned", "rate-limited", "capped",
                      "kernel-version-mismatch", "no-device", "unknown-device",
                      "read-only", "failed", "deferred", "unregistered"]
#: the status of a recorded miss (GET /misses)
MissStatus = Literal["queued", "running", "tuned", "failed", "rate-limited", "capped",
                     "kernel-version-mismatch", "no-device", "unknown-device", "read-only",
                     "unregistered"]
#: the longest kernel or Triton version the database stores
VERSION_MAX = 40


class ConfigPublic(BaseModel):
    """A config for one lookup. ``match``: ``exact`` (tuned on the caller's device for its
    kernel version, Triton minor version and shape), ``nearest`` (same, nearest tuned shape:
    ``tuned_shape`` and its log2 ``distance``), ``other-triton`` (the caller's device under
    another Triton minor version), ``other-device`` (another GPU: ``device`` says which),
    ``default`` (the kernel's default config; nothing tuned applies), ``none`` (a kernel this
    service has no code for, named by its qualified name with its ``kernel_version``, and
    nothing measured applies: ``config`` is empty, its own autotuning decides). ``measured``:
    how the served config's time was taken: ``retimed`` (a worker re-timed it beside the
    other finalists), ``trial`` (its trial's timing), ``client-measured`` (a model's process
    measured it with Triton's own autotuning, ``tuner.install()``: ranked below a worker's).
    ``miss``: with
    ``report_misses``, what became of a lookup that was not ``exact``. ``basis``: a served
    stored best against the kernel's default, ``default`` where the default itself was kept
    because the search found nothing faster beyond the noise; with the default's
    (``default_ms``) and the search's best (``search_ms``) re-timed p50 and the
    ``noise_margin`` (0.02: 2%) it was judged by."""

    model_config = _examples(_CONFIG_EXAMPLE)

    match: Match
    kernel: str
    dtype: str
    shape: dict[str, int]
    device: str | None
    config: dict[str, int]
    ms: float | None = None
    tflops: float | None = None
    tuned_shape: dict[str, int] | None = None
    distance: float | None = None
    kernel_version: str | None = None
    triton_version: str | None = None
    miss: MissOutcome | None = None
    measured: str | None = Field(default=None, description="retimed, trial or client-measured "
                                 "(see above); None for the kernel's default")
    verification: str | None = Field(None, description=VERIFICATION_DOC)
    timing: Timing | None = Field(default=None, description="how the served config was "
                                  "timed (None: the kernel's default, never timed)")
    timing_fallback: bool = Field(default=False, description="the config was timed another "
                                  "way than the lookup asked for: none timed its way matched "
                                  "as well")
    basis: Basis | None = Field(default=None, description=BASIS_DOC)
    default_ms: float | None = None
    search_ms: float | None = None
    noise_margin: float | None = None


class ConfigQueryItem(Strict):
    kernel: str = Field(max_length=100, examples=["matmul"])
    dtype: str = Field(max_length=20, examples=["float16"])
    shape: dict[str, Any] = Field(examples=[{"M": 4096, "N": 4096, "K": 4096}])
    device: str | None = Field(None, max_length=DEVICE_KEY_MAX,
                               examples=["cuda:NVIDIA H200:sm90"],
                               description="the caller's device key (GET /devices); without "
                                           "it, only other GPUs' configs can be served")
    kernel_version: str | None = Field(None, min_length=1, max_length=VERSION_MAX,
                                       description="hash of the caller's kernel source; "
                                                   "default: the kernel registered here")
    triton_version: str | None = Field(None, min_length=1, max_length=VERSION_MAX,
                                       examples=["3.6.0"],
                                       description="the caller's Triton; configs of another "
                                                   "minor version are ``other-triton``")
    timing: Timing = Field("eager-flushed", description="the timing method the caller wants "
                           "its configs chosen by (GET /configs's ``timing``)")


class ConfigQuery(Strict):
    model_config = _examples({"items": [{"kernel": "matmul", "dtype": "float16", "shape": _SHAPE,
                                         "device": _GPU, "triton_version": "3.6.0"}],
                              "report_misses": True, "client": "vllm-worker-0"})

    items: list[ConfigQueryItem] = Field(min_length=1, max_length=4_096)
    report_misses: bool = Field(False, description="record every item not answered "
                                "``exact`` as a miss and queue a tuning job for it on the "
                                "caller's device (each answer's ``miss`` says what became "
                                "of it; queueing needs write access when keys are "
                                "configured, else ``read-only``)")
    client: str | None = Field(None, min_length=1, max_length=100,
                               description="a name for the caller, shown in GET /misses; the "
                                           "per-client rate limit counts the API key "
                                           "presented, else the caller's address, never this "
                                           "name")


class ConfigsPublic(BaseModel):
    model_config = _examples({"data": [_CONFIG_EXAMPLE], "count": 1})

    data: list[ConfigPublic]
    count: int


class MissPublic(BaseModel):
    """A lookup that clients reported as not served exactly. ``status``: its job's (queued,
    running, tuned, failed), else why none was queued (rate-limited, capped,
    kernel-version-mismatch, no-device, unknown-device, read-only, unregistered: a kernel
    this service has no code for); ``note`` says more."""

    id: int
    kernel: str
    kernel_version: str
    dtype: str
    shape: dict[str, int]
    device: str | None
    count: int
    first_seen_at: datetime
    last_seen_at: datetime
    last_client: str | None
    status: str
    job_id: str | None
    job_url: str | None
    note: str | None
    timing: Timing = Field("eager-flushed", description="the timing method the lookup asked "
                           "for: its job tunes with it")


class MissesPublic(BaseModel):
    model_config = _examples({"data": [_MISS_EXAMPLE], "count": 1})

    data: list[MissPublic]
    count: int


class DimPublic(BaseModel):
    name: str
    min: int
    max: int
    doc: str


class KernelPublic(BaseModel):
    name: str
    version: str
    description: str
    #: "builtin", or "plugin" (an entry point or TUNER_KERNELS)
    source: Literal["builtin", "plugin"] = "builtin"
    ref: str = ""
    dims: list[DimPublic]
    dtypes: list[str]
    space: list[dict[str, Any]]
    space_size: int
    verification: str = Field("reference", description=VERIFICATION_DOC)


class PluginErrorPublic(BaseModel):
    """A kernel plugin that could not be registered: where it came from and why."""

    source: str = Field(examples=["entry point rmsnorm"])
    ref: str = Field(examples=["my_kernels.rmsnorm:KERNEL"])
    error: str = Field(examples=["ModuleNotFoundError: No module named 'my_kernels'"])


class KernelsPublic(BaseModel):
    model_config = _examples({"data": [_KERNEL_EXAMPLE], "count": 1, "errors": []})

    data: list[KernelPublic]
    count: int
    #: plugins that failed to load (the other kernels are unaffected)
    errors: list[PluginErrorPublic] = []


class WorkerPublic(BaseModel):
    """A worker process: the GPU it owns (index, UUID), what it does and when it last beat."""

    id: str
    host: str | None
    pid: int | None
    device: str | None
    kind: str | None
    gpu_index: int | None
    gpu_uuid: str | None
    status: str
    task_id: int | None
    error: str | None
    started_at: datetime | None
    last_seen_at: datetime | None
    seen_seconds_ago: float | None
    alive: bool


class DevicePublic(BaseModel):
    key: str
    kind: str
    name: str
    compute_capability: str | None
    sm_count: int | None
    memory_bytes: int | None
    triton_version: str | None
    torch_version: str | None
    copy_gbps: float | None
    matmul_tflops: float | None
    copy_gbps_spread: float | None = Field(None, description="(max - min) / median of the "
                                           "calibration's runs")
    matmul_tflops_spread: float | None = None
    calibration_runs: int | None = Field(None, description="runs each calibrated figure is "
                                         "the median of")
    calibrated_at: datetime | None = None
    last_seen_at: datetime | None
    seen_seconds_ago: float | None
    #: its workers that beat within one lease length
    workers: list[WorkerPublic] = []


class DevicesPublic(BaseModel):
    model_config = _examples({"data": [_DEVICE_EXAMPLE], "count": 1})

    data: list[DevicePublic]
    count: int


_STALE_EXAMPLE: dict[str, Any] = {
    "id": 7, "kernel": "matmul", "dtype": "float16", "shape": _SHAPE, "device": _GPU,
    "config": _CONFIG, "ms": 0.1763, "measured": "retimed", "kernel_version": "0d1c2b3a4f5e",
    "current_kernel_version": "363e2228ce72", "triton_version": "3.5.1",
    "current_triton_version": "3.6.0", "reasons": ["kernel-version", "triton-version"],
    "updated_at": _WHEN,
    "retune": {"kernel": "matmul", "dtype": "float16", "shapes": [_SHAPE],
               "budget": {"trials": 48, "seconds": None}, "strategy": "auto",
               "force": True, "seed": 0, "device": _GPU, "backend": "auto"}}

#: why a stored best is stale (``db.views.STALE_REASONS``)
StaleReason = Literal["kernel-version", "triton-version"]


class StaleConfigPublic(BaseModel):
    """A stored best tuned for code or a Triton that no longer runs: ``reasons`` says which
    (``kernel-version``: the kernel's source changed since, ``kernel_version`` is the stored
    one, ``current_kernel_version`` the registered one; ``triton-version``: its device now runs
    another Triton minor version, ``current_triton_version``). ``retune``: the body of the
    POST /jobs that tunes it again on its device (null for a replayed table's results)."""

    model_config = _examples(_STALE_EXAMPLE)

    id: int
    kernel: str
    dtype: str
    shape: dict[str, int]
    device: str
    config: dict[str, int]
    ms: float
    measured: str | None
    kernel_version: str
    current_kernel_version: str
    triton_version: str
    current_triton_version: str | None
    reasons: list[StaleReason]
    updated_at: datetime
    retune: JobCreate | None
    timing: Timing = Field("eager-flushed", description=TIMING_DOC)


class StaleConfigsPublic(BaseModel):
    model_config = _examples({"data": [_STALE_EXAMPLE], "count": 1})

    data: list[StaleConfigPublic]
    count: int
