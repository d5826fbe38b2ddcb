"""The output check's time per config on the GPU: the torch ops alone against the fused pass
first (``tuner/verification_fused.py``), side by side on the same outputs, in one process.

    python3 -m bench.verification_speed --out bench/results/verification_speed_h200.md

Each output is a kernel's correct output in its dtype (the fp32 reference rounded, with noise
of a quarter of the dtype's unit roundoff), against that fp32 reference, checked as the kernel
declares (softmax row-wise with row sums, the others per tensor). Times: median of
``triton.testing.do_bench`` (CUDA events, after a warm-up; ``compare`` ends with a host read,
so each run is whole). Also: both paths' answers (the largest error: equal, or the run fails),
a faulty output's (the same message), and the first use's compile of the two fused kernels in
a fresh Triton cache (a process of its own). The floor: reading the output and the reference
twice at the device's copy bandwidth.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.report import command_text, write_report

#: (name, shape, output dtype, tolerance (atol, rtol), row-wise with row sums)
OUTPUTS = (
    ("softmax 8192x50257", (8192, 50257), "bfloat16", (1e-5, 1.6e-2), True),
    ("matmul 8192x8192", (8192, 8192), "bfloat16", (8e-3, 1.6e-2), False),
    ("add_layernorm 32768x4096", (32768, 4096), "float16", (2e-3, 2e-3), False),
    ("flash attention 16x16x1024x64", (16, 16, 1024, 64), "float16", (2e-3, 2e-3), False),
)
COLD = """
import time, torch
from tuner.verification import compare
from tuner.kernel import Tolerance
ref = torch.rand(4096, 8192, device="cuda")
got = ref.to(torch.bfloat16)
t0 = time.perf_counter()
compare(got, ref, Tolerance(8e-3, 1.6e-2), "bfloat16")
print(time.perf_counter() - t0)
"""


def gpu_state() -> str:
    query = "name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"
    return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False).stdout.strip()


def measure(spec: tuple, gen: Any) -> tuple[str, bool]:
    """One output's table row, and whether both paths gave the same answers."""
    import torch
    import triton.testing

    from tuner import verification
    from tuner.kernel import OutputCheck, Tolerance
    from tuner.verification import compare

    name, shape, dtype, (atol, rtol), rowwise = spec
    fused_applies = verification._fused_applies
    tdtype = getattr(torch, dtype)
    if rowwise:
        ref = torch.softmax(torch.randn(shape, device="cuda", generator=gen) * 3, dim=-1)
    else:
        ref = torch.randn(shape, device="cuda", generator=gen)
    u = torch.finfo(tdtype).eps / 2
    noise = 1 + (torch.rand(shape, device="cuda", generator=gen) - 0.5) * (u / 2)
    got = (ref * noise).to(tdtype)
    del noise
    check = OutputCheck(rowwise=True, row_sum=1.0) if rowwise else OutputCheck()
    tol = Tolerance(atol, rtol)
    bad = got.clone()
    bad.view(-1)[12345] = float(bad.view(-1)[12345]) * 1.5 + 1.0

    def run(use_fused: bool, out: Any = got) -> str | float:
        verification._fused_applies = fused_applies if use_fused else (lambda got, ref: False)
        return compare(out, ref, tol, dtype, check)

    try:
        answers = (run(False), run(True))
        messages = (run(False, bad), run(True, bad))
        times = [triton.testing.do_bench(lambda u=use_fused: run(u), warmup=50, rep=400,
                                         return_mode="median") for use_fused in (False, True)]
    finally:
        verification._fused_applies = fused_applies
    floor = 2 * (got.numel() * got.element_size() + ref.numel() * 4) / 4.24e12 * 1e3
    same = isinstance(answers[0], float) and answers[0] == answers[1]
    same_msg = isinstance(messages[0], str) and messages[0] == messages[1]
    if not (same and same_msg):
        print(f"answers {answers}, messages {messages}", file=sys.stderr)
    return (f"| {name} {dtype} | {got.numel():,} | {floor:.2f} | {times[0]:.2f} | "
            f"{times[1]:.2f} | {times[0] / times[1]:.1f} | {same} | {same_msg} |",
            same and same_msg)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch

    state = gpu_state()
    lines = ["# The output check's time per config: torch ops against the fused pass first", "",
             f"Command: `{command_text('verification_speed', argv)}` "
             f"({time.strftime('%Y-%m-%d')}; {torch.cuda.get_device_name()})", "",
             f"GPU state before: {state}", "",
             "| output | elements | floor ms (2 reads of both at 4.24 TB/s) | torch ops ms | "
             "fused first ms | ratio | same answer | faulty: same message |",
             "|---|---|---|---|---|---|---|---|"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for spec in OUTPUTS:
        line, ok = measure(spec, gen)
        lines.append(line)
        print(line, flush=True)
        if not ok:
            return 1
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        cold = [subprocess.run([sys.executable, "-c", COLD], env=env, capture_output=True,
                               text=True, check=True).stdout.strip() for _ in range(2)]
    lines += ["", f"First use in a process (a 33.5 M-element bf16 output, fused), an empty "
              f"Triton cache: {float(cold[0]):.2f} s; the same cache again (a new process): "
              f"{float(cold[1]):.2f} s.",
              "", f"GPU state after: {gpu_state()}"]
    return write_report(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
