"""SQLite files as the tests of a store's copy need them: a writer whose rows live only in the
write-ahead log, and a table's row count read from a file alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def writer_with_rows_only_in_its_log(path: Path, rows: int) -> sqlite3.Connection:
    """An open connection to a new WAL-mode file at ``path`` that committed ``rows`` rows of
    table ``jobs`` with automatic checkpoints off: the main file holds no table yet."""
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE jobs (id INTEGER)")
    writer.executemany("INSERT INTO jobs VALUES (?)", [(i,) for i in range(rows)])
    writer.commit()
    return writer


def row_count(path: Path, table: str) -> int | None:
    """Rows of ``table`` in the file at ``path`` read alone; None where it has no such table."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # no such table
        return None
    finally:
        conn.close()
