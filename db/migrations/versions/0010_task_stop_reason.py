"""task stop reason: why a task's search stopped (budget, converged, near roofline, ...)

Revision ID: 0010
Revises: 0009

Tasks finished before it was recorded get NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("stop_reason", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("stop_reason")
