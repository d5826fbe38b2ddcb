"""Alembic environment. The engine comes from ``db.engine.alembic_config`` (no alembic.ini):
``config.attributes["engine"]``.

Processes that start at once against an empty database (an API replica and its workers) take
turns instead of racing to create the same tables; the second finds the schema at head and does
nothing. PostgreSQL: a transaction-scoped advisory lock, waited for without the connections'
``lock_timeout``. SQLite: ``BEGIN IMMEDIATE`` takes the write lock up front (the sqlite3 driver
would otherwise run the DDL outside a transaction).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from db.models import Base

#: arbitrary, fixed 64-bit key for pg_advisory_xact_lock ("tuner db" in ASCII)
MIGRATION_LOCK_KEY = 0x74756E6572206462

engine = context.config.attributes["engine"]

with engine.connect() as connection:
    # one transaction for every step, on SQLite too (Alembic would otherwise commit after each
    # migration, releasing the write lock, and a waiting process would run the next one too)
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite",
                      transactional_ddl=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # a process waits for another's migration however long it takes, and DDL for the
            # readers of its tables: the connections' lock_timeout is for short writes
            connection.execute(text("SET LOCAL lock_timeout = 0"))
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                               {"key": MIGRATION_LOCK_KEY})
        elif connection.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        context.run_migrations()
    connection.commit()
