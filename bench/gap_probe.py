"""Does a timing that follows another one after a short gap still need the long warm-up?

The settled protocol (``tuner/gpu_state.py``) gives every full timing 100 ms of the timed work
first, unless it follows another timing within ``settle_gap_s`` (20 ms): after 0.3 s idle an
H200 had regained its boost clock (``bench/results/warmup_probe_h200.md``). In a search the
trials follow each other after 30-150 ms (verification, the next config's inputs, the
parent's model), so each pays the 100 ms. This probe measures how fast the clock comes back
after a sustained load: a compute-bound 8192^3 bf16 config runs ``--load-ms`` (its own
sustained state), the GPU idles ``gap`` seconds, then the same config is timed as a trial is
(``tuner.gpu_timer.do_bench``, 40 ms) after a 10 ms or the settled 100 ms warm-up. A second
config of another power draw as the load (a 2048^3 one) shows what a gap after a *different*
config leaves. The reference is the timing right after a 500 ms warm-up. Settings are
interleaved and repeated; each cell is a median with its spread and the SM clock after.

Usage (on the GPU machine)::

    python3 -m bench.gap_probe --out $OUT/gap_probe.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIG = {"M": 8192, "N": 8192, "K": 8192}
SMALL = {"M": 2048, "N": 2048, "K": 2048}
DTYPE = "bfloat16"
GAPS_S = (0.0, 0.03, 0.06, 0.1, 0.2, 0.3)
WARMUPS_MS = (10.0, 100.0)


def _run_for(fn: Callable[[], Any], ms: float) -> None:
    """``fn`` back to back for about ``ms`` milliseconds of GPU time."""
    import torch

    end = time.monotonic() + ms / 1e3
    while time.monotonic() < end:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--load-ms", type=float, default=400.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    import triton

    from bench.timing_stability import spread, target_config
    from search_spaces import get_kernel
    from tuner.gpu_state import monitor_for_torch_device
    from tuner.gpu_timer import do_bench

    kernel = get_kernel("matmul")
    config = target_config()
    big = kernel.make_inputs(BIG, DTYPE, "cuda", 0)
    small = kernel.make_inputs(SMALL, DTYPE, "cuda", 1)
    timed = lambda: kernel.launch(config, big)  # noqa: E731
    loads = {"same config": timed, "a 2048^3 GEMM": lambda: kernel.launch(config, small)}
    timed()
    loads["a 2048^3 GEMM"]()
    torch.cuda.synchronize()
    mon = monitor_for_torch_device(0)
    Cell = tuple[str, float, float]
    cells: dict[Cell, list[tuple[float, Any]]] = {}
    reference: list[float] = []
    for _ in range(args.repeats):  # interleaved: drift and heat hit every setting alike
        time.sleep(0.3)
        reference.append(do_bench(timed, warmup=500.0, rep=40.0)[1])
        for load_name, load in loads.items():
            for gap in GAPS_S:
                for warmup in WARMUPS_MS:
                    _run_for(load, args.load_ms)
                    if gap:
                        time.sleep(gap)
                    ms = do_bench(timed, warmup=warmup, rep=40.0)[1]
                    cells.setdefault((load_name, gap, warmup), []).append(
                        (ms, mon.sample()["sm_mhz"]))
    ref = statistics.median(reference)
    lines = ["# The clock after a short gap: is the long warm-up needed? (compute-bound)", "",
             f"Command: `python3 -m bench.gap_probe {' '.join(sys.argv[1:])}`", "",
             f"matmul {BIG['M']}x{BIG['N']}x{BIG['K']} {DTYPE}, `{config.key()}`, "
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}; {args.repeats} repeats, interleaved. Each timing follows "
             f"{args.load_ms:.0f} ms of a load, then the gap idle, then the warm-up. "
             f"Reference (500 ms warm-up after 0.3 s idle): median **{ref:.4f} ms**, spread "
             f"{spread(reference):.1%}.", "",
             "| load before the gap | gap s | warm-up ms | median ms | vs reference | spread | "
             "SM MHz after |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for (load_name, gap, warmup), rows in cells.items():
        times = [r[0] for r in rows]
        med = statistics.median(times)
        lines.append(f"| {load_name} | {gap:g} | {warmup:g} | {med:.4f} | {med / ref:.3f} | "
                     f"{spread(times):.1%} | "
                     + ", ".join(f"{r[1]:.0f}" if r[1] else "-" for r in rows) + " |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
