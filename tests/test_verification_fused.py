"""The fused pass of the output check (``tuner/verification_fused.py``) on the interpreter:
``compare`` gives the same answer with it as without it (the largest error where an output
passes, the torch ops' own message where it fails), and the fused pass hands over, never
passes, what is near or over a bound."""

from __future__ import annotations

import pytest
import torch

from tuner import verification, verification_fused
from tuner.kernel import OutputCheck, Tolerance
from tuner.verification import compare, rounding_floor

SOFTMAX_CHECK = OutputCheck(rowwise=True, row_sum=1.0)
TOL = {"float16": Tolerance(1e-5, 2e-3), "bfloat16": Tolerance(1e-5, 1.6e-2)}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
#: rows long enough for three chunks of a program each, the last one partial
ROWS, N = 3, 2 * verification_fused.CHUNK + 1234


@pytest.fixture
def fused(monkeypatch):
    """``compare`` with the fused pass on host tensors (the interpreter runs it), and a count
    of the pairs it was asked about."""
    asked: list[int] = []

    def applies(got: torch.Tensor, ref: torch.Tensor) -> bool:
        asked.append(got.numel())
        return True

    monkeypatch.setattr(verification, "_fused_applies", applies)
    return asked


def softmax_pair(dtype: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ref = torch.softmax(torch.randn(ROWS, N, generator=gen) * 3.0, dim=-1)
    return ref.to(DTYPES[dtype]), ref


def both(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance, dtype: str,
         check: OutputCheck, monkeypatch) -> tuple[str | float, str | float]:
    """``compare`` with the fused pass, then without it."""
    with_fused = compare(got, ref, tol, dtype, check)
    monkeypatch.setattr(verification, "_fused_applies", lambda got, ref: False)
    return with_fused, compare(got, ref, tol, dtype, check)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_correct_softmax_passes_with_the_same_largest_error(fused, monkeypatch, dtype):
    got, ref = softmax_pair(dtype)
    a, b = both(got, ref, TOL[dtype], dtype, SOFTMAX_CHECK, monkeypatch)
    assert isinstance(a, float) and a == b and a > 0
    assert fused == [ROWS * N]


def test_the_fused_pass_itself_returns_the_largest_error_of_a_correct_output():
    got, ref = softmax_pair("float16", seed=1)
    worst = verification_fused.clearly_passes(
        got, ref, ROWS, 1e-5, 2e-3, rounding_floor("float16"),
        float(torch.finfo(torch.float16).smallest_normal), 1.0)
    assert worst == float((got.float() - ref).abs().max())


@pytest.mark.parametrize("fault", ["one element", "bias", "row sum", "nan", "inf"])
def test_a_faulty_output_fails_with_the_torch_ops_message(fused, monkeypatch, fault):
    got, ref = softmax_pair("float16", seed=2)
    got = got.float()
    if fault == "one element":
        got[1, int(ref[1].argmax())] *= 1.5
    elif fault == "bias":  # two ulps on every element of a row: each within its allowance
        got[2] += 2 * 2.0 ** -24
    elif fault == "row sum":  # rescaled: each element within 0.1%, the row sums to 1.001
        got[0] *= 1.001
    elif fault == "nan":
        got[0, 5] = float("nan")
    else:
        got[2, N - 1] = float("inf")
    got = got.half()
    a, b = both(got, ref, TOL["float16"], "float16", SOFTMAX_CHECK, monkeypatch)
    assert isinstance(a, str) and a == b
    assert fused == [ROWS * N]


def test_an_error_just_inside_its_allowance_is_left_to_the_torch_ops(monkeypatch):
    """Within MARGIN of the allowance: the fused pass does not say "passes", the torch ops
    do (and ``compare`` returns their answer)."""
    ref = torch.zeros(1, 4096)
    ref[0, 0] = 1.0  # the scale
    tol = Tolerance(1e-3, 0.0)
    allowed = tol.atol + rounding_floor("float32")
    got = ref.clone()
    got[0, 100] = allowed * (1 - verification_fused.MARGIN / 10)  # exact: the reference is 0
    normal = float(torch.finfo(torch.float32).smallest_normal)
    assert verification_fused.clearly_passes(got, ref, 1, tol.atol, tol.rtol,
                                             rounding_floor("float32"), normal, None) is None
    monkeypatch.setattr(verification, "_fused_applies", lambda got, ref: True)
    assert compare(got, ref, tol, "float32") == float(got[0, 100])


def test_a_per_tensor_check_with_non_finite_reference_elements(fused, monkeypatch):
    """One group (no row-wise check), an fp32 reference with inf and NaN: those elements are
    not compared, and count as the torch ops count them in the bias bound."""
    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(5, 9000, generator=gen) * 10
    ref[0, 0], ref[3, 17] = float("inf"), float("nan")
    got = ref.to(torch.bfloat16)
    got[0, 0] = 1.0  # anything where the reference is not finite
    a, b = both(got, ref, Tolerance(8e-3, 1.6e-2), "bfloat16", OutputCheck(), monkeypatch)
    assert isinstance(a, float) and a == b
    assert fused == [5 * 9000]


def test_only_large_outputs_on_the_gpu_take_the_fused_pass():
    small = torch.zeros(8)
    assert not verification._fused_applies(small, small)  # on the host: never
    assert not verification_fused.applies(small, small)
    assert verification_fused.FUSED_MIN_ELEMENTS >= 1 << 20


def test_a_fused_pass_that_fails_to_run_leaves_the_answer_to_the_torch_ops(monkeypatch, caplog):
    """A compile or launch error of the fused pass is never a config's failure."""
    got, ref = softmax_pair("bfloat16", seed=4)

    def broken(*args, **kwargs):
        raise RuntimeError("no such target")

    monkeypatch.setattr(verification, "_fused_applies", lambda got, ref: True)
    monkeypatch.setattr(verification_fused, "clearly_passes", broken)
    monkeypatch.setattr(verification, "_FUSED_FAILED", [])
    with caplog.at_level("ERROR", logger="tuner.verification"):
        answer = compare(got, ref, TOL["bfloat16"], "bfloat16", SOFTMAX_CHECK)
    assert answer == float((got.float() - ref).abs().max())
    assert "the fused output check failed" in caplog.text
