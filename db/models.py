"""SQLAlchemy 2 typed models. The Alembic migrations in ``db/migrations`` create exactly these
(``tests/test_db.py`` compares the two, so they cannot drift).

Every timestamp is a timezone-aware UTC ``datetime`` on both backends: SQLite has no time zone
type and hands back naive values, so ``UTCDateTime`` stores UTC wall time and re-attaches UTC
when reading.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# the lifecycle of jobs and tasks (queued -> running -> succeeded | failed | cancelled) has its
# home in tuner.lifecycle; imported here for the modules that read it from the models
from tuner.lifecycle import ACTIVE as ACTIVE
from tuner.lifecycle import TERMINAL as TERMINAL
from tuner.lifecycle import Status
from tuner.timing import DEFAULT_TIMING

#: what a worker is doing (``workers.status``)
WORKER_STATUSES = ("starting", "idle", "busy", "unhealthy", "stopped")

#: which measurement a time is: a trial's own timing, or a re-timing of the finalists
#: side by side in one process at the end of the search
MEASURED = ("trial", "retimed")

#: what a stored best is against the kernel's default (its ``default_config``, or the best of
#: the user's list), both re-timed side by side in one process: ``search``, a config that beat
#: the default by more than the noise; ``default``, the default itself (nothing beat it beyond
#: the noise). None: never compared (stored before this was recorded, imported, interrupted)
BASES = ("search", "default")

#: the WHERE clause of the partial unique index on ``jobs.request_key``: at most one queued or
#: running job per request key (identical submissions share it; finished jobs do not count)
ACTIVE_JOB_WHERE = f"status IN ({', '.join(repr(str(s)) for s in ACTIVE)})"


def vs_baseline(best_ms: float | None, best_measured: str | None,
                baseline_ms: float | None) -> float | None:
    """How many times faster than the baseline the best is (0.83: slower), ONLY from a
    re-timed best and the baseline timed interleaved with it in the same process: times taken
    at other moments differ by more than the gap being reported."""
    if not best_ms or not baseline_ms or best_measured != "retimed":
        return None
    return baseline_ms / best_ms


def utcnow() -> datetime:
    """Now, as a timezone-aware UTC datetime (the only kind stored)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that always returns aware UTC datetimes (naive input is
    taken as UTC), so comparisons never mix naive and aware values on SQLite."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else _as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else _as_utc(value)


def _as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime}


class Device(Base):
    """A machine a worker ran on: a GPU SKU (``cuda:NVIDIA H200:sm90``), the CPU interpreter
    (``interpret:cpu``) or a recorded table (``replay:NVIDIA H200``), with its measured limits."""

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
    #: (max - min) / median of the calibration's repeated runs (0.05: 5% apart)
    copy_gbps_spread: Mapped[float | None] = mapped_column(Float)
    matmul_tflops_spread: Mapped[float | None] = mapped_column(Float)
    #: how many runs each calibrated figure is the median of
    calibration_runs: Mapped[int | None] = mapped_column(Integer)
    calibrated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Job(Base):
    """One submission: a kernel, dtype and budget, with one task per shape."""

    __tablename__ = "jobs"
    __table_args__ = (Index("uq_jobs_active_request_key", "request_key", unique=True,
                            sqlite_where=text(ACTIVE_JOB_WHERE),
                            postgresql_where=text(ACTIVE_JOB_WHERE)),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kernel: Mapped[str] = mapped_column(String(100))
    kernel_version: Mapped[str] = mapped_column(String(40))
    dtype: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), index=True, default=Status.QUEUED)
    #: the device that must run it; None: any worker
    device_key: Mapped[str | None] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(20), default="auto")
    strategy: Mapped[str] = mapped_column(String(40), default="auto")
    budget_trials: Mapped[int] = mapped_column(Integer)
    budget_seconds: Mapped[float | None] = mapped_column(Float)
    force: Mapped[bool] = mapped_column(Boolean, default=False)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    #: how its configs are to be timed (``tuner/timing.py``: ``TIMING_METHODS``)
    timing: Mapped[str] = mapped_column(String(20), default=DEFAULT_TIMING,
                                        server_default=text(f"'{DEFAULT_TIMING}'"))
    #: sha256 of what makes two submissions the same (``repo.request_key``)
    request_key: Mapped[str] = mapped_column(String(64), index=True)
    #: why the service queued it on its own (``repo.queue_upgrade_retunes``: "re-tune after
    #: upgrade to Triton 3.6 (from 3.5)"); None for a job someone submitted
    reason: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    tasks: Mapped[list[Task]] = relationship(back_populates="job", order_by="Task.id",
                                             cascade="all, delete-orphan")


class Task(Base):
    """One shape of a job: claimed by a worker under a lease, with its progress so far."""

    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    shape_key: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), index=True, default=Status.QUEUED)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    #: times the task went back to the queue for a fault not its own (its lease expired: the
    #: worker died or lost the database); these use no attempt (``repo.MAX_REQUEUES`` bounds
    #: them)
    requeues: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: the device that ran it
    device_key: Mapped[str | None] = mapped_column(String(200))
    #: how its trials were timed, set when it runs: its job's ``timing``, or a replay table's
    #: own (None: not run yet, or run before this was recorded)
    timing: Mapped[str | None] = mapped_column(String(20))
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    #: the best config's time: a trial's p50 while the search runs, its re-timed p50 once the
    #: finalists were re-timed side by side (``best_measured`` says which)
    best_ms: Mapped[float | None] = mapped_column(Float)
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: which measurement ``best_ms`` is (``MEASURED``; a task answered from the store: the
    #: stored row's)
    best_measured: Mapped[str | None] = mapped_column(String(20))
    #: the vendor's operation (``baseline_name``, e.g. torch) timed in the same child,
    #: interleaved with the finalists: the only time a "vs torch" figure is computed from
    baseline_ms: Mapped[float | None] = mapped_column(Float)
    baseline_name: Mapped[str | None] = mapped_column(String(40))
    #: the stored best's re-timed p50, measured beside this task's finalists
    incumbent_ms: Mapped[float | None] = mapped_column(Float)
    #: what became of the stored best for the task's identity, in words
    best_note: Mapped[str | None] = mapped_column(Text)
    #: the kernel's default (its ``default_config``, or the best of the user's list) and its
    #: p50 re-timed beside the finalists
    default_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    default_ms: Mapped[float | None] = mapped_column(Float)
    #: what the task wrote into the stored best against the default (``BASES``; None: not
    #: compared, or nothing written) and the noise margin it was judged by (0.02: 2%)
    best_basis: Mapped[str | None] = mapped_column(String(20))
    noise_margin: Mapped[float | None] = mapped_column(Float)
    #: outcome value -> number of trials with it
    outcome_counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: why its search stopped (``tuner.search``: budget, time, converged, no expected gain,
    #: near roofline, space exhausted, ...); None before it finished or where not recorded
    stop_reason: Mapped[str | None] = mapped_column(String(40))
    #: where the task's wall time went, seconds by phase (``tuner.phases``: queued, setup,
    #: compile_wait, compile_child, measuring, retiming, storing, search, total) and the
    #: compile pool's work beside it; None before it finished or where not recorded
    phases: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    job: Mapped[Job] = relationship(back_populates="tasks")

    @property
    def vs_baseline(self) -> float | None:
        """``vs_baseline`` of this task's best and its same-child baseline."""
        return vs_baseline(self.best_ms, self.best_measured, self.baseline_ms)


class Trial(Base):
    """One measured config of a task (numbered from 1 within the task)."""

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
    #: the finalists' times when re-timed side by side at the end of the search (None for the
    #: other trials): p50_ms stays the trial's own timing
    retimed_p20_ms: Mapped[float | None] = mapped_column(Float)
    retimed_p50_ms: Mapped[float | None] = mapped_column(Float)
    retimed_p80_ms: Mapped[float | None] = mapped_column(Float)
    #: the GPU's state sampled right after the trial's timing (NVML; None on the interpreter)
    sm_mhz: Mapped[int | None] = mapped_column(Integer)
    mem_mhz: Mapped[int | None] = mapped_column(Integer)
    power_w: Mapped[float | None] = mapped_column(Float)
    temp_c: Mapped[int | None] = mapped_column(Integer)
    #: NVML's clock throttle reasons bitmask (0: not throttled)
    throttle: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class BestConfig(Base):
    """The best verified config for one identity (see DESIGN.md, "Identity")."""

    __tablename__ = "best_configs"
    __table_args__ = (UniqueConstraint("device_key", "kernel", "kernel_version", "dtype",
                                       "shape_key", "triton_version", "timing",
                                       name="uq_best_key"),
                      # the serving path reads every best of one kernel version and dtype
                      Index("ix_best_configs_serving", "kernel", "kernel_version", "dtype"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_key: Mapped[str] = mapped_column(String(200), index=True)
    kernel: Mapped[str] = mapped_column(String(100), index=True)
    kernel_version: Mapped[str] = mapped_column(String(40))
    dtype: Mapped[str] = mapped_column(String(20))
    shape_key: Mapped[str] = mapped_column(String(200))
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    triton_version: Mapped[str] = mapped_column(String(40))
    #: how its times were taken (``tuner/timing.py``), part of its identity: bests of one
    #: shape timed ``eager-flushed`` and ``cuda-graph`` are two rows
    timing: Mapped[str] = mapped_column(String(20), default=DEFAULT_TIMING,
                                        server_default=text(f"'{DEFAULT_TIMING}'"))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    p20_ms: Mapped[float] = mapped_column(Float)
    p50_ms: Mapped[float] = mapped_column(Float)
    p80_ms: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float)
    gbps: Mapped[float | None] = mapped_column(Float)
    torch_version: Mapped[str | None] = mapped_column(String(40))
    cuda_version: Mapped[str | None] = mapped_column(String(40))
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id", ondelete="SET NULL"))
    #: which measurement p20/p50/p80 are (``MEASURED``; None: stored before this was recorded)
    measured: Mapped[str | None] = mapped_column(String(20))
    #: one more at every write: a worker replaces the row only at the revision whose config it
    #: re-timed beside its finalists (``repo.write_best``)
    revision: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    #: the config against the kernel's default (``BASES``: ``default`` = this is the default,
    #: kept because nothing beat it beyond the noise), the default's and the search's best p50
    #: re-timed side by side, and the noise margin (relative) the comparison used
    basis: Mapped[str | None] = mapped_column(String(20))
    default_ms: Mapped[float | None] = mapped_column(Float)
    search_ms: Mapped[float | None] = mapped_column(Float)
    noise_margin: Mapped[float | None] = mapped_column(Float)
    #: a ``client-measured`` best's timing conditions as the model's process reported them
    #: (``timed_by``: the timer; ``gpu``: clocks, power, temperature, throttle reasons)
    client_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Miss(Base):
    """A lookup that the store could not answer exactly for its caller (reported by clients
    with ``report_misses``): one row per identity, counted each time it is reported, and the
    tuning job queued for it on the caller's device, if any.

    ``device_key`` is ``""`` when the caller gave no device: unique constraints treat NULLs as
    distinct, so a NULL would let every report of the same miss insert a row of its own.
    ``status`` is the job's state while there is a job (queued, running, tuned, failed: kept in
    step by the repository functions that change a job's status), else why none was queued
    (rate-limited, capped, kernel-version-mismatch, no-device)."""

    __tablename__ = "misses"
    __table_args__ = (UniqueConstraint("device_key", "kernel", "kernel_version", "dtype",
                                       "shape_key", "timing", name="uq_miss_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_key: Mapped[str] = mapped_column(String(200))
    kernel: Mapped[str] = mapped_column(String(100), index=True)
    kernel_version: Mapped[str] = mapped_column(String(40))
    dtype: Mapped[str] = mapped_column(String(20))
    shape_key: Mapped[str] = mapped_column(String(200))
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    #: the timing method the lookup asked for (its job tunes with it)
    timing: Mapped[str] = mapped_column(String(20), default=DEFAULT_TIMING,
                                        server_default=text(f"'{DEFAULT_TIMING}'"))
    #: times reported
    count: Mapped[int] = mapped_column(Integer, default=1)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    last_client: Mapped[str | None] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(40), index=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"),
                                               index=True)
    #: the client whose report queued the current job, and when (the per-client rate limit)
    queued_by: Mapped[str | None] = mapped_column(String(100))
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: why it is in its status, in words (the job's error, the limit that was hit, ...)
    note: Mapped[str | None] = mapped_column(Text)


class WorkerRow(Base):
    """One worker process (one GPU, or the CPU interpreter) as it last reported itself: where it
    runs, what it is doing and when it was last heard from. Named so as not to clash with
    ``tuner.app.worker.Worker``, the process itself."""

    __tablename__ = "workers"

    #: the worker id (the lease owner of the tasks it runs)
    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    device_key: Mapped[str] = mapped_column(String(200))
    #: ``cuda`` or ``interpret``
    kind: Mapped[str] = mapped_column(String(20))
    #: the GPU's index among the process's visible devices; None for the interpreter
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    gpu_uuid: Mapped[str | None] = mapped_column(String(100))
    #: one of ``WORKER_STATUSES``
    status: Mapped[str] = mapped_column(String(20))
    #: the task it is running, while busy
    task_id: Mapped[int | None] = mapped_column(Integer)
    #: why it is unhealthy, in words
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
