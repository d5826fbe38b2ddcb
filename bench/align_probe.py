"""Unaligned GEMMs: what staging the operands into 16-byte aligned rows buys (matmul ALIGN).

A row-major operand whose row is not a multiple of 16 bytes (fp16 K = 4321: 8,642 B) cannot
be read with vector loads: Triton specialises a stride on its divisibility by 16, so every
load of such an operand is a 2-byte ``ld.global.b16`` and the K loop has no ``cp.async``
pipeline (seen in the sm_90 build), and TMA needs aligned rows outright. ALIGN=1
(``search_spaces.matmul.stage``) copies such operands into zero-padded buffers whose rows and
K are multiples of 16 elements (one read and one write of each), after which every variant
runs at its aligned speed. This probe measures, in one process, interleaved round by round
with torch.matmul (cuBLAS), do_bench medians (L2 flushed):

1. the product's configs on the unaligned inputs as they are (ALIGN=0);
2. the same tiles with ALIGN=1, whole: the copies, the GEMM and (descriptor stores) C's copy;
3. ALIGN=1's copies alone (its Triton copy kernel), and the GEMM alone on staged operands.

Each kernel is verified once against the fp32 reference first.

    python3 -m bench.align_probe [--shape 777,1234,4321:float16 ...] [--rounds 3] [--smoke]
    python3 -m bench.align_probe --host [--shape ...]   # where each call's host time goes

``--smoke`` runs every kernel once on the CPU interpreter on a small problem, untimed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from bench.matmul_variants import _config, timed_interleaved, verified_once
from bench.skinny_probe import _parse

SHAPES = ("777,1234,4321:float16", "1500,3001,999:float16", "1000,3000,500:float16",
          "777,1234,4321:float32",
          "2047,5001,3001:bfloat16")

#: (variant, SPLIT_K, (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages))
AS_IS = [("tiled", 1, (64, 64, 64, 1, 4, 3)), ("tiled", 1, (64, 64, 32, 8, 4, 4)),
         ("tiled", 1, (128, 128, 32, 8, 4, 4)), ("split_k", 2, (64, 64, 64, 8, 4, 3))]
STAGED = [("tma_persistent", 1, (128, 128, 64, 8, 4, 4)),
          ("tma_persistent", 1, (128, 256, 64, 8, 8, 3)),
          ("tma_persistent", 1, (128, 64, 64, 8, 4, 4)),
          ("tiled", 1, (128, 128, 32, 8, 4, 4)), ("tiled", 1, (64, 128, 64, 8, 4, 4)),
          ("tiled", 1, (128, 128, 64, 8, 4, 4)), ("tiled", 1, (128, 256, 64, 8, 8, 3)),
          ("persistent", 1, (128, 128, 64, 8, 8, 4)),
          ("split_k", 2, (128, 128, 64, 8, 4, 4)), ("split_k", 2, (64, 128, 64, 8, 4, 4)),
          ("stream_k", 1, (128, 128, 64, 8, 4, 4))]


def probe(shape: dict[str, int], dtype: str, rounds: int, smoke: bool,
          log: Callable[[str], None]) -> int:
    from search_spaces import matmul as mm
    from search_spaces.matmul import KERNEL
    from tuner.config import KernelConfig
    from tuner.space import ProblemContext

    device = "cpu" if smoke else "cuda"
    if smoke:
        shape, dtype = {"M": 33, "N": 47, "K": 61}, "float16"
    M, N, K = shape["M"], shape["N"], shape["K"]
    ctx = ProblemContext(shape, dtype)
    space = KERNEL.space()
    inputs = KERNEL.make_inputs(shape, dtype, device, seed=0)
    a, b, out = inputs["a"], inputs["b"], inputs["out"]
    ref = KERNEL.reference(inputs)
    rows: list[str] = []
    fns: list[Callable[[], Any]] = []
    wrong = 0

    def add(label: str, fn: Callable[[], Any], into: Any) -> None:
        nonlocal wrong
        ok = verified_once(fn, into, ref, KERNEL, dtype, label, log)
        if ok is False:
            wrong += 1
        if ok:
            rows.append(label)
            fns.append(fn)

    def run(launches: list) -> None:
        for kernel, grid, args, kwargs in launches:
            kernel[grid](*args, **kwargs)

    for variant, split, tile in AS_IS:
        c = KernelConfig({**_config(variant, split, tile), "ALIGN": 0})
        add(f"ALIGN=0: {c.key()}", lambda c=c: KERNEL.launch(c, inputs), out)
    for variant, split, tile in STAGED:
        c = KernelConfig({**_config(variant, split, tile), "ALIGN": 1})
        if reason := space.violation(c, ctx):
            log(f"  {c.key()}: pruned ({reason})")
            continue
        add(f"ALIGN=1: {c.key()}", lambda c=c: KERNEL.launch(c, inputs), out)
    # the copies alone, and the first staged tile's GEMM alone on operands staged once
    first = KernelConfig({**_config(*STAGED[0 if dtype != "float32" else 3]), "ALIGN": 1})
    a2, b2, out2, pre, post = mm.stage(a, b, out, first)
    run(pre)
    def moved(launch: Any) -> int:  # bytes read and written by a copy launch
        args, two = launch[2], launch[3]["TWO"]
        pairs = [args[:8]] + ([args[8:16]] if two else [])
        return sum((p[2] * p[3] + p[4] * p[5]) * a.element_size() for p in pairs)

    copies: list[tuple[str, int]] = []
    for launch in pre:
        what = "A and B" if launch[3]["TWO"] else ("A" if launch[2][0] is a else "B")
        rows.append(f"ALIGN=1's copy of {what} alone (one launch)")
        fns.append(lambda x=launch: run([x]))
        copies.append((rows[-1], moved(launch)))
    for launch in post:
        rows.append("ALIGN=1's copy of C back alone")
        fns.append(lambda x=launch: run([x]))
        copies.append((rows[-1], moved(launch)))
    staged = {"a": a2, "b": b2, "out": out2}
    gemm = KernelConfig({**first, "ALIGN": 0})
    add(f"GEMM alone on staged operands: {gemm.key()}",
        lambda: KERNEL.launch(gemm, staged), out2)
    title = f"M={M},N={N},K={K} {dtype}"
    if smoke:
        log(f"{title}: {len(fns)} kernels ran on the interpreter, {wrong} wrong")
        return wrong
    ms = timed_interleaved([lambda: KERNEL.baseline(inputs), *fns], rounds)
    flops = 2.0 * M * N * K
    log(f"\n### {title}\n")
    log(f"Rows 16-byte aligned: A {K * a.element_size() % 16 == 0}, B and C "
        f"{N * b.element_size() % 16 == 0}. torch.matmul {ms[0]:.4f} ms "
        f"({flops / ms[0] / 1e9:.1f} TFLOP/s).\n")
    log("| kernel | ms | TFLOP/s (copies: TB/s read + written) | torch / this |")
    log("| --- | --- | --- | --- |")
    for i in sorted(range(len(rows)), key=lambda i: ms[i + 1]):
        t = ms[i + 1]
        if rows[i].startswith("ALIGN=1's copy"):
            rate = f"{dict(copies)[rows[i]] / t / 1e9:.2f} TB/s"
        else:
            rate = f"{flops / t / 1e9:.1f}"
        log(f"| {rows[i]} | {t:.4f} | {rate} | {ms[0] / t:.3f} |")
    return wrong


#: --host's configs: the unstaged best, and staged tiles with 2, 3 and 4 launches
HOST_CONFIGS = [("tiled", 1, (64, 64, 64, 1, 4, 3), 0), ("tiled", 1, (64, 128, 64, 8, 4, 4), 1),
                ("split_k", 2, (64, 256, 64, 8, 4, 4), 1),
                ("tma_persistent", 1, (128, 128, 64, 8, 4, 4), 1)]
#: --host's back-to-back calls per measurement (under the launch queue's depth)
HOST_CALLS = 200


def host_probe(shape: dict[str, int], dtype: str, log: Callable[[str], None]) -> None:
    """Where a launch's host time goes: per call, the Python that builds the launches
    (``_all_launches``: ALIGN's buffers included, nothing launched), the whole ``launch``
    enqueued back to back (host time: the GPU runs behind it unless the host is the
    bottleneck), the wall per call of the same loop until the GPU is done, and do_bench's
    flushed median for comparison."""
    import time

    import torch
    import triton

    from search_spaces import matmul as mm
    from search_spaces.matmul import KERNEL
    from tuner.config import KernelConfig

    inputs = KERNEL.make_inputs(shape, dtype, "cuda", seed=0)
    a, b, out = inputs["a"], inputs["b"], inputs["out"]
    log(f"\n### Host time per call: M={shape['M']},N={shape['N']},K={shape['K']} {dtype}\n")
    log(f"{HOST_CALLS} calls back to back after 20 warm-up calls; us a call.\n")
    log("| config | launches | building the launches (us) | enqueueing the calls (us) | "
        "wall until done (us) | do_bench, L2 flushed (us) |")
    log("| --- | --- | --- | --- | --- | --- |")
    for variant, split, tile, align in HOST_CONFIGS:
        c = KernelConfig({**_config(variant, split, tile), "ALIGN": align})
        launches = len(mm._all_launches(a, b, out, c))
        for _ in range(20):
            KERNEL.launch(c, inputs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            mm._all_launches(a, b, out, c)
        build = (time.perf_counter() - t0) / HOST_CALLS * 1e6
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            KERNEL.launch(c, inputs)
        enqueue = (time.perf_counter() - t0) / HOST_CALLS * 1e6
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / HOST_CALLS * 1e6
        flushed = float(triton.testing.do_bench(lambda c=c: KERNEL.launch(c, inputs),
                                                warmup=25, rep=100)) * 1e3
        log(f"| {c.key()} | {launches} | {build:.1f} | {enqueue:.1f} | {wall:.1f} | "
            f"{flushed:.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, help="M,N,K:dtype (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None, help="also write the tables here")
    ap.add_argument("--host", action="store_true",
                    help="instead: where each call's host time goes (GPU only)")
    args = ap.parse_args(argv)
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"# Unaligned GEMMs staged into aligned rows\n\nCommand: `python3 -m bench.align_probe "
        f"{' '.join(sys.argv[1:] if argv is None else argv)}`")
    wrong = 0
    for text in args.shape or list(SHAPES[:1] if args.smoke else SHAPES):
        shape, dtype = _parse(text)
        if args.host:
            host_probe(shape, dtype, log)
        else:
            wrong += probe(shape, dtype, args.rounds, args.smoke, log)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
