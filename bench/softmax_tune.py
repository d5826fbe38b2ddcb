"""``tuner tune softmax`` on the GPU against torch.softmax in the same run, with the floor.

    python3 -m bench.softmax_tune --out bench/results/softmax_tune_h200.md [--trials 32]

Softmax is memory-bound: the floor is reading x once and writing out once (2 x M x N x element
bytes) at the GPU's copy bandwidth (measured here with a device-to-device copy, as the workers'
calibration does). Each shape is tuned by the real CLI (a subprocess); the best config is then
timed again here next to torch.softmax (do_bench, L2 flushed, median).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.cli_tune import bench_args, run_cli

SHAPES = [((4096, 8192), "float16"), ((8192, 50257), "bfloat16"), ((32768, 1024), "float32"),
          ((16, 131072), "float16")]


def main() -> None:
    args = bench_args(trials=32, db="sqlite:////tmp/softmax-bench.db")
    import torch
    import triton.testing

    from search_spaces.softmax import KERNEL
    from tuner.config import KernelConfig

    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100)
    bw = 2 * src.numel() / (copy_ms * 1e-3)  # read + write, B/s
    lines = ["# `tuner tune softmax` on the GPU against torch.softmax", "",
             f"Command: `python3 -m bench.softmax_tune --out {args.out} --trials {args.trials}` "
             f"({time.strftime('%Y-%m-%d')}). Copy bandwidth measured here: "
             f"{bw / 1e9:.0f} GB/s (read + write of a 256 MiB buffer).", "",
             "| shape (M x N) | dtype | floor us | tuned us | torch us | tuned / torch | "
             "of floor | trials | wall s | best config |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (m, n), dtype in SHAPES:
        _cmd, rc, summary, wall = run_cli("softmax", f"M={m},N={n}", dtype, args.trials,
                                          args.db)
        if rc != 0 or summary is None:
            continue
        shape = {"M": m, "N": n}
        inputs = KERNEL.make_inputs(shape, dtype, "cuda", 0)
        config = KernelConfig(summary["best_config"])
        tuned = triton.testing.do_bench(lambda c=config, i=inputs: KERNEL.launch(c, i),
                                        warmup=25, rep=100)
        ref = triton.testing.do_bench(lambda i=inputs: torch.softmax(i["x"], dim=-1),
                                      warmup=25, rep=100)
        floor = KERNEL.bytes(shape, dtype) / bw * 1e3
        lines.append(f"| {m} x {n} | {dtype} | {floor * 1e3:.1f} | {tuned * 1e3:.1f} | "
                     f"{ref * 1e3:.1f} | {tuned / ref:.2f} | {floor / tuned:.0%} | "
                     f"{summary['trials']} | {wall:.1f} | "
                     f"`{json.dumps(summary['best_config'])}` |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
