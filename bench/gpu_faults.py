"""Issue 4 on the GPU: real Triton kernels that fault, tuned through the real pipeline.

    python3 bench/gpu_faults.py --out bench/results/gpu_faults_h200.md

The kernel ``out = 2 * x`` has a MODE parameter: 0 is right, 1 stores far out of bounds without
a mask (an illegal address: a sticky CUDA error), 2 spins forever on a value in memory that
never changes. The task must record each fault, restart the GPU child, and finish with a
verified best config.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from tuner.config import KernelConfig
from tuner.kernel import Dim, Tolerance
from tuner.space import Param, SearchSpace


@triton.jit
def _faulty_kernel(x_ptr, out_ptr, flag_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if MODE == 1:
        far = offs.to(tl.int64) + (1 << 40)
        tl.store(out_ptr + far, x * 2)  # no mask, 4 TiB past the buffer
    elif MODE == 2:
        flag = tl.load(flag_ptr, volatile=True)
        while flag == 0:  # the flag is zero and nothing ever writes it
            flag = tl.load(flag_ptr, volatile=True)
        tl.store(out_ptr + offs, x * 2, mask=mask)
    else:
        tl.store(out_ptr + offs, x * 2, mask=mask)


class FaultyCopy:
    name = "faulty_copy"
    ref = "bench.gpu_faults:KERNEL"
    version = "bench-1"
    dims = (Dim("N", 1, 1 << 30),)
    dtypes = ("float32",)
    interpreter_unsupported_dtypes: tuple[str, ...] = ()

    def space(self) -> SearchSpace:
        return SearchSpace((Param.ints("MODE", (0, 1, 2)), Param.pow2("BLOCK", 512, 1024),
                            Param.ints("num_warps", (4,)), Param.ints("num_stages", (2,))))

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        return KernelConfig(MODE=0, BLOCK=1024, num_warps=4, num_stages=2)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        return []

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(shape["N"], generator=gen, device=device)
        return {"x": x, "out": torch.empty_like(x),
                "flag": torch.zeros(1, dtype=torch.int32, device=device)}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        n = inputs["x"].numel()
        grid = (triton.cdiv(n, config["BLOCK"]),)
        _faulty_kernel[grid](inputs["x"], inputs["out"], inputs["flag"], n,
                             MODE=config["MODE"], BLOCK=config["BLOCK"],
                             num_warps=config.num_warps, num_stages=config.num_stages)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"] * 2

    def tolerance(self, dtype: str) -> Tolerance:
        return Tolerance(0.0, 0.0)

    def flops(self, shape: Mapping[str, int]) -> float:
        return float(shape["N"])

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        return 8.0 * shape["N"]


KERNEL = FaultyCopy()


def main() -> None:
    from tuner.backends import TimingOptions
    from tuner.backends.process import ProcessBackend
    from tuner.search import SearchOptions, run_search

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    shape = {"N": 1 << 24}
    timing = TimingOptions(compile_timeout_s=60, run_timeout_s=10, max_consecutive_deaths=20)
    t0 = time.monotonic()
    backend = ProcessBackend("cuda", KERNEL.ref, shape, "float32", timing=timing,
                             compile_workers=4)
    try:
        result = run_search(KERNEL, shape, "float32", backend,
                            SearchOptions(trials=6, strategy="exhaustive", batch_size=3))
        restarts = backend.restarts
    finally:
        backend.close()
    wall = time.monotonic() - t0
    lines = ["# Faulting Triton kernels through the pipeline (GPU)", "",
             f"Command: `python3 bench/gpu_faults.py --out {args.out}`", "",
             f"Device: {backend.fingerprint.name} (Triton {backend.fingerprint.triton_version})",
             "", "| # | config | outcome | p50 ms | error (first 160 chars) |",
             "|---|---|---|---|---|"]
    for i, m in enumerate(result.trials, 1):
        err = (m.error or "").replace("\n", " ").replace("|", "/")[:160]
        ms = f"{m.p50_ms:.4f}" if m.p50_ms else ""
        lines.append(f"| {i} | `{m.config.key()}` | {m.outcome.value} | {ms} | {err} |")
    best = result.best
    lines += ["", f"GPU child restarts: {restarts}; outcomes: {result.counts}; "
              f"wall {wall:.1f} s; stop: {result.stop_reason}",
              f"Verified best: `{best.config.key() if best else None}` "
              f"({best.p50_ms if best else float('nan'):.4f} ms)"]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if best is not None and best.config["MODE"] == 0 else 1)


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    main()
