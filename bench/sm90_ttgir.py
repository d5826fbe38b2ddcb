"""What the GPU machine's Triton makes of matmul's TMA persistent kernel, compiled on a CPU.

The GPU machine runs Triton 3.6; this machine's venv has 3.9. Triton's wheel compiles for
sm_90 without a GPU and without torch, so a venv holding only ``triton==3.6.0`` shows the
device's own compile: this script takes the @triton.jit functions of
``search_spaces/matmul.py`` up to the TMA persistent kernel out of the file (importing the
module would import torch), compiles the kernel for sm_90 (bf16) on each row of ``ROWS``, and
reports the registers and stack per thread (cuobjdump), the shared memory Triton asks for,
whether the TTGIR holds a warp-specialised region (``ttg.warp_specialize``, the partitions
Triton's automatic warp specialisation makes) or only the loop's request
(``tt.warp_specialize``), and, for 2-CTA clusters (``num_ctas``), whether the PTX multicasts a
TMA load to both CTAs.

Usage (CPU)::

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    /tmp/t36/bin/python -m bench.sm90_ttgir [--out bench/results/sm90_ttgir_triton36.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: (BLOCK_M, BLOCK_N, num_warps, num_stages, WS, num_ctas); BLOCK_K 64, GROUP_M 8. The last
#: rows ask for 2-CTA clusters (``num_ctas``), where cuBLAS's sm90 kernels multicast a TMA
#: load to both CTAs.
ROWS = [(128, 256, 8, 3, 0, 1), (128, 256, 8, 3, 1, 1), (128, 256, 8, 3, 2, 1),
        (128, 128, 4, 5, 0, 1), (128, 128, 4, 5, 1, 1), (128, 128, 4, 5, 2, 1),
        (128, 192, 8, 4, 0, 1), (128, 192, 8, 4, 2, 1), (128, 192, 4, 4, 0, 1),
        (128, 192, 4, 4, 1, 1), (128, 192, 4, 4, 2, 1), (128, 256, 8, 3, 0, 2),
        (128, 192, 4, 4, 0, 2)]


def load_kernels() -> Any:
    """The jit functions of matmul.py from ``tile_coords`` to the TMA persistent kernel, as a
    module of their own (no torch)."""
    source = (ROOT / "search_spaces" / "matmul.py").read_text()
    start = source.index("@triton.jit\ndef tile_coords(")
    end = source.index("@triton.jit\ndef _matmul_split_k_kernel(")
    folder = Path(tempfile.mkdtemp(prefix="matmul-jit-"))
    path = folder / "matmul_jit.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + source[start:end])
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args()
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bench.sm90_resources import resources, write_table

    module = load_kernels()
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32",
           "K": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32",
           "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
           "GROUP_M": "constexpr", "NUM_SMS": "constexpr", "WS": "constexpr",
           "SPLIT_N": "constexpr"}
    lines = ["# matmul's TMA persistent kernel compiled for sm_90 by this Triton", "",
             f"Command: `python -m bench.sm90_ttgir {' '.join(sys.argv[1:])}`; Triton "
             f"{triton.__version__}, no GPU.", "",
             "| BLOCK_MxBLOCK_N, warps, stages, CTAs | WS | registers, stack (B) | shared (B) | "
             "warp-specialised region | TMA multicast in the PTX |",
             "| --- | --- | --- | --- | --- | --- |"]
    for bm, bn, warps, stages, ws, ctas in ROWS:
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132,
                  "WS": ws, "SPLIT_N": bn - (1 << (bn.bit_length() - 1))}
        row = f"| {bm}x{bn}, {warps}, {stages}, {ctas} | {ws} |"
        try:
            compiled = triton.compile(
                ASTSource(fn=module._matmul_tma_persistent_kernel, signature=sig,
                          constexprs=consts),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": warps, "num_stages": stages, "num_ctas": ctas})
        except Exception as exc:  # noqa: BLE001 - a build this Triton refuses is a row too
            why = str(exc).splitlines()[-1][:120] if str(exc) else type(exc).__name__
            lines.append(f"{row} build FAILED: {why} | - | - | - |")
            continue
        ttgir = compiled.asm["ttgir"]
        region = ("yes" if "ttg.warp_specialize" in ttgir else
                  "no (only `tt.warp_specialize` on the loop)" if "tt.warp_specialize" in ttgir
                  else "no")
        regs, shared = resources(compiled)
        multicast = "yes" if ".multicast::cluster" in compiled.asm["ptx"] else "no"
        lines.append(f"{row} {regs} | {shared} | {region} | {multicast} |")
    return write_table(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
