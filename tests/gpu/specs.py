"""Datasheet numbers of the GPUs the tests were written for, to bound what they measure.

A calibration reads below the datasheet (copy bandwidth ~80-90% of the HBM's, cuBLAS bf16
~70-80% of the dense tensor peak), never above it. Other GPUs get only loose bounds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Spec:
    sm_count: int
    hbm_gbps: float  # memory bandwidth, GB/s
    bf16_tflops: float  # dense tensor-core peak, TFLOP/s


#: name fragments, most specific first (an "H100 PCIe" is also an "H100")
SPECS: tuple[tuple[tuple[str, ...], Spec], ...] = (
    (("H200",), Spec(132, 4800.0, 989.0)),
    (("H100", "PCIe"), Spec(114, 2000.0, 756.0)),
    (("H100", "NVL"), Spec(132, 3900.0, 835.0)),
    (("H100",), Spec(132, 3350.0, 989.0)),
    (("A100", "40GB"), Spec(108, 1555.0, 312.0)),
    (("A100",), Spec(108, 2039.0, 312.0)),
)


def spec_of(name: str) -> Spec | None:
    for parts, spec in SPECS:
        if all(p in name for p in parts):
            return spec
    return None
