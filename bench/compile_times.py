"""Each problem's compile times from a service log written with the compile pool's debug lines
(``TUNER_DEBUG_LOGGERS=tuner.backends.compile_pool``): per problem, how many configs the pool
compiled and the seconds each took of its process (CPU) and from its dispatch to its result
(wall). Where the search waits on compiles (issue 33), a compile's wall is the floor of a
config's latency: four configs in flight over a ~1.5 s compile measure ~2.7 configs a second.

    python3 -m bench.compile_times \\
        bench/results/tuning_time_33i/timeline_20346a7_h100_service.log.gz \\
        --out bench/results/tuning_time_33i/compile_times_20346a7_h100.md
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

PROBLEM = re.compile(r"measuring child \(pid \d+\) for (\S+) \{(.*?)\} (\w+)")
COMPILED = re.compile(r"pool: ok (\S+) in ([\d.]+) s of the process, ([\d.]+) s after its "
                      r"dispatch")


def read(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8", "replace")


def compile_times(log: str) -> dict[str, list[tuple[float, float]]]:
    """(CPU s, wall s) of each config the pool compiled, by the problem then being tuned."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    problem = None
    for line in log.splitlines():
        found = PROBLEM.search(line)
        if found:
            shape = found.group(2).replace("'", "").replace(": ", "=").replace(", ", ",")
            problem = f"{found.group(1)} {shape} {found.group(3)}"
            continue
        done = COMPILED.search(line)
        if done and problem is not None:
            out[problem].append((float(done.group(2)), float(done.group(3))))
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    times = compile_times(read(args.log))
    if not times:
        print(f"compile_times: no compile pool debug lines in {args.log}", file=sys.stderr)
        return 2
    lines = ["# Compile times by problem, from a service log", "",
             f"Command: `python3 -m bench.compile_times {' '.join(argv or sys.argv[1:])}`", "",
             "| problem | configs compiled | CPU s median | CPU s p90 | wall s median | "
             "wall s max |", "|---|---|---|---|---|---|"]
    for problem, rows in times.items():
        cpu, wall = [c for c, _ in rows], [w for _, w in rows]
        lines.append(f"| {problem} | {len(rows)} | {statistics.median(cpu):.2f} | "
                     f"{_quantile(cpu, 0.9):.2f} | {statistics.median(wall):.2f} | "
                     f"{max(wall):.2f} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
