"""initial schema: devices, jobs, tasks, trials, best_configs

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _at(name: str, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _version(name: str, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, sa.String(length=40), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("compute_capability", sa.String(length=10), nullable=True),
        sa.Column("sm_count", sa.Integer(), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("smem_per_block", sa.Integer(), nullable=True),
        _version("triton_version"),
        _version("torch_version"),
        _version("cuda_version"),
        _version("driver_version"),
        sa.Column("copy_gbps", sa.Float(), nullable=True),
        sa.Column("matmul_tflops", sa.Float(), nullable=True),
        _at("calibrated_at"),
        _at("created_at", nullable=False),
        _at("last_seen_at", nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kernel", sa.String(length=100), nullable=False),
        _version("kernel_version", nullable=False),
        sa.Column("dtype", sa.String(length=20), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("device_key", sa.String(length=200), nullable=True),
        sa.Column("backend", sa.String(length=20), nullable=False),
        sa.Column("strategy", sa.String(length=40), nullable=False),
        sa.Column("budget_trials", sa.Integer(), nullable=False),
        sa.Column("budget_seconds", sa.Float(), nullable=True),
        sa.Column("force", sa.Boolean(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("request_key", sa.String(length=64), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        _at("created_at", nullable=False),
        _at("started_at"),
        _at("finished_at"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_jobs_request_key", "jobs", ["request_key"])
    op.create_index("ix_jobs_status", "jobs", ["status"])

    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("shape_key", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=100), nullable=True),
        _at("lease_expires_at"),
        sa.Column("device_key", sa.String(length=200), nullable=True),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("best_ms", sa.Float(), nullable=True),
        sa.Column("best_config", sa.JSON(), nullable=True),
        sa.Column("outcome_counts", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        _at("started_at"),
        _at("finished_at"),
        _at("updated_at", nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_tasks_job_id", "tasks", ["job_id"])
    op.create_index("ix_tasks_status", "tasks", ["status"])

    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_key", sa.String(length=400), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("p20_ms", sa.Float(), nullable=True),
        sa.Column("p50_ms", sa.Float(), nullable=True),
        sa.Column("p80_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("max_error", sa.Float(), nullable=True),
        _at("created_at", nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("task_id", "number", name="uq_trial_task_number"),
    )
    op.create_index("ix_trials_task_id", "trials", ["task_id"])

    op.create_table(
        "best_configs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_key", sa.String(length=200), nullable=False),
        sa.Column("kernel", sa.String(length=100), nullable=False),
        _version("kernel_version", nullable=False),
        sa.Column("dtype", sa.String(length=20), nullable=False),
        sa.Column("shape_key", sa.String(length=200), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        _version("triton_version", nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("p20_ms", sa.Float(), nullable=False),
        sa.Column("p50_ms", sa.Float(), nullable=False),
        sa.Column("p80_ms", sa.Float(), nullable=False),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("gbps", sa.Float(), nullable=True),
        _version("torch_version"),
        _version("cuda_version"),
        sa.Column("task_id", sa.Integer(), nullable=True),
        _at("updated_at", nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("device_key", "kernel", "kernel_version", "dtype", "shape_key",
                            "triton_version", name="uq_best_key"),
    )
    op.create_index("ix_best_configs_device_key", "best_configs", ["device_key"])
    op.create_index("ix_best_configs_kernel", "best_configs", ["kernel"])


def downgrade() -> None:
    for table in ("best_configs", "trials", "tasks", "jobs", "devices"):
        op.drop_table(table)
