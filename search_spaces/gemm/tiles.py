"""The GEMM family's shared device code: the grouped tile order, the pipelined K loop of one
output tile (with fp32 operands rounded to TF32 on NVIDIA GPUs) and its masked store.

matmul's kernels, matmul_epilogue's and moe_gemm's call them (conv2d's, the tile order); a
kernel's version covers every jit function it reaches, here as in its own module
(``tuner/code_hash.py``): an edit here is an edit of each kernel that calls it. Moved here from
``search_spaces/matmul.py`` unchanged (a version hashes syntax trees and the constants read, by
name, not the module they live in).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def runs_ptx() -> bool:
    """Whether kernels here may use inline PTX: NVIDIA's Triton backend, not the CPU
    interpreter (read at call; the interpreter is chosen before any kernel module loads)."""
    return (os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
            and torch.version.hip is None)


#: whether fp32 operands are rounded to TF32 to nearest before ``tl.dot`` (``round_tf32``): on
#: NVIDIA GPUs, not in the CPU interpreter (which runs no PTX and computes fp32 exactly);
#: TUNER_TF32_ROUNDING=0 (read at import) leaves them to the tensor cores' truncation, as
#: Triton does (bench/fp32_tf32.py measures the two)
ROUND_TF32 = tl.constexpr(runs_ptx() and os.environ.get("TUNER_TF32_ROUNDING", "1") != "0")
#: constants that are the machine's settings, not code: left out of kernel versions
#: (``tuner.code_hash``), so the interpreter and a GPU-less API process agree on one
__unversioned__ = ("ROUND_TF32",)


@triton.jit
def round_tf32(x):
    """``x`` (fp32) rounded to TF32's 10-bit mantissa, to nearest (``cvt.rna.tf32.f32``).
    Hopper's TF32 wgmma reads fp32 operands from shared memory and drops their low 13 bits:
    truncation, a shrink of ~2^-11 a product on average. A linear GEMM's errors then still
    average out on zero-mean data, but after a nonlinear activation they show as a mean shift
    the verification rejects (bench/NOTES.md: gelu 512x512x256 3.67x over the bias bound).
    Rounded first, the operands are exact in TF32 and the errors are unbiased."""
    return tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def tile_coords(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                GROUP_M: tl.constexpr):
    """Output tile ``tile_id`` as (pid_m, pid_n) in grouped order: GROUP_M rows of tiles are
    walked column by column so that the B tiles they share stay in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile (pid_m, pid_n) in grouped order (one tile per program)."""
    return tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)


@triton.jit
def tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
             k_first, k_steps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The fp32 tile (pid_m, pid_n) of A @ B over the K steps ``k_first`` to ``k_first +
    k_steps`` (each BLOCK_K long; none when ``k_steps <= 0``).

    No load inside the loop is masked along M or N: rows past M and columns past N read row
    and column 0 of the tile instead (inside A and B), and the caller's store drops them, as
    in Triton's persistent-matmul tutorial. With ``EVEN_K`` (K % BLOCK_K == 0, decided at
    launch) the K edge needs no mask either: the loads are plain, vectorised and pipelined
    without per-element predicates (most of what the masks cost on Hopper). The tile's first
    row and column are added to the pointers in int64 (M * K and K * N may pass 2**31); a
    ``k_first`` other than 0 must be int64 for the same reason."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rm = tl.where(pid_m * BLOCK_M + rm < M, rm, 0)
    rn = tl.where(pid_n * BLOCK_N + rn < N, rn, 0)
    rm = tl.max_contiguous(tl.multiple_of(rm, BLOCK_M), BLOCK_M)
    rn = tl.max_contiguous(tl.multiple_of(rn, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k0 = k_first * BLOCK_K
    a_ptrs = (a_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_am + k0 * stride_ak
              + rm[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = (b_ptr + (pid_n * BLOCK_N).to(tl.int64) * stride_bn + k0 * stride_bk
              + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_steps):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k0 - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if ROUND_TF32 and a.dtype == tl.float32:
            a = round_tf32(a)
            b = round_tf32(b)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Store the tile (pid_m, pid_n), converted to C's dtype, masked at the M and N edges."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    mask = (pid_m * BLOCK_M + rm[:, None] < M) & (pid_n * BLOCK_N + rn[None, :] < N)
    c_ptrs = (c_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_cm
              + (pid_n * BLOCK_N).to(tl.int64) * stride_cn
              + rm[:, None] * stride_cm + rn[None, :] * stride_cn)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
