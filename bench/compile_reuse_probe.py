"""Which of a config's kernels does the GPU child compile again after the pool compiled it?

Issue 33's first run found the child's compile step at 0.7 s a trial on matmul 1500x3001x999
(0.08-0.16 s on aligned GEMMs) although the compile pool had compiled every one of those
configs ahead, on the problem's ``compile_shape``. A binary found in Triton's disk cache loads
in milliseconds, so a step that long is a compile: the child's launch specialises differently
from the pool's. This probe runs the real backend on one problem (a fresh Triton cache), lets
its pool compile the kernel's known-good configs, then measures each and lists, per config,
the child's compile step and the kernels it added to the cache; for each added kernel, what
differs from the pool's entry of the same name (its metadata JSON).

Usage (on the GPU machine)::

    python3 -m bench.compile_reuse_probe --problem matmul:M=1500,N=3001,K=999:float16 \\
        --out $OUT/compile_reuse.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: metadata fields that name a build, not what it was built for
_IGNORED = {"hash", "name"}


def _entries(cache: Path) -> dict[str, dict[str, Any]]:
    """Each cache entry's folder name and its kernel's metadata (``<name>.json``)."""
    found: dict[str, dict[str, Any]] = {}
    for folder in cache.iterdir() if cache.exists() else ():
        for meta in folder.glob("*.json"):
            if meta.name.startswith("__grp__"):
                continue
            try:
                found[folder.name] = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue
    return found


def _difference(added: dict[str, Any], pool: list[dict[str, Any]]) -> str:
    """What ``added`` has unlike the pool's nearest entry of its name (fewest differences)."""
    best = None
    for other in pool:
        keys = (set(added) | set(other)) - _IGNORED
        diff = sorted(k for k in keys if added.get(k) != other.get(k))
        if best is None or len(diff) < len(best[0]):
            best = (diff, other)
    if best is None:
        return "no pool entry of this name"
    diff, other = best
    return "; ".join(f"{k}: {str(other.get(k))[:80]} -> {str(added.get(k))[:80]}"
                     for k in diff) or "identical metadata"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", action="append", required=True,
                        help="kernel:SHAPE:dtype, as bench.tuning_time takes it")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "interpret"],
                        help="interpret: a run of the probe's own code on a CPU (no pool)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="triton-cache-"))
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # before any process starts Triton

    from bench.tuning_time import parse_problem
    from search_spaces import get_kernel
    from tuner.backends.process import ProcessBackend

    lines = ["# What the GPU child compiles after the compile pool did (issue 33)", "",
             f"Command: `python3 -m bench.compile_reuse_probe {' '.join(sys.argv[1:])}`", ""]
    for text in args.problem:
        problem = parse_problem(text)
        kernel = get_kernel(problem.kernel)
        configs = list(dict.fromkeys(
            [kernel.default_config(problem.shape, problem.dtype),
             *kernel.known_good_configs(problem.shape, problem.dtype)]))
        backend = ProcessBackend(args.backend, kernel.ref, dict(problem.shape), problem.dtype)
        try:
            backend.prefetch(configs[1:])
            backend.measure(configs[:1])  # the first, and the rest queued behind it
            deadline = time.monotonic() + 600
            pool = backend._pool  # noqa: SLF001 - a probe of the pool's own work
            while pool is not None and (set(configs[1:]) - set(backend._compiled)) and (  # noqa: SLF001
                    time.monotonic() < deadline):
                for compiled in pool.poll(0.5):
                    backend._stash(compiled)  # noqa: SLF001
            before = _entries(cache)
            by_name: dict[str, list[dict[str, Any]]] = {}
            for meta in before.values():
                by_name.setdefault(str(meta.get("name")), []).append(meta)
            lines += [f"## {text}", "", f"{len(configs)} configs (the default and the "
                      f"known-good ones); the pool left {len(before)} cache entries.", "",
                      "| config | outcome | child's compile step s | kernels the child added "
                      "| unlike the pool's |", "| --- | --- | --- | --- | --- |"]
            for config in configs[1:]:
                m = backend.measure([config])[0]
                after = _entries(cache)
                added = {k: v for k, v in after.items() if k not in before}
                before = after
                names = ", ".join(sorted(str(v.get("name")) for v in added.values())) or "-"
                diffs = " / ".join(_difference(v, by_name.get(str(v.get("name")), []))
                                   for v in added.values()) or "-"
                step = m.extra.get("compile_step_s")
                lines.append(f"| `{config.key()}` | {m.outcome.value} | "
                             f"{step if step is not None else '-'} | {names} | {diffs} |")
            lines.append("")
        finally:
            backend.close()
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
