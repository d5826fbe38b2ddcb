"""How long must a compute-bound config run before its timing is taken at a steady clock?

``bench/timing_stability.py`` showed a 10-15% spread for one 8192^3 bf16 config timed across
a sweep, whatever the protocol: between two timings the GPU idles (verification, compiles)
long enough to regain boost headroom, and a 10 ms warm-up + 40 ms timing then starts at
~1965 MHz and ends wherever the power limiter has pulled the clock. This probe times the same
config after an idle gap (``--gap-s``, as in a sweep) with a range of warm-ups (do_bench's
``warmup``: the config itself runs that long first) and reps, repeated, and reports each
setting's median, spread and the SM clock NVML read after each timing.

Usage (on the GPU machine)::

    python3 -m bench.warmup_probe --out bench/results/warmup_probe_h200.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

SHAPE = {"M": 8192, "N": 8192, "K": 8192}
DTYPE = "bfloat16"
SETTINGS = [(10, 40), (100, 40), (250, 40), (500, 40), (1000, 40), (10, 200), (250, 200)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--gap-s", type=float, default=0.3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    import triton
    import triton.testing

    from bench.timing_stability import spread, target_config
    from search_spaces import get_kernel
    from tuner.gpu_state import monitor_for_torch_device

    kernel = get_kernel("matmul")
    config = target_config()
    inputs = kernel.make_inputs(SHAPE, DTYPE, "cuda", 0)
    kernel.launch(config, inputs)
    torch.cuda.synchronize()
    mon = monitor_for_torch_device(0)
    results: dict[tuple[int, int], list[tuple[float, float | None, float | None]]] = {
        s: [] for s in SETTINGS}
    for _ in range(args.repeats):  # interleaved: drift and heat hit every setting alike
        for warmup, rep in SETTINGS:
            time.sleep(args.gap_s)
            ms = triton.testing.do_bench(lambda: kernel.launch(config, inputs),
                                         warmup=warmup, rep=rep)
            s = mon.sample()
            results[(warmup, rep)].append((float(ms), s["sm_mhz"], s["power_w"]))
    lines = ["# Warm-up length against the timing's spread (compute-bound, H200)", "",
             f"Command: `python3 -m bench.warmup_probe {' '.join(sys.argv[1:])}`", "",
             f"matmul {SHAPE['M']}x{SHAPE['N']}x{SHAPE['K']} {DTYPE}, `{config.key()}`, "
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}; each timing "
             f"follows {args.gap_s} s idle; settings interleaved, {args.repeats} repeats.", "",
             "| warm-up ms | rep ms | median ms | spread (max-min)/median | SM MHz after | "
             "power W after |", "| --- | --- | --- | --- | --- | --- |"]
    for (warmup, rep), rows in results.items():
        times = [r[0] for r in rows]
        lines.append(f"| {warmup} | {rep} | {statistics.median(times):.4f} | "
                     f"{spread(times):.1%} | "
                     + ", ".join(f"{r[1]:.0f}" if r[1] else "-" for r in rows) + " | "
                     + ", ".join(f"{r[2]:.0f}" if r[2] else "-" for r in rows) + " |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
