"""Issue 4: sweeping the 754-config GEMM space through the pipeline vs one config after another
in one process (the way ``triton.autotune`` does), on the GPU, in one run.

    python3 -m bench.tuning_speed --out bench/results/tuning_speed_h200.md [--serial-sample 60]

Pipeline arm: ``ProcessBackend("cuda")`` with its compile-ahead pool (one process per CPU core
but one), every config of the table handed to ``backend.measure`` in one batch: the pool compiles
while the GPU child verifies (NaN-poisoned output against torch) and times each config as soon as
its compile finished; adaptive timing (a quick do_bench first; configs over 2x the best so far
keep it). Its wall time includes starting the child and the pool.

Serial arm: a fresh process compiles (first launch), verifies and times each config in turn with
``do_bench(warmup=10 ms, rep=40 ms)`` (the pipeline's full timing; ``triton.autotune``'s own
default is 25/100 ms, which would make this arm slower still). Run on a seeded random sample of
the configs and extrapolated to all of them, labelled as such (``--serial-sample 0``: all).

Both arms start from an empty Triton cache (a fresh TRITON_CACHE_DIR each). GPU busy: the mean of
``nvidia-smi`` utilisation samples every 100 ms during the arm (the fraction of time a kernel
ran). Importable without CUDA; uses only Triton APIs common to 3.6 and 3.9.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests/data/replay/matmul_4096x4096x4096_float16_h200.json"
SHAPES: list[tuple[dict[str, int], str]] = [
    ({"M": 4096, "N": 4096, "K": 4096}, "float16"),
    ({"M": 2048, "N": 2048, "K": 2048}, "bfloat16"),
    ({"M": 777, "N": 1234, "K": 4321}, "float16"),
]
WARMUP_MS, REP_MS = 10.0, 40.0
#: the serial arm runs at least this many configs before its time cap stops it (compile times
#: have a heavy tail: 2% of the configs take 35% of the compile time on 777x1234x4321)
SERIAL_MIN_CONFIGS = 20


def table_configs() -> list[Any]:
    from tuner.config import KernelConfig

    data = json.loads(TABLE.read_text())
    return [KernelConfig(r["config"]) for r in data["results"]]


class Busy:
    """Mean ``nvidia-smi`` GPU utilisation while the block runs (nan where it cannot run)."""

    def __enter__(self) -> Busy:
        self.samples: list[float] = []
        try:
            self._proc: subprocess.Popen[str] | None = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self._proc = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=10)
        for line in out.splitlines():
            try:
                self.samples.append(float(line.split(",")[0]) / 100)
            except ValueError:
                pass

    @property
    def fraction(self) -> float:
        return statistics.fmean(self.samples) if self.samples else float("nan")


# -- the serial arm (in a process of its own) ---------------------------------------------------

def serial_arm(shape: dict[str, int], dtype: str, sample: list[int],
               budget_s: float) -> dict[str, Any]:
    """Compile (first launch), verify and time each config in turn, like triton.autotune;
    stops after ``budget_s`` (the sample is in random order, so what ran is a random subset)."""
    import torch
    import triton.testing

    from search_spaces.matmul import KERNEL as kernel

    configs = [table_configs()[i] for i in sample]
    inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
    ref = kernel.reference(inputs)
    tol = kernel.tolerance(dtype)
    torch.cuda.synchronize()
    t0, ok, first_launch_s, best, done = time.monotonic(), 0, 0.0, float("inf"), 0
    for config in configs:
        if done >= SERIAL_MIN_CONFIGS and time.monotonic() - t0 > budget_s:
            break
        done += 1
        try:
            inputs["out"].fill_(float("nan"))
            t1 = time.monotonic()
            kernel.launch(config, inputs)  # compiles: the cache is empty
            torch.cuda.synchronize()
            first_launch_s += time.monotonic() - t1
            if torch.allclose(inputs["out"].float(), ref, atol=tol.atol, rtol=tol.rtol):
                q = triton.testing.do_bench(lambda c=config: kernel.launch(c, inputs),
                                            warmup=WARMUP_MS, rep=REP_MS,
                                            quantiles=[0.2, 0.5, 0.8])
                best = min(best, float(q[1]))
                ok += 1
        except Exception:  # noqa: BLE001 - OutOfResources etc.: the next config
            torch.cuda.synchronize()
    return {"seconds": time.monotonic() - t0, "configs": done, "ok": ok,
            "first_launch_s": first_launch_s, "best_ms": best}


def run_serial(shape: dict[str, int], dtype: str, sample: list[int],
               budget_s: float) -> dict[str, Any]:
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="serial-cache-"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    with Busy() as busy:
        out = subprocess.run([sys.executable, "-m", "bench.tuning_speed", "--serial-arm",
                              json.dumps([shape, dtype, sample, budget_s])], cwd=ROOT, env=env,
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"serial arm failed:\n{out.stderr[-4000:]}")
    result = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    result["busy"] = busy.fraction
    return result


# -- the pipeline arm (this process never touches CUDA) -----------------------------------------

def kept_configs(shape: dict[str, int], dtype: str, prune: bool) -> tuple[list[int], int]:
    """Indices of the table's configs that the product would compile for this shape (the
    matmul space's constraints reject the others before compiling, as ``run_search`` does),
    and how many were rejected."""
    from search_spaces.matmul import KERNEL as kernel
    from tuner.space import ProblemContext

    configs = table_configs()
    if not prune:
        return list(range(len(configs))), 0
    space, ctx = kernel.space(), ProblemContext(shape, dtype)
    kept = [i for i, c in enumerate(configs) if space.violation(c, ctx) is None]
    return kept, len(configs) - len(kept)


def run_pipeline(shape: dict[str, int], dtype: str, batch: int, adaptive: bool,
                 workers: int | None, kept: list[int]) -> dict[str, Any]:
    from tuner.backends import TimingOptions
    from tuner.backends.process import ProcessBackend

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="pipeline-cache-")
    every = table_configs()
    configs = [every[i] for i in kept]
    timing = TimingOptions(warmup_ms=WARMUP_MS, rep_ms=REP_MS,
                           quick_rep_ms=5.0 if adaptive else 0.0, quick_factor=2.0,
                           compile_timeout_s=120, run_timeout_s=30)
    t0 = time.monotonic()
    with Busy() as busy:
        backend = ProcessBackend("cuda", "search_spaces.matmul:KERNEL", shape, dtype,
                                 timing=timing, compile_workers=workers)
        started = time.monotonic() - t0
        try:
            ms = []
            step = batch or len(configs)
            for i in range(0, len(configs), step):
                ms += backend.measure(configs[i:i + step])
            pool = backend.preferred_batch
            restarts = backend.restarts
        finally:
            backend.close()
    wall = time.monotonic() - t0
    ok = [m for m in ms if m.ok]
    best = min(ok, key=lambda m: m.p50_ms or 0.0)
    compiles = [m.compile_s for m in ms if m.compile_s]
    return {"seconds": wall, "start_s": started, "configs": len(configs), "ok": len(ok),
            "busy": busy.fraction, "best": best.config.key(), "best_ms": best.p50_ms,
            "quick": sum(bool(m.extra.get("quick")) for m in ok), "pool": pool,
            "restarts": restarts,
            "compile_median_s": statistics.median(compiles) if compiles else float("nan"),
            "compile_sum_s": sum(compiles),
            "per_config": [{"config": m.config.to_dict(), "outcome": m.outcome.value,
                            "ms": m.p50_ms, "compile_s": m.compile_s,
                            "quick": bool(m.extra.get("quick"))} for m in ms],
            "outcomes": {o: sum(m.outcome.value == o for m in ms)
                         for o in sorted({m.outcome.value for m in ms})}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="markdown file to write")
    ap.add_argument("--serial-sample", type=int, default=60,
                    help="configs timed in the serial arm, extrapolated to all (0: all)")
    ap.add_argument("--serial-budget-s", type=float, default=75.0,
                    help="stop the serial arm after this long per shape (then extrapolate)")
    ap.add_argument("--shapes", default="0,1,2", help=f"indices into {SHAPES}")
    ap.add_argument("--batch", type=int, default=0,
                    help="configs per backend.measure call (0: all in one)")
    ap.add_argument("--workers", type=int, default=None, help="compile processes (default: "
                    "CPU cores - 1)")
    ap.add_argument("--no-adaptive", action="store_true", help="full do_bench for every config")
    ap.add_argument("--no-prune", action="store_true",
                    help="compile every config, also those the space's constraints reject")
    ap.add_argument("--serial-arm", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serial_arm:
        shape, dtype, sample, budget_s = json.loads(args.serial_arm)
        print(json.dumps(serial_arm(shape, dtype, sample, budget_s)))
        return
    n = len(table_configs())
    k = n if args.serial_sample <= 0 else min(args.serial_sample, n)
    extrapolated = k < n or args.serial_budget_s < float("inf")
    cmd = " ".join(["python3 -m bench.tuning_speed", *sys.argv[1:]])
    lines = [
        "# Tuning speed: the pipeline vs a serial in-process sweep (GPU)", "",
        f"Command: `{cmd}`", "",
        f"Space: the {n} configs of `{TABLE.name}` (BLOCK_M/N 32..256, BLOCK_K 32..128, "
        "GROUP_M 1/8, 2/4/8 warps, 2..5 stages), swept on each shape. Both arms: empty Triton "
        f"cache, output verified before timing, do_bench(warmup={WARMUP_MS:g} ms, "
        f"rep={REP_MS:g} ms, L2 flushed)"
        + ("" if args.no_adaptive else "; the pipeline times a config quickly first "
           "(rep 5 ms) and keeps that for configs over 2x the best so far") + ".",
        "Serial: " + ("**extrapolated** (s/config x the configs kept) from a seeded random "
                      f"sample of up to {k} configs timed one after another, stopped after "
                      f"{args.serial_budget_s:g} s (at least {SERIAL_MIN_CONFIGS} configs)"
                      if extrapolated else "all configs")
        + ". Pipeline wall includes starting the GPU child and the compile pool."
        + ("" if args.no_prune else
           " The pipeline rejects configs that the matmul space's constraints rule out (shared "
           "memory over the limit, an accumulator over 255 registers per thread, tiles larger "
           "than the problem) before compiling, as the product does; the serial arm runs only "
           "the configs the pipeline kept (a sample of them), so both arms cover the same "
           "configs and the ratio does not count the pruning."), "",
        "| shape | dtype | configs kept (pruned) | pipeline wall s | of which start s | "
        "GPU busy (pipeline) | compile "
        "procs | compile median / sum CPU-s | serial configs run | serial s/config | serial "
        "wall s (all) | GPU busy (serial) | speed-up | pipeline best (quick-timed) | outcomes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for i in map(int, args.shapes.split(",")):
        shape, dtype = SHAPES[i]
        kept, pruned = kept_configs(shape, dtype, not args.no_prune)
        # random order: a time cap keeps it random
        sample = random.Random(0).sample(kept, min(k, len(kept)))
        pipe = run_pipeline(shape, dtype, args.batch, not args.no_adaptive, args.workers, kept)
        print(f"pipeline {shape} {dtype}: "
              f"{json.dumps({k: v for k, v in pipe.items() if k != 'per_config'})}", flush=True)
        serial = run_serial(shape, dtype, sample, args.serial_budget_s)
        print(f"serial {shape} {dtype}: {json.dumps(serial)}", flush=True)
        per = serial["seconds"] / serial["configs"]
        full = per * len(kept)
        label = "x".join(str(v) for v in shape.values())
        full_txt = f"{full:.0f}" + (" (extrapolated)" if serial["configs"] < len(kept) else "")
        lines.append(
            f"| {label} | {dtype} | {len(kept)} ({pruned}) | {pipe['seconds']:.1f} | "
            f"{pipe['start_s']:.1f} | "
            f"{pipe['busy']:.0%} | {pipe['pool']} | {pipe['compile_median_s']:.2f} / "
            f"{pipe['compile_sum_s']:.0f} | {serial['configs']} | {per:.3f} | {full_txt} | "
            f"{serial['busy']:.0%} | {full / pipe['seconds']:.1f}x | "
            f"`{pipe['best']}` {pipe['best_ms']:.4f} ms ({pipe['quick']} of {pipe['ok']} ok "
            f"quick-timed) | {pipe['outcomes']} |")
        rows.append({"shape": shape, "dtype": dtype, "kept": len(kept), "pruned": pruned,
                     "pipeline": pipe, "serial": serial,
                     "serial_extrapolated_s": full, "speedup": full / pipe["seconds"]})
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    main()
