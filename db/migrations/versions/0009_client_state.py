"""client state: how a client-measured best was timed (the GPU's clocks, power, temperature and
throttle reasons as the model's process sampled them, and the timer), sent with Triton's own
benchmark results by ``tuner.install()``

Revision ID: 0009
Revises: 0008

Bests a worker stored have none: existing rows get NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("best_configs", sa.Column("client_state", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("best_configs") as batch:
        batch.drop_column("client_state")
