"""Write bench/results/README.md: one line per result, grouped by kernel family or subsystem.

    python3 -m bench.index_results            # rewrite bench/results/README.md
    python3 -m bench.index_results --check    # exit 1 if it is stale (tests/test_bench_index.py)

A result is a file directly under bench/results/ (files that differ only in their extension,
``targets_14_h200.md`` and ``.json``, are one result) or a folder there (one result, however
many files it holds); bench/results/archive/ is indexed the same way in its own section. For
each: what it is (the first markdown heading of the file, or of the folder's COMMAND.md or
first .md; else the file's first line), the script that produced it (the first
``python3 -m bench.X`` / ``bench/X.py`` / ``bench/X.sh`` command in the file or folder, else
the bench script the name starts with, marked "by name"), its command's arguments, and the
commit that added it (one ``git log --name-status`` call over bench/results; a path moved by
``git mv`` keeps the commit that first added it; a folder: the commit that added its first
file). Nothing here reads the clock or the machine, so the output depends only on the tree
and its history.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("bench/results")
INDEX = RESULTS / "README.md"
ARCHIVE = "archive"

#: (topic, name patterns), first match wins; the order is bench/NOTES.md's.
TOPICS: list[tuple[str, tuple[str, ...]]] = [
    ("Flash attention", (r"flash",)),
    ("Softmax", (r"softmax",)),
    ("MoE grouped GEMM", (r"moe",)),
    ("GEMM epilogue (bias + activation)", (r"epilogue",)),
    ("GEMM (matmul)", (r"matmul", r"(?<!non)gemm", r"^align", r"skinny", r"split_tile",
                       r"stream_k", r"^sm90", r"^tma_", r"fp32_tf32", r"variant_table_picks",
                       r"^targets_13")),
    ("Several families at once (issue 14: vector add, layer norm, conv2d, softmax, flash)",
     (r"^targets_14",)),
    ("Search and strategies", (r"^search_quality", r"^record_", r"holdout", r"prior_fit",
                               r"^variant_tables", r"cli_tune_unaligned")),
    ("Measurement and timing", (r"^timing_", r"warmup", r"host_bound", r"gpu_faults",
                                r"tuning_speed", r"verification_calibration", r"^numbers")),
    ("Service, worker and fleet", (r"^tuning_time", r"serving_load", r"multi_gpu", r"fleet",
                                   r"serve_demo", r"dashboard", r"^cli_tune")),
    ("Install hook, client and plugins", (r"launch_rate", r"plugin_demo", r"corpus_demo")),
    ("Cold start", (r"^install_",)),
    ("GPU test transcripts", (r"^gpu_tests",)),
]
OTHER = "Other"

#: result names whose producing script their files do not state, by prefix.
SCRIPT_BY_NAME: list[tuple[str, str]] = [
    ("gpu_tests", "scripts/gpu_tests.sh"),
    ("record_nongemm", "bench/nongemm_tables.sh"),
    ("record_holdout", "bench/record_tables.py"),
    ("serve_demo", "bench/serve_demo.sh"),
    ("variant_table_picks", "bench/matmul_variants.py"),
    ("numbers", "tuner tune"),
]

COMMAND = re.compile(
    r"(?:python3?\s+(?:-m\s+)?bench[./](?P<mod>\w+)(?:\.py)?"
    r"|(?:bash\s+)?bench/(?P<sh>\w+)\.sh)(?P<args>[^\n`]*)")


@dataclass
class Result:
    name: str            # path relative to bench/results/, a folder without its slash
    files: list[Path] = field(default_factory=list)
    is_dir: bool = False
    what: str = ""
    script: str = ""
    args: str = ""
    commit: str = ""
    when: int = 0


def _read(path: Path, limit: int = 20000) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return ""
    if b"\0" in data:
        return ""
    return data.decode("utf-8", "replace")


def _heading(text: str) -> str | None:
    for line in text.splitlines()[:40]:
        if line.startswith("# "):
            return line[2:].strip()
    return None


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return ""


def _shorten(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _what_of_file(path: Path) -> str:
    text = _read(path)
    if path.suffix == ".csv" and "clocks" in _first_line(text):
        return "GPU state (nvidia-smi)"
    if path.suffix in (".db", ".sqlite") or (not text and path.stat().st_size):
        return "database / binary"
    head = _heading(text)
    if head:
        return head
    if path.suffix in (".json", ".jsonl"):
        return "JSON data"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines[:3]:
        if line.startswith("== ") and "pytest" in line:
            return "pytest transcript: " + line.split(" ", 2)[-1]
    first = lines[0] if lines else ""
    if "[100%]" in first:
        return "pytest transcript"
    if first.startswith("name, clocks") or first.startswith("NVIDIA "):
        # a device banner or nvidia-smi's state: say whose output it is
        script = _script_by_name(path.stem)
        banner = next((ln for ln in lines if ln.startswith("NVIDIA ")), first)
        return f"{Path(script).stem or 'run'} output ({banner.split(',')[0]})"
    return first or "(empty)"


def _command_in(paths: list[Path]) -> tuple[str, str] | None:
    for path in paths:
        m = COMMAND.search(_read(path))
        if m:
            if m["mod"]:
                script = f"bench/{m['mod']}.py"
                if not (ROOT / script).exists() and (ROOT / f"bench/{m['mod']}.sh").exists():
                    script = f"bench/{m['mod']}.sh"
            else:
                script = f"bench/{m['sh']}.sh"
            args = m["args"].strip()
            return script, args
    return None


def _script_by_name(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    for prefix, script in SCRIPT_BY_NAME:
        if base.startswith(prefix):
            return script
    best = ""
    for path in sorted((ROOT / "bench").iterdir()):
        if path.suffix in (".py", ".sh") and base.startswith(path.stem + "_") or base == path.stem:
            if len(path.stem) > len(Path(best).stem):
                best = f"bench/{path.name}"
    return best


def topic_of(name: str, script: str) -> str:
    base = name.rsplit("/", 1)[-1].lower()
    for topic, patterns in TOPICS:
        if any(re.search(p, base) for p in patterns):
            return topic
    stem = Path(script).stem
    for topic, patterns in TOPICS:
        if stem and any(re.search(p, stem) for p in patterns):
            return topic
    return OTHER


def collect(root: Path = ROOT) -> list[Result]:
    """The results under bench/results/ (and its archive/), without commits."""
    results: list[Result] = []
    for base in (root / RESULTS, root / RESULTS / ARCHIVE):
        if not base.is_dir():
            continue
        prefix = "" if base == root / RESULTS else ARCHIVE + "/"
        by_stem: dict[str, Result] = {}
        for entry in sorted(base.iterdir()):
            if entry.name.startswith(".") or entry.name == "README.md" or (
                    base == root / RESULTS and entry.name == ARCHIVE):
                continue
            if entry.is_dir():
                files = sorted(p for p in entry.rglob("*") if p.is_file())
                results.append(Result(prefix + entry.name, files, True))
            else:
                stem = entry.name.split(".", 1)[0]
                res = by_stem.setdefault(stem, Result(prefix + stem))
                res.files.append(entry)
        results.extend(by_stem.values())
    for res in results:
        _describe(res)
    return results


def _describe(res: Result) -> None:
    if res.is_dir:
        command = [p for p in res.files if p.name == "COMMAND.md"]
        readme = [p for p in res.files if p.name == "README.md"]
        mds = [p for p in res.files if p.suffix == ".md" and p not in command + readme]
        what = None
        for path in command + readme + mds:
            what = _heading(_read(path))
            if what:
                break
        firsts = [_first_line(_read(p)) for p in command + readme + mds + res.files]
        firsts = [f for f in firsts if f and f[0] not in "{[" and not f.startswith("name, clocks")]
        # a transcript's first command says more than a log's (possibly cut) first line
        firsts.sort(key=lambda f: not f.startswith(("$ ", "== ")))
        what = what or (firsts[0] if firsts else "JSON data")
        found = _command_in(command + readme + mds + [p for p in res.files if p not in mds])
    else:
        order = sorted(res.files, key=lambda p: (p.suffix != ".md", p.suffix))
        what = next((w for w in (_what_of_file(p) for p in order)
                     if w not in ("JSON data", "GPU state (nvidia-smi)")), None)
        what = what or _what_of_file(order[0])
        found = _command_in(order)
    res.what = _shorten(what, 110)
    if found:
        res.script, args = found
        args = re.sub(r"--out\s+\S+", "--out ...", args)
        res.args = _shorten(re.sub(r"\s*>\s*\S+", "", args), 90)
    else:
        by_name = _script_by_name(res.name)
        res.script = f"{by_name} (by name)" if by_name else ""


def added_commits(root: Path = ROOT) -> dict[str, tuple[str, int]]:
    """Each path under bench/results: (the commit that first added it, its time), following
    renames; one git call."""
    out = subprocess.run(
        ["git", "log", "--reverse", "-M", "--name-status", "--diff-filter=AR",
         "--format=%x01%H %ct", "--", str(RESULTS)],
        cwd=root, capture_output=True, text=True, check=True).stdout
    added: dict[str, tuple[str, int]] = {}
    current = ("", 0)
    for line in out.splitlines():
        if line.startswith("\x01"):
            h, t = line[1:].split()
            current = (h[:7], int(t))
        elif line:
            parts = line.split("\t")
            if parts[0] == "A":
                added.setdefault(parts[1], current)
            elif parts[0].startswith("R") and len(parts) == 3:
                added.setdefault(parts[2], added.get(parts[1], current))
    return added


def render(results: list[Result], added: dict[str, tuple[str, int]],
           root: Path = ROOT) -> str:
    for res in results:
        stamps = [added.get(p.relative_to(root).as_posix()) for p in res.files]
        known = [s for s in stamps if s]
        if known:
            res.commit, res.when = min(known, key=lambda s: s[1])
        else:
            res.commit, res.when = "uncommitted", 1 << 40
        if len(known) < len(stamps) and known:
            res.commit += " (+ uncommitted files)"
    live = [r for r in results if not r.name.startswith(ARCHIVE + "/")]
    archived = [r for r in results if r.name.startswith(ARCHIVE + "/")]
    lines = [
        "# bench/results: index",
        "",
        "Generated by `python3 -m bench.index_results` (do not edit by hand; "
        "`tests/test_bench_index.py` fails when it is stale). One line per result: a file "
        "(its `.md`/`.json`/`.log` siblings of one name together) or a folder. *What*: its "
        "first heading (or first line); *script*: the command its text names (\"by name\": "
        "inferred from the file name); *added*: the commit that added it. Newest first within "
        "a topic. What the numbers mean: [`bench/NOTES.md`](../NOTES.md); superseded runs: "
        "[`archive/`](archive/).",
        "",
        f"{len(live)} results, {len(archived)} archived.",
        "",
    ]
    groups: dict[str, list[Result]] = {}
    for res in live:
        groups.setdefault(topic_of(res.name, res.script), []).append(res)
    order = [t for t, _ in TOPICS] + [OTHER]
    sections = [(t, groups[t]) for t in order if t in groups]
    if archived:
        sections.append(("Archive (superseded runs)", archived))
    lines.append("Topics: " + ", ".join(
        f"[{t}](#{_anchor(t)}) ({len(rs)})" for t, rs in sections) + ".")
    for topic, rs in sections:
        lines += ["", f"## {topic}", "",
                  "| result | what | script | arguments | added |",
                  "| --- | --- | --- | --- | --- |"]
        for res in sorted(rs, key=lambda r: (-r.when, r.name)):
            if res.is_dir:
                label = f"[`{res.name}/`]({res.name}/) ({len(res.files)} files)"
            else:
                main = min(res.files, key=lambda p: (p.suffix != ".md", p.name))
                target = main.relative_to(root / RESULTS).as_posix()
                if len(res.files) == 1:
                    label = f"[`{target}`]({target})"
                else:
                    exts = ", ".join(p.name[len(Path(res.name).name):] for p in res.files)
                    label = f"[`{res.name}`]({target}) ({exts})"
            if res.script.endswith(" (by name)"):
                script = f"`{res.script[:-len(' (by name)')]}` (by name)"
            else:
                script = f"`{res.script}`" if res.script else ""
            args = f"`{res.args}`" if res.args else ""
            lines.append(f"| {label} | {_cell(res.what)} | {script} | {_cell(args)} | "
                         f"{res.commit} |")
    return "\n".join(lines) + "\n"


def _anchor(title: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    return slug


def generate(root: Path = ROOT) -> str:
    return render(collect(root), added_commits(root), root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the index is stale")
    args = ap.parse_args(argv)
    text = generate()
    path = ROOT / INDEX
    if args.check:
        current = path.read_text() if path.exists() else ""
        if current != text:
            print(f"{INDEX} is stale: run python3 -m bench.index_results", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
