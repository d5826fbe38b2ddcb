"""How long the service's processes take to import what they import, each in a fresh Python
(the median of ``--runs``), and whether this Python has byte code to load or compiles every
module from source (issue 33: the GPU machine's image ships no ``.pyc`` files and sets
``PYTHONDONTWRITEBYTECODE=1``, so every process there compiled torch's 2,000 modules again;
a ``pip install`` byte-compiles, as the project's Dockerfile does).

Usage: ``python3 -m bench.import_times --label source --out FILE`` (appends a table), then
``python3 -m compileall -q -j 16 <site-packages...>`` and the same with ``--label compiled``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: what each process of the service imports before it can do its part
IMPORTS = {
    "tuner serve, before it starts its workers":
        "import tuner.app.cli, tuner.app.cli_commands, tuner.app.service, db.engine",
    "torch (the GPU child's start)": "import torch",
    "triton": "import triton",
    "the worker's task imports (tuner.app.service.warm_imports)":
        "from tuner.app.service import warm_imports; warm_imports()",
}


def _pyc_share(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return "-"
    root = Path(next(iter(spec.submodule_search_locations)))
    sources = sum(1 for _ in root.rglob("*.py"))
    compiled = sum(1 for _ in root.rglob("*.pyc"))
    return f"{compiled} .pyc / {sources} .py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", required=True, help="markdown file (appended)")
    args = ap.parse_args()
    lines = [f"## {args.label}", "",
             f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}; "
             f"torch: {_pyc_share('torch')}; triton: {_pyc_share('triton')}; "
             f"sqlalchemy: {_pyc_share('sqlalchemy')}", "",
             "| imports | median s | runs s |", "| --- | --- | --- |"]
    for name, code in IMPORTS.items():
        runs = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            runs.append(time.perf_counter() - t0)
        lines.append(f"| {name} | {statistics.median(runs):.2f} | "
                     f"{', '.join(f'{r:.2f}' for r in runs)} |")
    text = "\n".join(lines) + "\n\n"
    with open(args.out, "a") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
