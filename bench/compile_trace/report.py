"""Read a ``TUNER_COMPILE_TRACE`` folder: per process kind, compiles and cache hits; for each
compile the GPU child missed in the cache, the pool's compile of the same kernel name and
constants (if any) and which parts of the cache key differed.

Usage: ``python3 -m bench.compile_trace.report FOLDER [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

#: the key's parts, in the order Triton joins them
PARTS = ("fn_cache_key", "attrs", "signature", "constants", "backend_hash", "options_hash",
         "env_vars")


def load(folder: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return sorted(records, key=lambda r: r.get("t", 0.0))


def role(record: dict[str, Any]) -> str:
    name = str(record.get("process", ""))
    if name == "tuner-compile":
        return "pool"
    if name.endswith("-child"):
        return "child"
    return name or "?"


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = [p for p in PARTS if a.get(p) != b.get(p)]
    if "options_hash" in out:
        ao, bo = a.get("options", {}), b.get("options", {})
        out += [f"options.{k}: {ao.get(k)} -> {bo.get(k)}"
                for k in sorted(set(ao) | set(bo)) if ao.get(k) != bo.get(k)]
    return out


def report(records: list[dict[str, Any]]) -> str:
    errors = [r for r in records if "error" in r]
    records = [r for r in records if "error" not in r]
    lines = ["# Triton compiles by process (bench/compile_trace)", ""]
    counts = Counter((role(r), r["hit"]) for r in records)
    lines += ["| process | compiles (cache miss) | loads (cache hit) |", "| --- | --- | --- |"]
    for who in sorted({role(r) for r in records}):
        lines.append(f"| {who} | {counts[(who, False)]} | {counts[(who, True)]} |")
    if errors:
        lines += ["", f"{len(errors)} trace errors, first: {errors[0]['error']}"]
    pool_by_hash = {r["hash"] for r in records if role(r) == "pool"}
    misses = [r for r in records if role(r) == "child" and not r["hit"]]
    lines += ["", "## The child's compiles", "",
              "| kernel | constants | the pool compiled this hash | nearest pool compile "
              "(same name and constants) differs in |", "| --- | --- | --- | --- |"]
    why = Counter()
    for r in misses:
        same = [p for p in records if role(p) == "pool" and p["name"] == r["name"]
                and p["constants"] == r["constants"] and p["t"] < r["t"]]
        if r["hash"] in pool_by_hash:
            diff = "(same hash: compiled by the pool after the child's look-up, or still "\
                   "being written)"
        elif not same:
            diff = "no pool compile of these constants"
        else:
            best = min((differences(p, r) for p in same), key=len)
            diff = "; ".join(best) or "nothing recorded differs"
        why[diff.split(":")[0] if diff.startswith("options.") else diff] += 1
        lines.append(f"| {r['name']} | `{r['constants'][:160]}` | "
                     f"{r['hash'] in pool_by_hash} | {diff[:400]} |")
    lines += ["", "## Why, counted", ""] + [f"- {n} x {d[:300]}" for d, n in why.most_common()]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--out")
    args = ap.parse_args()
    text = report(load(Path(args.folder)))
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
