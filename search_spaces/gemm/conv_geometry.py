"""conv2d's implicit GEMM: a convolution problem's sizes and the GEMM it computes (``Geometry``:
M output pixels x K_OUT filters, a reduction of K_RED taps), and the limits of its int32 offsets.

Host code of conv2d (its launcher, constraints and prior read it), moved here from
``search_spaces/conv2d.py`` unchanged: a version hashes the syntax trees and constants its host
code reaches in the package, wherever they live (``tuner/code_hash.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: the largest GEMM row count (output pixels) a problem may have: the pixel index is int32
MAX_PIXELS = 1 << 30
#: the most elements one padded input image, one output image or the filter may have: offsets
#: within them are int32 (an image's own offset in the batch is int64)
MAX_IMAGE = (1 << 31) - 1
#: ``PADDED=1``'s packed filter and tap table have a multiple of this many taps (the largest
#: BLOCK_K): every BLOCK_K slice of the reduction reads inside them
RED_ALIGN = 128


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Geometry:
    """A problem's sizes and its implicit GEMM's (M x K_OUT output, K_RED reduction)."""

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: int
    pad: int
    dil: int

    @classmethod
    def of(cls, shape: Mapping[str, int]) -> Geometry:
        return cls(shape["N"], shape["C"], shape["H"], shape["W"], shape["K"], shape["R"],
                   shape["S"], shape["STRIDE"], shape["PAD1"] - 1, shape["DIL"])

    @property
    def P(self) -> int:  # noqa: N802 - the output height, as the literature names it
        return (self.H + 2 * self.pad - self.dil * (self.R - 1) - 1) // self.stride + 1

    @property
    def Q(self) -> int:  # noqa: N802 - the output width
        return (self.W + 2 * self.pad - self.dil * (self.S - 1) - 1) // self.stride + 1

    @property
    def M(self) -> int:  # noqa: N802 - the GEMM's rows: output pixels
        return self.N * self.P * self.Q

    @property
    def K_RED(self) -> int:  # noqa: N802 - the GEMM's reduction: filter taps
        return self.C * self.R * self.S

    @property
    def padded_elements(self) -> int:
        """Elements of the padded input ``PADDED=1`` gathers from: the padding written out and
        one zero channel after the last."""
        return self.N * (self.C + 1) * (self.H + 2 * self.pad) * (self.W + 2 * self.pad)

    def padded_problem(self) -> str | None:
        """Why ``PADDED=1`` cannot compute this problem (its int32 offsets into the padded input
        and the packed filter would overflow), else None."""
        packed = _round_up(self.K_RED, RED_ALIGN) * self.K
        if max(self.padded_elements, packed) > MAX_IMAGE:
            return (f"PADDED=1: a padded input of {self.padded_elements} or a packed filter of "
                    f"{packed} elements; offsets into them are int32 (at most {MAX_IMAGE})")
        return None

    def problem(self) -> str | None:
        """Why this problem cannot be computed (no output, too many pixels), else None."""
        axes = (("H", self.H, self.R, self.P), ("W", self.W, self.S, self.Q))
        for axis, size, taps, out in axes:
            if out < 1:
                return (f"no output: the padded {axis} ({size} + 2 x {self.pad}) is smaller than "
                        f"the dilated filter ({self.dil} x ({taps} - 1) + 1)")
        if self.M > MAX_PIXELS:
            return f"N * P * Q = {self.M} output pixels; at most {MAX_PIXELS} are supported"
        padded = self.C * (self.H + 2 * self.pad) * (self.W + 2 * self.pad)
        if max(padded, self.K * self.P * self.Q, self.K * self.K_RED) > MAX_IMAGE:
            return (f"an image of {padded} padded input or {self.K * self.P * self.Q} output "
                    f"elements, or a filter of {self.K * self.K_RED}; at most {MAX_IMAGE} "
                    "(offsets within an image and within the filter are int32)")
        return None


def geometry(shape: Mapping[str, int]) -> Geometry:
    """The problem's geometry; ValueError when it has no output or is too large."""
    g = Geometry.of(shape)
    why = g.problem()
    if why:
        raise ValueError(f"conv2d {dict(shape)}: {why}")
    return g
