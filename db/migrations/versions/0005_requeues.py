"""requeues: a task's returns to the queue for faults not its own, counted apart from attempts

Revision ID: 0005
Revises: 0004

A lease that expired (the worker died, or lost the database) used to consume one of the task's
``max_attempts``: three worker kills failed a job with 22 trials stored. Existing tasks start
at 0 requeues.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("requeues", sa.Integer(), nullable=False,
                                     server_default=sa.text("0")))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("requeues")
