"""task phases: where a task's wall time went, seconds by phase (tuner.phases)

Revision ID: 0011
Revises: 0010

Tasks finished before it was recorded get NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("phases", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("phases")
