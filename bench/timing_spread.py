"""Does one config get one number? The timing protocol against the GPU's power state.

The issue this answers: the same 8192^3 bf16 matmul config ran 1.46 ms in a fresh process after
5 s idle and 1.68 ms right after 20 s of sustained GEMMs (the SM clock falls from 1980 MHz to
~1470 MHz at the power cap). This script times ONE config through the product's measuring child
(a fresh ``ProcessBackend`` each time) in both GPU states, with the settled-sustained-state
protocol (``TimingOptions.settle_max_ms`` > 0, the default) and without it (0), repeating each
combination, interleaved. Per combination it reports the median time, the run-to-run spread
((max - min) / median) and the SM clock and power NVML recorded with the timing.

"hot": a parent thread runs bf16 GEMMs for ``--heat-s`` seconds and keeps them running while
the child starts, stopping just before the timing; "cold": the GPU idles ``--idle-s`` first.

Usage (on the GPU machine)::

    python3 -m bench.timing_spread --repeats 3 --out bench/results/timing_spread_h200.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tuner.search import SearchOptions

SHAPE = {"M": 8192, "N": 8192, "K": 8192}
DTYPE = "bfloat16"


class Heater(threading.Thread):
    """bf16 GEMMs back to back on the GPU until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()

    def run(self) -> None:
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not self.halt.is_set():
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()


def one_run(config: Any, state: str, settle: bool, heat_s: float, idle_s: float,
            rounds: int) -> dict[str, Any]:
    from search_spaces import get_kernel
    from tuner.backends.base import TimingOptions
    from tuner.backends.process import ProcessBackend

    kernel = get_kernel("matmul")
    timing = TimingOptions() if settle else TimingOptions(settle_max_ms=0.0)
    heater = None
    if state == "hot":
        heater = Heater()
        heater.start()
        time.sleep(heat_s)
    else:
        time.sleep(idle_s)
    backend = ProcessBackend("cuda", kernel.ref, dict(SHAPE), DTYPE, timing=timing,
                             compile_workers=0)
    try:
        if heater is not None:
            heater.halt.set()
            heater.join()
        started = time.monotonic()
        # the stored number of a tuned config is its re-timing (the search's retime_rounds);
        # the binary is in Triton's cache (``prime``)
        (m,) = backend.retime([config], rounds)
        took = time.monotonic() - started
    finally:
        if heater is not None:
            heater.halt.set()
        backend.close()
    gpu = m.extra.get("gpu") or {}
    return {"state": state, "settle": settle, "ms": m.p50_ms, "sm_mhz": gpu.get("sm_mhz"),
            "power_w": gpu.get("power_w"), "seconds": took}


def prime(config: Any) -> None:
    """Compile and verify the config once, so that every timed run loads it from Triton's
    cache (a verification or compile in a run would heat a "cold" GPU before its timing)."""
    from search_spaces import get_kernel
    from tuner.backends.process import ProcessBackend

    backend = ProcessBackend("cuda", get_kernel("matmul").ref, dict(SHAPE), DTYPE,
                             compile_workers=0)
    try:
        (m,) = backend.measure([config])
        if not m.ok:
            raise SystemExit(f"the config does not run: {m.outcome} {m.error}")
    finally:
        backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--heat-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="re-timing rounds per run, the median (default 1, as the "
                             f"results were taken; a search stores the median of "
                             f"{SearchOptions().retime_rounds})")
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--config", default=None,
                        help="NAME=VALUE,... (default: the kernel's default config)")
    parser.add_argument("--out", default="-")
    args = parser.parse_args()
    from search_spaces import get_kernel
    from tuner.config import KernelConfig

    config = (KernelConfig({k: int(v) for k, v in (kv.split("=") for kv in
                                                    args.config.split(","))})
              if args.config else get_kernel("matmul").default_config(SHAPE, DTYPE))
    prime(config)
    rows = []
    for rep in range(args.repeats):
        for settle in (True, False):
            for state in ("cold", "hot"):
                row = one_run(config, state, settle, args.heat_s, args.idle_s, args.rounds)
                rows.append(row)
                print(f"repeat {rep}: {row}", flush=True)
    lines = ["# One config, one number? Timing protocol against the GPU's power state", "",
             f"Command: `python3 -m bench.timing_spread {' '.join(sys.argv[1:])}`", "",
             f"matmul {SHAPE['M']}x{SHAPE['N']}x{SHAPE['K']} {DTYPE}, config `{config.key()}`, "
             "each run a fresh measuring child (`ProcessBackend`), the number its re-timing "
             f"(`retime`, {args.rounds} round(s), the median; settles first when the "
             "protocol is on). cold: after "
             f"{args.idle_s:.0f} s idle; hot: right after {args.heat_s:.0f} s of bf16 GEMMs "
             "(kept running while the child starts).", "",
             "| protocol | GPU state before | runs | median ms | spread (max-min)/median | "
             "ms of each run | SM MHz at timing | power W at timing |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for settle in (True, False):
        for state in ("cold", "hot"):
            sel = [r for r in rows if r["settle"] == settle and r["state"] == state]
            times = [r["ms"] for r in sel if r["ms"]]
            med = statistics.median(times) if times else float("nan")
            spread = (max(times) - min(times)) / med if times else float("nan")
            lines.append(
                f"| {'settled sustained state' if settle else 'none (as found)'} | {state} | "
                f"{len(times)} | {med:.4f} | {spread:.1%} | "
                + ", ".join(f"{t:.4f}" for t in times) + " | "
                + ", ".join(str(r["sm_mhz"]) for r in sel) + " | "
                + ", ".join(f"{r['power_w']:.0f}" if r["power_w"] else "-" for r in sel) + " |")
    for settle in (True, False):
        sel = [r["ms"] for r in rows if r["settle"] == settle and r["ms"]]
        if sel:
            lines.append("")
            lines.append(f"{'Settled' if settle else 'Unsettled'}, cold and hot together: "
                         f"median {statistics.median(sel):.4f} ms, spread "
                         f"{(max(sel) - min(sel)) / statistics.median(sel):.1%} over {len(sel)} "
                         "runs.")
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
