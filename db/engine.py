"""Engine and session setup: SQLite (WAL, busy timeout) by default, PostgreSQL for several
machines; migrations applied programmatically with Alembic (no alembic.ini at runtime)."""

from __future__ import annotations

import errno
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from db.sqlite_file import SqliteFile
from tuner.errors import DatabaseUrlError
from tuner.settings import DatabaseBounds

if TYPE_CHECKING:
    from alembic.config import Config

# ``sqlite:///<data dir>/tuner.db`` ($TUNER_DATA_DIR, else ./data): spelled in tuner.settings,
# where the service's settings read the environment; db itself takes explicit URLs
from tuner.settings import default_database_url as default_database_url

MIGRATIONS = Path(__file__).resolve().parent / "migrations"

#: seconds a SQLite connection waits for another writer before "database is locked"
SQLITE_BUSY_TIMEOUT_S = 30
#: the server-side limits of PostgreSQL connections unless told otherwise (the service passes
#: its settings': ``TUNER_DB_LOCK_TIMEOUT_S``, ``TUNER_DB_IDLE_IN_TRANSACTION_S``)
DEFAULT_BOUNDS = DatabaseBounds()


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
#: seconds a PostgreSQL connection attempt waits for the server (libpq's ``connect_timeout``;
#: unset, a server whose host drops packets holds it for minutes): the first lookup to find the
#: database gone waits this long at most (``api.serving``). The URL's ``?connect_timeout=`` wins
CONNECT_TIMEOUT_S = 5


def make_engine(url: str, *, create_folder: bool = True,
                bounds: DatabaseBounds = DEFAULT_BOUNDS) -> Engine:
    """An engine for ``url``. SQLite: the file's folder is created (``create_folder``; else a
    missing folder is a FileNotFoundError naming it), every connection runs in WAL mode with a
    30 s busy timeout and foreign keys on, and connections may cross threads. PostgreSQL
    (psycopg 3): connections are checked before use (``pool_pre_ping``), named
    ``APPLICATION_NAME`` and bounded by the server (``bounds``: ``server_options``)."""
    url = normalise_url(url)
    if not is_sqlite(url):
        return create_engine(url, pool_pre_ping=True,
                             connect_args={"application_name": APPLICATION_NAME,
                                           **_connect_timeout(url),
                                           "options": server_options(url, bounds)})
    database = make_url(url).database
    in_memory = database in (None, "", ":memory:")
    if not in_memory:
        _sqlite_folder(str(database), create_folder)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
        # an in-memory database lives in one connection: share it, or each one is empty
        **({"poolclass": StaticPool} if in_memory else {}))
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def server_options(url: str, bounds: DatabaseBounds) -> str:
    """The ``options`` a PostgreSQL connection starts with: ``bounds`` as ``lock_timeout`` and
    ``idle_in_transaction_session_timeout`` (milliseconds; 0 turns one off), then the URL's own
    ``options`` (``?options=-c%20lock_timeout%3D0``), which win where they set the same."""
    ours = (f"-c lock_timeout={round(bounds.lock_timeout_s * 1000)} "
            f"-c idle_in_transaction_session_timeout={round(bounds.idle_in_transaction_s * 1000)}")
    given = make_url(url).query.get("options")
    given = given[-1] if isinstance(given, tuple) else given
    return f"{ours} {given}" if given else ours


def _connect_timeout(url: str) -> dict[str, int]:
    """``CONNECT_TIMEOUT_S`` as a connection argument, unless the URL sets its own."""
    return {} if "connect_timeout" in make_url(url).query else {
        "connect_timeout": CONNECT_TIMEOUT_S}


def _sqlite_folder(database: str, create: bool) -> None:
    folder = Path(database).expanduser().resolve().parent
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    elif not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such folder (create it, or mount the volume "
                                "it is on)", str(folder))


def create_sqlite_folder(url: str) -> None:
    """Create the folder of a SQLite file ``url`` (nothing for PostgreSQL or in memory): what
    ``make_engine`` does with ``create_folder``, for a process that starts others on the URL
    before opening it (``tuner serve``: its workers are told the URL, and do not create it)."""
    url = normalise_url(url)
    if is_sqlite(url):
        database = make_url(url).database
        if database not in (None, "", ":memory:"):
            _sqlite_folder(str(database), True)


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
    """An Alembic config built in code: ``db/migrations`` scripts, run on ``engine``. Alembic
    is imported here, not with this module: ``tuner serve`` imports this module before it
    starts its workers, and Alembic's import was most of that (1.1 of 1.5 s uncompiled on a
    GPU machine), for migrations it runs after."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(url_or_engine: str | Engine) -> None:
    """Bring the schema to the newest migration. Idempotent, and safe when several processes
    start at once (they take turns: see ``db/migrations/env.py``)."""
    from alembic import command

    if isinstance(url_or_engine, Engine):
        command.upgrade(alembic_config(url_or_engine), "head")
        return
    engine = make_engine(url_or_engine)
    try:
        command.upgrade(alembic_config(engine), "head")
    finally:
        engine.dispose()


_FACTORIES: dict[str, sessionmaker[Session]] = {}
_FILES: dict[str, SqliteFile] = {}
_FACTORIES_LOCK = threading.Lock()


def init_db(url: str, *, create_folder: bool = True,
            bounds: DatabaseBounds = DEFAULT_BOUNDS) -> sessionmaker[Session]:
    """Migrate the database at ``url`` and return its session factory. One engine per URL per
    process: a second call returns the same factory without migrating again. A SQLite file's
    identity is recorded as opened (``opened_file``). ``create_folder``, ``bounds``: see
    ``make_engine`` (the service passes ``Settings.database_bounds``)."""
    with _FACTORIES_LOCK:
        if url not in _FACTORIES:
            engine = make_engine(url, create_folder=create_folder, bounds=bounds)
            try:
                upgrade(engine)
            except BaseException:
                engine.dispose()
                raise
            _FACTORIES[url] = make_session_factory(engine)
            _record_file(url)
        return _FACTORIES[url]


def _record_file(url: str) -> None:
    if is_sqlite(url):
        database = make_url(normalise_url(url)).database
        opened = SqliteFile.opened(database) if database not in (None, "", ":memory:") else None
        if opened is not None:
            _FILES[url] = opened


def opened_file(url: str) -> SqliteFile | None:
    """The SQLite file ``init_db(url)`` opened in this process (None: PostgreSQL, in memory,
    or not opened yet): ``problem()`` says whether its path still holds it."""
    return _FILES.get(url)


def dispose(url: str) -> None:
    """Close the pooled connections of ``url``'s engine and forget it (tests drop their
    databases; a later ``init_db(url)`` starts afresh)."""
    with _FACTORIES_LOCK:
        factory = _FACTORIES.pop(url, None)
        _FILES.pop(url, None)
    bind = factory.kw.get("bind") if factory is not None else None
    if isinstance(bind, Engine):
        bind.dispose()


def close_engine(url: str) -> None:
    """Close the pooled connections of ``url``'s engine in this process (it is stopping; the
    engine stays usable), then checkpoint a SQLite file's write-ahead log into the file, so
    that once the last process has closed it the file alone holds every committed row: a
    copy of it (a backup, a move) is whole. An in-memory database is left open (its one
    connection is the database)."""
    with _FACTORIES_LOCK:
        factory = _FACTORIES.get(url)
    bind = factory.kw.get("bind") if factory is not None else None
    if isinstance(bind, Engine):
        if isinstance(bind.pool, StaticPool):
            return
        bind.dispose()
    checkpoint_sqlite(url)  # what the last connection's close did not (another still open)


def checkpoint_sqlite(url: str) -> bool:
    """Move a SQLite file's write-ahead log into the file and empty the log (``PRAGMA
    wal_checkpoint(TRUNCATE)``, on a connection of its own, closed after). Whether it all
    went in: False where another process is reading or writing it (it then goes in when the
    last connection closes) or there is no such file. Not SQLite: False, nothing done."""
    if not is_sqlite(url):
        return False
    database = make_url(normalise_url(url)).database
    if database in (None, "", ":memory:") or not Path(database).is_file():
        return False
    try:
        conn = sqlite3.connect(database, timeout=1.0)
    except sqlite3.Error:
        return False
    try:
        busy, _frames, _moved = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return busy == 0
    except sqlite3.Error:
        return False
    finally:
        conn.close()


# -- a URL that can never work, and why a database does not answer -----------------------------

def shown_url(url: str) -> str:
    """``url`` with its password hidden, as messages show it (also where it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


#: the URLs this service runs on, as messages spell them
_URL_FORMS = "sqlite:///PATH or postgresql://USER@HOST:PORT/NAME"


def check_url(url: str) -> None:
    """DatabaseUrlError for a URL no retry can make work: one that does not parse, names an
    unknown dialect or a driver not installed here. Opens nothing."""
    try:
        create_engine(normalise_url(url)).dispose()
    except ArgumentError as exc:  # also NoSuchModuleError: an unknown dialect
        raise DatabaseUrlError(f"database URL {shown_url(url)!r}: {exc}; write it as "
                               f"{_URL_FORMS} (--db or TUNER_DATABASE_URL)") from None
    except ValueError as exc:  # e.g. a port that is not a number
        raise DatabaseUrlError(f"database URL {shown_url(url)!r} does not parse ({exc}); "
                               f"write it as {_URL_FORMS}") from None
    except ImportError as exc:
        raise DatabaseUrlError(f"database URL {shown_url(url)!r}: its driver is not installed "
                               f"({exc}); this service runs on {_URL_FORMS}") from None


def unreachable_reason(exc: BaseException) -> str:
    """Why a database did not answer, in a few words: the driver's own reason ("connection
    refused", "unable to open database file") or the file system's ("/x: permission
    denied"), never the SQL or SQLAlchemy's background link."""
    if isinstance(exc, DBAPIError):
        first = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
        # psycopg: 'connection failed: connection to server at "h", port 5439 failed: Connection
        # refused' -- the last clause is the reason
        reason = first.rsplit(": ", 1)[-1].strip()
        return _lower_first(reason)[:200]
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{_lower_first(exc.strerror or str(exc))}"
    return f"{type(exc).__name__}: {exc}"[:200]


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[1:2].islower() else text
