"""Record exhaustive replay-v1 tables: every config of a kernel's WHOLE space, one table per shape.

    python3 -m bench.record_tables --kernel softmax --out-dir DIR \\
        --shapes "M=4096,N=8192:float16;M=16,N=131072:float16" [--backend cuda|interpret]
        [--limit-seconds 150] [--total-seconds T [--reserve-seconds 30]] [--sample N]
    python3 -m bench.record_tables --summary --out-dir DIR      # a line about each table
    python3 -m bench.record_tables --out-dir tests/data/replay [--shapes all|0,2|MxNxK:dtype]

The kernel is loaded by name (``search_spaces.get_kernel``: built-ins and plugins); the default is
matmul with its ``SHAPES``. Every config of ``kernel.space()`` is measured, including the ones the
kernel's constraints would prune (each entry then carries the constraint's reason under
``"constraint"``), so that a table is evidence about the whole space, the constraints included.
Each goes through the product's own pipeline (ProcessBackend: the compile pool, the measuring
child, verification against the kernel's reference, do_bench with the L2 flushed); failures and
wrong results are recorded as errors. Configs are measured in a seeded random order, so that a
table cut short by the wall-clock limit is an unbiased sample; the table says so (``timing``
and ``coverage``). ``reference_ms`` holds the kernel's ``torch_baseline`` time where it has one.

Configs that run the same code on a problem (the kernel's optional ``same_kernel``: matmul's
SPLIT_K outside split_k, ALIGN=1 where nothing needs copying) are one kernel, measured once under
the config that names it. ``--sample N`` measures the first N of the seeded order: a uniform random
sample of the whole space, the same configs for every shape (so shapes of one dtype and
alignment share the compiled binaries in Triton's cache), where the whole space is more than a
session can measure (matmul with its variants: 21,600 distinct kernels a problem).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SHAPES = [
    ({"M": 16, "N": 4096, "K": 4096}, "float16"),
    ({"M": 32, "N": 14336, "K": 4096}, "bfloat16"),
    ({"M": 2048, "N": 2048, "K": 2048}, "bfloat16"),
    ({"M": 4096, "N": 4096, "K": 4096}, "bfloat16"),
    ({"M": 16384, "N": 1024, "K": 1024}, "float16"),
    ({"M": 1000, "N": 3000, "K": 500}, "float16"),
    ({"M": 777, "N": 1234, "K": 4321}, "float16"),
]
#: what the baseline is called in reference_ms (default: "torch (<kernel>.torch_baseline)")
BASELINE_LABELS = {"matmul": "torch.matmul (cuBLAS)", "softmax": "torch.softmax"}
#: how each config is timed on the GPU (the tables in tests/data/replay used the same)
TIMING = dict(warmup_ms=5, rep_ms=20, compile_timeout_s=30, run_timeout_s=20)
#: with --total-seconds, a table is not started with less than this left for it
MIN_TABLE_S = 10.0
#: seconds between progress lines
PROGRESS_EVERY_S = 5.0

Shape = dict[str, int]
Log = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


# -- shapes and names ---------------------------------------------------------------------------

def parse_shape(item: str, dims: Sequence[str]) -> tuple[Shape, str]:
    """``M=4096,N=8192:float16`` or ``4096x8192:float16`` (values in the order of ``dims``)."""
    text, sep, dtype = item.strip().rpartition(":")
    if not sep or not text or not dtype:
        raise ValueError(f"{item!r}: expected DIMS:dtype, e.g. M=4096,N=8192:float16")
    if "=" in text:
        pairs = [p.split("=", 1) for p in text.split(",")]
        shape = {k.strip(): int(v) for k, v in pairs}
    else:
        values = [int(v) for v in text.split("x")]
        if len(values) != len(dims):
            raise ValueError(f"{item!r}: {len(values)} values for the dims {', '.join(dims)}")
        shape = dict(zip(dims, values, strict=True))
    if set(shape) != set(dims):
        raise ValueError(f"{item!r}: the kernel's dims are {', '.join(dims)}")
    return {d: shape[d] for d in dims}, dtype.strip()


def select_shapes(spec: str, dims: Sequence[str] = ("M", "N", "K"),
                  presets: Sequence[tuple[Shape, str]] = tuple(SHAPES)
                  ) -> list[tuple[Shape, str]]:
    """``all`` (the presets), entries separated by ``;`` (``M=..,N=..:dtype`` or
    ``AxB:dtype``), or the older comma-separated ``0,2,MxNxK:dtype`` (indices into presets)."""
    if spec == "all":
        return list(presets)
    out: list[tuple[Shape, str]] = []
    for entry in (e.strip() for e in spec.split(";")):
        if not entry:
            continue
        for item in [entry] if "=" in entry else entry.split(","):
            out.append(presets[int(item)] if item.strip().isdigit()
                       else parse_shape(item, dims))
    return out


def device_tag(fp: Any) -> str:
    """A short name of the device for file names: ``h200``, ``interpret``."""
    if getattr(fp, "kind", "") == "interpret":
        return "interpret"
    name = str(getattr(fp, "name", "") or "gpu")
    model = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", name)
    return model.group(1).lower() if model else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def table_name(shape: Shape, dtype: str, kernel: str = "matmul", tag: str = "h200") -> str:
    return f"{kernel}_{'x'.join(str(v) for v in shape.values())}_{dtype}_{tag}.json"


# -- the table ----------------------------------------------------------------------------------

def entry_of(m: Any, constraint: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"config": m.config.to_dict()}
    if m.ok:
        entry["ms"] = round(m.p50_ms, 6)
    else:
        # the replay backend reads "OutOfResources" in an error as out_of_resources
        kind = "OutOfResources" if m.outcome.value == "out_of_resources" else m.outcome.value
        entry["error"] = f"{kind}: {(m.error or '')[:300]}"
    if constraint:
        entry["constraint"] = constraint
    return entry


def table_of(shape: Shape, dtype: str, measurements: list, fp: object, timing: str, *,
             kernel: str = "matmul", kernel_note: str | None = None,
             constraints: dict | None = None, params: Sequence[str] | None = None,
             coverage: dict[str, Any] | None = None) -> dict[str, Any]:
    """A replay-v1 table (shared/replay/README.md) of ``measurements``; ``constraints`` maps a
    config to the reason the kernel's constraints would prune it."""
    results = [entry_of(m, (constraints or {}).get(m.config)) for m in measurements]
    table: dict[str, Any] = {
        "format": "replay-v1", "kernel": kernel,
        "kernel_note": kernel_note or ("search_spaces/matmul.py: C = A @ B, fp32 accumulate, "
                                       "masked edges, grouped tile order"),
        "device": getattr(fp, "name", "?"),
        "triton_version": getattr(fp, "triton_version", "?"),
        "torch_version": getattr(fp, "torch_version", "?"), "shape": shape, "dtype": dtype,
        "timing": timing, "reference_ms": {},
        "params": list(params) if params else (list(results[0]["config"]) if results else []),
        "results": results}
    if coverage is not None:
        table["coverage"] = coverage
    return table


# -- measuring ----------------------------------------------------------------------------------

def baseline_ms(kernel: Any, shape: Shape, dtype: str, backend: str) -> float | None:
    """The kernel's torch baseline on this problem (do_bench on the GPU; on the interpreter
    the median CPU wall time of 5 calls, which says nothing about a GPU); None without one."""
    fn = getattr(kernel, "torch_baseline", None)
    if fn is None:
        return None
    device = "cuda" if backend == "cuda" else "cpu"
    try:
        return _time_baseline(fn, kernel.make_inputs(shape, dtype, device, 0), device)
    finally:
        if device == "cuda":  # the next table's child needs the memory more than we do
            import torch

            torch.cuda.empty_cache()


def _time_baseline(fn: Callable[[Any], None], inputs: Any, device: str) -> float:
    if device == "cuda":
        import triton.testing

        q = triton.testing.do_bench(lambda: fn(inputs), warmup=25, rep=100,
                                    quantiles=[0.2, 0.5, 0.8])
        return float(q[1])
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn(inputs)
        samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)[2]


def timing_note(backend: str, done: int, total: int, wall: float, stopped: str,
                compile_timeout_s: float = 30.0) -> str:
    if backend == "cuda":
        how = ("pipeline: triton.testing.do_bench(warmup=5 ms, rep=20 ms; a config over 2x the "
               "best so far keeps a 5 ms quick timing), median ms, randn inputs, L2 flushed; "
               "output verified against the kernel's reference first; compiles over "
               f"{compile_timeout_s:.0f} s recorded as timeouts")
    else:
        how = ("Triton CPU interpreter through the pipeline, median wall time of 3 runs (not a "
               "GPU timing); output verified against the kernel's reference first")
    cut = (f"; INCOMPLETE ({stopped}): a seeded random sample of the space"
           if done < total else "")
    return f"{how}; {done} of {total} configs of the whole space in {wall:.0f} s{cut}"


def _progress(label: str, measured: list, total: int, t0: float) -> str:
    ok = [m.p50_ms for m in measured if m.ok and m.p50_ms]
    best = f"best {min(ok):.4f} ms" if ok else "none ok yet"
    return (f"[{label}] {len(measured)}/{total} configs ({len(ok)} ok), {best}, "
            f"{time.monotonic() - t0:.0f} s")


def measure_space(backend: Any, configs: list, limit_s: float, t0: float, label: str,
                  batch: int, log: Log = _print) -> tuple[list, str]:
    """Measure ``configs`` in batches until done or ``limit_s`` after ``t0`` (the first batch
    always: a slow start still leaves a table). Returns the measurements and why it stopped
    early ("" when it did not)."""
    from tuner.errors import WorkerDied

    measured: list = []
    shown, stopped = t0, ""
    for i in range(0, len(configs), batch):
        if i and time.monotonic() - t0 > limit_s:
            stopped = f"cut at the {limit_s:.0f} s limit"
            break
        try:
            measured += backend.measure(configs[i:i + batch])
        except WorkerDied as exc:
            stopped = f"the device became unusable: {exc}"
            break
        except Exception as exc:  # noqa: BLE001 - one bad batch must not lose the table
            log(f"[{label}] batch {i // batch} failed: {type(exc).__name__}: {exc}")
            stopped = f"batch {i // batch} failed: {type(exc).__name__}"
        if time.monotonic() - shown >= PROGRESS_EVERY_S or i + batch >= len(configs):
            shown = time.monotonic()
            log(_progress(label, measured, len(configs), t0))
    if stopped:
        log(f"[{label}] {stopped}")
    return measured, stopped


def distinct_kernels(kernel: Any, configs: Sequence[Any], shape: Shape,
                     dtype: str) -> list[Any]:
    """``configs`` with each kernel once: the kernel's optional ``same_kernel(config, shape,
    dtype)`` names the config that runs the same code (matmul: SPLIT_K outside split_k, ALIGN
    where nothing is copied); without it every config is its own. Space order is kept."""
    same = getattr(kernel, "same_kernel", None)
    if not callable(same):
        return list(configs)
    return list(dict.fromkeys(same(c, shape, dtype) for c in configs))


def record_shape(kernel: Any, shape: Shape, dtype: str, timing: Any, limit_s: float,
                 batch: int | None = None, backend_kind: str = "cuda",
                 log: Log = _print, sample: int | None = None
                 ) -> tuple[dict[str, Any], str, str]:
    """Measure every distinct kernel of the kernel's whole space on ``shape`` (seeded random
    order; with ``sample``, the first ``sample`` of that order: a uniform random sample) and
    return the table, its file name and a summary line."""
    from tuner.backends.base import preferred_batch
    from tuner.backends.process import ProcessBackend
    from tuner.space import DEFAULT_SMEM_LIMIT, ProblemContext

    t0 = time.monotonic()
    name = getattr(kernel, "name", "matmul")
    label = f"{name} {'x'.join(str(v) for v in shape.values())} {dtype}"
    backend = ProcessBackend(backend_kind, kernel.ref, shape, dtype, timing=timing)
    try:
        fp = backend.fingerprint
        ctx = ProblemContext(shape, dtype, fp.smem_per_block or DEFAULT_SMEM_LIMIT,
                             fp.sm_count or ProblemContext.sm_count,
                             ProblemContext.capability_of(fp.compute_capability))
        space = kernel.space()
        whole = list(space)  # the whole space: what the constraints would prune included
        configs = distinct_kernels(kernel, whole, shape, dtype)
        random.Random(0).shuffle(configs)
        distinct = len(configs)
        if sample is not None:
            configs = configs[:sample]
        pruned = {c: r for c in configs if (r := space.violation(c, ctx))}
        log(f"[{label}] {len(configs)} configs ({len(pruned)} that the constraints would "
            f"prune) of the space's {distinct} distinct kernels ({len(whole)} configs) on "
            f"{fp.name}, limit {limit_s:.0f} s")
        size = batch or max(8, 4 * preferred_batch(backend))
        measured, stopped = measure_space(backend, configs, limit_s, t0, label, size, log)
    finally:
        backend.close()
    wall = time.monotonic() - t0
    coverage = {"space": distinct, "measured": len(measured),
                "complete": len(measured) == distinct, "limit_s": round(limit_s, 1),
                "wall_s": round(wall, 1), "constraint_pruned": len(pruned),
                "stopped": stopped, "space_configs": len(whole), "sample": sample}
    note = (f"{getattr(kernel, 'description', name)}; every config of its space, including "
            "those its constraints prune (their reason under \"constraint\")")
    if distinct < len(whole):
        note += (f"; its {len(whole)} configs are {distinct} distinct kernels on this problem "
                 "(the rest differ only in parameters the code does not read here: "
                 f"{name}.same_kernel), each recorded once")
    if sample is not None and sample < distinct:
        stopped = stopped or f"a sample of {sample}"
    how = timing_note(backend_kind, len(measured), distinct, wall, stopped,
                      float(getattr(timing, "compile_timeout_s", 30.0)))
    table = table_of(shape, dtype, measured, fp, how, kernel=name, kernel_note=note,
                     constraints=pruned, params=sorted(space.names), coverage=coverage)
    try:
        ms = baseline_ms(kernel, shape, dtype, backend_kind)
        if ms is not None:
            label_ = (BASELINE_LABELS.get(name, f"torch ({name}.torch_baseline)")
                      if backend_kind == "cuda" else f"torch on the cpu ({name}.torch_baseline)")
            table["reference_ms"] = {label_: round(ms, 6)}
    except Exception as exc:  # noqa: BLE001 - the table is worth keeping without it
        log(f"[{label}] torch baseline failed: {type(exc).__name__}: {exc}")
    ok = sorted(r["ms"] for r in table["results"] if "ms" in r)
    file_name = table_name(shape, dtype, name, device_tag(fp))
    summary = (f"{file_name}: {len(measured)}/"
               f"{len(configs)} configs{f' ({stopped})' if stopped else ''} "
               f"in {wall:.1f} s; {len(ok)} ok, best "
               f"{ok[0] if ok else float('nan'):.4f} ms, torch {table['reference_ms']}")
    return table, file_name, summary


# -- reading tables back ------------------------------------------------------------------------

def summary_line(name: str, table: dict[str, Any]) -> str:
    """One line about a recorded table: its coverage, its best (and whether the constraints
    prune it), the torch baseline, and each VARIANT's best where the configs have one."""
    cov = table.get("coverage", {})
    ok = [r for r in table["results"] if "ms" in r]
    if not ok:
        return f"{name}: no config ran"
    best = min(ok, key=lambda r: r["ms"])
    kept = [r["ms"] for r in ok if "constraint" not in r]
    pruned = (f"; the optimum is PRUNED ({best['constraint']}), the best kept is "
              f"{min(kept) / best['ms']:.3f}x" if "constraint" in best and kept else "")
    whole = ("the whole space" if cov.get("complete")
             else f"INCOMPLETE: {cov.get('stopped') or 'a sample of ' + str(cov.get('sample'))}")
    line = (f"{name}: {cov.get('measured')}/{cov.get('space')} configs ({whole}, "
            f"{cov.get('wall_s')} s), {cov.get('constraint_pruned')} the constraints prune; "
            f"{len(ok)} ok, best {best['ms']:.4f} ms, torch {table.get('reference_ms') or '-'}"
            f"{pruned}")
    variants: dict[int, float] = {}
    for r in ok:
        v = r["config"].get("VARIANT")
        if v is not None:
            variants[v] = min(variants.get(v, math.inf), r["ms"])
    if variants:
        line += "; best by VARIANT: " + ", ".join(
            f"{v}: {ms:.4f}" for v, ms in sorted(variants.items()))
    return line


def summarize(folder: str, log: Log = _print) -> int:
    paths = sorted(Path(folder).glob("*.json"))
    for path in paths:
        log(summary_line(path.name, json.loads(path.read_text())))
    return 0 if paths else 1


# -- the command --------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--kernel", default="matmul", help="a registered kernel name")
    ap.add_argument("--out-dir", default="tests/data/replay")
    ap.add_argument("--shapes", default=None,
                    help='"M=4096,N=8192:float16;M=16,N=131072:float16" (or 4096x8192:float16);'
                         " matmul also: all (default), indices into SHAPES, MxNxK:dtype")
    ap.add_argument("--backend", choices=("cuda", "interpret"), default="cuda")
    ap.add_argument("--limit-seconds", type=float, default=150.0,
                    help="per table: stop measuring new batches after this long")
    ap.add_argument("--total-seconds", type=float, default=None,
                    help="for the whole run: a table may use what is left but the reserve of "
                         "each table after it")
    ap.add_argument("--reserve-seconds", type=float, default=30.0,
                    help="with --total-seconds: kept for each later table")
    ap.add_argument("--compile-timeout", type=float, default=TIMING["compile_timeout_s"],
                    help="seconds a config may compile before it is recorded as a timeout")
    ap.add_argument("--sample", type=int, default=None,
                    help="measure only the first N distinct kernels of the seeded random order "
                         "(a uniform random sample of the whole space, the same N for every "
                         "shape)")
    ap.add_argument("--summary", action="store_true",
                    help="only print a line about each table under --out-dir")
    ap.add_argument("--batch", type=int, default=None,
                    help="configs per measure call (default 4x the compile pool, >= 8)")
    return ap.parse_args(argv)


def table_limit(limit_s: float, deadline: float | None, tables_after: int,
                reserve_s: float = 0.0) -> float:
    """This table's limit: ``limit_s``, or less so that each table after it keeps
    ``reserve_s`` of what is left before ``deadline`` (a table that finishes early leaves the
    rest to the later ones)."""
    if deadline is None:
        return limit_s
    return max(0.0, min(limit_s, deadline - time.monotonic() - reserve_s * tables_after))


def main(argv: Sequence[str] | None = None, log: Log = _print) -> int:
    from search_spaces import get_kernel
    from tuner.backends import TimingOptions

    args = parse_args(argv)
    if args.summary:
        return summarize(args.out_dir, log)
    kernel = get_kernel(args.kernel)
    dims = [d.name for d in kernel.dims]
    spec = args.shapes or ("all" if args.kernel == "matmul" else "")
    try:
        shapes = select_shapes(spec, dims, SHAPES if args.kernel == "matmul" else ())
        bad = [dt for _, dt in shapes if dt not in kernel.dtypes]
        if bad or not shapes:
            raise ValueError(f"dtypes must be among {', '.join(kernel.dtypes)}" if bad
                             else "give --shapes")
    except (ValueError, IndexError) as exc:
        log(f"record_tables: bad --shapes: {exc}")
        return 2
    if args.sample is not None and args.sample < 1:
        log(f"record_tables: --sample must be at least 1 (got {args.sample})")
        return 2
    timing = TimingOptions(**{**TIMING, "compile_timeout_s": args.compile_timeout})
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    deadline = None if args.total_seconds is None else time.monotonic() + args.total_seconds
    written = 0
    for i, (shape, dtype) in enumerate(shapes):
        limit = table_limit(args.limit_seconds, deadline, len(shapes) - i - 1,
                            args.reserve_seconds)
        if deadline is not None and limit < min(MIN_TABLE_S, args.limit_seconds):
            log(f"{args.kernel} {shape} {dtype}: skipped, no time left of --total-seconds")
            continue
        try:
            table, file_name, summary = record_shape(kernel, shape, dtype, timing, limit,
                                                     args.batch, args.backend, log,
                                                     args.sample)
        except Exception as exc:  # noqa: BLE001 - the next shape may still work
            log(f"{args.kernel} {shape} {dtype}: failed: {type(exc).__name__}: {exc}")
            continue
        if any("ms" in r for r in table["results"]):
            path = out / file_name
            path.write_text(json.dumps(table, indent=0))
            written += 1
            log(f"wrote {path}")
        else:
            errors = [r["error"] for r in table["results"]][:3]
            log(f"{args.kernel} {shape} {dtype}: no config ran; no table written: {errors}")
        log(summary)
    log(f"done at {time.strftime('%H:%M:%S')}: {written} of {len(shapes)} tables written")
    return 0 if written else 1


if __name__ == "__main__":
    # the parent launches no Triton kernel; a cuda child must not inherit the interpreter (an
    # interpret child sets it for itself)
    os.environ.pop("TRITON_INTERPRET", None)
    sys.exit(main())
