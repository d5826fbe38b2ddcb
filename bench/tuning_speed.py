"""Issue 4: sweeping the 754-config GEMM space through the pipeline vs one config after another
in one process (the way ``triton.autotune`` does), on the GPU, in one run.

    python3 bench/tuning_speed.py --out bench/results/tuning_speed_h200.md [--serial-sample 120]

Both arms start from an empty Triton cache (a fresh TRITON_CACHE_DIR each) and verify every
config before timing it with the same do_bench settings. The serial arm times a random sample
of the configs (seeded) and extrapolates to all 754, labelled as such.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / (
    "tests/data/replay/matmul_4096x4096x4096_float16_h200.json")
SHAPES = [({"M": 4096, "N": 4096, "K": 4096}, "float16"),
          ({"M": 2048, "N": 2048, "K": 2048}, "bfloat16"),
          ({"M": 16, "N": 14336, "K": 4096}, "bfloat16")]


def table_configs() -> list:
    from tuner.config import KernelConfig

    data = json.loads(TABLE.read_text())
    return [KernelConfig(r["config"]) for r in data["results"]]


def serial_arm(shape: dict, dtype: str, sample: list[int]) -> dict:
    """In this process: compile, verify and time each config in turn (like triton.autotune)."""
    import torch
    import triton.testing

    from search_spaces import get_kernel

    kernel = get_kernel("matmul")
    configs = [table_configs()[i] for i in sample]
    inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
    ref = kernel.reference(inputs)
    t0, ok = time.monotonic(), 0
    for config in configs:
        try:
            inputs["out"].fill_(float("nan"))
            kernel.launch(config, inputs)
            torch.cuda.synchronize()
            if torch.allclose(inputs["out"].float(), ref, atol=3e-2, rtol=2e-2):
                triton.testing.do_bench(lambda c=config: kernel.launch(c, inputs), warmup=10,
                                        rep=40, quantiles=[0.2, 0.5, 0.8])
                ok += 1
        except Exception:  # noqa: BLE001 - OutOfResources etc.: next config
            torch.cuda.synchronize()
    return {"seconds": time.monotonic() - t0, "configs": len(configs), "ok": ok}


def run_serial(shape: dict, dtype: str, sample: list[int]) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="serial-cache-")}
    out = subprocess.run([sys.executable, __file__, "--serial-arm", json.dumps([shape, dtype,
                                                                                sample])],
                         env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_pipeline(shape: dict, dtype: str) -> dict:
    from bench.sweep import sweep
    from search_spaces import get_kernel
    from tuner.backends import TimingOptions

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="pipeline-cache-")
    configs = table_configs()
    ms, wall, busy, _fp = sweep(get_kernel("matmul"), shape, dtype, configs,
                                TimingOptions(warmup_ms=10, rep_ms=40, compile_timeout_s=120))
    ok = [m for m in ms if m.ok]
    best = min(ok, key=lambda m: m.p50_ms or 0.0)
    return {"seconds": wall, "configs": len(configs), "ok": len(ok), "busy": busy,
            "best": best.config.key(), "best_ms": best.p50_ms,
            "outcomes": {o: sum(m.outcome.value == o for m in ms)
                         for o in sorted({m.outcome.value for m in ms})}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--serial-sample", type=int, default=120)
    ap.add_argument("--serial-arm")
    args = ap.parse_args()
    if args.serial_arm:
        shape, dtype, sample = json.loads(args.serial_arm)
        print(json.dumps(serial_arm(shape, dtype, sample)))
        return
    n = len(table_configs())
    sample = sorted(random.Random(0).sample(range(n), args.serial_sample))
    lines = ["# Tuning speed: the pipeline vs a serial in-process sweep (GPU)", "",
             f"Command: `python3 bench/tuning_speed.py --out {args.out} --serial-sample "
             f"{args.serial_sample}`", "",
             f"Space: the {n} configs of `{TABLE.name}` (BLOCK_M/N 32..256, BLOCK_K 32..128, "
             "GROUP_M 1/8, 4/8 warps, 2..5 stages), swept on each shape. Timing in both arms: "
             "verify, then do_bench(warmup=10 ms, rep=40 ms), empty Triton cache at the start.",
             "", "| shape | dtype | pipeline wall s (all configs) | GPU busy | serial s for "
             "sample | serial s/config | serial extrapolated to all s | speed-up | pipeline "
             "best | outcomes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for shape, dtype in SHAPES:
        pipe = run_pipeline(shape, dtype)
        serial = run_serial(shape, dtype, sample)
        per = serial["seconds"] / serial["configs"]
        full = per * n
        label = "x".join(str(v) for v in shape.values())
        lines.append(f"| {label} | {dtype} | {pipe['seconds']:.1f} | {pipe['busy']:.0%} | "
                     f"{serial['seconds']:.1f} ({serial['configs']} configs) | {per:.3f} | "
                     f"{full:.0f} | {full / pipe['seconds']:.1f}x | `{pipe['best']}` "
                     f"{pipe['best_ms']:.4f} ms | {pipe['outcomes']} |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    main()
