"""Engine and session setup: SQLite (WAL, busy timeout) by default, PostgreSQL for several
machines; migrations applied programmatically with Alembic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def normalise_url(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def is_sqlite(url: str) -> bool:
    return normalise_url(url).startswith("sqlite")


def make_engine(url: str) -> Engine:
    url = normalise_url(url)
    if not is_sqlite(url):
        return create_engine(url, pool_pre_ping=True, future=True)
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    command.upgrade(alembic_config(engine), "head")


_FACTORIES: dict[str, sessionmaker[Session]] = {}


def init_db(url: str) -> sessionmaker[Session]:
    """Migrate the database at ``url`` and return a session factory (one engine per URL)."""
    if url not in _FACTORIES:
        engine = make_engine(url)
        upgrade(engine)
        _FACTORIES[url] = make_session_factory(engine)
    return _FACTORIES[url]


def dispose(url: str) -> None:
    """Close the pooled connections of ``url``'s engine (tests drop their databases)."""
    factory = _FACTORIES.pop(url, None)
    if factory is not None:
        bind = factory.kw.get("bind")
        if bind is not None:
            bind.dispose()
