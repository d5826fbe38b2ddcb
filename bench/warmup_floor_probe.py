"""How short can a power-pressed trial's warm-up be? (issue 33: 1.6-3 s a compute-bound shape)

A trial's full timing on a power-pressed problem (the limiter engaged) is preceded by the
settled protocol's 100 ms of the timed work (``TimingOptions.settle_warmup_ms``), chosen on an
H200 where 10 ms read 12% fast (the clock still at boost) and 100, 250 and 500 ms agreed
(``results/warmup_probe_h200.md``); nothing between 10 and 100 ms was measured. On a
compute-bound shape every trial pays it: 16-32 trials, 1.6-3.2 s of the shape's wall
(``results/tuning_time_33h/``). This probe measures the warm-ups between, in the order a
search meets them: a *previous* config of the same problem runs ``--load-ms`` (the previous
trial, at its own sustained power), the GPU idles ``gap`` (5 ms: the next trial of a batch;
100 ms: the first of the next batch, after the parent's model and the next compiles), then
the *timed* config is timed as the measuring child times a trial (``tuner.gpu_timer.bench``,
eager-flushed, 40 ms) after each warm-up. The reference is the timed config after a 400 ms
warm-up (after 0.3 s idle). Settings are interleaved and repeated; each cell is the median
of its repeats, its ratio to the reference, its spread and the SM clock read after.

A warm-up is long enough where its cells match the reference as closely as the 100 ms cells
do, at both gaps, on every problem.

Usage (on the GPU machine)::

    python3 -m bench.warmup_floor_probe --out $OUT/warmup_floor.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: (kernel, shape, dtype): the held-out set's compute-bound problems (every trial pressed)
PROBLEMS = (("matmul", {"M": 8192, "N": 8192, "K": 8192}, "bfloat16"),
            ("matmul_epilogue_gelu", {"M": 4096, "N": 4096, "K": 4096}, "bfloat16"),
            ("moe_gemm", {"M": 512, "N": 14336, "K": 4096, "E": 8, "TOPK": 2}, "bfloat16"),
            ("flash_attention", {"B": 16, "H": 16, "S": 1024, "D": 64}, "float16"))
WARMUPS_MS = (10.0, 25.0, 50.0, 75.0, 100.0)
GAPS_S = (0.005, 0.1)
REFERENCE_WARMUP_MS = 400.0
REP_MS = 40.0


def _run_for(fn: Any, ms: float) -> None:
    """``fn`` back to back for about ``ms`` milliseconds."""
    import torch

    end = time.monotonic() + ms / 1e3
    while time.monotonic() < end:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()


def _two_configs(kernel: Any, shape: dict[str, int], dtype: str) -> tuple[Any, Any]:
    """(previous, timed): two distinct known-good configs, else the default twice."""
    picks = list(dict.fromkeys(kernel.known_good_configs(shape, dtype)))
    default = kernel.default_config(shape, dtype)
    if not picks:
        return default, default
    timed = picks[0]
    previous = next((c for c in picks[1:] if c != timed), default)
    return previous, timed


def probe(name: str, shape: dict[str, int], dtype: str, repeats: int, load_ms: float,
          mon: Any) -> list[str]:
    import torch

    from search_spaces import get_kernel
    from tuner.gpu_timer import bench

    kernel = get_kernel(name)
    previous, timed = _two_configs(kernel, shape, dtype)
    inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
    run_prev = lambda: kernel.launch(previous, inputs)  # noqa: E731
    run_timed = lambda: kernel.launch(timed, inputs)  # noqa: E731
    run_prev(), run_timed()
    torch.cuda.synchronize()
    settings: list[tuple[float | None, float]] = [(None, REFERENCE_WARMUP_MS)]
    settings += [(gap, w) for gap in GAPS_S for w in WARMUPS_MS]
    cells: dict[tuple[float | None, float], list[tuple[float, Any]]] = {s: [] for s in settings}
    for _ in range(repeats):  # interleaved: drift and heat meet every setting alike
        for gap, warmup in settings:
            if gap is None:
                time.sleep(0.3)
            else:
                _run_for(run_prev, load_ms)
                time.sleep(gap)
            ms = bench("eager-flushed", run_timed, warmup=warmup, rep=REP_MS)[1]
            cells[(gap, warmup)].append((float(ms), mon.sample().get("sm_mhz")))
    ref = statistics.median(t for t, _ in cells[(None, REFERENCE_WARMUP_MS)])
    lines = [f"## {name} {','.join(f'{k}={v}' for k, v in shape.items())} {dtype}", "",
             f"Previous config `{previous.key()}`; timed config `{timed.key()}`. Reference "
             f"({REFERENCE_WARMUP_MS:.0f} ms warm-up after 0.3 s idle): **{ref:.4f} ms**.", "",
             "| gap after the previous config s | warm-up ms | median ms | vs reference | "
             "spread | SM MHz after |", "| --- | --- | --- | --- | --- | --- |"]
    for (gap, warmup), rows in cells.items():
        times = [t for t, _ in rows]
        med = statistics.median(times)
        spread = (max(times) - min(times)) / med if len(times) > 1 else 0.0
        lines.append(f"| {'reference' if gap is None else gap} | {warmup:.0f} | {med:.4f} | "
                     f"{med / ref:.3f} | {spread:.1%} | "
                     + ", ".join(f"{m:.0f}" if m else "-" for _, m in rows) + " |")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--load-ms", type=float, default=150.0,
                        help="how long the previous config runs before each gap (ms)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    import triton

    from tuner.gpu_state import monitor_for_torch_device

    mon = monitor_for_torch_device(0)
    lines = ["# The warm-up a power-pressed trial needs (compute-bound problems)", "",
             f"Command: `python3 -m bench.warmup_floor_probe {' '.join(sys.argv[1:])}`", "",
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}; {args.repeats} repeats, settings interleaved; before each "
             f"timing the previous config ran {args.load_ms:.0f} ms, then the GPU idled the "
             f"gap; each timing `tuner.gpu_timer.bench('eager-flushed', warmup, rep="
             f"{REP_MS:.0f})`'s median.", "", f"GPU state before: {mon.sample()}", ""]
    for name, shape, dtype in PROBLEMS:
        lines += probe(name, shape, dtype, args.repeats, args.load_ms, mon)
        print("\n".join(lines[-(len(WARMUPS_MS) * len(GAPS_S) + 8):]), flush=True)
    lines.append(f"GPU state after: {mon.sample()}")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
