"""Where a trial's time goes in the measuring child, against its floor.

A trial of a power-pressed problem took 250-310 ms of the GPU child on an H100 (8192^3 bf16:
4.93 s of "measuring" over 16 trials, ``results/tuning_time_33d_h100/``), where its timing asks
for ~150 ms of GPU work (a 100 ms sustained-state warm-up, 40 ms of timed runs, the estimate's
five runs and the quick timing's 5 ms). This probe runs the child's own batch code
(``measure_many``) on configs already compiled, records when each of its messages is sent, and
times the steps of a verification apart (the launch, the kernel's reference, the comparison),
so that each step's wall time stands beside what it must cost:

- ``load``: the binary's load (compiled before the probe: a cache hit);
- ``verify``: one launch, the reference, the comparison (``_verify``);
- ``time``: the trial's timing with the GPU's state read (``_timed``); its floor: the timing
  options' warm-up and rep, the estimate's five runs and the quick timing, at the kernel's
  own time (the batch's best so far decides whether a trial gets the quick timing first).

``--cold``: as the service meets a config instead: its binary compiled by another process
(a compile pool's, into a fresh Triton cache), so that this process loads it from disk; each
config's verification steps are then timed apart on first use (the compile hook's cache load,
the first launch with its module load, a second launch, the reference, the comparison). Each
problem twice: the other process compiling the binaries only, then also building their
launchers (``tuner.host_compile.build_launchers``, as the compile pool does).

Usage (on the GPU machine)::

    python3 -m bench.trial_cost_probe --out $OUT/trial_cost_probe.md
    python3 -m bench.trial_cost_probe --cold --out $OUT/trial_cost_cold.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

#: (kernel, shape, dtype): the held-out set's problems whose trials cost most
PROBLEMS = (("matmul", {"M": 8192, "N": 8192, "K": 8192}, "bfloat16"),
            ("softmax", {"M": 8192, "N": 50257}, "bfloat16"),
            ("moe_gemm", {"M": 512, "N": 14336, "K": 4096, "E": 8, "TOPK": 2}, "bfloat16"),
            ("flash_attention", {"B": 16, "H": 16, "S": 1024, "D": 64}, "float16"),
            ("add_layernorm", {"M": 4096, "N": 8192}, "bfloat16"))


def _configs(kernel: Any, shape: dict[str, int], dtype: str, n: int) -> list[Any]:
    picks = list(dict.fromkeys(kernel.known_good_configs(shape, dtype)))
    if not picks:
        picks = [kernel.default_config(shape, dtype)]
    return picks[::max(1, len(picks) // n)][:n]


def _stamp(events: list[tuple[float, tuple[Any, ...]]], msg: tuple[Any, ...]) -> None:
    events.append((time.perf_counter(), msg))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=6)
    parser.add_argument("--cold", action="store_true",
                        help="binaries compiled by another process, loaded here on first use")
    parser.add_argument("--cold-part", help=argparse.SUPPRESS)  # one of --cold's processes
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.cold_part:
        return cold_part(args)
    if args.cold:
        return cold_main(args)

    import torch
    import triton

    from search_spaces import get_kernel
    from tuner.backends import TimingOptions
    from tuner.backends import child as child_mod
    from tuner.launching import output_tensor

    timing = TimingOptions()
    lines = ["# Where a trial's time goes in the measuring child", "",
             f"Command: `python3 -m bench.trial_cost_probe {' '.join(sys.argv[1:])}`", "",
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}. Timing options: warm-up {timing.settle_warmup_ms:g} ms "
             f"(sustained) / {timing.warmup_ms:g} ms, rep {timing.rep_ms:g} ms, quick rep "
             f"{timing.quick_rep_ms:g} ms, method {timing.method}. Each problem: "
             f"{args.configs} known-good configs, compiled and run once first, then one batch "
             "of the child's `measure_many` (the second of two: the first warms the "
             "reference's libraries); ms of wall time per config. `floor`: the GPU time the "
             "timing asks for at the config's own p50 (estimate 5 runs, warm-up, rep, and the "
             "quick timing's where it had one).", ""]
    for name, shape, dtype in PROBLEMS:
        kernel = get_kernel(name)
        configs = _configs(kernel, shape, dtype, args.configs)
        state = child_mod.ChildState("cuda")
        state.kernel, state.shape, state.dtype = kernel, dict(shape), dtype
        inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
        for c in configs:
            kernel.launch(c, inputs)
        torch.cuda.synchronize()
        # the verification's steps apart, on the same inputs
        steps: dict[str, list[float]] = {"launch": [], "reference": [], "compare": []}
        for _ in range(3):
            t0 = time.perf_counter()
            kernel.launch(configs[0], inputs)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            ref = kernel.reference(inputs)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            refs = ref if isinstance(ref, tuple | list) else (ref,)
            names = child_mod._output_names(inputs)
            for out_name, r in zip(names, refs, strict=True):
                child_mod._compare(state, output_tensor(inputs[out_name]).float(), r.float(), "")
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            for key, v in zip(steps, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                steps[key].append(v)
        del inputs, ref, refs
        torch.cuda.empty_cache()
        rows: list[tuple[Any, ...]] = []
        for attempt in range(2):
            events: list[tuple[float, tuple[Any, ...]]] = []
            state.last_busy = 0.0
            state.quiet = False
            t_start = time.perf_counter()
            child_mod.measure_many(state, configs, timing, partial(_stamp, events))
            if attempt == 0:
                continue
            last = t_start
            stamps: dict[tuple[str, int], float] = {}
            for t, msg in events:
                stamps[(msg[0], msg[1])] = t
            results = {msg[1]: msg[2] for _, msg in events if msg[0] == "result"}
            previous = max(stamps[("verified", i)] for i in range(len(configs))
                           if ("verified", i) in stamps)
            best = None
            for i, c in enumerate(configs):
                m = results[i]
                compiled = stamps.get(("compiled", i), last)
                verified = stamps.get(("verified", i), compiled)
                load = compiled - (stamps.get(("verified", i - 1), t_start) if i else t_start)
                verify = verified - compiled
                done = stamps[("result", i)]
                spent = done - previous
                previous = done
                p50 = m.p50_ms or 0.0
                quick = best is not None and timing.quick_rep_ms > 0
                warm = m.extra.get("warmup_ms") or 0.0
                floor = 5 * p50 + (0 if m.extra.get("quick") else warm + timing.rep_ms)
                if quick:
                    floor += 5 * p50 + max(timing.quick_rep_ms / 5, 0.5) + timing.quick_rep_ms
                if m.ok and not m.extra.get("quick") and (best is None or p50 < best):
                    best = p50
                rows.append((c.key(), f"{p50:.4f}", _ms(load), _ms(verify), _ms(spent),
                             f"{floor:.1f}", f"{warm:g}", "yes" if m.extra.get("quick") else "",
                             _ms(float(m.extra.get("time_s") or 0.0))))
            last = t_start
        lines += [f"## {name} {shape} {dtype}", "",
                  "Verification's steps apart (median of 3, ms): " + ", ".join(
                      f"{k} {statistics.median(v) * 1e3:.1f}" for k, v in steps.items()) + ".",
                  "", "| config | p50 ms | load | verify | time (to its result) | floor | "
                  "warm-up ms | quick only | time_s (child) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
        lines.append("")
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


#: --cold: the problems whose verification cost most in the service
COLD_PROBLEMS = PROBLEMS[:2]
COMPILE_CODE = r"""
import json, sys
from search_spaces import get_kernel
from tuner.config import KernelConfig
from tuner.kernel import compile_inputs_for
name, shape, dtype = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
configs = json.loads(sys.argv[4])
if sys.argv[5] == "launchers":  # as a compile pool process does
    from tuner.host_compile import build_launchers
    build_launchers()
kernel = get_kernel(name)
inputs = compile_inputs_for(kernel, shape, dtype, "cuda")
for c in configs:
    kernel.compile(KernelConfig(c), inputs)
"""


def cold_main(args: argparse.Namespace) -> int:
    """Each (problem, launchers or not) in a process of its own (``--cold-part``): a fresh
    Triton cache, and no binary or launcher loaded before in the process that measures."""
    import json
    import subprocess

    import torch
    import triton

    lines = ["# A trial's verification on first use of a binary another process compiled", "",
             f"Command: `python3 -m bench.trial_cost_probe {' '.join(sys.argv[1:])}`", "",
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}. Each problem: {args.configs} known-good configs compiled "
             "by a subprocess (the compile shape's inputs, as a compile pool) into a fresh "
             "Triton cache; then, in a fresh process, per config (ms, each step "
             "synchronised): the compile hook (a cache load), the first launch (the module's "
             "load), a second launch, the reference, the comparison.", ""]
    for index, (name, shape, dtype) in enumerate(COLD_PROBLEMS):
        for mode in ("binaries", "launchers"):
            run = subprocess.run([sys.executable, "-m", "bench.trial_cost_probe", "--out", "-",
                                  "--configs", str(args.configs), "--cold-part",
                                  f"{index}:{mode}"], capture_output=True, text=True,
                                 timeout=900)
            built = ("the compiling process also built the launchers "
                     "(`tuner.host_compile.build_launchers`)" if mode == "launchers"
                     else "binaries only")
            lines += [f"## {name} {shape} {dtype}: {built}", ""]
            if run.returncode != 0:
                lines += ["```", run.stderr[-3000:], "```", ""]
                continue
            rows = json.loads(run.stdout.strip().splitlines()[-1])
            lines += ["| config | compile hook | first launch | second launch | reference | "
                      "comparison |", "|---|---|---|---|---|---|"]
            lines += [f"| `{key}` | " + " | ".join(_ms(v) for v in steps) + " |"
                      for key, steps in rows]
            lines.append("")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


def cold_part(args: argparse.Namespace) -> int:
    import json
    import os
    import subprocess
    import tempfile

    index, mode = args.cold_part.split(":")
    name, shape, dtype = COLD_PROBLEMS[int(index)]
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="trial-cost-cache-")
    import torch

    from search_spaces import get_kernel
    from tuner.backends import child as child_mod
    from tuner.launching import output_tensor

    kernel = get_kernel(name)
    configs = _configs(kernel, shape, dtype, args.configs)
    subprocess.run([sys.executable, "-c", COMPILE_CODE, name, json.dumps(shape), dtype,
                    json.dumps([c.to_dict() for c in configs]), mode], check=True,
                   timeout=600)
    state = child_mod.ChildState("cuda")
    state.kernel, state.shape, state.dtype = kernel, dict(shape), dtype
    inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
    torch.cuda.synchronize()
    rows = []
    for c in configs:
        marks = [time.perf_counter()]
        kernel.compile(c, inputs)
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        for _ in range(2):
            kernel.launch(c, inputs)
            torch.cuda.synchronize()
            marks.append(time.perf_counter())
        ref = kernel.reference(inputs)
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        refs = ref if isinstance(ref, tuple | list) else (ref,)
        for out_name, r in zip(child_mod._output_names(inputs), refs, strict=True):
            child_mod._compare(state, output_tensor(inputs[out_name]).float(), r.float(), "")
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        rows.append((c.key(), [b - a for a, b in zip(marks, marks[1:], strict=False)]))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
