"""SQLAlchemy 2 typed models. The Alembic migrations in ``db/migrations`` create exactly these."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Device(Base):
    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(20))
    name: Mapped[str] = mapped_column(String(200))
    compute_capability: Mapped[str | None] = mapped_column(String(10))
    sm_count: Mapped[int | None] = mapped_column(Integer)
    memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    smem_per_block: Mapped[int | None] = mapped_column(Integer)
    triton_version: Mapped[str | None] = mapped_column(String(40))
    torch_version: Mapped[str | None] = mapped_column(String(40))
    cuda_version: Mapped[str | None] = mapped_column(String(40))
    driver_version: Mapped[str | None] = mapped_column(String(40))
    copy_gbps: Mapped[float | None] = mapped_column(Float)
    matmul_tflops: Mapped[float | None] = mapped_column(Float)
    calibrated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kernel: Mapped[str] = mapped_column(String(100))
    kernel_version: Mapped[str] = mapped_column(String(40))
    dtype: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), index=True, default="queued")
    device_key: Mapped[str | None] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(20), default="auto")
    strategy: Mapped[str] = mapped_column(String(40), default="auto")
    budget_trials: Mapped[int] = mapped_column(Integer)
    budget_seconds: Mapped[float | None] = mapped_column(Float)
    force: Mapped[bool] = mapped_column(Boolean, default=False)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    request_key: Mapped[str] = mapped_column(String(64), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    tasks: Mapped[list[Task]] = relationship(back_populates="job", order_by="Task.id",
                                             cascade="all, delete-orphan")


class Task(Base):
    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    shape_key: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), index=True, default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    device_key: Mapped[str | None] = mapped_column(String(200))
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    best_ms: Mapped[float | None] = mapped_column(Float)
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    outcome_counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow,
                                                 onupdate=utcnow)

    job: Mapped[Job] = relationship(back_populates="tasks")


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("task_id", "number", name="uq_trial_task_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_key: Mapped[str] = mapped_column(String(400))
    outcome: Mapped[str] = mapped_column(String(20))
    p20_ms: Mapped[float | None] = mapped_column(Float)
    p50_ms: Mapped[float | None] = mapped_column(Float)
    p80_ms: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    compile_s: Mapped[float | None] = mapped_column(Float)
    max_error: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BestConfig(Base):
    __tablename__ = "best_configs"
    __table_args__ = (UniqueConstraint("device_key", "kernel", "kernel_version", "dtype",
                                       "shape_key", "triton_version", name="uq_best_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_key: Mapped[str] = mapped_column(String(200), index=True)
    kernel: Mapped[str] = mapped_column(String(100), index=True)
    kernel_version: Mapped[str] = mapped_column(String(40))
    dtype: Mapped[str] = mapped_column(String(20))
    shape_key: Mapped[str] = mapped_column(String(200))
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    triton_version: Mapped[str] = mapped_column(String(40))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    p20_ms: Mapped[float] = mapped_column(Float)
    p50_ms: Mapped[float] = mapped_column(Float)
    p80_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float)
    gbps: Mapped[float | None] = mapped_column(Float)
    torch_version: Mapped[str | None] = mapped_column(String(40))
    cuda_version: Mapped[str | None] = mapped_column(String(40))
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
