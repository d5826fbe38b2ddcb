"""Do a batch's back-to-back trial timings agree with timings taken alone?

The measuring child times a batch's verified configs back to back (``measure_many``). A timing
that starts right after another keeps the short warm-up (10 ms) where the settled protocol
would give 100 ms; right after a lighter load the clock is higher than this config's sustained
one (``bench/results/gap_probe_h100.md``: 8192^3 with 10 ms ran 0.922x after a 2048^3 GEMM).
This probe times configs of one problem, of different power draws (the kernel's known-good
configs, spread over its list), three ways, in the child's own timing code (``_time_fn``):

- ``alone``: each after 0.3 s idle, so with the long warm-up (the reference: how a trial was
  timed before batches);
- ``back to back``: in turn with no gap, the short warm-up for all but the first (the batch
  as first built, 7930a39);
- ``guarded``: in turn with no gap, as trials are now: the short warm-up only while the power
  after the previous timing was quiet, a short one that finds the limiter engaged taken again.

The order rotates each round, so each config follows different ones; each cell is the median
over rounds of the timing's p50, against ``alone``'s.

Usage (on the GPU machine)::

    python3 -m bench.batch_bias_probe --out $OUT/batch_bias_probe.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

PROBLEMS = (({"M": 8192, "N": 8192, "K": 8192}, "bfloat16"),
            ({"M": 4096, "N": 4096, "K": 4096}, "bfloat16"))
MODES = ("alone", "back to back", "guarded")


def _configs(kernel: Any, shape: dict[str, int], dtype: str, n: int) -> list[Any]:
    """``n`` of the kernel's known-good configs, spread over its list (tiles of every size,
    and each variant: draws of different power)."""
    picks = list(dict.fromkeys(kernel.known_good_configs(shape, dtype)))
    return picks[::max(1, len(picks) // n)][:n]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    import triton

    from search_spaces import get_kernel
    from tuner.backends import TimingOptions
    from tuner.backends import child as child_mod

    kernel = get_kernel("matmul")
    timing = TimingOptions(quick_rep_ms=0)
    lines = ["# A batch's back-to-back trial timings against timings taken alone", "",
             f"Command: `python3 -m bench.batch_bias_probe {' '.join(sys.argv[1:])}`", "",
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}; {args.rounds} rounds, the order rotated each round; "
             f"warm-ups {timing.warmup_ms:g} / {timing.settle_warmup_ms:g} ms, rep "
             f"{timing.rep_ms:g} ms. Each cell: the median over rounds of the timing's p50, "
             "and its ratio to `alone`'s; warm-ups long/short/redone per mode; the power (W) "
             "after each of the last round's timings.", ""]
    for shape, dtype in PROBLEMS:
        configs = _configs(kernel, shape, dtype, args.configs)
        inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
        state = child_mod.ChildState("cuda")
        state.kernel, state.shape, state.dtype = kernel, dict(shape), dtype
        for c in configs:  # compiled and run once before anything is timed
            kernel.launch(c, inputs)
        torch.cuda.synchronize()
        times: dict[tuple[str, int], list[float]] = {}
        power: dict[tuple[str, int], float] = {}
        warmups: dict[str, dict[str, int]] = {}
        for r in range(args.rounds):
            order = [(i + r) % len(configs) for i in range(len(configs))]
            for mode in MODES:
                state.take_warmups()
                time.sleep(0.3)
                state.last_busy = time.monotonic() - 0.3
                state.quiet = False
                for i in order:
                    if mode == "alone":
                        time.sleep(0.3)
                    p50 = child_mod._time_fn(state, partial(kernel.launch, configs[i], inputs),
                                             timing, guarded=mode == "guarded")[1]
                    state.last_busy = time.monotonic()
                    times.setdefault((mode, i), []).append(p50)
                    sample = state.gpu_sample() or {}
                    power[(mode, i)] = float(sample.get("power_w") or 0.0)
                counts = state.take_warmups()
                total = warmups.setdefault(mode, dict.fromkeys(counts, 0))
                for k, v in counts.items():
                    total[k] += v
        lines += [f"## matmul {shape['M']}x{shape['N']}x{shape['K']} {dtype}", "",
                  "| config | " + " | ".join(MODES) + " |",
                  "| --- | " + " | ".join("---" for _ in MODES) + " |"]
        worst = dict.fromkeys(MODES[1:], 1.0)
        for i, c in enumerate(configs):
            ref = statistics.median(times[("alone", i)])
            cells = []
            for mode in MODES:
                med = statistics.median(times[(mode, i)])
                cells.append(f"{med:.4f} ({med / ref:.3f}; {power[(mode, i)]:.0f} W)")
                if mode != "alone" and abs(med / ref - 1) > abs(worst[mode] - 1):
                    worst[mode] = med / ref
            lines.append(f"| `{c.key()}` | " + " | ".join(cells) + " |")
        lines += ["", "Warm-ups long/short/redone: " + "; ".join(
            f"{m} {w['long']}/{w['short']}/{w['redone']}" for m, w in warmups.items())
            + ". Furthest from `alone`: " + "; ".join(
            f"{m} {v:.3f}" for m, v in worst.items()) + ".", ""]
        inputs.clear()
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
