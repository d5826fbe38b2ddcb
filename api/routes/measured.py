"""``POST /api/v1/configs/measured``: what Triton's own autotuning measured in a model's process
(``tuner.install()``: a key no store answered, benchmarked over the kernel's list), stored as
the key's best labelled ``client-measured`` (``measured``).

Such a result ranks below a worker's: it is stored where the key has no best, or replaces a
``client-measured`` one it beats; a best a worker stored (verified, re-timed) is kept, also one
written while this request ran. It is served like any best, its answer's ``measured`` saying
``client-measured``; a worker that tunes the key later re-times it as the incumbent.

The kernel may be one this service has no code for (``api.validation.ExternalKernel``: a
library kernel, named by its qualified name, with its ``kernel_version``): its results are
stored and served the same way, labelled "served from client measurements only"."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.deps import SessionDep, WriteAccess
from api.schemas import DEVICE_KEY_MAX, VERSION_MAX
from api.validation import (
    ExternalKernel,
    check_external_problem,
    check_shape,
    kernel_for_lookup,
)
from db import repo
from tuner.dtypes import check_dtype

#: the ``measured`` label of a best a model's process measured
CLIENT_MEASURED = "client-measured"

router = APIRouter(prefix="/configs", tags=["configs"])


class MeasuredTiming(BaseModel):
    """One config of the list and what Triton's benchmark gave it (its 20/50/80th
    percentiles, ms)."""

    config: dict[str, int] = Field(max_length=64)
    p20_ms: float = Field(gt=0, allow_inf_nan=False)
    p50_ms: float = Field(gt=0, allow_inf_nan=False)
    p80_ms: float = Field(gt=0, allow_inf_nan=False)


#: one value of Triton's key: a key argument's value or a tensor's dtype (pydantic's smart
#: union keeps each value's own JSON type: 1 stays 1, true stays true)
KeyValue = bool | int | Annotated[float, Field(allow_inf_nan=False)] | Annotated[
    str, Field(max_length=100)] | None


class GpuState(BaseModel):
    """The GPU's state as the model's process sampled it after Triton's benchmark (NVML; any
    may be missing)."""

    sm_mhz: int | None = Field(None, ge=0, le=100_000)
    mem_mhz: int | None = Field(None, ge=0, le=100_000)
    power_w: float | None = Field(None, ge=0, le=100_000, allow_inf_nan=False)
    temp_c: int | None = Field(None, ge=-100, le=1_000)
    throttle: int | None = Field(None, ge=0, lt=2**63)


class MeasuredItem(BaseModel):
    kernel: str = Field(max_length=100)
    kernel_version: str = Field(min_length=1, max_length=VERSION_MAX)
    dtype: str = Field(max_length=20)
    shape: dict[str, int] = Field(max_length=32)
    device: str = Field(min_length=1, max_length=DEVICE_KEY_MAX)
    triton_version: str = Field(min_length=1, max_length=VERSION_MAX)
    timings: list[MeasuredTiming] = Field(min_length=1, max_length=1024)
    timed_by: str | None = Field(None, max_length=100, description="the timer (e.g. "
                                 "triton.testing.do_bench, Triton's autotuning benchmark)")
    gpu: GpuState | None = None
    triton_key: list[KeyValue] | None = Field(
        None, max_length=64, description="Triton's own autotune key of the launch (the key "
        "arguments' values, then every tensor argument's dtype): what libraries that keep their "
        "own config files (fla) look configs up by; tuner export --format fla writes it")


def examples(example: dict[str, Any]) -> ConfigDict:
    """A model's example in its JSON schema (the OpenAPI document's, shown by /docs)."""
    return ConfigDict(json_schema_extra={"examples": [example]})


_TIMING = {"config": {"BLOCK_SIZE": 1024, "num_warps": 4, "num_stages": 2},
           "p20_ms": 0.0121, "p50_ms": 0.0124, "p80_ms": 0.0127}


class MeasuredRequest(BaseModel):
    items: list[MeasuredItem] = Field(min_length=1, max_length=256)

    model_config = examples({"items": [{
        "kernel": "fla.modules.l2norm.l2norm_fwd_kernel", "kernel_version": "3f2a9c1d0b7e",
        "dtype": "float16", "shape": {"D": 128, "T": 131072},
        "device": "cuda:NVIDIA H100 80GB HBM3:sm90", "triton_version": "3.6.0",
        "timed_by": "triton.autotune (do_bench)",
        "gpu": {"sm_mhz": 1980, "mem_mhz": 2619, "power_w": 312.5, "temp_c": 41, "throttle": 0},
        "timings": [_TIMING, {**_TIMING, "config": {"BLOCK_SIZE": 2048, "num_warps": 8,
                                                    "num_stages": 2}, "p50_ms": 0.0131}]}]})


class MeasuredAnswer(BaseModel):
    """``stored``: this item's fastest config is now the key's best; ``kept``: the key's best
    is a worker's; ``slower``: a faster ``client-measured`` best is stored."""

    status: Literal["stored", "kept", "slower"]
    config: dict[str, int]
    p50_ms: float


class MeasuredAnswers(BaseModel):
    data: list[MeasuredAnswer]

    model_config = examples({"data": [{"status": "stored", "config": _TIMING["config"],
                                       "p50_ms": 0.0124}]})


@router.post("/measured", response_model=MeasuredAnswers, dependencies=[WriteAccess])
def post_measured(body: MeasuredRequest, session: SessionDep) -> MeasuredAnswers:
    """Store each item's fastest config as its key's ``client-measured`` best (see the
    module docstring)."""
    checked = []
    for i, item in enumerate(body.items):
        kernel = kernel_for_lookup(item.kernel, item.kernel_version, f"items.{i}.kernel")
        if isinstance(kernel, ExternalKernel):
            shape = check_external_problem(item.shape, item.dtype, f"items.{i}.shape",
                                           f"items.{i}.dtype")
        else:
            check_dtype(kernel, item.dtype, f"items.{i}.dtype")
            shape = check_shape(kernel, item.shape, f"items.{i}.shape")
        checked.append((item, shape))
    answers = []
    status: Literal["stored", "kept", "slower"]
    for item, shape in checked:
        best = min(item.timings, key=lambda t: t.p50_ms)
        state = {"timed_by": item.timed_by,
                 "gpu": item.gpu.model_dump(exclude_none=True) if item.gpu else None,
                 **({"triton_key": item.triton_key} if item.triton_key is not None else {})}
        # one conditional write: a worker's best (even one stored since) is never replaced
        row, written = repo.store_best(
            session, device_key=item.device, kernel=item.kernel,
            kernel_version=item.kernel_version, dtype=item.dtype, shape=shape,
            triton_version=item.triton_version, config=best.config, p20_ms=best.p20_ms,
            p50_ms=best.p50_ms, p80_ms=best.p80_ms, tflops=None, gbps=None,
            torch_version=None, cuda_version=None, task_id=None,
            measured=CLIENT_MEASURED, replaces_only=CLIENT_MEASURED, client_state=state)
        status = "stored" if written else (
            "slower" if row.measured == CLIENT_MEASURED else "kept")
        answers.append(MeasuredAnswer(status=status, config=best.config, p50_ms=best.p50_ms))
    session.commit()
    return MeasuredAnswers(data=answers)
