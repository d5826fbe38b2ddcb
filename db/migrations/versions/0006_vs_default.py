"""never worse than the default: each stored best and task records how it compares with the
kernel's default, both re-timed side by side (basis, default and search p50, noise margin)

Revision ID: 0006
Revises: 0005

Existing best configs and tasks get NULLs: they were never compared with the default.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COLUMNS: dict[str, list[sa.Column[object]]] = {
    "tasks": [
        sa.Column("default_config", sa.JSON(), nullable=True),
        sa.Column("default_ms", sa.Float(), nullable=True),
        sa.Column("best_basis", sa.String(length=20), nullable=True),
        sa.Column("noise_margin", sa.Float(), nullable=True),
    ],
    "best_configs": [
        sa.Column("basis", sa.String(length=20), nullable=True),
        sa.Column("default_ms", sa.Float(), nullable=True),
        sa.Column("search_ms", sa.Float(), nullable=True),
        sa.Column("noise_margin", sa.Float(), nullable=True),
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
