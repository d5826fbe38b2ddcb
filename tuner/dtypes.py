"""The one home of the dtypes the tuner names: their element sizes, their torch dtypes, the
checks of a requested dtype against a kernel (and the interpreter), and the power-of-two
rounding every kernel's space uses. Importing this module does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.errors import UnsupportedDtype

if TYPE_CHECKING:
    import torch

    from tuner.kernel import TunableKernel

#: bytes per element of each dtype name the tuner knows
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1}
#: every dtype name the tuner knows
DTYPES = tuple(ELEMENT_BYTES)


def element_bytes(dtype: str) -> int:
    """Bytes per element (an unknown name counts as float32's 4)."""
    return ELEMENT_BYTES.get(dtype, 4)


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a dtype name (KeyError for a name the tuner does not know)."""
    import torch

    if dtype not in ELEMENT_BYTES:
        raise KeyError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return getattr(torch, dtype)  # type: ignore[no-any-return]


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def check_dtype(kernel: TunableKernel, dtype: str, field: str = "dtype") -> None:
    """UnsupportedDtype naming ``field`` unless ``kernel`` takes ``dtype`` (the API's job and
    config requests, ``tuner tune``)."""
    if dtype not in kernel.dtypes:
        raise UnsupportedDtype(f"dtype {dtype!r} is not supported by {kernel.name}; choose one "
                               f"of {', '.join(kernel.dtypes)}", field=field)


def check_interpreter_dtype(kernel: TunableKernel, dtype: str, where: str = "",
                            advice: str = "use a GPU or another dtype") -> None:
    """UnsupportedDtype for a run only the Triton CPU interpreter will make of a dtype it
    computes wrongly (bf16 ``tl.dot``): its outputs could not be verified, and the run would
    only fail later. ``where`` and ``advice`` say why only the interpreter can run it and what
    to do instead."""
    if dtype in kernel.interpreter_unsupported_dtypes:
        raise UnsupportedDtype(f"dtype {dtype!r} cannot be checked on the interpret backend "
                               f"(Triton's CPU interpreter computes it wrongly){where}; {advice}",
                               field="dtype")
