"""Where a skinny GEMM's time goes (M <= 64: the bytes of B are the work).

For each problem it measures, in one process, interleaved round by round with torch.matmul
(cuBLAS), do_bench medians (L2 flushed by do_bench before each timed run):

1. the floor's inputs: a copy of a B-sized buffer (read + write) and a read-only pass over B
   by a Triton kernel that sums ``BLOCK_K x BLOCK_N`` strips of B over its share of K, with
   the same grid shapes as the GEMM configs below (``N / BLOCK_N`` column blocks times
   ``SPLIT`` K shares): the read bandwidth such a grid can reach, with no A and no MMA;
2. the product's own configs (``search_spaces.matmul``) for the tiled, split_k and
   tma_persistent variants over the tile sizes that suit the problem, each verified once
   against the fp32 reference first; for split_k also its first kernel alone (the partial
   products without the reduction), which says what the second launch costs.

    python3 -m bench.skinny_probe [--shape 64,8192,8192:float16 ...] [--rounds 3]

3. torch.matmul, the best tiled config and the copy again, after an L2 flush that leaves the
   cache dirty (do_bench's) and after one that leaves it clean: a dirty L2 costs a
   write-back of up to its size before the kernel's own reads.

``--smoke`` runs every kernel once on the CPU interpreter on a small problem, untimed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from bench.matmul_variants import _config, timed_interleaved

SHAPES = ("64,8192,8192:float16", "16,14336,4096:bfloat16")


@triton.jit
def _read_strips(b_ptr, out_ptr, K, N, stride_bk, BLOCK_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    """Column sums of B's (K / SPLIT) x BLOCK_N strip of this program (pid_n, split), stored
    so that the loads cannot be dropped."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    steps = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT)
    rk = tl.arange(0, BLOCK_K)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ptrs = b_ptr + (split * steps * BLOCK_K + rk)[:, None].to(tl.int64) * stride_bk + rn[None, :]
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for _ in range(steps):
        acc += tl.load(ptrs).to(tl.float32)
        ptrs += BLOCK_K * stride_bk
    tl.store(out_ptr + split * N + rn, tl.sum(acc, axis=0))


#: (variant, SPLIT_K, (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)); BLOCK_M is
#: the problem's M rounded up to 16
def _gemm_configs(m: int) -> list[tuple[str, int, tuple[int, ...]]]:
    bm = max(16, 1 << (m - 1).bit_length())
    out: list[tuple[str, int, tuple[int, ...]]] = []
    for bn, bk, stages in itertools.product((32, 64, 128), (64, 128, 256), (3, 4, 5)):
        out.append(("tiled", 1, (bm, bn, bk, 1, 4, stages)))
    for bn, split in itertools.product((64, 128, 256), (2, 4)):
        out.append(("split_k", split, (bm, bn, 64 if bn == 256 else 128, 1, 4, 4)))
    for bn in (64, 128):
        out.append(("tma_persistent", 1, (bm, bn, 128, 1, 4, 4)))
    return out


#: (BLOCK_N, BLOCK_K, SPLIT) of the read-only probe
READS = [(bn, bk, s) for bn in (32, 64, 128) for bk in (64, 128) for s in (1, 2, 4)]


def _parse(text: str) -> tuple[dict[str, int], str]:
    dims, _, dtype = text.partition(":")
    m, n, k = (int(v) for v in dims.split(","))
    return {"M": m, "N": n, "K": k}, dtype or "float16"


def probe(shape: dict[str, int], dtype: str, rounds: int, smoke: bool,
          log: Callable[[str], None]) -> int:
    import torch

    from search_spaces import matmul as mm
    from search_spaces.matmul import KERNEL
    from tuner.kernel import output_check_of
    from tuner.space import DEFAULT_SMEM_LIMIT, ProblemContext
    from tuner.verification import compare

    device = "cpu" if smoke else "cuda"
    if smoke:
        shape = {"M": shape["M"], "N": 256, "K": 512}
        dtype = "float16"
    M, N, K = shape["M"], shape["N"], shape["K"]
    sms, smem, cc = 132, DEFAULT_SMEM_LIMIT, 90
    if not smoke:
        props = torch.cuda.get_device_properties(0)
        sms, cc = props.multi_processor_count, props.major * 10 + props.minor
        smem = int(getattr(props, "shared_memory_per_block_optin", smem) or smem)
    ctx = ProblemContext(shape, dtype, smem, sms, cc)
    inputs = KERNEL.make_inputs(shape, dtype, device, seed=0)
    a, b = inputs["a"], inputs["b"]
    ref = KERNEL.reference(inputs)
    esize = b.element_size()
    gemm_bytes = (M * K + K * N + M * N) * esize
    rows: list[tuple[str, float | None]] = []  # (label, bytes for TB/s or None)
    fns: list[Callable[[], Any]] = []
    wrong = 0

    copy_dst = torch.empty_like(b)
    rows.append(("torch copy of B (read + write)", 2.0 * b.numel() * esize))
    fns.append(lambda: copy_dst.copy_(b))
    for bn, bk, split in READS:
        if N % bn or K % (bk * split):
            continue
        sums = torch.empty((split, N), device=device, dtype=torch.float32)
        grid = (N // bn, split)
        _read_strips[grid](b, sums, K, N, b.stride(0), BLOCK_K=bk, BLOCK_N=bn, SPLIT=split)
        want = b.float().reshape(split, K // split, N).sum(dim=1)
        if not torch.allclose(sums, want, rtol=1e-3, atol=1e-2):
            wrong += 1
            log(f"  read probe {bn}x{bk} split {split}: WRONG")
            continue
        rows.append((f"read B only: {grid[0] * split} programs, {bk}x{bn} strips, split {split}",
                     float(b.numel() * esize)))
        fns.append(lambda g=grid, s=sums, bn=bn, bk=bk, sp=split: _read_strips[g](
            b, s, K, N, b.stride(0), BLOCK_K=bk, BLOCK_N=bn, SPLIT=sp))

    space = KERNEL.space()
    for variant, split, tile in _gemm_configs(M):
        config = _config(variant, split, tile)
        reason = space.violation(config, ctx)
        if reason:
            log(f"  {config.key()}: pruned ({reason})")
            continue
        try:
            inputs["out"].fill_(float("nan"))
            KERNEL.launch(config, inputs)
            check = compare(inputs["out"], ref, KERNEL.tolerance(dtype), dtype,
                            output_check_of(KERNEL))
        except Exception as exc:  # noqa: BLE001 - a config this Triton cannot build
            log(f"  {config.key()}: FAILED {type(exc).__name__}")
            continue
        if not isinstance(check, float):
            wrong += 1
            log(f"  {config.key()}: WRONG ({check})")
            continue
        programs = mm.output_tiles(config, shape) * (split if variant == "split_k" else 1)
        rows.append((f"{variant} {programs} programs: {config.key()}", float(gemm_bytes)))
        fns.append(lambda c=config: KERNEL.launch(c, inputs))
        if variant == "split_k":  # the partial products alone, without the reduction
            first = mm._launches(a, b, inputs["out"], config)[0]
            rows.append((f"split_k partials alone (no reduction): {config.key()}",
                         float(gemm_bytes)))
            fns.append(lambda f=first: f[0][f[1]](*f[2], **f[3]))
    title = f"M={M},N={N},K={K} {dtype}"
    if smoke:
        log(f"{title}: {len(fns)} kernels ran on the interpreter, {wrong} wrong")
        return wrong
    ms = timed_interleaved([lambda: KERNEL.baseline(inputs), *fns], rounds)
    floor_ms = gemm_bytes / (2.0 * b.numel() * esize / ms[1]) if ms[1] else float("nan")
    log(f"\n### {title}\n")
    log(f"Bytes A + B + C: {gemm_bytes / 1e6:.1f} MB. torch.matmul {ms[0]:.4f} ms "
        f"({gemm_bytes / ms[0] / 1e9:.2f} TB/s). Floor at the copy's bandwidth: "
        f"{floor_ms:.4f} ms.\n")
    log("| kernel | ms | TB/s | torch / this |")
    log("| --- | --- | --- | --- |")
    order = sorted(range(len(rows)), key=lambda i: ms[i + 1])
    for i in order:
        label, nbytes = rows[i]
        t = ms[i + 1]
        rate = f"{nbytes / t / 1e9:.2f}" if nbytes else ""
        log(f"| {label} | {t:.4f} | {rate} | {ms[0] / t:.3f} |")
    best_gemm = min((i for i in range(len(rows)) if rows[i][0].startswith("tiled")),
                    key=lambda i: ms[i + 1])
    picked = [("torch.matmul", float(gemm_bytes), lambda: KERNEL.baseline(inputs)),
              (rows[best_gemm][0], rows[best_gemm][1] or 0.0, fns[best_gemm]),
              (rows[0][0], rows[0][1] or 0.0, fns[0])]
    log("\nThe same kernels after an L2 flush that leaves the cache dirty (do_bench's: it "
        "writes a 256 MB buffer, whose lines the kernel's reads must first write back to "
        "DRAM) and after one that leaves it clean (reading the buffer), medians of "
        f"{FLUSH_RUNS} CUDA-event timings, interleaved:\n")
    log("| kernel | dirty flush ms | TB/s | clean flush ms | TB/s |")
    log("| --- | --- | --- | --- | --- |")
    for label, nbytes, fn in picked:
        dirty, clean = flushed_ms(fn, dirty=True), flushed_ms(fn, dirty=False)
        log(f"| {label} | {dirty:.4f} | {nbytes / dirty / 1e9:.2f} | {clean:.4f} | "
            f"{nbytes / clean / 1e9:.2f} |")
    return wrong


#: timings per flush kind
FLUSH_RUNS = 60


def flushed_ms(fn: Callable[[], Any], dirty: bool) -> float:
    """Median CUDA-event time of ``fn`` after flushing L2 with a 256 MB buffer, written
    (``dirty``: as do_bench flushes) or read (the L2 then holds clean lines)."""
    import statistics

    import torch

    buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(5):
        fn()
    times = []
    for _ in range(FLUSH_RUNS):
        if dirty:
            buf.zero_()
        else:
            buf.sum(dtype=torch.int64)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--shape", action="append", help="M,N,K:dtype (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, small shapes")
    ap.add_argument("--out", help="also write the tables to this file")
    args = ap.parse_args(argv)
    lines: list[str] = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    if not args.smoke:
        import torch

        log(f"# Skinny GEMM probe: {torch.cuda.get_device_name(0)}, Triton {triton.__version__},"
            f" torch {torch.__version__}\n\nCommand: `python3 -m bench.skinny_probe "
            f"{' '.join(sys.argv[1:] if argv is None else argv)}`")
    wrong = 0
    for text in args.shape or SHAPES:
        shape, dtype = _parse(text)
        wrong += probe(shape, dtype, args.rounds, args.smoke, log)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
