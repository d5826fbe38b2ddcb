"""Request and response models (FastAPI-template naming: XCreate, XPublic, XsPublic)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: the largest integer a path or query parameter takes (PostgreSQL's ``integer`` columns)
INT32_MAX = 2**31 - 1
#: the longest wall-clock budget per shape: a year (an infinite one is no budget: leave it out)
MAX_BUDGET_SECONDS = 365 * 86400.0


class Budget(Strict):
    trials: int = Field(48, ge=1, le=100_000, description="trials per shape")
    seconds: float | None = Field(None, gt=0, le=MAX_BUDGET_SECONDS, allow_inf_nan=False,
                                  description="wall-clock limit per shape; none: no limit")


JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
#: the longest device key the database stores (``devices.key``)
DEVICE_KEY_MAX = 200


class JobCreate(Strict):
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
                                           "worker")
    backend: Literal["auto", "cuda", "interpret"] = "auto"


class JobCreated(BaseModel):
    """The answer to a submission. ``deduplicated``: an identical queued or running job was
    returned instead of a new one. ``answered_from_store``: shapes already tuned for the target
    device, whose tasks were created as succeeded (all of them: the job is ``succeeded`` and
    the status code is 200)."""

    id: str
    status: str
    url: str
    deduplicated: bool = False
    answered_from_store: int = 0


#: which measurement a time is (``db.models.MEASURED``)
Measured = Literal["trial", "retimed"]


class TaskPublic(BaseModel):
    """One shape of a job. ``best_ms`` is the best config's re-timed p50 once the finalists
    were re-timed side by side (``best_measured`` ``retimed``), a trial's own p50 before
    (``trial``). ``vs_baseline``: how many times faster than ``baseline_name`` (torch) the best
    is, ONLY from the baseline timed interleaved with the finalists in the same process
    (``baseline_ms``); None otherwise. ``incumbent_ms``: the stored best re-timed beside the
    finalists; ``best_note``: what became of the stored best."""

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
    outcome_counts: dict[str, int]
    device: str | None
    attempts: int
    error: str | None


class JobPublic(BaseModel):
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
    url: str
    waiting: str | None = Field(None, description="why a queued job has not started: no live "
                                "worker has its device (said once it waited a lease length)")
    tasks: list[TaskPublic]


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class GpuStatePublic(BaseModel):
    """The GPU's state sampled right after a trial's timing (NVML; a field None where the
    driver does not report it). ``throttle``: NVML's clock throttle reasons bitmask,
    ``throttle_reasons`` its names ([]: not throttled)."""

    sm_mhz: int | None
    mem_mhz: int | None
    power_w: float | None
    temp_c: int | None
    throttle: int | None
    throttle_reasons: list[str]


class TrialPublic(BaseModel):
    """One trial: ``p20_ms``/``p50_ms``/``p80_ms`` are its own timing; a finalist's re-timing
    beside the other finalists at the end of the search is ``retimed_*`` (None for the other
    trials); ``gpu``: the GPU's state as it was timed (None on the interpreter)."""

    task_id: int
    number: int
    config: dict[str, int]
    outcome: str
    p20_ms: float | None
    p50_ms: float | None
    p80_ms: float | None
    retimed_p20_ms: float | None = None
    retimed_p50_ms: float | None = None
    retimed_p80_ms: float | None = None
    gpu: GpuStatePublic | None = None
    error: str | None
    compile_s: float | None


class TrialsPublic(BaseModel):
    task_id: int | None = None  # set when the list is one task's
    data: list[TrialPublic]
    count: int


#: how an answer of GET /configs relates to the caller's identity (best first)
Match = Literal["exact", "nearest", "other-triton", "other-device", "default"]
#: what became of a reported miss (``report_misses``)
MissOutcome = Literal["queued", "pending", "tuned", "rate-limited", "capped",
                      "kernel-version-mismatch", "no-device", "failed"]
#: the status of a recorded miss (GET /misses)
MissStatus = Literal["queued", "running", "tuned", "failed", "rate-limited", "capped",
                     "kernel-version-mismatch", "no-device"]
#: the longest kernel or Triton version the database stores
VERSION_MAX = 40


class ConfigPublic(BaseModel):
    """A config for one lookup. ``match``: ``exact`` (tuned on the caller's device for its
    kernel version, Triton minor version and shape), ``nearest`` (same, nearest tuned shape:
    ``tuned_shape`` and its log2 ``distance``), ``other-triton`` (the caller's device under
    another Triton minor version), ``other-device`` (another GPU: ``device`` says which),
    ``default`` (the kernel's default config; nothing tuned applies). ``miss``: with
    ``report_misses``, what became of a lookup that was not ``exact``."""

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


class ConfigQuery(Strict):
    items: list[ConfigQueryItem] = Field(min_length=1, max_length=4_096)
    report_misses: bool = Field(False, description="record every item not answered "
                                "``exact`` as a miss and queue a tuning job for it on the "
                                "caller's device (each answer's ``miss`` says what became "
                                "of it)")
    client: str | None = Field(None, min_length=1, max_length=100,
                               description="who is asking, for the per-client rate limit on "
                                           "queued misses; default: the API key presented, "
                                           "else the caller's host")


class ConfigsPublic(BaseModel):
    data: list[ConfigPublic]
    count: int


class MissPublic(BaseModel):
    """A lookup that clients reported as not served exactly. ``status``: its job's (queued,
    running, tuned, failed), else why none was queued (rate-limited, capped,
    kernel-version-mismatch, no-device); ``note`` says more."""

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


class MissesPublic(BaseModel):
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


class PluginErrorPublic(BaseModel):
    """A kernel plugin that could not be registered: where it came from and why."""

    source: str = Field(examples=["entry point rmsnorm"])
    ref: str = Field(examples=["my_kernels.rmsnorm:KERNEL"])
    error: str = Field(examples=["ModuleNotFoundError: No module named 'my_kernels'"])


class KernelsPublic(BaseModel):
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
    data: list[DevicePublic]
    count: int
