"""initial schema

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


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
        sa.Column("triton_version", sa.String(length=40), nullable=True),
        sa.Column("torch_version", sa.String(length=40), nullable=True),
        sa.Column("cuda_version", sa.String(length=40), nullable=True),
        sa.Column("driver_version", sa.String(length=40), nullable=True),
        sa.Column("copy_gbps", sa.Float(), nullable=True),
        sa.Column("matmul_tflops", sa.Float(), nullable=True),
        sa.Column("calibrated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kernel", sa.String(length=100), nullable=False),
        sa.Column("kernel_version", sa.String(length=40), nullable=False),
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
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_request_key"), ["request_key"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_status"), ["status"], unique=False)

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
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("device_key", sa.String(length=200), nullable=True),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("best_ms", sa.Float(), nullable=True),
        sa.Column("best_config", sa.JSON(), nullable=True),
        sa.Column("outcome_counts", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tasks_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_tasks_status"), ["status"], unique=False)

    op.create_table(
        "best_configs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_key", sa.String(length=200), nullable=False),
        sa.Column("kernel", sa.String(length=100), nullable=False),
        sa.Column("kernel_version", sa.String(length=40), nullable=False),
        sa.Column("dtype", sa.String(length=20), nullable=False),
        sa.Column("shape_key", sa.String(length=200), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("triton_version", sa.String(length=40), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("p20_ms", sa.Float(), nullable=False),
        sa.Column("p50_ms", sa.Float(), nullable=False),
        sa.Column("p80_ms", sa.Float(), nullable=False),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("gbps", sa.Float(), nullable=True),
        sa.Column("torch_version", sa.String(length=40), nullable=True),
        sa.Column("cuda_version", sa.String(length=40), nullable=True),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "device_key",
            "kernel",
            "kernel_version",
            "dtype",
            "shape_key",
            "triton_version",
            name="uq_best_key",
        ),
    )
    with op.batch_alter_table("best_configs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_best_configs_device_key"), ["device_key"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_best_configs_kernel"), ["kernel"], unique=False)

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
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("task_id", "number", name="uq_trial_task_number"),
    )
    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_trials_task_id"), ["task_id"], unique=False)




def downgrade() -> None:

    with op.batch_alter_table("trials", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_trials_task_id"))

    op.drop_table("trials")
    with op.batch_alter_table("best_configs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_best_configs_kernel"))
        batch_op.drop_index(batch_op.f("ix_best_configs_device_key"))

    op.drop_table("best_configs")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tasks_status"))
        batch_op.drop_index(batch_op.f("ix_tasks_job_id"))

    op.drop_table("tasks")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_jobs_request_key"))

    op.drop_table("jobs")
    op.drop_table("devices")

