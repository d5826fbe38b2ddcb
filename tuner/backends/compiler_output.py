"""What a compile prints, kept out of a worker's log when the compile failed: Triton prints the
whole PTX of a config that ``ptxas`` rejects on stdout (~1,200 lines each), and a measuring
child's or compile process's stdout is the worker's log. A failed compile's output is cut to
its first lines (the error, ``ptxas``'s own lines, the repro command) and a note; the config's
error itself is stored with its trial. Output of a compile that succeeded (dumps a user asked
Triton for) passes on whole."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import TextIO

#: lines of a failed compile's output kept in the log
KEPT_LINES = 12


@contextlib.contextmanager
def captured_stdout() -> Iterator[io.StringIO]:
    """What the block prints on ``sys.stdout`` (Python's ``print``: Triton's dumps), held."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


def shortened(text: str, what: str, kept: int = KEPT_LINES) -> str:
    """``text``'s first ``kept`` non-blank lines, then a note of how many were left out."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) <= kept:
        return "\n".join(lines) + "\n" if lines else ""
    return "\n".join([*lines[:kept], f"[... {len(lines) - kept} more lines of the compiler's "
                      f"output for {what} left out of the log]"]) + "\n"


def pass_on(text: str, failed: bool, what: str, stream: TextIO | None = None) -> None:
    """Write a compile's held output where it would have gone: shortened when it failed."""
    if not text:
        return
    out = stream if stream is not None else sys.stdout
    out.write(shortened(text, what) if failed else text)
    out.flush()
