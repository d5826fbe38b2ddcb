"""Engine and session setup: SQLite (WAL, busy timeout) by default, PostgreSQL for several
machines; migrations applied programmatically with Alembic (no alembic.ini at runtime)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

# ``sqlite:///<data dir>/tuner.db`` ($TUNER_DATA_DIR, else ./data): spelled in tuner.settings,
# where the service's settings read the environment; db itself takes explicit URLs
from tuner.settings import default_database_url as default_database_url

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

#: seconds a SQLite connection waits for another writer before "database is locked"
SQLITE_BUSY_TIMEOUT_S = 30


def normalise_url(url: str) -> str:
    """Route ``postgresql://`` (and ``postgres://``) URLs to the psycopg 3 driver."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme):]
    return url


def is_sqlite(url: str) -> bool:
    return make_url(normalise_url(url)).get_backend_name() == "sqlite"


#: the ``application_name`` of the service's PostgreSQL connections (``pg_stat_activity``
#: tells them from an operator's psql sessions by it)
APPLICATION_NAME = "tuner"


def make_engine(url: str) -> Engine:
    """An engine for ``url``. SQLite: the file's folder is created, every connection runs in
    WAL mode with a 30 s busy timeout and foreign keys on, and connections may cross threads.
    PostgreSQL (psycopg 3): connections are checked before use (``pool_pre_ping``) and named
    ``APPLICATION_NAME``."""
    url = normalise_url(url)
    if not is_sqlite(url):
        return create_engine(url, pool_pre_ping=True,
                             connect_args={"application_name": APPLICATION_NAME})
    database = make_url(url).database
    in_memory = database in (None, "", ":memory:")
    if not in_memory:
        Path(str(database)).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
        # an in-memory database lives in one connection: share it, or each one is empty
        **({"poolclass": StaticPool} if in_memory else {}))
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
    _set_wal(cursor)  # readers never block the one writer
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe with WAL
    cursor.close()


def _set_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode=WAL``, retried while the file is locked. Switching a new file
    to WAL takes an exclusive lock, and two connections asking at once (processes starting
    together on an empty database: CI saw one of four fail) can each hold the shared lock the
    other must lose: SQLite then answers "database is locked" at once, without its busy
    handler, to break the deadlock. The loser waits and asks again; by then the file is in
    WAL mode and the pragma is a read."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    delay = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (they are handed to other layers)."""
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine) -> Config:
    """An Alembic config built in code: ``db/migrations`` scripts, run on ``engine``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(url_or_engine: str | Engine) -> None:
    """Bring the schema to the newest migration. Idempotent, and safe when several processes
    start at once (they take turns: see ``db/migrations/env.py``)."""
    if isinstance(url_or_engine, Engine):
        command.upgrade(alembic_config(url_or_engine), "head")
        return
    engine = make_engine(url_or_engine)
    try:
        command.upgrade(alembic_config(engine), "head")
    finally:
        engine.dispose()


_FACTORIES: dict[str, sessionmaker[Session]] = {}
_FACTORIES_LOCK = threading.Lock()


def init_db(url: str) -> sessionmaker[Session]:
    """Migrate the database at ``url`` and return its session factory. One engine per URL per
    process: a second call returns the same factory without migrating again."""
    with _FACTORIES_LOCK:
        if url not in _FACTORIES:
            engine = make_engine(url)
            upgrade(engine)
            _FACTORIES[url] = make_session_factory(engine)
        return _FACTORIES[url]


def dispose(url: str) -> None:
    """Close the pooled connections of ``url``'s engine and forget it (tests drop their
    databases; a later ``init_db(url)`` starts afresh)."""
    with _FACTORIES_LOCK:
        factory = _FACTORIES.pop(url, None)
    bind = factory.kw.get("bind") if factory is not None else None
    if isinstance(bind, Engine):
        bind.dispose()
