"""Calibration of ``tuner/verification.py`` on a GPU: every built-in and example kernel, each
dtype, odd shapes and long rows, six configs and two seeds each. Prints, per (kernel, shape,
dtype), the worst ratio of each check to its bound: the largest per-element error over its
allowance, the largest |sum of errors| over the bias bound, and (softmax) the largest
|row sum - 1| over the same bound. A correct output must stay well under 1.

    python bench/verification_calibration.py   # on a CUDA machine, from the repo root
"""

from __future__ import annotations

import sys
from typing import Any

import torch

sys.path[:0] = ["examples/rmsnorm", "examples/bias_gelu", "."]

from bias_gelu import KERNEL as BIAS_GELU  # noqa: E402
from tuner_example_rmsnorm import KERNEL as RMSNORM  # noqa: E402

from search_spaces.matmul import KERNEL as MATMUL  # noqa: E402
from search_spaces.softmax import KERNEL as SOFTMAX  # noqa: E402
from tuner.kernel import OutputCheck, Tolerance, output_check_of  # noqa: E402
from tuner.verification import _bias_bound, _groups, compare, rounding_floor  # noqa: E402

CASES: list[tuple[Any, list[dict[str, int]]]] = [
    (SOFTMAX, [{"M": 4, "N": 50257}, {"M": 64, "N": 4096}, {"M": 3, "N": 129},
               {"M": 1000, "N": 7}, {"M": 8, "N": 262144}]),
    (MATMUL, [{"M": 17, "N": 33, "K": 65}, {"M": 512, "N": 512, "K": 4096},
              {"M": 1000, "N": 1000, "K": 16384}, {"M": 4096, "N": 4096, "K": 512}]),
    (RMSNORM, [{"M": 4, "N": 50257}, {"M": 256, "N": 4096}, {"M": 5, "N": 37}]),
    (BIAS_GELU, [{"M": 4, "N": 50257}, {"M": 1024, "N": 4096}, {"M": 5, "N": 37}]),
]


def ratios(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance, dtype: str,
           check: OutputCheck) -> list[float]:
    """Each check's worst ratio to its bound (element, bias, row sum)."""
    g, r = _groups(got.float(), check.rowwise), _groups(ref.float(), check.rowwise)
    scale = r.abs().amax(1, keepdim=True)
    allowed = tol.atol * scale + tol.rtol * r.abs() + rounding_floor(dtype)
    bound = _bias_bound(allowed, r.abs(), dtype, rounding_floor(dtype))
    element = float(((g - r).abs() / allowed).max())
    bias = float(((g - r).sum(1, dtype=torch.float64).abs() / bound).max())
    sums = 0.0
    if check.row_sum is not None:
        sums = float(((g.sum(1, dtype=torch.float64) - check.row_sum).abs() / bound).max())
    return [element, bias, sums]


def run_case(kernel: Any, shape: dict[str, int], dtype: str) -> tuple[list[float], list[str]]:
    check = output_check_of(kernel)
    worst, fails = [0.0, 0.0, 0.0], []
    configs = kernel.known_good_configs(shape, dtype)[:6] or [kernel.default_config(shape, dtype)]
    for config in configs:
        for seed in (1, 2):
            inputs = kernel.make_inputs(shape, dtype, "cuda", seed)
            names = inputs.get("_outputs") or ("out",)
            for name in names:
                inputs[name].fill_(float("nan"))
            try:
                kernel.launch(config, inputs)
            except Exception as exc:  # noqa: BLE001 - a config too large for the shape
                fails.append(f"launch {config}: {type(exc).__name__}")
                continue
            torch.cuda.synchronize()
            refs = kernel.reference(inputs)
            refs = refs if isinstance(refs, tuple | list) else (refs,)
            for name, ref in zip(names, refs, strict=True):
                tol = kernel.tolerance(dtype)
                wrong = compare(inputs[name].float(), ref.float(), tol, dtype, check)
                if isinstance(wrong, str):
                    fails.append(f"{config}: {wrong[:200]}")
                now = ratios(inputs[name], ref, tol, dtype, check)
                worst = [max(a, b) for a, b in zip(worst, now, strict=True)]
    return worst, fails


def main() -> None:
    worst_all: dict[tuple[str, str], list[float]] = {}
    for kernel, shapes in CASES:
        for shape in shapes:
            for dtype in kernel.dtypes:
                worst, fails = run_case(kernel, shape, dtype)
                key = (kernel.name, dtype)
                before = worst_all.get(key, [0.0, 0.0, 0.0])
                worst_all[key] = [max(a, b) for a, b in zip(before, worst, strict=True)]
                print(f"{kernel.name:9} {str(shape):38} {dtype:8} elem={worst[0]:.3f} "
                      f"bias={worst[1]:.3f} rowsum={worst[2]:.3f}", flush=True)
                for fail in fails[:3]:
                    print("   FAIL", fail, flush=True)
    print("\nworst per kernel and dtype (elem, bias, rowsum):")
    for (name, dtype), w in worst_all.items():
        print(f"  {name:9} {dtype:8} {w[0]:.3f} {w[1]:.3f} {w[2]:.3f}")


if __name__ == "__main__":
    main()
