"""Request and response models (FastAPI-template naming: XCreate, XPublic, XsPublic)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(Strict):
    trials: int = Field(48, ge=1, le=100_000, description="trials per shape")
    seconds: float | None = Field(None, gt=0, description="wall-clock limit per shape")


class JobCreate(Strict):
    kernel: str = Field(examples=["matmul"])
    dtype: str = Field(examples=["float16"])
    shapes: list[dict[str, Any]] = Field(min_length=1, examples=[[{"M": 4096, "N": 4096,
                                                                   "K": 4096}]])
    budget: Budget = Field(default_factory=Budget)  # type: ignore[arg-type]
    strategy: str = "auto"
    force: bool = False
    seed: int = 0
    device: str | None = Field(None, description="target device key; default: any worker")
    backend: Literal["auto", "cuda", "interpret"] = "auto"


class JobCreated(BaseModel):
    id: str
    status: str
    url: str
    deduplicated: bool = False
    answered_from_store: int = 0


class TaskPublic(BaseModel):
    id: int
    shape: dict[str, int]
    status: str
    trials_done: int
    budget_trials: int
    best_ms: float | None
    best_config: dict[str, int] | None
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
    tasks: list[TaskPublic]


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class TrialPublic(BaseModel):
    number: int
    config: dict[str, int]
    outcome: str
    p20_ms: float | None
    p50_ms: float | None
    p80_ms: float | None
    error: str | None
    compile_s: float | None


class TrialsPublic(BaseModel):
    task_id: int
    data: list[TrialPublic]
    count: int


class ConfigPublic(BaseModel):
    match: Literal["exact", "nearest", "default"]
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


class ConfigQueryItem(Strict):
    kernel: str
    dtype: str
    shape: dict[str, Any]
    device: str | None = None


class ConfigQuery(Strict):
    items: list[ConfigQueryItem] = Field(min_length=1, max_length=10_000)


class ConfigsPublic(BaseModel):
    data: list[ConfigPublic]
    count: int
