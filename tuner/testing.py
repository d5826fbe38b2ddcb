"""The kernel conformance suite, for plugin authors: what every TunableKernel must pass.

The project runs exactly these checks over every registered kernel
(``tests/test_kernel_conformance.py``). Run them over yours in your own pytest::

    import os
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

    import tuner.testing
    from my_kernels import KERNEL  # a tuner.Kernel, or any TunableKernel

    def test_my_kernel_conforms():
        tuner.testing.check_kernel(KERNEL)

Without a GPU, kernels run on Triton's CPU interpreter, which ``@triton.jit`` only uses when
``TRITON_INTERPRET=1`` is set before the module defining the kernel is imported (a
``conftest.py`` at your tests' root is the place). On a GPU, pass ``device="cuda"`` and leave
it unset.

``check_kernel`` runs every check and raises one ``AssertionError`` listing each check that
failed and why. Each check is also a function of its own (``check_inputs(KERNEL)``...), and
``CHECKS`` lists them by name, to parametrise a test over::

    @pytest.mark.parametrize("check", [c for _, c in tuner.testing.CHECKS],
                             ids=[n for n, _ in tuner.testing.CHECKS])
    def test_my_kernel(check):
        check(KERNEL)

Every check takes the problem it runs on as ``shape=`` (default: 7 per dimension, within its
bounds: odd and small, so masks are exercised and the interpreter is quick), ``dtype=``
(default: float32, else float16, whichever the interpreter computes right) and ``device=``.
The two checks of the kernel's output check (``check_rejects_wrong_outputs``,
``check_accepts_rounding_noise``) use the given shape and dtype, else rows of 37 (long enough
for a bias to stand out of rounding) in every dtype the device computes right.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tuner.backends.child import ChildState, _verify
from tuner.config import KernelConfig
from tuner.dtypes import DTYPES
from tuner.kernel import (
    OutputCheck,
    listed_configs_hook,
    load_ref,
    missing_members,
    output_check_of,
    with_defaults,
)
from tuner.launching import output_tensor
from tuner.space import ProblemContext
from tuner.verification import compare

#: each dimension of the default shape: odd (masks) and small (the interpreter is slow)
SMALL_DIM = 7
#: the last dimension of the shape the output check is tested on: rows long enough that a bias
#: of 3 ulps stands out of rounding; the other dimensions are 5
CHECKED_ROW = 37
#: dtypes whose outputs the check-of-the-check compares (float8 outputs are not compared)
COMPARED_DTYPES = ("float16", "bfloat16", "float32")
#: the required members that are called
METHODS = ("space", "default_config", "make_inputs", "launch", "reference", "tolerance",
           "flops", "bytes")


@dataclass(frozen=True)
class Case:
    """The problem a kernel is checked on."""

    #: the kernel, its missing optional members filled in (``with_defaults``), as the engine
    #: sees it
    kernel: Any
    shape: dict[str, int]
    dtype: str
    device: str
    #: where the kernel's output check is tested (``check_rejects_wrong_outputs``): the given
    #: shape, else rows of ``CHECKED_ROW``; the given dtype, else every dtype the device
    #: computes right
    compare_shape: dict[str, int]
    compare_dtypes: tuple[str, ...]

    @property
    def name(self) -> str:
        return str(getattr(self.kernel, "name", repr(self.kernel)))


def small_shape(kernel: Any) -> dict[str, int]:
    """``SMALL_DIM`` per dimension, clamped to the dimension's bounds."""
    return {d.name: min(d.hi, max(d.lo, SMALL_DIM)) for d in kernel.dims}


def row_shape(kernel: Any) -> dict[str, int]:
    """5 per dimension and ``CHECKED_ROW`` for the last, clamped to the bounds."""
    last = len(kernel.dims) - 1
    return {d.name: min(d.hi, max(d.lo, CHECKED_ROW if i == last else 5))
            for i, d in enumerate(kernel.dims)}


def computed_dtypes(kernel: Any, device: str) -> list[str]:
    """The kernel's dtypes whose outputs can be compared on ``device`` (on the interpreter:
    not those in ``interpreter_unsupported_dtypes``, such as bf16 ``tl.dot``)."""
    skip = () if _on_gpu(device) else tuple(kernel.interpreter_unsupported_dtypes)
    return [d for d in kernel.dtypes if d in COMPARED_DTYPES and d not in skip]


def checkable_dtype(kernel: Any, device: str = "cpu") -> str:
    """float32, else float16: the dtype the checks run in by default."""
    ok = [d for d in ("float32", "float16") if d in computed_dtypes(kernel, device)]
    if not ok:
        raise ValueError(f"none of its dtypes {tuple(kernel.dtypes)} is float32 or float16 "
                         "outside interpreter_unsupported_dtypes; pass dtype=")
    return ok[0]


def case_for(kernel: Any, shape: Mapping[str, int] | None = None, dtype: str | None = None,
             device: str = "cpu") -> Case:
    """The case the checks run ``kernel`` on (defaults: the module docstring). AssertionError
    when none can be chosen (no dims, no dtype the device computes right)."""
    kernel = with_defaults(kernel)
    try:
        return Case(kernel, dict(shape) if shape is not None else small_shape(kernel),
                    dtype or checkable_dtype(kernel, device), device,
                    dict(shape) if shape is not None else row_shape(kernel),
                    (dtype,) if dtype else tuple(computed_dtypes(kernel, device)))
    except Exception as exc:  # noqa: BLE001 - a broken kernel is reported, not crashed on
        name, missing = getattr(kernel, "name", repr(kernel)), missing_members(kernel)
        why = (f"check_members: missing required member(s) {missing} "
               "(tuner.kernel.PROTOCOL_MEMBERS)" if missing else "pass shape= and dtype=")
        raise AssertionError(f"kernel {name!r}: no problem to run the checks on "
                             f"({type(exc).__name__}: {exc}); {why}") from exc


Findings = Callable[[Case], Iterator[str]]


class Check:
    """One conformance check. Called on a kernel it raises ``AssertionError`` naming the
    kernel, the check and what was wrong; ``findings(case)`` lists what was wrong instead."""

    def __init__(self, findings: Findings) -> None:
        self._findings = findings
        self.__name__ = findings.__name__
        self.__doc__ = findings.__doc__

    def findings(self, case: Case) -> list[str]:
        """What is wrong (empty: the check passes); an exception is one finding."""
        found: list[str] = []
        try:
            for finding in self._findings(case):  # one by one: those before a raise are kept
                found.append(finding)
        except Exception as exc:  # noqa: BLE001 - a kernel that raises fails the check
            found.append(f"raised {type(exc).__name__}: {exc}")
        return found

    def __call__(self, kernel: Any, *, shape: Mapping[str, int] | None = None,
                 dtype: str | None = None, device: str = "cpu") -> None:
        case = case_for(kernel, shape, dtype, device)
        _raise_failures(case, [(self.__name__, self.findings(case))])

    def __repr__(self) -> str:
        return f"tuner.testing.{self.__name__}"


#: every check, by name, in the order ``check_kernel`` runs them
CHECKS: list[tuple[str, Check]] = []


def conformance_check(findings: Findings) -> Check:
    """Makes ``findings`` (a generator of what is wrong) a ``Check``, listed in ``CHECKS``."""
    check = Check(findings)
    CHECKS.append((check.__name__, check))
    return check


def check_kernel(kernel: Any, *, shape: Mapping[str, int] | None = None,
                 dtype: str | None = None, device: str = "cpu") -> None:
    """Run every check (``CHECKS``) on ``kernel``; one AssertionError lists all that fail."""
    case = case_for(kernel, shape, dtype, device)
    _raise_failures(case, [(name, check.findings(case)) for name, check in CHECKS])


def _raise_failures(case: Case, results: list[tuple[str, list[str]]]) -> None:
    failed = [(name, found) for name, found in results if found]
    if not failed:
        return
    lines = [f"kernel {case.name!r} fails {len(failed)} conformance check(s) on shape "
             f"{case.shape} {case.dtype} ({case.device}):"]
    lines += [f"  {name}: {finding}" for name, found in failed for finding in found]
    raise AssertionError("\n".join(lines))


def _on_gpu(device: str) -> bool:
    return device.startswith("cuda")


# -- the protocol --------------------------------------------------------------------------------

@conformance_check
def check_members(case: Case) -> Iterator[str]:
    """Every required member (``PROTOCOL_MEMBERS``), its methods callable; the optional
    ``output_check`` an ``OutputCheck`` (anything else is silently ignored) and
    ``verification`` a string."""
    kernel = case.kernel
    missing = missing_members(kernel)
    if missing:
        yield f"missing required member(s) {missing} (tuner.kernel.PROTOCOL_MEMBERS)"
        return
    yield from (f"{m} is not callable" for m in METHODS if not callable(getattr(kernel, m)))
    check = getattr(kernel, "output_check", None)
    if check is not None and not isinstance(check, OutputCheck):
        yield (f"output_check is a {type(check).__name__}, not a tuner.kernel.OutputCheck: "
               "the verification would ignore it")
    if not isinstance(getattr(kernel, "verification", ""), str):
        yield "verification is not a string"


@conformance_check
def check_version(case: Case) -> Iterator[str]:
    """The version is a 12-hex source hash, the same on every read and (once registered) on
    the object its ``ref`` imports, as a measuring child process imports it: configs are
    stored under it."""
    version = case.kernel.version
    if not isinstance(version, str) or not re.fullmatch(r"[0-9a-f]{12}", version):
        yield (f"version {version!r} is not 12 lowercase hex digits: make it a hash of the "
               "code it runs and its space (tuner.kernel.code_version)")
        return
    if case.kernel.version != version:
        yield "version changes from one read to the next"
    ref = getattr(case.kernel, "ref", "")
    imported = load_ref(ref).version if ref else version
    if imported != version:
        yield f"the object its ref {ref!r} imports has version {imported}, not {version}"


@conformance_check
def check_dims_and_dtypes(case: Case) -> Iterator[str]:
    """Dimensions named once each, with bounds ``0 <= lo <= hi`` (0: a key that is a flag);
    dtypes known to the tuner; ``interpreter_unsupported_dtypes`` among them."""
    kernel = case.kernel
    names = [d.name for d in kernel.dims]
    if not names:
        yield "no dims"
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        yield f"dims named more than once: {repeated}"
    yield from (f"dim {d.name}: bounds {d.lo}..{d.hi}; need 0 <= lo <= hi"
                for d in kernel.dims if not 0 <= d.lo <= d.hi)
    if not kernel.dtypes:
        yield "no dtypes"
    unknown = sorted(set(kernel.dtypes) - set(DTYPES))
    if unknown:
        yield f"unknown dtype(s) {unknown}; the tuner knows {list(DTYPES)}"
    stray = sorted(set(kernel.interpreter_unsupported_dtypes) - set(kernel.dtypes))
    if stray:
        yield f"interpreter_unsupported_dtypes {stray} are not among its dtypes"


@conformance_check
def check_configs(case: Case) -> Iterator[str]:
    """A non-empty space holding the default, known-good and listed configs; configs survive
    a JSON round trip (as the database stores them) and convert to ``triton.Config``."""
    kernel, shape, dtype = case.kernel, case.shape, case.dtype
    space = kernel.space()
    if space.size() <= 0:
        yield "its search space is empty"
        return
    default = kernel.default_config(shape, dtype)
    known = kernel.known_good_configs(shape, dtype)
    lister = listed_configs_hook(kernel)  # optional (tuner.Kernel's user list)
    listed: list[KernelConfig] = list(lister(shape, dtype)) if callable(lister) else []
    for what, config in [("default", default), *(("known-good", c) for c in known),
                         *(("listed", c) for c in listed)]:
        if not space.contains(config):
            yield f"the {what} config {config.key()} is not in its search space"
        if KernelConfig.from_json(config.to_json()) != config:
            yield f"the {what} config {config.key()} changes in a JSON round trip"
    if default.to_triton().num_warps != default.num_warps:
        yield f"the default config {default.key()} loses num_warps as a triton.Config"


@conformance_check
def check_inputs(case: Case) -> Iterator[str]:
    """``make_inputs`` gives the outputs it declares and input tensors on the device that are
    random (never all zeros: a zero input hides wrong arithmetic), the same for the same seed
    and different for another. An output updated in place (``restore_value``: put back
    before every launch) is an input too."""
    kernel, shape, dtype, device = case.kernel, case.shape, case.dtype, case.device
    first = kernel.make_inputs(shape, dtype, device, 1)
    outputs = set(first.get("_outputs") or ("out",))
    if not outputs <= set(first):
        yield f"declares outputs {sorted(outputs - set(first))} it does not return"
    written = (outputs - set(first.get("_pristine") or ())) | {"out"}
    data = {k: v for k, v in _tensors(first).items() if k not in written}
    if not data:
        yield "returns no input tensors"
        return
    yield from (f"{k} is on {v.device}, not {device}" for k, v in data.items()
                if v.device.type != torch.device(device).type)
    yield from (f"{k} is all zeros" for k, v in data.items() if not bool((v != 0).any()))
    again = _tensors(kernel.make_inputs(shape, dtype, device, 1))
    yield from (f"{k} differs between two calls with seed 1" for k, v in data.items()
                if not torch.equal(v, again[k]))
    other = _tensors(kernel.make_inputs(shape, dtype, device, 2))
    if all(torch.equal(v, other[k]) for k, v in data.items()):
        yield "seeds 1 and 2 give the same inputs: make_inputs ignores its seed"


def _tensors(inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors among the inputs (a tensor descriptor's: its base), bookkeeping left out."""
    found = {k: output_tensor(v) for k, v in inputs.items() if not k.startswith("_")}
    return {k: v for k, v in found.items() if isinstance(v, torch.Tensor)}


@conformance_check
def check_problem_roundtrip(case: Case) -> Iterator[str]:
    """For a kernel that ``tuner.autotune`` serves (one with ``problem_of``: ``tuner.Kernel``),
    the arguments ``make_inputs(shape, dtype, ...)`` gives are the problem ``(shape, dtype)``:
    else a launch looks up another problem than the one its configs were tuned and stored
    for. A launch passes the kernel's arguments alone, so that is what is looked at."""
    problem_of = getattr(case.kernel, "problem_of", None)
    if not callable(problem_of):
        return
    inputs = case.kernel.make_inputs(case.shape, case.dtype, case.device, 0)
    args = case.kernel.kernel_args(inputs) if hasattr(case.kernel, "kernel_args") else inputs
    shape, dtype = problem_of(args)
    if dict(shape) != case.shape:
        yield (f"make_inputs for shape {case.shape} gives arguments whose problem is shape "
               f"{dict(shape)}: tuning stores configs under the first, a launch looks up the "
               "second (make the key arguments equal the shape's dimensions, or give problem=)")
    if dtype != case.dtype:
        yield (f"make_inputs for dtype {case.dtype} gives arguments whose problem is dtype "
               f"{dtype} (name the tensor that carries it with dtype_arg=)")


# -- running it ----------------------------------------------------------------------------------

def _state(case: Case, kernel: Any) -> ChildState:
    """What the measuring child holds while it verifies a config: its ``_verify`` is run."""
    state = ChildState("cuda" if _on_gpu(case.device) else "interpret")
    state.kernel, state.shape, state.dtype = kernel, dict(case.shape), case.dtype
    return state


@conformance_check
def check_default_matches_reference(case: Case) -> Iterator[str]:
    """The default config's outputs pass the verification every measured config passes
    (against the reference, at the kernel's tolerance and output check)."""
    kernel = case.kernel
    default = kernel.default_config(case.shape, case.dtype)
    inputs = kernel.make_inputs(case.shape, case.dtype, case.device, 3)
    wrong = _verify(_state(case, kernel), default, inputs)
    if wrong is not None:
        yield f"the default config {default.key()} fails verification: {wrong}"


class _Zeroing:
    """The kernel, but its launch zeroes every output afterwards (a broken config)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        self.kernel.launch(config, inputs)
        for name in inputs.get("_outputs") or ("out",):
            output_tensor(inputs[name]).zero_()


@conformance_check
def check_zeroing_is_rejected(case: Case) -> Iterator[str]:
    """Verification rejects a launch that zeroes its outputs: the reference (or, without one,
    the kernel's own first config) tells a zero output from a right one."""
    kernel = case.kernel
    default = kernel.default_config(case.shape, case.dtype)
    inputs = kernel.make_inputs(case.shape, case.dtype, case.device, 4)
    if _verify(_state(case, _Zeroing(kernel)), default, inputs) is None:
        yield (f"a launch of {default.key()} that zeroes its outputs passes verification: its "
               "reference gives zeros on these inputs")


@conformance_check
def check_roofline_and_prior(case: Case) -> Iterator[str]:
    """``flops`` and ``bytes`` finite and >= 0 (the roofline), the prior finite or None,
    tolerances >= 0."""
    kernel, shape, dtype = case.kernel, case.shape, case.dtype
    for what, value in (("flops", kernel.flops(shape)), ("bytes", kernel.bytes(shape, dtype))):
        if not (math.isfinite(float(value)) and float(value) >= 0):
            yield f"{what}({shape}) is {value}; give a count >= 0 (0.0: unknown)"
    default = kernel.default_config(shape, dtype)
    prior = kernel.prior(default, ProblemContext(shape, dtype))
    if prior is not None and not math.isfinite(prior):
        yield f"prior of the default config is {prior}; give a finite estimate or None"
    tol = kernel.tolerance(dtype)
    if not (tol.atol >= 0 and tol.rtol >= 0):
        yield f"tolerance({dtype}) is {tol}; atol and rtol must be >= 0"


# -- the kernel's output check rejects wrong outputs (issue 12) ----------------------------------

def reference_outputs(case: Case, dtype: str) -> list[torch.Tensor]:
    """The kernel's reference on ``case.compare_shape``, in fp32 (several outputs: each)."""
    inputs = case.kernel.make_inputs(case.compare_shape, dtype, case.device, 5)
    refs = case.kernel.reference(inputs)
    return [r.float() for r in (refs if isinstance(refs, tuple | list) else (refs,))]


def groups(t: torch.Tensor, rowwise: bool) -> torch.Tensor:
    """A view of ``t`` as (groups, elements), as the check groups it."""
    return t.reshape(-1, t.shape[-1]) if rowwise and t.dim() > 1 else t.reshape(1, -1)


def ulps_at_scale(ref: torch.Tensor, dtype: str, rowwise: bool, ulps: float) -> torch.Tensor:
    """``ulps`` ulps of the dtype at each group's scale (its largest |value|), one per group.
    fp32 is judged in TF32's ulps: an fp32 dot goes through TF32 on a GPU, the coarsest
    arithmetic a correct fp32 kernel may use."""
    scale = groups(ref, rowwise).abs().amax(dim=1, keepdim=True)
    eps = 2.0 ** -10 if dtype == "float32" else torch.finfo(getattr(torch, dtype)).eps
    return ulps * eps * torch.exp2(torch.floor(torch.log2(scale)))


def adversaries(ref: torch.Tensor, dtype: str, rowwise: bool) -> dict[str, torch.Tensor]:
    """Wrong outputs derived from the correct one (``ref`` rounded to the dtype). The bias
    only where a row (or, per tensor, the tensor) holds ``CHECKED_ROW`` elements or more: 3
    ulps is within what the tolerance allows each element (``DEFAULT_TOLERANCES``: 4u at the
    scale plus 8u), so only a sum over many of them can tell it from rounding (a total of one
    element cannot)."""
    good = ref.to(getattr(torch, dtype)).float()
    out = {}
    small = groups(ref, rowwise).abs()
    zeroed = groups(good.clone(), rowwise)
    zeroed[small < small.median(dim=1, keepdim=True).values] = 0.0
    out["its smaller half zeroed"] = zeroed.reshape(ref.shape)
    biased = groups(good.clone(), rowwise)
    if biased.shape[1] >= CHECKED_ROW:
        bias = ulps_at_scale(ref, dtype, rowwise, 3.0)
        row = biased.shape[0] // 2
        biased[row] += bias[row]
        out["a bias of 3 ulps at the scale on one whole row" if rowwise
            else "a bias of 3 ulps at the scale on the whole tensor"] = biased.reshape(ref.shape)
    one = good.clone().flatten()
    one[one.numel() // 3] += 0.5 * float(ref.abs().max())
    out["one element off by half the scale"] = one.reshape(ref.shape)
    return out


@conformance_check
def check_rejects_wrong_outputs(case: Case) -> Iterator[str]:
    """For every compared dtype: the reference rounded to the dtype passes the kernel's own
    check (its tolerance and ``output_check``); zeroing the smaller half of each row, a bias
    of three ulps at the output's scale on one whole row (row-wise kernels) or the whole
    tensor, and one element off by half the scale are each rejected."""
    check = output_check_of(case.kernel)
    for dtype in case.compare_dtypes:
        tol = case.kernel.tolerance(dtype)
        for ref in reference_outputs(case, dtype):
            if not bool((ref != 0).any()):
                yield (f"{dtype}: its reference on {case.compare_shape} is all zeros: no wrong "
                       "output can be told from it")
                continue
            good = ref.to(getattr(torch, dtype)).float()
            result = compare(good, ref, tol, dtype, check)
            if isinstance(result, str):
                yield f"{dtype}: the reference rounded to {dtype} fails its check: {result}"
            for what, wrong in adversaries(ref, dtype, check.rowwise).items():
                if torch.equal(wrong, good):  # not wrong: a half of zeros already (ReLU)
                    continue
                if not isinstance(compare(wrong, ref, tol, dtype, check), str):
                    yield f"{dtype}: {what} passes its check ({tol}, {check})"


@conformance_check
def check_accepts_rounding_noise(case: Case) -> Iterator[str]:
    """A correct output that rounded the other way on every element (one ulp off, random
    signs) passes: the check is not tighter than the dtype allows."""
    check = output_check_of(case.kernel)
    gen = torch.Generator().manual_seed(9)
    for dtype in case.compare_dtypes:
        for ref in reference_outputs(case, dtype):
            sign = (torch.randint(0, 2, ref.shape, generator=gen).float() * 2 - 1).to(ref.device)
            eps = torch.finfo(getattr(torch, dtype)).eps
            noisy = (ref + sign * eps * ref.abs()).to(getattr(torch, dtype)).float()
            result = compare(noisy, ref, case.kernel.tolerance(dtype), dtype, check)
            if isinstance(result, str):
                yield f"{dtype}: one ulp of rounding noise fails its check: {result}"
