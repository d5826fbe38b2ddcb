"""What matmul's persistent kernels cost an sm_90 SM, compiled here without a GPU.

Compiles ``_matmul_stream_k_kernel`` (TMA path) and ``_matmul_tma_persistent_kernel`` for sm_90
with the installed Triton (its own ptxas), bf16, on the 128x256/8 warps/3 stages and
128x128/4 warps/4 stages tiles (and TMA persistent's split 128x192 tiles, 4 stages, 8 and 4
warps). It reports each kernel's registers and stack per thread
(``cuobjdump --dump-resource-usage``), the dynamic shared memory Triton asks for at launch,
and how many multi-stage buffers for A the TTGIR allocates (one per software-pipelined K
loop). ``--rev REV`` compiles ``search_spaces/matmul.py`` as it was at that git revision.
The installed Triton is not the GPU machine's: its figures are indicative for 3.6.

Usage (CPU)::

    python3 -m bench.sm90_resources [--rev 7cefe81] [--out bench/results/sm90_resources.md]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TILES = [(128, 256, 64, 8, 3), (128, 128, 64, 4, 4)]
#: tma_persistent's split tiles (BLOCK_N 192 = 128 + 64), compiled for that kernel alone
SPLIT_TILES = [(128, 192, 64, 8, 4), (128, 192, 64, 4, 4)]


def load_matmul(rev: str | None) -> Any:
    """search_spaces.matmul, or that file at git revision ``rev`` as a module of its own."""
    if rev is None:
        from search_spaces import matmul

        return matmul
    source = subprocess.run(["git", "show", f"{rev}:search_spaces/matmul.py"], check=True,
                            capture_output=True, text=True).stdout
    folder = tempfile.mkdtemp(prefix="matmul-rev-")
    path = Path(folder) / f"matmul_{rev}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resources(compiled: Any) -> tuple[str, int]:
    """cuobjdump's register and stack line of the kernel, and its dynamic shared memory."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        out = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], check=True,
                             capture_output=True, text=True).stdout
    line = next((x.strip() for x in out.splitlines() if "REG:" in x), "?")
    fields = [f for f in line.split() if f.startswith(("REG:", "STACK:"))]
    return " ".join(fields), int(compiled.metadata.shared)


def write_table(lines: list[str], out: str | None) -> int:
    """Print the table's lines, and write them to ``out`` too where one is given; exit 0."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
    return 0


def compile_kernel(fn: Any, variant: str, tile: tuple[int, ...]) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bm, bn, bk, warps, stages = tile
    if variant == "stream_k":
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "ws_ptr": "*fp32",
               "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32",
               "stride_ak": "constexpr", "stride_bk": "i32", "stride_bn": "constexpr",
               "stride_cm": "i32", "stride_cn": "constexpr", "BLOCK_M": "constexpr",
               "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "GROUP_M": "constexpr",
               "EVEN_K": "constexpr", "NUM_SMS": "constexpr", "USE_TMA": "constexpr"}
        consts = {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, "EVEN_K": True,
                  "USE_TMA": True}
    else:
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32",
               "K": "i32", "stride_am": "i32", "stride_bk": "i32", "stride_cm": "i32",
               "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
               "GROUP_M": "constexpr", "NUM_SMS": "constexpr"}
        # the product's build: no warp specialisation; a split tile's second block width
        extra = {"WS": 0, "SPLIT_N": bn - (1 << (bn.bit_length() - 1))}
        consts = {k: v for k, v in extra.items() if k in fn.arg_names}
        sig.update({k: "constexpr" for k in consts})
    consts.update(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, NUM_SMS=132)
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts),
                          target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", action="append", default=[],
                        help="a git revision of search_spaces/matmul.py (repeatable; default: "
                             "the working tree's)")
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton

    lines = ["# matmul's persistent kernels compiled for sm_90 without a GPU", "",
             f"Command: `python3 -m bench.sm90_resources {' '.join(sys.argv[1:])}`; Triton "
             f"{triton.__version__} (not the GPU machine's 3.6: indicative).", "",
             "| matmul.py | kernel | BLOCK_MxBLOCK_N, warps, stages | registers, stack (B) | "
             "shared memory (B) | pipelined K loops (A's multi-stage buffers in the TTGIR) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for rev in args.rev or [None]:
        module = load_matmul(rev)
        for variant, fn in (("stream_k", module._matmul_stream_k_kernel),
                            ("tma_persistent", module._matmul_tma_persistent_kernel)):
            split = variant == "tma_persistent" and hasattr(module, "second_block")
            for tile in TILES + (SPLIT_TILES if split else []):
                compiled = compile_kernel(fn, variant, tile)
                regs, shared = resources(compiled)
                buffers = compiled.asm["ttgir"].count(
                    f"local_alloc : () -> !ttg.memdesc<{tile[4]}x{tile[0]}x{tile[2]}x")
                lines.append(f"| {rev or 'working tree'} | {variant} | {tile[0]}x{tile[1]}, "
                             f"{tile[3]}, {tile[4]} | {regs} | {shared} | {buffers} |")
    return write_table(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
