"""``python -m tuner.run SCRIPT [ARGS]`` (or ``-m MODULE [ARGS]``): run a Python program with
``tuner.install()`` in effect, so every ``triton.autotune`` kernel it launches gets its configs
from the configs file or the service (``TUNER_CONFIGS_FILE``, ``TUNER_URL``,
``TUNER_PINNED``: as for ``tuner.autotune``) with no change to its source."""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

USAGE = "usage: python -m tuner.run SCRIPT [ARGS] | python -m tuner.run -m MODULE [ARGS]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args == ["-m"]:
        print(USAGE, file=sys.stderr)
        return 2
    from tuner.installing import install

    install()
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
