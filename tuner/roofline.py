"""The roofline: the fastest a problem can run on a device, from the device's measured ceilings.

One computation, used by the worker's early stop (``TUNER_ROOFLINE_STOP``: stop once the best
reaches that fraction of the floor) and by the dashboard's roofline page ("of roof" = floor /
achieved time), so the two never disagree about a problem's floor.

The floor is the LARGER of the two limits: moving the kernel's bytes at the measured copy
bandwidth, and doing its FLOPs at the measured matmul peak. A kernel cannot beat either, so it
cannot beat the slower of the two (the roofline's attainable FLOP/s, min(peak, bandwidth x
intensity), is the same bound seen from the other side).

Which dtypes the compute limit applies to: the calibration measures a 16-bit tensor-core GEMM
peak (float16/bfloat16). A float32 kernel runs on other units (TF32 or CUDA cores) at a
fraction of that peak, so the 16-bit peak says nothing useful about it: float32 floors (and
those of any dtype without a calibrated peak) use the bandwidth limit alone, and say so
(``Roofline.compute_ms`` is None, ``bound`` is ``memory``). That floor is still a true lower
bound, only a looser one for compute-bound float32 problems, so the early stop fires later,
never wrongly. A kernel that does not say how many bytes or FLOPs it needs (``bytes`` or
``flops`` 0, the default for users' kernels) has no limit of that kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.kernel import TunableKernel

#: dtypes whose matmul peak the calibration measures (16-bit tensor-core GEMMs)
CALIBRATED_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True, slots=True)
class Roofline:
    """A problem's floor on one device: each limit's time (None where it does not apply),
    the floor (the larger) and which limit it is (``memory`` or ``compute``)."""

    memory_ms: float | None
    compute_ms: float | None
    floor_ms: float
    bound: str
    flops: float
    bytes: float

    def of_roof(self, achieved_ms: float | None) -> float | None:
        """The share of the floor an achieved time reaches (1.0: on the roof)."""
        return self.floor_ms / achieved_ms if achieved_ms else None

    @property
    def roof_tflops(self) -> float | None:
        """The FLOP/s the floor stands for (the roof above the problem's intensity)."""
        return self.flops / (self.floor_ms * 1e-3) / 1e12 if self.flops else None


def roofline(kernel: TunableKernel, shape: Mapping[str, int], dtype: str,
             copy_gbps: float | None, matmul_tflops: float | None) -> Roofline | None:
    """The problem's floor from the device's measured ceilings (see the module docstring);
    None when no limit applies (not calibrated, or the kernel gives neither bytes nor FLOPs)."""
    moved = float(kernel.bytes(shape, dtype))
    work = float(kernel.flops(shape))
    memory_ms = moved / (copy_gbps * 1e9) * 1e3 if copy_gbps and moved > 0 else None
    compute_ms = (work / (matmul_tflops * 1e12) * 1e3
                  if matmul_tflops and work > 0 and dtype in CALIBRATED_DTYPES else None)
    limits = {name: ms for name, ms in (("memory", memory_ms), ("compute", compute_ms))
              if ms is not None}
    if not limits:
        return None
    bound = max(limits, key=lambda name: limits[name])
    return Roofline(memory_ms, compute_ms, limits[bound], bound, work, moved)


def floor_ms(kernel: TunableKernel, shape: Mapping[str, int], dtype: str,
             copy_gbps: float | None, matmul_tflops: float | None) -> float | None:
    """The fastest the device's measured ceilings allow for the problem, in ms (``roofline``'s
    floor); None when unknown."""
    roof = roofline(kernel, shape, dtype, copy_gbps, matmul_tflops)
    return roof.floor_ms if roof is not None else None
