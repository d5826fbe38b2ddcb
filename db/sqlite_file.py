"""The SQLite file a process opened, and whether its path still holds that file.

A SQLite connection keeps writing to the file it opened after the file is deleted or replaced:
``tuner serve`` answered 72 submissions 202 and ``/readyz`` "ready" while every write went to
an unlinked file, lost at exit (issue 28). The file's identity (device, inode) recorded when the
engine opened it, compared with what the path holds now, tells it in one ``os.stat``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: what the service must do once its file is gone: a new process opens the path afresh
RESTART = "restart the service (tuner serve, or this API process) to open the file at that path"


@dataclass(frozen=True)
class SqliteFile:
    """A SQLite database file as opened: its absolute path and (st_dev, st_ino) then."""

    path: Path
    identity: tuple[int, int]

    @classmethod
    def opened(cls, database: str) -> SqliteFile | None:
        """The file at ``database`` (a path as a SQLite URL spells it) as it is now; None when
        there is none there (an in-memory database, or a URI SQLite resolves itself)."""
        path = Path(database).expanduser().resolve()
        try:
            stat = os.stat(path)
        except OSError:
            return None
        return cls(path, (stat.st_dev, stat.st_ino))

    def problem(self) -> str | None:
        """None while the path still holds the file opened; else what happened to it and what
        to do (one ``os.stat``)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return (f"the database file {self.path} was removed while the service ran; what it "
                    f"writes now would be lost with the deleted file: {RESTART}")
        except OSError as exc:
            return f"the database file {self.path} cannot be read ({exc.strerror}): {RESTART}"
        if (stat.st_dev, stat.st_ino) != self.identity:
            return (f"the database file {self.path} was replaced by another file while the "
                    f"service ran; the service still writes to the old one: {RESTART}")
        return None
