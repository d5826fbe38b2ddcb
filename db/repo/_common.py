"""The repository's shared pieces: its errors (``NotFound``, ``LeaseLost``) and the helpers
of its guarded writes (row counts, compare-and-set updates, inserts that ignore conflicts,
write transactions, reloading a row)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, Result, Select, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key


class NotFound(LookupError):
    """No row with that id or key (the API answers 404)."""


class LeaseLost(Exception):
    """The task is no longer the calling worker's (reaped, leased to another worker, cancelled
    or finished): its write was not made."""


# -- helpers ----------------------------------------------------------------------------------

def _rowcount(result: Result[Any]) -> int:
    return int(cast(CursorResult[Any], result).rowcount)


def _changed(session: Session, statement: Any) -> bool:
    """Run a guarded UPDATE that targets one row; True when it matched."""
    return _rowcount(session.execute(statement.execution_options(
        synchronize_session=False))) == 1


def _changed_row(session: Session, model: type[Any], row_id: Any, statement: Any) -> bool:
    """``_changed``, then the session's copy of the row (if it holds one) reloads on next
    access, so callers holding it never read what the UPDATE replaced."""
    changed = _changed(session, statement)
    cached = session.identity_map.get(identity_key(model, row_id))
    if cached is not None:
        session.expire(cached)
    return changed


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _insert_ignoring_conflicts(session: Session, model: type[Any], values: Mapping[str, Any],
                               key: Sequence[str]) -> bool:
    """``INSERT ... ON CONFLICT (key) DO NOTHING``; True when the row was inserted."""
    dialect = session.get_bind().dialect.name
    insert_for: Callable[..., Any]
    if dialect == "postgresql":
        insert_for = postgresql.insert
    elif dialect == "sqlite":
        insert_for = sqlite.insert
    else:
        raise NotImplementedError(f"database {dialect!r}: use SQLite or PostgreSQL")
    statement = (insert_for(model).values(**values).on_conflict_do_nothing(index_elements=key)
                 .returning(model.id))  # rowcount is -1 on psycopg; a returned id is certain
    return session.execute(statement).first() is not None


def _write_transaction(session: Session) -> None:
    """SQLite: make sure the connection is in a transaction that holds the write lock, so that a
    SAVEPOINT nests in it (the sqlite3 driver opens transactions only before INSERT, UPDATE and
    DELETE; a SAVEPOINT outside one would start its own, and releasing it would commit) and
    what this transaction reads stays true until it commits. PostgreSQL: nothing to do."""
    if _is_postgres(session):
        return
    connection = session.connection()
    if not getattr(connection.connection.dbapi_connection, "in_transaction", True):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _reloaded(session: Session, model: type[Any], row_id: Any) -> Any:
    """The row as the database has it now (in-session copies are overwritten)."""
    row = session.get(model, row_id, populate_existing=True)
    if row is None:
        raise NotFound(f"no {model.__tablename__} row {row_id!r}")
    return row


def _page(session: Session, query: Select[Any], order: Sequence[Any], limit: int,
          offset: int) -> tuple[list[Any], int]:
    """One page of ``query``'s rows in ``order``, and how many rows it matches in all (the
    lists of jobs and misses)."""
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(*order).limit(limit).offset(offset))
    return list(rows), int(total)
