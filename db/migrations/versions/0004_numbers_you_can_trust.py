"""numbers you can trust: the GPU's state per trial, re-timed finalists, the same-child
baseline per task, the stored best's revision and measurement, calibration spreads

Revision ID: 0004
Revises: 0003

Existing best configs get revision 1 and no ``measured`` (stored before it was recorded);
existing trials, tasks and devices get NULLs (nothing was measured for them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COLUMNS: dict[str, list[sa.Column[object]]] = {
    "devices": [
        sa.Column("copy_gbps_spread", sa.Float(), nullable=True),
        sa.Column("matmul_tflops_spread", sa.Float(), nullable=True),
        sa.Column("calibration_runs", sa.Integer(), nullable=True),
    ],
    "tasks": [
        sa.Column("best_measured", sa.String(length=20), nullable=True),
        sa.Column("baseline_ms", sa.Float(), nullable=True),
        sa.Column("baseline_name", sa.String(length=40), nullable=True),
        sa.Column("incumbent_ms", sa.Float(), nullable=True),
        sa.Column("best_note", sa.Text(), nullable=True),
    ],
    "trials": [
        sa.Column("retimed_p20_ms", sa.Float(), nullable=True),
        sa.Column("retimed_p50_ms", sa.Float(), nullable=True),
        sa.Column("retimed_p80_ms", sa.Float(), nullable=True),
        sa.Column("sm_mhz", sa.Integer(), nullable=True),
        sa.Column("mem_mhz", sa.Integer(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("temp_c", sa.Integer(), nullable=True),
        sa.Column("throttle", sa.BigInteger(), nullable=True),
    ],
    "best_configs": [
        sa.Column("measured", sa.String(length=20), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=False, server_default=sa.text("1")),
    ],
}


def upgrade() -> None:
    for table, columns in _COLUMNS.items():
        for column in columns:
            op.add_column(table, column)


def downgrade() -> None:
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.drop_column(column.name)
