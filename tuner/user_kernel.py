"""``tuner.Kernel``: a user's ``@triton.jit`` kernel described in a few lines, as a TunableKernel.

A user gives the kernel (a ``@triton.jit`` function, or one decorated with ``tuner.autotune``,
which brings its name, configs and key), its grid, how to make its arguments for a problem
shape, and optionally a reference. Everything else has defaults:

- dims: the autotune ``key`` (the integer kernel arguments a config depends on), 1..2**30;
- space: derived from the user's ``triton.Config`` list (each parameter's values extended by
  one step around what the list holds; the list itself is tried first as a warm start), or
  given as parameter ranges with constraints;
- reference: with none, outputs are compared against the user's first config;
- tolerance per dtype (``DEFAULT_TOLERANCES``; atol is relative to the output's scale) and
  ``output_check`` (``OutputCheck()``: per tensor; ``OutputCheck(rowwise=True)`` for a kernel
  whose last dimension is a row); outputs: the arguments whose name contains "out"; flops and
  bytes unknown (0.0).

``make_inputs(shape, dtype, device, seed)`` returns the kernel's arguments by parameter name
(tensors of random data, ints, floats); the key arguments must equal the shape's dimensions.
The kernel is launched as ``fn[grid](**args, **config.meta, num_warps=..., num_stages=...)``,
and ``grid`` is called like Triton's: with the arguments and the config's meta-parameters.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tuner.config import KernelConfig
from tuner.errors import InvalidRequest
from tuner.kernel import DEFAULT_TOLERANCES, Dim, OutputCheck, Tolerance
from tuner.space import Constraint, Param, ProblemContext, SearchSpace

ALL_DTYPES = ("float16", "bfloat16", "float32")
#: the upper bound of a dimension the user did not bound
DEFAULT_DIM_MAX = 1 << 30
#: launch options a derived space tunes besides the kernel's meta-parameters
_WARPS = (1, 2, 4, 8, 16, 32)
_MAX_STAGES = 7

MakeInputs = Callable[[Mapping[str, int], str, str, int], dict[str, Any]]
Grid = Callable[[Mapping[str, Any]], tuple[int, ...]]


def jit_function(fn: Any) -> Any:
    """The ``@triton.jit`` function under ``tuner.autotune``/``triton.autotune``/heuristics
    wrappers: the first object whose ``fn`` is a plain Python function."""
    while hasattr(fn, "fn") and not inspect.isfunction(fn.fn):
        fn = fn.fn
    return fn


def python_function(fn: Any) -> Callable[..., Any]:
    """The plain Python function a (possibly wrapped) Triton kernel was written as."""
    jit = jit_function(fn)
    inner: Callable[..., Any] = getattr(jit, "fn", jit)
    return inner


def source_hash(fn: Any, name: str) -> str:
    """A short hash of the kernel's source and name: its ``version``. The client computes the
    same hash from the same source, so a config is exact only for the code it was tuned on."""
    try:
        source = inspect.getsource(python_function(fn))
    except (OSError, TypeError):
        source = getattr(jit_function(fn), "src", "") or repr(fn)
    return hashlib.sha256(f"{name}\n{source}".encode()).hexdigest()[:12]


def arg_names(fn: Any) -> list[str]:
    return list(inspect.signature(python_function(fn)).parameters)


def config_from_triton(config: Any) -> KernelConfig:
    """A ``triton.Config`` (or a flat mapping) as a KernelConfig."""
    if isinstance(config, Mapping):
        return KernelConfig(dict(config))
    values = dict(config.kwargs)
    values["num_warps"] = int(config.num_warps)
    values["num_stages"] = int(config.num_stages)
    return KernelConfig(values)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _around(name: str, values: Sequence[int]) -> Param:
    """The parameter's values, extended one step beyond the list's smallest and largest."""
    lo, hi = min(values), max(values)
    if name == "num_warps":
        return Param.ints(name, [w for w in _WARPS if lo / 2 <= w <= hi * 2])
    if name == "num_stages":
        return Param.ints(name, range(max(1, lo - 1), min(_MAX_STAGES, hi + 1) + 1))
    if all(_is_pow2(v) for v in values):
        return Param.pow2(name, max(1, lo // 2), hi * 2)
    return Param.ints(name, sorted(set(values)))


def space_from_configs(configs: Sequence[KernelConfig],
                       constraints: Sequence[Constraint] = ()) -> SearchSpace:
    """A space around a user's configs: every parameter they set, each extended by one step
    (powers of two: halved and doubled; stages: one fewer and one more; warps: a power of two
    each way). Configs that disagree on which parameters they set are refused."""
    names = set(configs[0])
    for c in configs:
        if set(c) != names:
            raise InvalidRequest(f"configs set different parameters ({sorted(set(c))} vs "
                                 f"{sorted(names)}); give every config the same ones",
                                 field="configs")
    ordered = sorted(names, key=lambda n: (n in ("num_warps", "num_stages"), n))
    params = tuple(_around(n, [c[n] for c in configs]) for n in ordered)
    return SearchSpace(params, tuple(constraints))


def space_from_ranges(ranges: Mapping[str, Iterable[int]],
                      constraints: Sequence[Constraint] = ()) -> SearchSpace:
    """A space from parameter name -> values (powers of two are ordinal)."""
    params = []
    for name, values in ranges.items():
        vals = sorted(set(int(v) for v in values))
        if len(vals) > 1 and all(_is_pow2(v) for v in vals) and vals == [
                vals[0] << i for i in range(len(vals))]:
            params.append(Param.pow2(name, vals[0], vals[-1]))
        else:
            params.append(Param.ints(name, vals))
    return SearchSpace(tuple(params), tuple(constraints))


def _dims(dims: Mapping[str, Any] | Sequence[Dim] | None, key: Sequence[str]) -> tuple[Dim, ...]:
    if dims is None:
        return tuple(Dim(k, 1, DEFAULT_DIM_MAX) for k in key)
    if isinstance(dims, Mapping):
        out = []
        for name, bounds in dims.items():
            lo, hi = (1, int(bounds)) if isinstance(bounds, int) else map(int, bounds)
            out.append(Dim(name, lo, hi))
        return tuple(out)
    return tuple(dims)


class Kernel:
    """A TunableKernel built from a user's Triton kernel (see the module docstring)."""

    def __init__(self, fn: Any, *, grid: Grid, make_inputs: MakeInputs,
                 name: str | None = None, configs: Sequence[Any] | None = None,
                 key: Sequence[str] | None = None,
                 dims: Mapping[str, Any] | Sequence[Dim] | None = None,
                 space: SearchSpace | Mapping[str, Iterable[int]] | None = None,
                 constraints: Sequence[Constraint] = (),
                 reference: Callable[[dict[str, Any]], Any] | None = None,
                 outputs: Sequence[str] | None = None, dtypes: Sequence[str] = ALL_DTYPES,
                 tolerance: Mapping[str, Tolerance] | None = None,
                 output_check: OutputCheck | None = None,
                 flops: Callable[[Mapping[str, int]], float] | None = None,
                 bytes: Callable[[Mapping[str, int], str], float] | None = None,
                 prior: Callable[[KernelConfig, ProblemContext], float | None] | None = None,
                 description: str = "",
                 interpreter_unsupported_dtypes: Sequence[str] = ()) -> None:
        self.fn = fn
        self.jit = jit_function(fn)
        self.name = name or getattr(fn, "name", None) or python_function(fn).__name__
        self.ref = ""  # set by the registry from the reference it loaded
        self.description = description or (inspect.getdoc(python_function(fn)) or "").split(
            "\n")[0]
        key = list(key if key is not None else getattr(fn, "key", []))
        self.dims = _dims(dims, key)
        if not self.dims:
            raise InvalidRequest(f"kernel {self.name}: give its problem dimensions (dims=...) "
                                 "or an autotune key", field="dims")
        self.dtypes = tuple(dtypes)
        self.interpreter_unsupported_dtypes = tuple(interpreter_unsupported_dtypes)
        user_configs = configs if configs is not None else getattr(fn, "configs", None) or []
        self.configs = [config_from_triton(c) for c in user_configs]
        if isinstance(space, SearchSpace):
            self._space = space
        elif space is not None:
            self._space = space_from_ranges(space, constraints)
        elif self.configs:
            self._space = space_from_configs(self.configs, constraints)
        else:
            raise InvalidRequest(f"kernel {self.name}: give configs=[triton.Config(...)] or "
                                 "space={'BLOCK': [...], 'num_warps': [...], ...}",
                                 field="space")
        self._grid, self._make_inputs, self._reference = grid, make_inputs, reference
        self._args = arg_names(fn)
        #: None: the tensor arguments whose name contains "out", found in make_inputs
        self._outputs: list[str] | None = list(outputs) if outputs is not None else None
        self._tolerance = {**DEFAULT_TOLERANCES, **(tolerance or {})}
        self.output_check = output_check or OutputCheck()
        self._flops, self._bytes, self._prior = flops, bytes, prior
        self._version = source_hash(fn, self.name)

    # -- identity and space --------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self._version

    def space(self) -> SearchSpace:
        return self._space

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """The user's own configs (in their order): tried first, as a warm start."""
        return [c for c in self.configs if self._space.contains(c)]

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """The user's first config, else the space's first config that fits the problem."""
        if self.configs:
            return self.configs[0]
        ctx = ProblemContext(dict(shape), dtype)
        for config in self._space:
            if self._space.violation(config, ctx) is None:
                return config
        return next(iter(self._space))

    # -- running --------------------------------------------------------------------------------

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        args = dict(self._make_inputs(shape, dtype, device, seed))
        if self._outputs is None:
            self._outputs = [a for a in self._args
                             if "out" in a.lower() and hasattr(args.get(a), "clone")]
        if not self._outputs:
            raise InvalidRequest(f"kernel {self.name}: name its output arguments "
                                 f"(outputs=[...]); its arguments are {self._args}",
                                 field="outputs")
        unknown = [o for o in self._outputs if o not in args]
        if unknown:
            raise InvalidRequest(f"kernel {self.name}: make_inputs returned no {unknown}",
                                 field="outputs")
        args["_outputs"] = tuple(self._outputs)
        if "out" not in self._args:
            args["out"] = args[self._outputs[0]]
        return args

    def kernel_args(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs that are kernel parameters (without ``out``/``_outputs`` bookkeeping)."""
        return {k: v for k, v in inputs.items() if k in self._args}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        self.jit[self._grid](**self.kernel_args(inputs), **config.meta,
                             num_warps=config.num_warps, num_stages=config.num_stages)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        self.jit.warmup(**self.kernel_args(inputs), **config.meta, num_warps=config.num_warps,
                        num_stages=config.num_stages, grid=self._grid)

    def reference(self, inputs: dict[str, Any]) -> Any:
        """The user's reference, else the outputs of the user's first config."""
        if self._reference is not None:
            return self._reference(self.kernel_args(inputs))
        if not self.configs:
            raise InvalidRequest(f"kernel {self.name}: without configs, give a reference",
                                 field="reference")
        fresh = dict(inputs)
        names = inputs["_outputs"]
        for name in names:
            fresh[name] = inputs[name].clone()
        self.launch(self.configs[0], fresh)
        outs = tuple(fresh[name] for name in names)
        return outs[0] if len(outs) == 1 else outs

    def tolerance(self, dtype: str) -> Tolerance:
        return self._tolerance.get(dtype, DEFAULT_TOLERANCES["float32"])

    def flops(self, shape: Mapping[str, int]) -> float:
        return float(self._flops(shape)) if self._flops else 0.0

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        return float(self._bytes(shape, dtype)) if self._bytes else 0.0

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        return self._prior(config, ctx) if self._prior else None

    def __repr__(self) -> str:
        return f"tuner.Kernel({self.name!r}, version={self.version})"
