"""job reason: why the service queued a job on its own (a re-tune after a Triton upgrade)

Revision ID: 0008
Revises: 0007

Jobs someone submitted have none: existing jobs get NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("reason", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reason")
