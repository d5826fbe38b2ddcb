"""Issue 14's flash-attention targets: the configs the H200 measured best, each plain, with the
query block held as two interleaved halves (the kernel's SUBTILE switch) and, with ``--ws``,
with Triton's warp specialisation of its key loops (WS), timed beside torch's SDPA (flash
backend) in this one process.

Each config is checked against the space's constraints, run once and verified against the
fp32 reference, then timed with ``triton.testing.do_bench`` interleaved with SDPA, round by
round (ratio = SDPA ms / config ms: above 1 the config is faster). A quick look, not the
tuner's protocol: ``bench/targets.py`` tunes the same problems with the product.

Usage (on the GPU machine)::

    python3 -m bench.flash_variants [--only causal] [--rounds 3] [--ws]

``--smoke`` runs and verifies every config once on the CPU interpreter, on a small shape with
the same head dim, in float16, untimed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from bench.matmul_variants import timed_interleaved, verified_once

#: (kernel, shape, dtype, target, [(BLOCK_M, BLOCK_N, num_warps, num_stages, TMA)]), each
#: timed whole and as two halves (SUBTILE 0 and 1)
TARGETS: list[tuple[str, dict[str, int], str, float, list[tuple[int, ...]]]] = [
    ("flash_attention_causal", {"B": 4, "H": 32, "S": 4096, "D": 128}, "bfloat16", 0.85,
     [(128, 64, 4, 2, 1), (128, 128, 8, 3, 1), (128, 64, 8, 3, 0), (128, 128, 8, 2, 1)]),
    ("flash_attention", {"B": 16, "H": 16, "S": 1024, "D": 64}, "float16", 0.85,
     [(128, 64, 8, 3, 0), (128, 64, 4, 3, 0), (128, 64, 8, 3, 1), (256, 64, 8, 3, 0),
      (256, 64, 8, 3, 1)]),
]
#: (WS, SUBTILE, label) timed for each tile: the plain kernel, the query block as two
#: interleaved halves; with --ws also the warp-specialised key loops
SWITCHES = ((0, 0, ""), (0, 1, ""))
WS_SWITCH = (1, 0, " (warp-specialised)")


def run(only: str, rounds: int, smoke: bool, log: Callable[[str], None] = print,
        ws: bool = False) -> int:
    from search_spaces import get_kernel
    from search_spaces.flash_attention import flash_attention
    from tuner.config import KernelConfig
    from tuner.space import ProblemContext

    device = "cpu" if smoke else "cuda"
    wrong = 0
    for name, shape, dtype, target, tiles in TARGETS:
        if only not in name:
            continue
        kernel = get_kernel(name)
        if smoke:
            shape, dtype = {**shape, "B": 1, "H": 2, "S": 67}, "float16"
        inputs = kernel.make_inputs(shape, dtype, device, seed=0)
        ref = kernel.reference(inputs)
        space, ctx = kernel.space(), ProblemContext(shape, dtype)
        rows, fns = [], []
        for bm, bn, warps, stages, tma in tiles:
            for w, sub, label in SWITCHES + ((WS_SWITCH,) if ws else ()):
                config = KernelConfig(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
                                      num_stages=stages, TMA=tma, SUBTILE=sub)
                reason = space.violation(config, ctx)
                if reason and not smoke:
                    log(f"  {config.key()}: pruned ({reason})")
                    continue
                fn = (lambda c=config, w=w, x=inputs, causal=kernel.causal:
                      flash_attention(x["q"], x["k"], x["v"], x["out"], causal, c,
                                      warp_spec=w))
                ok = verified_once(fn, inputs["out"], ref, kernel, dtype, config.key() + label,
                                   log)
                if not ok:
                    wrong += ok is False
                    continue
                rows.append(config.key() + label)
                fns.append(fn)
        text = ",".join(f"{k}={v}" for k, v in shape.items())
        if smoke:
            log(f"{name} {text} {dtype}: {len(rows)} configs right on the interpreter")
            continue
        ms = timed_interleaved([lambda x=inputs, k=kernel: k.baseline(x), *fns], rounds)
        flops = kernel.flops(shape)
        log(f"{name} {text} {dtype} (target {target}x SDPA): SDPA {ms[0]:.4f} ms, "
            f"{flops / ms[0] / 1e9:.0f} TFLOP/s")
        for row, t in sorted(zip(rows, ms[1:], strict=True), key=lambda r: r[1]):
            log(f"  {ms[0] / t:5.3f}x  {t:.4f} ms  {flops / t / 1e9:4.0f} TFLOP/s  {row}")
    return 1 if wrong else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", default="", help="kernels whose name contains this text")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, small shapes")
    parser.add_argument("--ws", action="store_true", help="also the warp-specialised rows")
    args = parser.parse_args(argv)
    if args.smoke:  # before the kernel module is imported
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.smoke and torch.cuda.is_available():
        print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    return run(args.only, args.rounds, args.smoke, ws=args.ws)


if __name__ == "__main__":
    sys.exit(main())
