"""Writing a benchmark's markdown report: the one tail the study scripts share."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def write_report(lines: list[str], out: str) -> int:
    """Write ``lines`` (one per line) to ``out`` (its folder made), print them, and return
    0: a script's ``main`` ends with ``return write_report(lines, args.out)``."""
    text = "\n".join(lines) + "\n"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(text)
    return 0


def command_text(module: str, argv: Sequence[str] | None) -> str:
    """``python3 -m bench.MODULE ARGS``: how a script was run (``argv``: its ``main``'s, None
    for the command line's own)."""
    args = sys.argv[1:] if argv is None else argv
    return f"python3 -m bench.{module} {' '.join(args)}"
