"""Record exhaustive replay-v1 tables on the GPU: every feasible config of the matmul space.

    python3 bench/record_tables.py --out-dir tests/data/replay [--shapes 0,1,2]

Every config goes through the product's own pipeline (compile pool, GPU child, verification
against torch, do_bench with the L2 flushed); wrong results and failures are recorded as errors.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

SHAPES = [
    ({"M": 16, "N": 4096, "K": 4096}, "float16"),
    ({"M": 32, "N": 14336, "K": 4096}, "bfloat16"),
    ({"M": 2048, "N": 2048, "K": 2048}, "bfloat16"),
    ({"M": 4096, "N": 4096, "K": 4096}, "bfloat16"),
    ({"M": 16384, "N": 1024, "K": 1024}, "float16"),
    ({"M": 1000, "N": 3000, "K": 500}, "float16"),
    ({"M": 777, "N": 1234, "K": 4321}, "float16"),
]


def torch_ms(shape: dict[str, int], dtype: str) -> float:
    import torch
    import triton.testing

    dt = getattr(torch, dtype)
    a = torch.randn(shape["M"], shape["K"], device="cuda", dtype=dt)
    b = torch.randn(shape["K"], shape["N"], device="cuda", dtype=dt)
    q = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=100, quantiles=[0.2, 0.5, 0.8])
    return float(q[1])


def table_of(shape: dict[str, int], dtype: str, measurements: list, fp: object,
             timing: str) -> dict:
    results = []
    for m in measurements:
        entry: dict = {"config": m.config.to_dict()}
        if m.ok:
            entry["ms"] = round(m.p50_ms, 6)
        else:
            entry["error"] = f"{m.outcome.value}: {(m.error or '')[:300]}"
        results.append(entry)
    return {"format": "replay-v1", "kernel": "matmul",
            "kernel_note": "search_spaces/matmul.py: C = A @ B, fp32 accumulate, masked edges, "
                           "grouped tile order; every feasible config of its space",
            "device": getattr(fp, "name", "?"),
            "triton_version": getattr(fp, "triton_version", "?"),
            "torch_version": getattr(fp, "torch_version", "?"), "shape": shape, "dtype": dtype,
            "timing": timing, "reference_ms": {}, "params": list(results[0]["config"]),
            "results": results}


def main() -> None:
    from bench.sweep import sweep
    from search_spaces import get_kernel
    from tuner.backends import TimingOptions
    from tuner.space import ProblemContext

    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="tests/data/replay")
    ap.add_argument("--shapes", default=",".join(str(i) for i in range(len(SHAPES))))
    args = ap.parse_args()
    kernel = get_kernel("matmul")
    timing = TimingOptions(warmup_ms=5, rep_ms=20, compile_timeout_s=60, run_timeout_s=20)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for i in map(int, args.shapes.split(",")):
        shape, dtype = SHAPES[i]
        configs = kernel.space().feasible(ProblemContext(shape, dtype))
        ms, wall, busy, fp = sweep(kernel, shape, dtype, configs, timing)
        note = (f"pipeline: triton.testing.do_bench(warmup=5 ms, rep=20 ms), median ms, randn "
                f"inputs, L2 flushed; output verified first; {len(configs)} configs in "
                f"{wall:.0f} s, GPU busy {busy:.0%}")
        table = table_of(shape, dtype, ms, fp, note)
        table["reference_ms"] = {"torch.matmul (cuBLAS)": round(torch_ms(shape, dtype), 6)}
        name = f"matmul_{shape['M']}x{shape['N']}x{shape['K']}_{dtype}_h200.json"
        (out / name).write_text(json.dumps(table, indent=0))
        ok = [r["ms"] for r in table["results"] if "ms" in r]
        print(f"{name}: {len(configs)} configs in {wall:.1f} s (GPU busy {busy:.0%}); best "
              f"{min(ok):.4f} ms, median {sorted(ok)[len(ok) // 2]:.4f} ms, torch "
              f"{table['reference_ms']}", flush=True)
    print(f"done at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    main()
