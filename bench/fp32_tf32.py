"""fp32 GEMMs on Hopper with the operands rounded to TF32 to nearest (the product) or left to
the TF32 wgmma's truncation (Triton's default), one child process each, one after another.

Each child (``TUNER_TF32_ROUNDING`` set for it, read when ``search_spaces.matmul`` is imported)
verifies with the product's check, and times with do_bench interleaved with torch.matmul
(TF32 allowed), matmul's pointer-loaded configs on fp32 4096^3 and 2048^3, then verifies
``matmul_epilogue_gelu`` fp32 (512x512x256, 4096^3) with its persistent and tiled configs.
Prints one table per setting.

    python3 -m bench.fp32_tf32 [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

GEMMS = [("tiled", 1, (128, 128, 32, 8, 8, 3)), ("tiled", 1, (64, 128, 32, 8, 4, 3)),
         ("persistent", 1, (128, 128, 32, 8, 8, 3))]
SHAPES = [{"M": 4096, "N": 4096, "K": 4096}, {"M": 2048, "N": 2048, "K": 2048}]
EPILOGUE_SHAPES = [{"M": 512, "N": 512, "K": 256}, {"M": 4096, "N": 4096, "K": 4096}]


def child() -> None:
    import torch

    from bench.matmul_variants import _config, timed_interleaved
    from search_spaces import matmul as mm
    from search_spaces import matmul_epilogue as me
    from tuner.config import KernelConfig
    from tuner.kernel import output_check_of
    from tuner.verification import compare

    print(f"TUNER_TF32_ROUNDING={os.environ.get('TUNER_TF32_ROUNDING')}: "
          f"operands rounded to nearest: {bool(mm.ROUND_TF32)}")
    torch.backends.cuda.matmul.allow_tf32 = True
    for shape in SHAPES:
        x = mm.KERNEL.make_inputs(shape, "float32", "cuda", seed=0)
        ref = mm.KERNEL.reference(x)
        rows, fns = ["torch.matmul (TF32)"], [lambda x=x: mm.KERNEL.baseline(x)]
        for variant, split, tile in GEMMS:
            config = _config(variant, split, tile)
            x["out"].fill_(float("nan"))
            mm.KERNEL.launch(config, x)
            check = compare(x["out"], ref, mm.KERNEL.tolerance("float32"), "float32",
                            output_check_of(mm.KERNEL))
            ok = "verified" if isinstance(check, float) else f"REJECTED: {check[:120]}"
            rows.append(f"{config.key()} ({ok})")
            fns.append(lambda c=config, x=x: mm.KERNEL.launch(c, x))
        ms = timed_interleaved(fns, 5)
        print(f"\nmatmul fp32 {'x'.join(map(str, shape.values()))}:\n")
        print("| config | ms | torch / this |\n| --- | --- | --- |")
        for label, t in zip(rows, ms, strict=True):
            print(f"| {label} | {t:.4f} | {ms[0] / t:.3f} |")
    print("\nmatmul_epilogue_gelu fp32, the product's check:\n")
    for shape in EPILOGUE_SHAPES:
        x = me.GELU.make_inputs(shape, "float32", "cuda", seed=0)
        ref = me.GELU.reference(x)
        for variant in (mm.PERSISTENT, mm.TILED):
            config = KernelConfig(VARIANT=variant, BLOCK_M=128, BLOCK_N=128, BLOCK_K=32,
                                  GROUP_M=8, num_warps=8, num_stages=3)
            x["out"].fill_(float("nan"))
            me.GELU.launch(config, x)
            check = compare(x["out"], ref, me.GELU.tolerance("float32"), "float32",
                            output_check_of(me.GELU))
            ok = "verified" if isinstance(check, float) else f"REJECTED: {check}"
            print(f"- {'x'.join(map(str, shape.values()))} VARIANT={variant}: {ok}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child()
        return 0
    text = []
    for setting in ("0", "1"):
        env = {**os.environ, "TUNER_TF32_ROUNDING": setting}
        done = subprocess.run([sys.executable, "-m", "bench.fp32_tf32", "--child"], env=env,
                              capture_output=True, text=True)
        text.append(done.stdout + (done.stderr[-2000:] if done.returncode else ""))
        print(text[-1], flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("# fp32 GEMMs: TF32 operands truncated (0) or rounded to nearest (1)\n\n"
                     "Command: `python3 -m bench.fp32_tf32`\n\n" + "\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
