"""Record exhaustive replay-v1 tables on the GPU: every feasible config of the matmul space.

    python3 -m bench.record_tables --out-dir tests/data/replay [--shapes 0,1,2|all|MxNxK:dtype]
        [--limit-seconds 150]

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
            # the replay backend reads "OutOfResources" in an error as out_of_resources
            kind = ("OutOfResources" if m.outcome.value == "out_of_resources"
                    else m.outcome.value)
            entry["error"] = f"{kind}: {(m.error or '')[:300]}"
        results.append(entry)
    return {"format": "replay-v1", "kernel": "matmul",
            "kernel_note": "search_spaces/matmul.py: C = A @ B, fp32 accumulate, masked edges, "
                           "grouped tile order; every feasible config of its space",
            "device": getattr(fp, "name", "?"),
            "triton_version": getattr(fp, "triton_version", "?"),
            "torch_version": getattr(fp, "torch_version", "?"), "shape": shape, "dtype": dtype,
            "timing": timing, "reference_ms": {},
            "params": list(results[0]["config"]) if results else [],
            "results": results}


def table_name(shape: dict[str, int], dtype: str) -> str:
    return f"matmul_{shape['M']}x{shape['N']}x{shape['K']}_{dtype}_h200.json"


def select_shapes(spec: str) -> list[tuple[dict[str, int], str]]:
    """``0,2`` (indices into SHAPES), ``all``, or explicit ``MxNxK:dtype`` entries."""
    if spec == "all":
        return list(SHAPES)
    out = []
    for item in spec.split(","):
        if item.isdigit():
            out.append(SHAPES[int(item)])
            continue
        dims, dtype = item.split(":")
        m, n, k = (int(x) for x in dims.split("x"))
        out.append(({"M": m, "N": n, "K": k}, dtype))
    return out


def record_shape(kernel: object, shape: dict[str, int], dtype: str, timing: object,
                 limit_s: float, batch: int = 64) -> tuple[dict, str]:
    """Measure every feasible config of ``shape`` (in a seeded random order, so that a table cut
    short by ``limit_s`` is an unbiased sample) and return the table and a summary line."""
    import random

    from tuner.backends.process import ProcessBackend
    from tuner.space import DEFAULT_SMEM_LIMIT, ProblemContext

    t0 = time.monotonic()
    backend = ProcessBackend("cuda", kernel.ref, shape, dtype, timing=timing)  # type: ignore
    measured: list = []
    try:
        fp = backend.fingerprint
        ctx = ProblemContext(shape, dtype, fp.smem_per_block or DEFAULT_SMEM_LIMIT,
                             fp.sm_count or ProblemContext.sm_count)
        configs = kernel.space().feasible(ctx)  # type: ignore[attr-defined]
        random.Random(0).shuffle(configs)
        for i in range(0, len(configs), batch):
            if time.monotonic() - t0 > limit_s:
                break
            try:
                measured += backend.measure(configs[i:i + batch])
            except Exception as exc:  # noqa: BLE001 - one bad batch must not lose the table
                print(f"batch {i // batch} failed: {type(exc).__name__}: {exc}", flush=True)
    finally:
        backend.close()
    wall = time.monotonic() - t0
    cut = f", cut at the {limit_s:.0f} s limit" if len(measured) < len(configs) else ""
    note = (f"pipeline: triton.testing.do_bench(warmup=5 ms, rep=20 ms), median ms, randn "
            f"inputs, L2 flushed; output verified first; {len(measured)} of {len(configs)} "
            f"feasible configs in {wall:.0f} s{cut}")
    table = table_of(shape, dtype, measured, fp, note)
    try:
        table["reference_ms"] = {"torch.matmul (cuBLAS)": round(torch_ms(shape, dtype), 6)}
    except Exception as exc:  # noqa: BLE001
        print(f"torch reference failed: {exc}", flush=True)
    ok = sorted(r["ms"] for r in table["results"] if "ms" in r)
    summary = (f"{table_name(shape, dtype)}: {len(measured)}/{len(configs)} configs in "
               f"{wall:.1f} s; best {ok[0] if ok else float('nan'):.4f} ms, torch "
               f"{table['reference_ms']}")
    return table, summary


def main() -> None:
    from search_spaces import get_kernel
    from tuner.backends import TimingOptions

    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default="tests/data/replay")
    ap.add_argument("--shapes", default="all",
                    help="all, indices into SHAPES (0,2) or MxNxK:dtype entries")
    ap.add_argument("--limit-seconds", type=float, default=150.0,
                    help="per shape: stop measuring new batches after this long")
    args = ap.parse_args()
    kernel = get_kernel("matmul")
    timing = TimingOptions(warmup_ms=5, rep_ms=20, compile_timeout_s=30, run_timeout_s=20)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for shape, dtype in select_shapes(args.shapes):
        try:
            table, summary = record_shape(kernel, shape, dtype, timing, args.limit_seconds)
        except Exception as exc:  # noqa: BLE001 - the next shape may still work
            print(f"{shape} {dtype}: failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        if table["results"]:
            (out / table_name(shape, dtype)).write_text(json.dumps(table, indent=0))
        print(summary, flush=True)
    print(f"done at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    main()
