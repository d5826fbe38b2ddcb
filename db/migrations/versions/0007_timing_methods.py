"""timing methods: how a result was timed (eager-flushed, cuda-graph, eager-hot) on jobs, tasks,
best configs and misses; part of a best's and a miss's identity

Revision ID: 0007
Revises: 0006

Every result stored so far was timed eagerly with the L2 flushed: existing jobs, best configs
and misses get ``eager-flushed``; existing tasks get it where they ran (a device is recorded),
NULL where they did not. The unique keys of best configs and misses gain the column, so that
bests of one shape timed two ways coexist.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DEFAULT = "eager-flushed"
_BEST_KEY = ["device_key", "kernel", "kernel_version", "dtype", "shape_key", "triton_version"]
_MISS_KEY = ["device_key", "kernel", "kernel_version", "dtype", "shape_key"]


def _timing() -> sa.Column[str]:
    return sa.Column("timing", sa.String(length=20), nullable=False,
                     server_default=sa.text(f"'{DEFAULT}'"))


def upgrade() -> None:
    op.add_column("jobs", _timing())
    op.add_column("tasks", sa.Column("timing", sa.String(length=20), nullable=True))
    op.execute(f"UPDATE tasks SET timing = '{DEFAULT}' WHERE device_key IS NOT NULL")
    for table, name, key in (("best_configs", "uq_best_key", _BEST_KEY),
                             ("misses", "uq_miss_key", _MISS_KEY)):
        with op.batch_alter_table(table) as batch:
            batch.add_column(_timing())
            batch.drop_constraint(name, type_="unique")
            batch.create_unique_constraint(name, [*key, "timing"])


def downgrade() -> None:
    # a shape's bests (and misses) of other methods than the default would collide in the
    # narrower key: only the default's are kept
    for table, name, key in (("best_configs", "uq_best_key", _BEST_KEY),
                             ("misses", "uq_miss_key", _MISS_KEY)):
        op.execute(f"DELETE FROM {table} WHERE timing <> '{DEFAULT}'")
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(name, type_="unique")
            batch.create_unique_constraint(name, key)
            batch.drop_column("timing")
    for table in ("tasks", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("timing")
