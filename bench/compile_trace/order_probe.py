"""Does a GEMM kernel's Triton ``cache_key`` depend on which kernel the process compiled
first? Each order runs in a fresh process: compile the first variant's config, then the
second's, then print the kernels' keys and what each key took from its callees, in order
(issue 33: the compile trace found two keys for ``_matmul_kernel`` among the pool's processes,
by what each compiled first). ``--settle``: each process loads the kernel as the pool and the
GPU child do (``tuner.kernel.load_ref``, which settles the keys, callees first) before it
compiles.

Usage (GPU machine): ``python3 -m bench.compile_trace.order_probe [--settle]``
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

_CONFIGS = {
    "tiled": "ALIGN=0,BLOCK_K=64,BLOCK_M=64,BLOCK_N=128,GROUP_M=8,SPLIT_K=1,VARIANT=0,"
             "num_stages=4,num_warps=4",
    "split_k": "ALIGN=0,BLOCK_K=64,BLOCK_M=64,BLOCK_N=128,GROUP_M=8,SPLIT_K=2,VARIANT=3,"
               "num_stages=4,num_warps=4",
    "none": "",
}
_KERNELS = ("_matmul_kernel", "_matmul_split_k_kernel", "_matmul_persistent_kernel")


def _config(text: str) -> Any:
    from tuner.config import KernelConfig

    return KernelConfig({k: int(v) for k, v in (p.split("=") for p in text.split(","))})


def _one(order: list[str], settle: bool) -> str:
    import torch
    import triton.runtime.jit as jit

    from search_spaces import matmul as mm
    from tuner.kernel import load_ref

    trace: list[str] = []
    update = jit.DependenciesFinder._update_hash

    def logged(self: Any, func: Any) -> None:  # what each key takes from its callees
        update(self, func)
        used = sorted((k[0], str(v[0])) for k, v in self.used_global_vals.items())
        trace.append(f"{self.name} <- {func.__name__} {func.cache_key[:8]} globals {used}")

    jit.DependenciesFinder._update_hash = logged
    if settle:
        load_ref("search_spaces.matmul:KERNEL")
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    out = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    for name in order:
        if _CONFIGS[name]:
            mm.compile_matmul(a, b, out, _config(_CONFIGS[name]))
    keys = {k: getattr(mm, k).cache_key[:12] for k in _KERNELS}
    return f"{' then '.join(order)}: {keys}\n  " + "\n  ".join(trace)


def main() -> int:
    settle = "--settle" in sys.argv
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(_one([a for a in sys.argv[2:] if a != "--settle"], settle))
        return 0
    for order in (["none"], ["tiled", "split_k"], ["split_k", "tiled"]):
        subprocess.run([sys.executable, "-m", "bench.compile_trace.order_probe", "--one",
                        *order, *(["--settle"] if settle else [])], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
