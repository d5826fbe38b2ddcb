"""Launch rate: the host time of one call, for every built-in launcher against torch's same op,
and for ``tuner.autotune`` against ``triton.autotune`` (GPU).

A serving engine calls small kernels back to back; without CUDA graphs the host side of a
launch (Python, argument binding, the driver call) is what a small problem costs, and
``do_bench`` (which times the GPU) hides it. Each case is called ``--calls`` times in a loop
after a warm-up: ``host us`` is the loop's time before the final synchronize divided by the
calls (the GPU runs behind: every case here is host-bound, which ``wall us`` , with the
synchronize, confirms when it is close to ``host us``). Ours and torch's alternate, ``--repeats``
times, medians. Built-ins launch their default config on small problems (where the host
dominates) through ``kernel.launch`` (the code a served config runs); torch's is the kernel's
``baseline`` (the like-for-like op: cuBLAS, cuDNN, torch's softmax, ...).

The decorator: one vector-add kernel under ``triton.autotune`` (two configs, already tuned for
the key) and under ``tuner.autotune`` served from an exported configs file (no service), and the
bare ``@triton.jit`` launch with the same config as the floor.

Usage (on the GPU machine)::

    python3 -m bench.launch_rate --out bench/results/launch_rate_h100.md
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: (kernel, shape, dtype): small problems, host-bound
CASES: list[tuple[str, dict[str, int], str]] = [
    ("vector_add", {"N": 4096}, "float16"),
    ("softmax", {"M": 1, "N": 4096}, "float16"),
    ("add_layernorm", {"M": 1, "N": 4096}, "float16"),
    ("matmul", {"M": 1, "N": 4096, "K": 4096}, "float16"),
    ("matmul_epilogue_gelu", {"M": 1, "N": 4096, "K": 4096}, "float16"),
    ("matmul_epilogue_silu_residual", {"M": 1, "N": 4096, "K": 4096}, "float16"),
    ("moe_gemm", {"M": 1, "N": 14336, "K": 4096, "E": 8, "TOPK": 2}, "float16"),
    ("flash_attention", {"B": 1, "H": 8, "S": 128, "D": 64}, "float16"),
    ("conv2d", {"N": 1, "C": 64, "H": 14, "W": 14, "K": 64, "R": 3, "S": 3, "STRIDE": 1,
                "PAD1": 2, "DIL": 1}, "float16"),
    ("conv2d_nhwc", {"N": 1, "C": 64, "H": 14, "W": 14, "K": 64, "R": 3, "S": 3, "STRIDE": 1,
                     "PAD1": 2, "DIL": 1}, "float16"),
]


def per_call(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(host us, wall us) per call of ``calls`` back-to-back calls."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def compare(cases: dict[str, Callable[[], Any]], calls: int,
            repeats: int) -> dict[str, tuple[float, float]]:
    """Median (host us, wall us) of each case, the cases alternating within each repeat."""
    for fn in cases.values():  # compile, allocate, tune
        for _ in range(20):
            fn()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            runs[name].append(per_call(fn, calls))
    return {name: (statistics.median(h for h, _ in r), statistics.median(w for _, w in r))
            for name, r in runs.items()}


def builtins(calls: int, repeats: int) -> list[dict[str, Any]]:
    from search_spaces import get_kernel

    rows = []
    for name, shape, dtype in CASES:
        kernel = get_kernel(name)
        config = kernel.default_config(shape, dtype)
        inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
        result = compare({"ours": lambda k=kernel, c=config, i=inputs: k.launch(c, i),
                          "torch": lambda k=kernel, i=inputs: k.baseline(i)}, calls, repeats)
        rows.append({"kernel": name, "shape": shape, "dtype": dtype, "config": dict(config),
                     "ours": result["ours"], "torch": result["torch"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def decorator(calls: int, repeats: int, tmp: Path) -> dict[str, tuple[float, float]]:
    import torch
    import triton
    import triton.language as tl

    import tuner
    from tuner.identity import local_device_key, local_triton_version

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
                 + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    configs = [triton.Config({"BLOCK": 1024}, num_warps=4),
               triton.Config({"BLOCK": 2048}, num_warps=8)]
    with_triton = triton.autotune(configs=configs, key=["n"])(add_kernel)
    with_tuner = tuner.autotune(configs=configs, key=["n"], name="bench_add")(add_kernel)
    n = 4096
    x, y = (torch.randn(n, device="cuda", dtype=torch.float16) for _ in range(2))
    out = torch.empty_like(x)
    entry = {"kernel": "bench_add", "kernel_version": with_tuner.version, "dtype": "float16",
             "device": local_device_key(), "triton_version": local_triton_version(),
             "shape": {"n": n}, "config": {"BLOCK": 1024, "num_warps": 4, "num_stages": 3},
             "ms": 0.003}
    path = tmp / "configs.json"
    path.write_text(json.dumps({"format": "tuner-configs-v1",
                                "exported_at": "2026-01-01T00:00:00Z", "configs": [entry]}))
    tuner.configure(configs_file=str(path), url="")

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK"]),)

    result = compare({
        "triton.jit (the config given)": lambda: add_kernel[grid](x, y, out, n, BLOCK=1024,
                                                                   num_warps=4),
        "triton.autotune": lambda: with_triton[grid](x, y, out, n),
        "tuner.autotune (configs file)": lambda: with_tuner[grid](x, y, out, n),
        "torch.add": lambda: torch.add(x, y, out=out)}, calls, repeats)
    sources = set(with_tuner.sources.values())
    assert sources == {"file"}, f"tuner.autotune did not serve from the file: {sources}"
    return result


def markdown(rows: list[dict[str, Any]], deco: dict[str, tuple[float, float]], gpu: str,
             args: argparse.Namespace) -> str:
    lines = ["# Launch rate: host time per call (us), back-to-back launches, no CUDA graphs", "",
             f"`python3 -m bench.launch_rate {' '.join(sys.argv[1:])}`", "", "```",
             gpu.strip(), "```", "",
             f"Medians of {args.repeats} loops of {args.calls} calls each, ours and torch's "
             "alternating. host: the loop before the final synchronize; wall: with it.", "",
             "| kernel | shape | ours host | torch host | ours / torch | ours wall | "
             "torch wall | default config |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        (oh, ow), (th, tw) = r["ours"], r["torch"]
        shape = "x".join(str(v) for v in r["shape"].values())
        lines.append(f"| {r['kernel']} | {shape} | {oh:.1f} | {th:.1f} | {oh / th:.2f}x | "
                     f"{ow:.1f} | {tw:.1f} | `{json.dumps(r['config'])}` |")
    lines += ["", "The decorator (vector add, n = 4096, fp16):", "",
              "| launcher | host us | wall us | / triton.autotune |", "|---|---|---|---|"]
    base = deco["triton.autotune"][0]
    for name, (h, w) in deco.items():
        lines.append(f"| {name} | {h:.1f} | {w:.1f} | {h / base:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", nargs="*", help="kernels of CASES to run (default: all)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.only:
        CASES[:] = [c for c in CASES if c[0] in args.only]
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,power.draw,"
                          "power.limit,temperature.gpu", "--format=csv"], capture_output=True,
                         text=True).stdout
    import torch
    import triton

    gpu += f"torch {torch.__version__}, triton {triton.__version__}, python " \
           f"{sys.version.split()[0]}, {os.cpu_count()} CPUs"
    rows = builtins(args.calls, args.repeats)
    deco = decorator(args.calls, args.repeats, Path(tempfile.mkdtemp()))
    Path(args.out).write_text(markdown(rows, deco, gpu, args))
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
