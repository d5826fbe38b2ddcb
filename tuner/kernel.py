"""The TunableKernel protocol: the one type the engine, the workers and the API use for a kernel.

Built-in kernels live one per module in ``search_spaces/``; users describe theirs in a few lines
with ``tuner.Kernel`` (``tuner/user_kernel.py``) or implement this protocol directly. Every
registered kernel passes the conformance suite (``tuner.testing``, run over the registry by
``tests/test_kernel_conformance.py``; plugin authors run it on theirs).

A kernel's ``version`` is ``code_version`` (``tuner/code_hash.py``) of what it runs and how it
is searched; built-ins take it from ``builtin_version``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from tuner.code_hash import code_version
from tuner.config import KernelConfig
from tuner.space import ProblemContext, SearchSpace
from tuner.triton_keys import settle_cache_keys


@dataclass(frozen=True)
class Dim:
    """A named problem dimension with inclusive bounds."""

    name: str
    lo: int = 1
    hi: int = 65536
    doc: str = ""


@dataclass(frozen=True)
class Tolerance:
    """How far an output element may be from the reference: ``atol * scale + rtol * |ref|``,
    where ``scale`` is the largest ``|ref|`` of the element's row (``OutputCheck.rowwise``) or
    tensor. ``atol`` is relative to that scale, not absolute: an absolute atol lets through
    anything below it, and a softmax row of 50,257 holds nothing but such small values. The
    same per-element allowances bound the mean error (``tuner/verification.py``)."""

    atol: float
    rtol: float


#: tolerances for kernels that give none, in units of the dtype's unit roundoff u (fp16 2**-11,
#: bf16 2**-8; fp32 may go through TF32 tensor cores, u = 2**-11): 4u at the scale plus 8u of
#: the element, room for a few roundings of an fp32 computation and a mean check that still
#: catches a bias of a few ulps
DEFAULT_TOLERANCES = {"float16": Tolerance(2e-3, 4e-3), "bfloat16": Tolerance(1.6e-2, 3.2e-2),
                      "float32": Tolerance(2e-3, 4e-3)}


@dataclass(frozen=True)
class OutputCheck:
    """What a kernel's outputs are checked for besides closeness (``tuner/verification.py``).

    ``rowwise``: the last dimension is a row computed as a unit (softmax, the norms): scale,
    mean error and invariants are taken per row; else per output tensor. ``row_sum``: every
    row of the output sums to this (softmax: 1), checked on the output alone. A kernel
    declares one as its ``output_check`` attribute; without one, ``OutputCheck()``."""

    rowwise: bool = False
    row_sum: float | None = None


def output_check_of(kernel: Any) -> OutputCheck:
    """The kernel's declared ``output_check``, else the default (per tensor, no invariant)."""
    check = getattr(kernel, "output_check", None)
    return check if isinstance(check, OutputCheck) else OutputCheck()


def verification_of(kernel: Any) -> str:
    """How the kernel's outputs are checked: its declared ``verification`` (a ``tuner.Kernel``
    without a reference: ``"unverified: no reference"``), else ``"reference"`` (built-ins)."""
    verification = getattr(kernel, "verification", None)
    return verification if isinstance(verification, str) and verification else "reference"


@runtime_checkable
class TunableKernel(Protocol):
    """One kernel family.

    Required (``PROTOCOL_MEMBERS``): ``name``, ``ref``, ``dims``, ``dtypes``, ``version``,
    ``space``, ``default_config``, ``make_inputs``, ``launch``, ``reference``, ``tolerance``,
    ``flops``, ``bytes``. ``make_inputs`` returns a dict of random inputs (never zeros) plus the
    output buffer under ``"out"`` (several outputs: their keys listed under ``"_outputs"``).
    ``launch`` writes the outputs; ``reference`` returns the expected output (a tuple for
    several) computed another way, compared at ``tolerance(dtype)``. ``flops`` and ``bytes``
    feed the roofline (0.0 when unknown). ``ref`` is the ``module:attribute`` a measuring child
    process imports to get this object (the registry sets it).

    Optional with defaults (``OPTIONAL_MEMBERS``; ``with_defaults`` fills them in, so a plugin
    written against the required members alone loads and runs, and they are members of this
    protocol): ``description``; ``interpreter_unsupported_dtypes``; ``known_good_configs``
    (tried first).

    Optional hooks, not members of this protocol (``OPTIONAL_HOOKS``: each its own protocol
    below, read through its accessor, which gives None for a kernel without it):

    - ``compile`` (``CompilesAhead``, ``compile_hook``) builds the binary without launching
      (the compile-ahead pool calls it in processes that never time anything; without it the
      GPU child compiles on the first launch);
    - ``prior`` (``HasPrior``, ``prior_hook``) is an estimated log run time, used only to rank
      configs before measuring them (None: no model). ``with_defaults`` gives a kernel without
      one a flat prior (None for every config), which ranks as no prior does;
    - ``baseline(inputs)`` (``HasBaseline``, ``baseline_hook``) does the same work with the
      vendor's library (torch) on the same inputs, in their dtype (matmul: ``torch.matmul``);
      re-timing times it interleaved with the finalists in the same process
      (``SearchResult.baseline``), a like-for-like comparison. Its result is not checked;
    - ``listed_configs(shape, dtype)`` (``ListsConfigs``, ``listed_configs_hook``): the user's
      own config list (``tuner.Kernel``): a search measures every one of them before it extends
      around them, and re-times their best beside its finalists, so what it serves is never
      slower than the list's best;
    - ``compile_shape(shape, dtype) -> dict`` (``HasCompileShape``) gives a smaller shape whose
      compiled binary is the same (Triton specialises on dtypes, 16-byte alignment of pointers,
      divisibility by 16 and ==1 of integers, and constexprs, never on sizes); the compile pool
      builds its inputs with it (see ``compile_shape_for``);
    - ``compile_inputs(shape, dtype, device)`` (``HasCompileInputs``): the inputs the compile
      pool compiles with (see ``compile_inputs_for``);
    - ``same_kernel(config, shape, dtype) -> KernelConfig`` (``NamesSameKernel``) names the
      config that runs the same code as ``config`` on that problem (matmul: SPLIT_K outside
      split_k); the table recorder (``bench/record_tables.py``) measures each such kernel once.

    Optional attributes: ``verification`` (str): how outputs are checked, ``"reference"`` (the
    default) or ``"unverified: no reference"`` (configs checked against each other and for
    NaN/Inf only; the API and the dashboard show it; ``verification_of``); ``output_check``
    (an ``OutputCheck``): row-wise comparison, declared invariants (``output_check_of``);
    ``compiles_on_host`` (bool, default False): ``compile`` builds the GPU binary from host
    tensors (its host code asks ``tuner.host_compile.on_gpu`` where it would ask
    ``tensor.is_cuda``), so a GPU worker's compile pool makes the inputs in host memory and
    starts no CUDA context (``tuner.host_compile.compiles_on_host``; the built-in kernels).
    """

    name: str
    ref: str
    description: str
    dims: tuple[Dim, ...]
    dtypes: tuple[str, ...]
    #: dtypes whose results the Triton CPU interpreter gets wrong (bf16 ``tl.dot``)
    interpreter_unsupported_dtypes: tuple[str, ...]

    @property
    def version(self) -> str: ...

    def space(self) -> SearchSpace: ...

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig: ...

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]: ...

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]: ...

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None: ...

    def reference(self, inputs: dict[str, Any]) -> Any: ...

    def tolerance(self, dtype: str) -> Tolerance: ...

    def flops(self, shape: Mapping[str, int]) -> float: ...

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float: ...


class CompilesAhead(Protocol):
    """The optional ``compile`` hook: build ``config``'s binary for ``inputs`` without
    launching it."""

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None: ...


class HasPrior(Protocol):
    """The optional ``prior`` hook: ``config``'s estimated log run time on ``ctx``'s problem
    (lower ranks first), None where it has no estimate."""

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None: ...


class HasBaseline(Protocol):
    """The optional ``baseline`` hook: the same work done by the vendor's library."""

    def baseline(self, inputs: dict[str, Any]) -> Any: ...


class ListsConfigs(Protocol):
    """The optional ``listed_configs`` hook: the user's own configs for a problem."""

    def listed_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]: ...


class HasCompileShape(Protocol):
    """The optional ``compile_shape`` hook: a small shape compiling to the same binary."""

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> Mapping[str, int]: ...


class HasCompileInputs(Protocol):
    """The optional ``compile_inputs`` hook: the inputs the compile pool compiles with."""

    def compile_inputs(self, shape: Mapping[str, int], dtype: str,
                       device: str) -> Mapping[str, Any]: ...


class NamesSameKernel(Protocol):
    """The optional ``same_kernel`` hook: the config running the same code on a problem."""

    def same_kernel(self, config: KernelConfig, shape: Mapping[str, int],
                    dtype: str) -> KernelConfig: ...


#: the optional hooks (each a method a kernel may have or lack) and the protocol declaring it;
#: read them through ``optional_hook`` or its typed accessors (``compile_hook``,
#: ``prior_hook``, ``baseline_hook``, ``listed_configs_hook``), never as plain attributes.
#: Not by ``isinstance`` on the protocols: kernels reach the engine wrapped (``with_defaults``,
#: test doubles) with members forwarded by ``__getattr__``, which a runtime-checkable
#: protocol's ``isinstance`` does not see on Python 3.12 (``inspect.getattr_static``).
OPTIONAL_HOOKS: dict[str, type] = {
    "compile": CompilesAhead,
    "prior": HasPrior,
    "baseline": HasBaseline,
    "listed_configs": ListsConfigs,
    "compile_shape": HasCompileShape,
    "compile_inputs": HasCompileInputs,
    "same_kernel": NamesSameKernel,
}


def optional_hook(kernel: object, name: str) -> Callable[..., Any] | None:
    """The kernel's optional hook ``name`` (one of ``OPTIONAL_HOOKS``) as a bound callable;
    None for a kernel without it (or with a non-callable in its place)."""
    if name not in OPTIONAL_HOOKS:
        raise KeyError(f"{name!r} is not an optional kernel hook ({', '.join(OPTIONAL_HOOKS)})")
    hook = getattr(kernel, name, None)
    return hook if callable(hook) else None


def compile_hook(kernel: object) -> Callable[[KernelConfig, dict[str, Any]], None] | None:
    """The kernel's ``compile`` (``CompilesAhead``), None without one."""
    return optional_hook(kernel, "compile")


def prior_hook(kernel: object) -> Callable[[KernelConfig, ProblemContext], float | None] | None:
    """The kernel's ``prior`` (``HasPrior``), None without one."""
    return optional_hook(kernel, "prior")


def baseline_hook(kernel: object) -> Callable[[dict[str, Any]], Any] | None:
    """The kernel's ``baseline`` (``HasBaseline``), None without one."""
    return optional_hook(kernel, "baseline")


def listed_configs_hook(kernel: object
                        ) -> Callable[[Mapping[str, int], str], list[KernelConfig]] | None:
    """The kernel's ``listed_configs`` (``ListsConfigs``), None without one."""
    return optional_hook(kernel, "listed_configs")


#: what a TunableKernel must have (attributes and methods), for plugin checks: the protocol
#: as DESIGN.md documents it. A plugin written against it loads, whatever was added later.
PROTOCOL_MEMBERS = ("name", "ref", "dims", "dtypes", "version", "space", "default_config",
                    "make_inputs", "launch", "reference", "tolerance", "flops", "bytes")

#: the optional members and what a kernel without them gets (``with_defaults``): no
#: description, every dtype checkable on the interpreter, no known-good configs beyond the
#: default, and a flat prior (no estimate for any config: ranks as no prior does). A kernel
#: without ``compile`` gets nothing in its place (``compile_hook`` is None: the GPU child
#: compiles on the first launch).
OPTIONAL_MEMBERS: dict[str, Any] = {
    "description": "",
    "interpreter_unsupported_dtypes": (),
    "known_good_configs": lambda shape, dtype: [],
    "prior": lambda config, ctx: None,
}


class _WithDefaults:
    """A kernel that lacks optional members, with their defaults (``OPTIONAL_MEMBERS``);
    everything else is the kernel's own."""

    def __init__(self, kernel: Any) -> None:
        self.__dict__["_kernel"] = kernel

    def __getattr__(self, name: str) -> Any:
        kernel = self.__dict__["_kernel"]
        if hasattr(kernel, name) or name not in OPTIONAL_MEMBERS:
            return getattr(kernel, name)
        return OPTIONAL_MEMBERS[name]

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_kernel"], name, value)

    def __repr__(self) -> str:
        return repr(self.__dict__["_kernel"])


_completed: dict[int, tuple[Any, _WithDefaults]] = {}


def with_defaults(kernel: Any) -> Any:
    """``kernel`` itself when it has every optional member, else one wrapper per kernel object
    (the same object on every call: the registry's and a child's lookups agree) that gives the
    missing ones their defaults. Engine code reads optional members as attributes."""
    if all(hasattr(kernel, m) for m in OPTIONAL_MEMBERS):
        return kernel
    known = _completed.get(id(kernel))
    if known is None or known[0] is not kernel:
        known = _completed[id(kernel)] = (kernel, _WithDefaults(kernel))
    return known[1]


#: without a ``compile_shape``, the compile pool builds full-size inputs only up to this size
#: (each of its processes holds a set, on the GPU)
MAX_FULL_COMPILE_BYTES = 256 << 20


def compile_shape_for(kernel: Any, shape: Mapping[str, int], dtype: str) -> dict[str, int] | None:
    """The shape the compile pool builds its inputs with: the kernel's ``compile_shape``; else
    the shape itself when its inputs are small (``kernel.bytes`` at most
    ``MAX_FULL_COMPILE_BYTES``); else None: the pool does not compile ahead and the GPU child
    compiles each config itself (a cache miss costs only time)."""
    hook = optional_hook(kernel, "compile_shape")
    if hook is not None:
        return {k: int(v) for k, v in hook(shape, dtype).items()}
    size = kernel.bytes(shape, dtype)
    return dict(shape) if 0 < size <= MAX_FULL_COMPILE_BYTES else None


def compile_inputs_for(kernel: Any, shape: Mapping[str, int], dtype: str,
                       device: str) -> dict[str, Any] | None:
    """The inputs the compile pool compiles ``kernel`` with on this problem: the kernel's
    ``compile_inputs(shape, dtype, device)`` (``tuner.Kernel``: tiny stand-ins of the
    problem's tensors, whatever size it declares), else those of ``compile_shape_for``'s shape;
    None: no compiling ahead (the GPU child compiles each config itself). Never full-size
    inputs of a large problem in every pool process."""
    hook = optional_hook(kernel, "compile_inputs")
    if hook is not None:
        return dict(hook(shape, dtype, device))
    small = compile_shape_for(kernel, shape, dtype)
    return kernel.make_inputs(small, dtype, device, 0) if small is not None else None


def shrunk_dim(d: int, modulus: int = 256) -> int:
    """A size that specialises like ``d`` but is under ``2 * modulus``: the same residue mod
    ``modulus`` (a multiple of 16: the same divisibility by 16; 256 also keeps ``d % BLOCK``
    for blocks up to 256), and 1 stays 1. For ``compile_shape`` hooks."""
    return d if d < 2 * modulus else modulus + d % modulus


def missing_members(obj: object) -> list[str]:
    """The required protocol members ``obj`` lacks (``ref`` may be missing: the registry sets
    it; the optional ones have defaults, ``OPTIONAL_MEMBERS``)."""
    return [m for m in PROTOCOL_MEMBERS if m != "ref" and not hasattr(obj, m)]


def source_version(*modules: ModuleType) -> str:
    """A short hash of whole modules' source. Superseded by ``code_version`` (any edit of a
    module, a comment included, changes it); kept for plugins written against it."""
    source = "".join(inspect.getsource(module) for module in modules)
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def builtin_version(kernel: Any, *launched: Any) -> str:
    """A built-in kernel's version (``code_version``): the jit functions it launches
    (``launched``, declared by the kernel) and those they call; its host code, ``launch`` and
    ``default_config`` and what they call in its package (the launcher decides which jit
    function runs, with which constexprs and grid; the default is what a tuned config must
    beat); its space and constraints. Not its ``known_good_configs``, ``prior``,
    ``make_inputs`` or ``reference``: they steer a search or check it, and a change of them
    leaves stored configs right for the code. Computed once per kernel object."""
    cached = vars(kernel).get("_code_version")
    if not isinstance(cached, str):
        cached = code_version(*launched, kernel.launch, kernel.default_config,
                              space=kernel.space())
        vars(kernel)["_code_version"] = cached
    return cached


def load_ref(ref: str) -> Any:
    """Import ``"package.module:ATTR"``: how child processes find the kernel they measure.
    The Triton cache keys of the module's JIT functions are computed here, callees first
    (``tuner.triton_keys``): a process that compiles one of them later has the keys that
    every other process has, whatever it compiles first."""
    module_name, _, attr = ref.partition(":")
    module = importlib.import_module(module_name)
    kernel = getattr(module, attr or "KERNEL")
    settle_cache_keys(module, kernel)
    return with_defaults(kernel)
