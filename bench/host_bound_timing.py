"""Small multi-launch configs timed by triton's do_bench against tuner.gpu_timer's (GPU).

Each case (a kernel, a problem, a config, or torch's baseline) is timed ``--repeats`` times by
``triton.testing.do_bench`` and by ``tuner.gpu_timer.do_bench`` (the same protocol plus a spin
before each timed run, so that the host is ahead of the GPU), interleaved, first with the CPU
idle and then with ``--busy`` processes spinning on the CPU (as the compile pool's do during a
search). A timer that measures the GPU gives the same median in both columns; one that
measures the host's enqueue time moves with the CPU's load.

Usage (on the GPU machine)::

    python3 -m bench.host_bound_timing --out bench/results/host_bound_timing_h200.md
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (kernel, shape, dtype, config or None for torch's baseline)
CASES = [
    ("softmax", {"M": 16, "N": 131072}, "float16",
     {"BLOCK_N": 4096, "EVICT": 1, "PROGRAMS_PER_SM": 0, "ROWS": 1, "SPLIT": 32,
      "num_stages": 1, "num_warps": 8}),
    ("softmax", {"M": 16, "N": 131072}, "float16",
     {"BLOCK_N": 2048, "EVICT": 0, "PROGRAMS_PER_SM": 0, "ROWS": 1, "SPLIT": 32,
      "num_stages": 3, "num_warps": 4}),
    ("softmax", {"M": 16, "N": 131072}, "float16", None),
    ("matmul", {"M": 16, "N": 14336, "K": 4096}, "bfloat16",
     {"VARIANT": 3, "SPLIT_K": 4, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1,
      "num_warps": 4, "num_stages": 4}),
    ("matmul", {"M": 8192, "N": 8192, "K": 8192}, "bfloat16",
     {"VARIANT": 2, "SPLIT_K": 1, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
      "num_warps": 8, "num_stages": 3}),
]


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy", type=int, default=16, help="CPU-spinning processes")
    parser.add_argument("--rep-ms", type=float, default=40.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    import triton
    import triton.testing

    from search_spaces import get_kernel
    from tuner import gpu_timer
    from tuner.config import KernelConfig

    timers = {"triton": lambda fn: triton.testing.do_bench(fn, warmup=100, rep=args.rep_ms,
                                                          return_mode="median"),
              "gpu_timer": lambda fn: gpu_timer.do_bench(fn, warmup=100, rep=args.rep_ms,
                                                         quantiles=[0.5])[0]}
    fns: list[Callable[[], Any]] = []
    for name, shape, dtype, cfg in CASES:
        k = get_kernel(name)
        inputs = k.make_inputs(shape, dtype, "cuda", 0)
        if cfg is None:
            fns.append(functools.partial(getattr(k, "baseline"), inputs))  # noqa: B009
        else:
            config = KernelConfig(cfg)
            k.launch(config, inputs)
            fns.append(functools.partial(k.launch, config, inputs))
    torch.cuda.synchronize()
    results: dict[tuple[int, str, str], list[float]] = {}
    for load in ("idle", "busy"):
        procs = []
        if load == "busy":
            ctx = mp.get_context("spawn")
            stop = time.monotonic() + 3600
            procs = [ctx.Process(target=_spin, args=(stop,), daemon=True)
                     for _ in range(args.busy)]
            for p in procs:
                p.start()
            time.sleep(1.0)
        for _ in range(args.repeats):
            for i, fn in enumerate(fns):
                for tname, timer in timers.items():
                    results.setdefault((i, load, tname), []).append(float(timer(fn)))
        for p in procs:
            p.terminate()
    lines = ["# Host-bound timing: triton's do_bench against tuner.gpu_timer (H200)", "",
             f"Command: `python3 -m bench.host_bound_timing {' '.join(sys.argv[1:])}`", "",
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}, {time.strftime('%Y-%m-%d')}. Median of {args.repeats} "
             f"timings (each a median of its runs, {args.rep_ms:.0f} ms of them after 100 ms "
             f"of warm-up), in us; 'busy': {args.busy} processes spinning on the CPU; spread "
             "= (max - min) / median over the timings.", "",
             "| kernel | shape | config | triton idle | triton busy | gpu_timer idle | "
             "gpu_timer busy | spread triton busy | spread gpu_timer busy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, (name, shape, _dtype, cfg) in enumerate(CASES):
        cells = []
        for tname in ("triton", "gpu_timer"):
            for load in ("idle", "busy"):
                cells.append(f"{statistics.median(results[(i, load, tname)]) * 1e3:.1f}")
        spreads = []
        for tname in ("triton", "gpu_timer"):
            v = results[(i, "busy", tname)]
            spreads.append(f"{(max(v) - min(v)) / statistics.median(v):.0%}")
        label = "torch" if cfg is None else ",".join(f"{k}={v}" for k, v in cfg.items())
        lines.append(f"| {name} | {'x'.join(map(str, shape.values()))} | `{label}` | "
                     + " | ".join(cells + spreads) + " |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
