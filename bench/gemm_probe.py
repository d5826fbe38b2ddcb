"""Where a TMA persistent GEMM tile's time goes: the full loop against the same loop with parts
taken out, timed interleaved on the GPU (a diagnosis, not a kernel: the probes compute wrong
results on purpose, and nothing here is verified but the full loop).

The probe kernel is matmul's ``tma_persistent`` loop (whole or split 192-wide tiles, unflattened
like the product's split tiles) with a ``MODE``:

- 0, full: loads every K step, MMAs, stores C (verified against torch first);
- 1, MMA only: A and B loaded once before the K loop, the loop's MMAs read the same shared
  memory every step (no L2 or HBM traffic, no load waits): the tensor cores' ceiling for the
  tile, with its prologue and epilogue;
- 2, no store: the full K loop, the epilogue's C store skipped (the conversion kept);
- 3, MMA only and no store;
- 4, full, with C stored from registers by pointers (``tl.store``) instead of staged in shared
  memory for the descriptor's store: the staging buffer (a tile of C) goes to the pipeline,
  so one more stage fits (verified like the full loop).

Time per tile = kernel time / tile-waves (3 on 3072^3 at 128x192 or 128x256, 5 at 128x128).

Usage (on the GPU machine)::

    python3 -m bench.gemm_probe [--shape 3072,3072,3072] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import triton
import triton.language as tl

#: (BLOCK_M, BLOCK_N, num_warps, num_stages, MODEs): the best whole and split tiles on 3072^3,
#: and the same with one more stage where the store needs no staging
TILES = [(128, 256, 8, 3, (0, 1, 2, 3)), (128, 128, 4, 5, (0, 1, 2, 3, 4)),
         (128, 192, 4, 4, (0, 1, 2, 3, 4)), (128, 192, 8, 4, (0, 1, 2, 3)),
         (128, 128, 4, 6, (4,)), (128, 192, 4, 5, (4,)), (128, 256, 8, 4, (4,))]
MODES = {0: "full", 1: "MMA only", 2: "no store", 3: "MMA only, no store",
         4: "pointer store"}


@triton.jit
def _probe_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_N: tl.constexpr, NUM_SMS: tl.constexpr,
                  MODE: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1],
                                       block_shape=[BLOCK_K, (BLOCK_N - SPLIT_N)])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                       block_shape=[BLOCK_M, (BLOCK_N - SPLIT_N)])
    if SPLIT_N > 0:
        b2_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1],
                                            block_shape=[BLOCK_K, SPLIT_N])
        c2_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                            block_shape=[BLOCK_M, SPLIT_N])
    num_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * num_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=False):
        off_m = tile // num_n * BLOCK_M  # row-major tile order (the probe needs no L2 grouping)
        off_n = tile % num_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, (BLOCK_N - SPLIT_N)), dtype=tl.float32)
        if SPLIT_N > 0:
            acc2 = tl.zeros((BLOCK_M, SPLIT_N), dtype=tl.float32)
        if MODE % 2 == 1:  # MMA only: one load, reused every step
            a = a_desc.load([off_m, 0])
            b = b_desc.load([0, off_n])
            if SPLIT_N > 0:
                b2 = b2_desc.load([0, off_n + (BLOCK_N - SPLIT_N)])
        for ki in range(k_tiles):
            if MODE % 2 == 0:
                a = a_desc.load([off_m, ki * BLOCK_K])
                b = b_desc.load([ki * BLOCK_K, off_n])
                if SPLIT_N > 0:
                    b2 = b2_desc.load([ki * BLOCK_K, off_n + (BLOCK_N - SPLIT_N)])
            acc = tl.dot(a, b, acc)
            if SPLIT_N > 0:
                acc2 = tl.dot(a, b2, acc2)
        out = acc.to(c_ptr.dtype.element_ty)
        if MODE == 4:
            rows = off_m + tl.arange(0, BLOCK_M)[:, None]
            cols = off_n + tl.arange(0, BLOCK_N - SPLIT_N)[None, :]
            tl.store(c_ptr + rows * N + cols, out, mask=(rows < M) & (cols < N))
            if SPLIT_N > 0:
                cols2 = off_n + (BLOCK_N - SPLIT_N) + tl.arange(0, SPLIT_N)[None, :]
                tl.store(c_ptr + rows * N + cols2, acc2.to(c_ptr.dtype.element_ty),
                         mask=(rows < M) & (cols2 < N))
        elif MODE < 2:
            c_desc.store([off_m, off_n], out)
            if SPLIT_N > 0:
                c2_desc.store([off_m, off_n + (BLOCK_N - SPLIT_N)],
                              acc2.to(c_ptr.dtype.element_ty))
        else:  # keep the conversion; store behind a branch never taken (M is never < 0)
            if M < 0:
                c_desc.store([off_m, off_n], out)
                if SPLIT_N > 0:
                    c2_desc.store([off_m, off_n + (BLOCK_N - SPLIT_N)],
                                  acc2.to(c_ptr.dtype.element_ty))


def run(shape: tuple[int, int, int], rounds: int) -> int:
    import torch

    from bench.matmul_variants import timed_interleaved
    from search_spaces.matmul import second_block, set_tma_allocator

    M, N, K = shape
    dev = torch.device("cuda")
    set_tma_allocator(dev)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16) * K ** -0.25
    b = torch.randn(K, N, device=dev, dtype=torch.bfloat16) * K ** -0.25
    c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    print(f"{torch.cuda.get_device_name(0)}, {sms} SMs, {M}x{N}x{K} bf16, "
          f"Triton {triton.__version__}")
    rows: list[str] = []
    fns: list[Any] = [lambda: torch.matmul(a, b, out=c)]
    for bm, bn, warps, stages, modes in TILES:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        waves = triton.cdiv(tiles, sms)
        grid = min(sms, tiles)
        for mode in modes:
            name = MODES[mode]

            def launch(bm=bm, bn=bn, warps=warps, stages=stages, mode=mode,
                       grid=grid) -> None:
                _probe_kernel[(grid,)](
                    a, b, c, M, N, K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64,
                    SPLIT_N=second_block(bn), NUM_SMS=sms, MODE=mode, num_warps=warps,
                    num_stages=stages)

            if mode in (0, 4):
                c.fill_(float("nan"))
                try:
                    launch()
                    err = (c.float() - ref).abs().max().item()
                except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory
                    print(f"  {bm}x{bn}/{warps} warps/{stages} stages {name}: FAILED "
                          f"{type(exc).__name__}")
                    continue
                if not err < 0.1:
                    print(f"  {bm}x{bn}/{warps} warps/{stages} stages {name}: WRONG "
                          f"(max error {err})")
                    continue
            rows.append(f"{bm}x{bn}, {warps} warps, {stages} stages, {waves} tile-waves: {name}")
            fns.append(launch)
    ms = timed_interleaved(fns, rounds)
    print(f"cuBLAS {ms[0]:.4f} ms")
    print("| tile, warps, stages, waves: probe | ms | us a tile-wave | x cuBLAS |")
    print("| --- | --- | --- | --- |")
    for row, t in zip(rows, ms[1:], strict=True):
        waves = int(row.split(" tile-waves")[0].rsplit(", ", 1)[1])
        print(f"| {row} | {t:.4f} | {1000 * t / waves:.1f} | {ms[0] / t:.3f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="3072,3072,3072", help="M,N,K")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    m, n, k = (int(x) for x in args.shape.split(","))
    return run((m, n, k), args.rounds)


if __name__ == "__main__":
    sys.exit(main())
