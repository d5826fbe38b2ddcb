"""workers table; one active job per request key; the serving index on best_configs

Revision ID: 0003
Revises: 0002

Before the partial unique index on ``jobs.request_key`` can exist, identical queued or running
jobs that concurrent submissions created are told apart: all but the oldest of each request key
get the key ``repo.unshared_request_key`` gives a job created beside an active identical one
(they keep running; new submissions are deduplicated to the oldest).
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: the same text as ``db.models.ACTIVE_JOB_WHERE`` (a migration does not import the models)
ACTIVE_JOB_WHERE = "status IN ('queued', 'running')"


def _at(name: str, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _unshared(request_key: str, job_id: str) -> str:
    """``repo.unshared_request_key``, copied so that this migration never changes."""
    return hashlib.sha256(f"{request_key}:{job_id}".encode()).hexdigest()


def _rekey_active_duplicates() -> None:
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("request_key", sa.String),
                    sa.column("status", sa.String), sa.column("created_at"))
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.request_key)
                        .where(jobs.c.status.in_(("queued", "running")))
                        .order_by(jobs.c.created_at, jobs.c.id)).all()
    seen: set[str] = set()
    for job_id, key in rows:
        if key in seen:
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id)
                         .values(request_key=_unshared(key, job_id)))
        seen.add(key)


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_key", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("gpu_uuid", sa.String(length=100), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _at("started_at", nullable=False),
        _at("last_seen_at", nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    _rekey_active_duplicates()
    op.create_index("uq_jobs_active_request_key", "jobs", ["request_key"], unique=True,
                    sqlite_where=sa.text(ACTIVE_JOB_WHERE),
                    postgresql_where=sa.text(ACTIVE_JOB_WHERE))
    op.create_index("ix_best_configs_serving", "best_configs",
                    ["kernel", "kernel_version", "dtype"])


def downgrade() -> None:
    op.drop_index("ix_best_configs_serving", table_name="best_configs")
    op.drop_index("uq_jobs_active_request_key", table_name="jobs")
    op.drop_table("workers")
