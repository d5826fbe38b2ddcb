"""Issue 12's evidence: does one config get one number, and does re-tuning choose the same one?

Part 1, **a config timed across a sweep**: one compute-bound config (matmul 8192^3 bf16, the
issue's) is timed 10 times inside a sweep of the space's known-good configs, through the
product's measuring child (``ProcessBackend.measure``: verify, then time, as every trial is),
once per timing protocol (``none``: as found; ``settled``; ``cool``; ``tuner/gpu_state.py``),
each in a fresh child. Per protocol: the target's 10 times, their spread ((max - min) /
median), the SM clock and power NVML read with each, and the sweep's wall time (what the
protocol costs).

Part 2, **re-tuning**: three shapes, each tuned three times by the real CLI (``tuner tune ...
--json``, a fresh database each time, so nothing stored steers the search), under the
protocol given by ``--retune-protocol`` (``auto``: part 1's protocol with the smallest spread).
Each run's chosen config, its re-timed time and torch's, timed interleaved in the same child
(the CLI's ``baseline_ms``).

Part 3, **do the choices differ beyond the noise?** Per shape, one fresh child re-times every
distinct chosen config and torch interleaved (``retime``, 7 rounds), so the choices are compared
at one clock; a choice "differs beyond the noise band" when its time is more than the band
over the fastest choice's, the band being the larger of 2% and the chosen configs' own
round-to-round spread.

Usage (on the GPU machine)::

    python3 -m bench.timing_stability --out bench/results/timing_stability.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SWEEP_SHAPE = {"M": 8192, "N": 8192, "K": 8192}
SWEEP_DTYPE = "bfloat16"
TARGET = "BLOCK_K=64,BLOCK_M=128,BLOCK_N=256,GROUP_M=8,num_stages=4,num_warps=8"
PROTOCOLS = ("none", "settled", "cool")
RETUNE = [("M=4096,N=4096,K=4096", "float16"), ("M=16,N=14336,K=4096", "bfloat16"),
          ("M=777,N=1234,K=4321", "float16")]
#: the smallest band within which two timings count as the same
MIN_BAND = 0.02


def parse_config(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}


def target_config() -> Any:
    """``TARGET``, with any parameter it does not name taken from the kernel's default."""
    from search_spaces import get_kernel
    from tuner.config import KernelConfig

    default = get_kernel("matmul").default_config(SWEEP_SHAPE, SWEEP_DTYPE)
    return KernelConfig({**dict(default.items()), **parse_config(TARGET)})


def spread(values: list[float]) -> float:
    """(max - min) / median; 0.0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    return (max(values) - min(values)) / statistics.median(values)


def _timing(protocol: str) -> Any:
    from tuner.backends.base import TimingOptions

    return TimingOptions(protocol=protocol)


def sweep(protocol: str, rounds: int, per_round: int) -> dict[str, Any]:
    """The target timed once per round among ``per_round`` other configs, in one child."""
    from search_spaces import get_kernel
    from tuner.backends.process import ProcessBackend

    kernel = get_kernel("matmul")
    target = target_config()
    others = [c for c in kernel.known_good_configs(SWEEP_SHAPE, SWEEP_DTYPE) if c != target]
    backend = ProcessBackend("cuda", kernel.ref, dict(SWEEP_SHAPE), SWEEP_DTYPE,
                             timing=_timing(protocol), compile_workers=0)
    rows = []
    started = time.monotonic()
    try:
        for r in range(rounds):
            batch = [others[(r * per_round + i) % len(others)] for i in range(per_round)]
            batch.insert(r % (per_round + 1), target)  # the target's place moves
            results = backend.measure(batch)
            m = next(x for x in results if x.config == target)
            gpu = m.extra.get("gpu") or {}
            rows.append({"ms": m.p50_ms, "ok": m.ok, "sm_mhz": gpu.get("sm_mhz"),
                         "power_w": gpu.get("power_w"), "temp_c": gpu.get("temp_c"),
                         "cool_ms": (m.extra.get("cool") or {}).get("ms"),
                         "settle_ms": (m.extra.get("settle") or {}).get("ms")})
            print(f"{protocol} round {r}: {rows[-1]}", flush=True)
    finally:
        backend.close()
    return {"protocol": protocol, "rows": rows, "wall_s": time.monotonic() - started}


def prime() -> None:
    """Compile and run every sweep config once (Triton's cache), so no protocol pays for it."""
    from search_spaces import get_kernel
    from tuner.backends.process import ProcessBackend

    kernel = get_kernel("matmul")
    configs = [target_config(), *kernel.known_good_configs(SWEEP_SHAPE, SWEEP_DTYPE)]
    backend = ProcessBackend("cuda", kernel.ref, dict(SWEEP_SHAPE), SWEEP_DTYPE,
                             timing=_timing("none"))
    try:
        backend.measure(configs)
    finally:
        backend.close()


def retune(shape: str, dtype: str, protocol: str, trials: int) -> dict[str, Any]:
    """One ``tuner tune`` run in a fresh database, under ``protocol``; its JSON summary."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "tuner.app.cli", "--db", f"sqlite:///{tmp}/t.db", "tune",
               "matmul", "--shape", shape, "--dtype", dtype, "--trials", str(trials),
               "--backend", "cuda", "--json", "--no-progress"]
        env = {**os.environ, "TUNER_TIMING_PROTOCOL": protocol}
        t0 = time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        wall = time.monotonic() - t0
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        return {"shape": shape, "dtype": dtype, "error": out.stderr[-500:], "wall_s": wall}
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    return {"shape": shape, "dtype": dtype, "wall_s": wall, "config": summary["best_config"],
            "best_ms": summary["best_ms"], "measured": summary.get("best_measured"),
            "baseline_ms": summary.get("baseline_ms"), "gpu": summary.get("best_gpu") or {}}


def compare_choices(shape: str, dtype: str, configs: list[dict[str, int]], protocol: str,
                    rounds: int) -> dict[str, Any]:
    """Every distinct chosen config and torch re-timed interleaved in one fresh child."""
    from search_spaces import get_kernel
    from tuner.backends.process import ProcessBackend
    from tuner.config import KernelConfig

    kernel = get_kernel("matmul")
    dims = parse_config(shape)
    distinct = list(dict.fromkeys(KernelConfig(c) for c in configs))
    backend = ProcessBackend("cuda", kernel.ref, dims, dtype, timing=_timing(protocol),
                             compile_workers=0)
    try:
        backend.measure(distinct)  # compiled and verified in this child first
        results = backend.retime(distinct, rounds, baseline=True)
    finally:
        backend.close()
    times = {m.config.key(): m for m in results if not m.extra.get("baseline")}
    base = next((m for m in results if m.extra.get("baseline")), None)
    return {"times": {k: m.p50_ms for k, m in times.items()},
            "spreads": {k: (m.p80_ms - m.p20_ms) / m.p50_ms for k, m in times.items()
                        if m.p50_ms and m.p20_ms is not None and m.p80_ms is not None},
            "torch_ms": base.p50_ms if base else None}


def verdicts(keys: list[str], times: dict[str, float], spreads: dict[str, float]
             ) -> tuple[float, list[tuple[str, float, bool]]]:
    """The noise band and, per run's choice, its time over the fastest choice's and whether
    that is beyond the band."""
    band = max([MIN_BAND, *spreads.values()])
    fastest = min(times.values())
    out = []
    for key in keys:
        ratio = times[key] / fastest
        out.append((key, ratio, ratio - 1.0 > band))
    return band, out


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def sweep_table(results: list[dict[str, Any]]) -> list[str]:
    lines = ["| protocol | timings | median ms | spread (max-min)/median | ms of each timing | "
             "SM MHz | power W | waited per timing ms | sweep wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for res in results:
        times = [r["ms"] for r in res["rows"] if r["ok"] and r["ms"]]
        waits = [r["cool_ms"] or r["settle_ms"] or 0.0 for r in res["rows"]]
        lines.append(
            f"| {res['protocol']} | {len(times)} | {_fmt(statistics.median(times))} | "
            f"{spread(times):.1%} | {', '.join(_fmt(t) for t in times)} | "
            + ", ".join(_fmt(r["sm_mhz"], ".0f") for r in res["rows"]) + " | "
            + ", ".join(_fmt(r["power_w"], ".0f") for r in res["rows"]) + " | "
            + f"{_fmt(statistics.median(waits), '.0f')} | {res['wall_s']:.1f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timings of the target per sweep")
    parser.add_argument("--per-round", type=int, default=4, help="other configs per round")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--retune-protocol", default="auto")
    parser.add_argument("--retune-runs", type=int, default=3)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--compare-rounds", type=int, default=7)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    prime()
    sweeps = [sweep(p, args.rounds, args.per_round) for p in args.protocols.split(",")]
    protocol = args.retune_protocol
    if protocol == "auto":
        protocol = min(sweeps, key=lambda s: spread([r["ms"] for r in s["rows"] if r["ok"]])
                       )["protocol"]
    runs = [retune(shape, dtype, protocol, args.trials)
            for _ in range(args.retune_runs) for shape, dtype in RETUNE]
    lines = ["# One config, one number; one shape, one choice (issue 12, H200)", "",
             f"Command: `python3 -m bench.timing_stability {' '.join(sys.argv[1:])}`", "",
             gpu_line(), "",
             f"## A config timed across a sweep (matmul {SWEEP_SHAPE['M']}x{SWEEP_SHAPE['N']}x"
             f"{SWEEP_SHAPE['K']} {SWEEP_DTYPE}, `{TARGET}`)", "",
             f"Each protocol: a fresh measuring child; {args.rounds} rounds, each measuring the "
             f"target and {args.per_round} of the space's known-good configs back to back "
             "(verify, then time: the trial path). 'none' is before the protocol; the SM clock "
             "and power are NVML's readings right after each timing.", "",
             *sweep_table(sweeps), "",
             f"## Re-tuning three shapes {args.retune_runs} times each (protocol: {protocol}"
             f"{' (the sweep spread smallest)' if args.retune_protocol == 'auto' else ''})", "",
             f"`tuner tune matmul --shape S --dtype D --trials {args.trials} --backend cuda "
             f"--json`, a fresh database per run, `TUNER_TIMING_PROTOCOL={protocol}`.", "",
             "| shape | dtype | run | chosen config | its time ms (re-timed) | torch ms (same "
             "child) | torch / tuned | SM MHz | power W | wall s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, run in enumerate(runs):
        if "error" in run:
            lines.append(f"| {run['shape']} | {run['dtype']} | {i // len(RETUNE) + 1} | "
                         f"failed: {run['error'][-120:]!r} | | | | | | {run['wall_s']:.1f} |")
            continue
        key = ",".join(f"{k}={v}" for k, v in sorted(run["config"].items()))
        ratio = (run["baseline_ms"] / run["best_ms"]) if run["baseline_ms"] else None
        lines.append(f"| {run['shape']} | {run['dtype']} | {i // len(RETUNE) + 1} | `{key}` | "
                     f"{_fmt(run['best_ms'])} ({run['measured']}) | {_fmt(run['baseline_ms'])} |"
                     f" {_fmt(ratio, '.3f')} | {_fmt(run['gpu'].get('sm_mhz'), '.0f')} | "
                     f"{_fmt(run['gpu'].get('power_w'), '.0f')} | {run['wall_s']:.1f} |")
    lines += ["", "## Do the choices differ beyond the noise?", "",
              f"Per shape, every distinct chosen config and torch re-timed interleaved in one "
              f"fresh child ({args.compare_rounds} rounds, protocol {protocol}); band = the "
              f"larger of {MIN_BAND:.0%} and the choices' own p20-p80 spread over rounds.", "",
              "| shape | dtype | distinct choices | band | each run's choice / fastest choice "
              "| beyond the band | torch ms | fastest choice ms | torch / fastest |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    beyond_total = 0
    for shape, dtype in RETUNE:
        mine = [r for r in runs if r["shape"] == shape and r["dtype"] == dtype and "config" in r]
        if not mine:
            continue
        cmp = compare_choices(shape, dtype, [r["config"] for r in mine], protocol,
                              args.compare_rounds)
        from tuner.config import KernelConfig

        keys = [KernelConfig(r["config"]).key() for r in mine]
        band, rows = verdicts(keys, cmp["times"], cmp["spreads"])
        beyond = sum(1 for _, _, b in rows if b)
        beyond_total += beyond
        fastest = min(cmp["times"].values())
        lines.append(f"| {shape} | {dtype} | {len(cmp['times'])} | {band:.1%} | "
                     + ", ".join(f"{ratio:.3f}" for _, ratio, _ in rows)
                     + f" | {beyond} of {len(rows)} | {_fmt(cmp['torch_ms'])} | "
                     f"{_fmt(fastest)} | "
                     f"{_fmt(cmp['torch_ms'] / fastest if cmp['torch_ms'] else None, '.3f')} |")
    lines += ["", f"Choices beyond the noise band: {beyond_total} of {len(runs)} runs."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"sweeps": sweeps, "runs": runs, "protocol": protocol}, indent=1, default=str))
    print(text)
    return 0


def gpu_line() -> str:
    """The GPU, its driver, Triton and torch versions, and its state now (NVML)."""
    import torch
    import triton

    from tuner.gpu_state import monitor_for_torch_device

    mon = monitor_for_torch_device(0)
    s = mon.sample()
    return (f"GPU: {torch.cuda.get_device_name(0)}, power limit "
            f"{_fmt(mon.power_limit_w(), '.0f')} W; at the start: SM {_fmt(s['sm_mhz'], '.0f')}"
            f" MHz, {_fmt(s['power_w'], '.0f')} W, {_fmt(s['temp_c'], '.0f')} C. Triton "
            f"{triton.__version__}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}.")


if __name__ == "__main__":
    raise SystemExit(main())
