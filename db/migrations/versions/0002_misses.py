"""misses: lookups clients reported as not served exactly, and the jobs queued for them

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _at(name: str, nullable: bool = True) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "misses",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_key", sa.String(length=200), nullable=False),
        sa.Column("kernel", sa.String(length=100), nullable=False),
        sa.Column("kernel_version", sa.String(length=40), nullable=False),
        sa.Column("dtype", sa.String(length=20), nullable=False),
        sa.Column("shape_key", sa.String(length=200), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        _at("first_seen_at", nullable=False),
        _at("last_seen_at", nullable=False),
        sa.Column("last_client", sa.String(length=100), nullable=True),
        sa.Column("status", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("queued_by", sa.String(length=100), nullable=True),
        _at("queued_at"),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("device_key", "kernel", "kernel_version", "dtype", "shape_key",
                            name="uq_miss_key"),
    )
    op.create_index("ix_misses_kernel", "misses", ["kernel"])
    op.create_index("ix_misses_last_seen_at", "misses", ["last_seen_at"])
    op.create_index("ix_misses_status", "misses", ["status"])
    op.create_index("ix_misses_job_id", "misses", ["job_id"])


def downgrade() -> None:
    op.drop_table("misses")
