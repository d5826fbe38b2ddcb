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
and ``grid`` is called like Triton's, with the config's meta-parameters and every value
``make_inputs`` (and ``prepare``) returned, tensors as tensors.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tuner.config import KernelConfig
from tuner.errors import InvalidConfig, InvalidRequest, WrongOutput
from tuner.kernel import (
    DEFAULT_TOLERANCES,
    MAX_FULL_COMPILE_BYTES,
    Dim,
    OutputCheck,
    Tolerance,
    code_version,
)
from tuner.launching import (
    Hooks,
    Problem,
    ProblemFn,
    autotune_keys,
    capture_launch,
    launch_kwargs,
    output_tensor,
    unwrap,
    with_output,
)
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


def user_version(fn: Any, configs: Sequence[KernelConfig] = (),
                 space: SearchSpace | None = None) -> str:
    """A user's kernel's version (``code_version``): its jit function and every jit function
    it calls, the constants they read, its ``triton.heuristics``, its config list and its
    space (parameters, values, constraints). ``tuner.autotune`` computes it from the
    decorator's configs, the same as a ``tuner.Kernel`` of that kernel, so the model's
    process and the workers agree on it. The launcher (grid, ``make_inputs``) is not in it:
    the model's process does not know the worker's."""
    listed = [tuple(sorted(KernelConfig(c).items())) for c in configs]
    return code_version(fn, space=space, extra=[("configs", listed)])


def arg_names(fn: Any) -> list[str]:
    return list(inspect.signature(python_function(fn)).parameters)


def config_from_triton(config: Any) -> KernelConfig:
    """A ``triton.Config`` (or a flat mapping) as a KernelConfig (``num_ctas`` and
    ``maxnreg`` kept where they are not Triton's defaults)."""
    if isinstance(config, Mapping):
        return KernelConfig(dict(config))
    values = dict(config.kwargs)
    values["num_warps"] = int(config.num_warps)
    values["num_stages"] = int(config.num_stages)
    if int(getattr(config, "num_ctas", 1) or 1) != 1:
        values["num_ctas"] = int(config.num_ctas)
    if getattr(config, "maxnreg", None) is not None:
        values["maxnreg"] = int(config.maxnreg)
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
    if dims is None:  # key values may be 0 (a bool flag that is off)
        return tuple(Dim(k, 0, DEFAULT_DIM_MAX) for k in key)
    if isinstance(dims, Mapping):
        out = []
        for name, bounds in dims.items():
            lo, hi = (1, int(bounds)) if isinstance(bounds, int) else map(int, bounds)
            out.append(Dim(name, lo, hi))
        return tuple(out)
    return tuple(dims)


#: what a kernel without a reference is checked by (the API and the dashboard show it)
UNVERIFIED = "unverified: no reference"

Prepare = Callable[[KernelConfig, Mapping[str, Any]], Mapping[str, Any]]


def _standin(value: Any, device: str) -> Any:
    """A tiny tensor that compiles like ``value``: same dtype, same 16-byte alignment of its
    address (Triton specialises pointers on dtype and alignment, never on size); a tensor
    descriptor with such a base. Anything else is itself."""
    import torch

    if isinstance(value, torch.Tensor):
        size = value.element_size()
        offset = (value.data_ptr() % 16) // size
        return torch.empty(offset + 16, dtype=value.dtype, device=device)[offset:]
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor) and dataclasses.is_dataclass(value):
        return dataclasses.replace(value, base=_standin(base, device))  # type: ignore[type-var]
    return value


class Kernel:
    """A TunableKernel built from a user's Triton kernel (see the module docstring)."""

    def __init__(self, fn: Any, *, grid: Grid | None = None,
                 make_inputs: MakeInputs | None = None,
                 call: Callable[[dict[str, Any]], Any] | None = None,
                 call_inputs: MakeInputs | None = None,
                 name: str | None = None, configs: Sequence[Any] | None = None,
                 key: Sequence[str] | None = None,
                 dims: Mapping[str, Any] | Sequence[Dim] | None = None,
                 problem: ProblemFn | None = None, dtype_arg: str | None = None,
                 space: SearchSpace | Mapping[str, Iterable[int]] | None = None,
                 constraints: Sequence[Constraint] = (),
                 reference: Callable[[dict[str, Any]], Any] | None = None,
                 prepare: Prepare | None = None,
                 outputs: Sequence[str] | None = None, dtypes: Sequence[str] = ALL_DTYPES,
                 tolerance: Mapping[str, Tolerance] | None = None,
                 output_check: OutputCheck | None = None,
                 reset_to_zero: Sequence[str] | None = None,
                 restore_value: Sequence[str] | None = None,
                 flops: Callable[[Mapping[str, int]], float] | None = None,
                 bytes: Callable[[Mapping[str, int], str], float] | None = None,
                 prior: Callable[[KernelConfig, ProblemContext], float | None] | None = None,
                 description: str = "",
                 interpreter_unsupported_dtypes: Sequence[str] = ()) -> None:
        parts = unwrap(fn)
        self.fn, self.jit, self._runner = fn, parts.jit, parts.runner
        self.name = name or getattr(fn, "name", None) or parts.python.__name__
        self.ref = ""  # set by the registry from the reference it loaded
        self.description = description or (inspect.getdoc(parts.python) or "").split("\n")[0]
        self._args = arg_names(fn)
        served = getattr(fn, "problem_spec", None)  # a tuner.autotune kernel's own
        key = list(key if key is not None else autotune_keys(parts.autotuner))
        self.problem_spec = Problem(
            tuple(key), tuple(self._args),
            problem if problem is not None else getattr(served, "problem", None),
            dtype_arg if dtype_arg is not None else getattr(served, "dtype_arg", None))
        self.dims = _dims(dims, key)
        if not self.dims:
            raise InvalidRequest(f"kernel {self.name}: give its problem dimensions (dims=...) "
                                 "or an autotune key", field="dims")
        self.dtypes = tuple(dtypes)
        self.interpreter_unsupported_dtypes = tuple(interpreter_unsupported_dtypes)
        user_configs = list(configs if configs is not None
                            else getattr(parts.autotuner, "configs", None) or [])
        self.configs = [config_from_triton(c) for c in user_configs]
        self.hooks = Hooks.of(parts.autotuner, user_configs, reset_to_zero, restore_value)
        self._prune = _early_prune(parts.autotuner)
        self._space = self._make_space(space, constraints)
        self._grid, self._reference = grid, reference
        self._call, self._call_inputs = call, call_inputs
        if call is not None and call_inputs is not None:
            self._make_inputs: MakeInputs = self._inputs_by_call
        elif make_inputs is not None and grid is not None:
            self._make_inputs = make_inputs
        else:
            raise InvalidRequest(f"kernel {self.name}: give grid= and make_inputs=, or the "
                                 "library function that launches it (call=) and its inputs "
                                 "(call_inputs=)", field="make_inputs")
        self._prepare = prepare
        #: None: the tensor arguments whose name contains "out", found in make_inputs
        self._outputs: list[str] | None = list(outputs) if outputs is not None else None
        self._tolerance = {**DEFAULT_TOLERANCES, **(tolerance or {})}
        self.output_check = output_check or OutputCheck()
        self.verification = "reference" if reference is not None else UNVERIFIED
        self._flops, self._bytes, self._prior = flops, bytes, prior
        # a tuner.autotune kernel's own version: the one its lookups send, whatever this
        # description adds to its space
        declared = getattr(fn, "version", None) if served is not None else None
        self._version = declared if isinstance(declared, str) else user_version(
            fn, self.configs, self._space)
        self._cross_checked: set[tuple[tuple[tuple[str, int], ...], str]] = set()

    def _make_space(self, space: SearchSpace | Mapping[str, Iterable[int]] | None,
                    constraints: Sequence[Constraint]) -> SearchSpace:
        if isinstance(space, SearchSpace):
            return space
        if space is not None:
            return space_from_ranges(space, constraints)
        if self.configs:
            return space_from_configs(self.configs, constraints)
        raise InvalidRequest(f"kernel {self.name}: give configs=[triton.Config(...)] or "
                             "space={'BLOCK': [...], 'num_warps': [...], ...}", field="space")

    # -- identity and space --------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self._version

    def space(self) -> SearchSpace:
        return self._space

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """The user's own configs (in their order): tried first, as a warm start."""
        return self.listed_configs(shape, dtype)

    def listed_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """The user's config list, every one of which a search measures (pruned ones aside)
        before extending around it."""
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

    def problem_of(self, args: Mapping[str, Any]) -> tuple[dict[str, int], str]:
        """The problem (shape, dtype) a launch with these arguments is: what ``tuner.autotune``
        looks up. ``make_inputs(shape, dtype, ...)`` must give arguments whose problem is
        ``(shape, dtype)`` (``tuner.testing`` checks it)."""
        return self.problem_spec.shape(args), self.problem_spec.dtype(args)

    # -- running --------------------------------------------------------------------------------

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        args = dict(self._make_inputs(shape, dtype, device, seed))
        if self._outputs is None:
            self._outputs = [a for a in self._args if "out" in a.lower()
                             and hasattr(output_tensor(args.get(a)), "clone")]
        if not self._outputs:
            raise InvalidRequest(f"kernel {self.name}: name its output arguments "
                                 f"(outputs=[...]); its arguments are {self._args}",
                                 field="outputs")
        unknown = [o for o in self._outputs if o not in args]
        if unknown:
            raise InvalidRequest(f"kernel {self.name}: make_inputs returned no {unknown}",
                                 field="outputs")
        args["_outputs"] = tuple(self._outputs)
        if self.hooks.restore_value:  # the kernel writes them: every launch starts from these
            args["_pristine"] = {n: args[n].clone() for n in self.hooks.restore_value}
        if "out" not in self._args:
            args["out"] = args[self._outputs[0]]
        return args

    def _inputs_by_call(self, shape: Mapping[str, int], dtype: str, device: str,
                        seed: int) -> dict[str, Any]:
        """The kernel's arguments as the library's own launcher passes them (``call`` run on
        ``call_inputs``, the launch intercepted: ``capture_launch``), its grid under
        ``_grid``, and the call's inputs under their names where no argument has them."""
        assert self._call is not None and self._call_inputs is not None
        given = dict(self._call_inputs(shape, dtype, device, seed))
        call = self._call
        seen = capture_launch(self.fn, lambda: call(given))
        tuned = {p.name for p in self._space.params}  # the configs set these
        args = {k: v for k, v in seen.args.items() if k not in tuned}
        return {**{k: v for k, v in given.items() if k not in args}, **args,
                "_grid": seen.grid}

    def compile_inputs(self, shape: Mapping[str, int], dtype: str,
                       device: str) -> dict[str, Any]:
        """Inputs the compile-ahead pool compiles with: the problem's own when they are small,
        else tiny stand-ins that compile the same binary (``_standin``), made from the
        problem's inputs on the CPU, whatever ``bytes`` declares."""
        if 0 < self.bytes(shape, dtype) <= MAX_FULL_COMPILE_BYTES:
            return self.make_inputs(shape, dtype, device, 0)
        inputs = self.make_inputs(shape, dtype, "cpu", 0)
        small = {k: _standin(v, device) for k, v in inputs.items() if k in self._args}
        if "out" not in self._args:
            small["out"] = small[inputs["_outputs"][0]]
        for k, v in inputs.items():
            if k not in small:  # bookkeeping; what ``prepare`` reads goes to the device as it
                # is (routing metadata: it may launch kernels of its own there)
                moves = self._prepare is not None and not k.startswith("_") and hasattr(v, "to")
                small[k] = v.to(device) if moves else v
        return small

    def kernel_args(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs that are kernel parameters (without ``out``/``_outputs`` bookkeeping)."""
        return {k: v for k, v in inputs.items() if k in self._args}

    def _launch_args(self, config: KernelConfig, inputs: dict[str, Any]) -> dict[str, Any]:
        """The kernel's arguments for ``config``: the inputs, plus what ``prepare`` derives
        from the config (made once per config and inputs)."""
        args = self.kernel_args(inputs)
        if self._prepare is None:
            return args
        prepared = inputs.setdefault("_prepared", {})
        if config not in prepared:
            prepared[config] = dict(self._prepare(config, inputs))
        return {**args, **self.kernel_args(prepared[config])}

    def _check_pruned(self, config: KernelConfig, args: dict[str, Any]) -> None:
        if self._prune is not None and not self._prune(config, args):
            raise InvalidConfig(f"kernel {self.name}: the kernel's prune_configs_by rejects "
                                f"{config.key()} for these arguments", field="config")

    def _grid_seeing(self, config: KernelConfig, inputs: dict[str, Any]) -> Any:
        """The user's grid, called with the launch's meta-parameters and every value
        ``make_inputs`` and ``prepare`` gave, as they are: a size no kernel argument carries
        (rows that only set the grid) is there, and tensors are tensors (Triton's CPU
        interpreter hands a grid pointer values where a GPU launch hands tensors)."""
        grid = inputs.get("_grid", self._grid)
        if not callable(grid):
            return grid
        given = {k: v for k, v in inputs.items() if not k.startswith("_")}
        given.update(inputs.get("_prepared", {}).get(config, {}))
        return lambda meta: grid({**meta, **given})

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        args = self._launch_args(config, inputs)
        self._check_pruned(config, args)
        self.hooks.before(config, args, inputs.get("_pristine"))
        self._runner.run(grid=self._grid_seeing(config, inputs), warmup=False, **args,
                         **launch_kwargs(config))

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        args = self._launch_args(config, inputs)
        self._check_pruned(config, args)
        hook = self.hooks.pre_hook(config)
        if hook is not None:  # a pre_hook may set what compiles (descriptors' block shapes)
            hook({**args, **launch_kwargs(config)})
        self._runner.run(grid=self._grid_seeing(config, inputs), warmup=True, **args,
                         **launch_kwargs(config))

    def reference(self, inputs: dict[str, Any]) -> Any:
        """The user's reference, given every value ``make_inputs`` returned; else the outputs
        of the user's first config, refused where they are NaN/Inf from finite inputs or where
        the list's second config disagrees with them (``verification`` says so)."""
        if self._reference is not None:  # restore_value arguments as they were made
            given = {**inputs, **inputs.get("_pristine", {})}
            return self._reference({k: v for k, v in given.items() if not k.startswith("_")})
        if not self.configs:
            raise InvalidRequest(f"kernel {self.name}: without configs, give a reference",
                                 field="reference")
        outs = self._outputs_of(self.configs[0], inputs)
        _check_finite(self.name, self.configs[0], outs, inputs)
        self._cross_check(inputs, outs)
        return outs[0] if len(outs) == 1 else outs

    def _outputs_of(self, config: KernelConfig, inputs: dict[str, Any]) -> tuple[Any, ...]:
        fresh = dict(inputs)
        fresh.pop("_prepared", None)
        names = inputs["_outputs"]
        for name in names:
            clone = output_tensor(inputs[name]).clone().fill_(float("nan"))
            fresh[name] = with_output(inputs[name], clone)
        self.launch(config, fresh)
        return tuple(output_tensor(fresh[name]) for name in names)

    def _cross_check(self, inputs: dict[str, Any], outs: tuple[Any, ...]) -> None:
        """Once per problem in a process: the list's second config must agree with its first
        (a wrong kernel whose every config is wrong alike still passes; a reference does not)."""
        from tuner.verification import compare

        if len(self.configs) < 2:
            return
        shape, dtype = self.problem_of(inputs)
        problem = (tuple(sorted(shape.items())), dtype)
        if problem in self._cross_checked:
            return
        second = self._outputs_of(self.configs[1], inputs)
        for name, a, b in zip(inputs["_outputs"], outs, second, strict=True):
            wrong = compare(b.float(), a.float(), self.tolerance(dtype), dtype,
                            self.output_check, f"output {name}: ")
            if isinstance(wrong, str):
                raise WrongOutput(f"kernel {self.name} has no reference and its configs "
                                  f"{self.configs[0].key()} and {self.configs[1].key()} "
                                  f"disagree ({wrong}); give it a reference")
        self._cross_checked.add(problem)

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


def _check_finite(name: str, config: KernelConfig, outs: Sequence[Any],
                  inputs: Mapping[str, Any]) -> None:
    """WrongOutput when an output has NaN/Inf although every floating input is finite."""
    import torch

    finite_inputs = all(bool(torch.isfinite(v).all()) for k, v in inputs.items()
                        if isinstance(v, torch.Tensor) and v.is_floating_point()
                        and k not in inputs["_outputs"] and k != "out")
    if not finite_inputs:
        return
    for out_name, out in zip(inputs["_outputs"], outs, strict=True):
        bad = int((~torch.isfinite(out)).sum()) if out.is_floating_point() else 0
        if bad:
            raise WrongOutput(f"kernel {name} has no reference, and its first config "
                              f"{config.key()} wrote {bad} NaN/Inf element(s) to {out_name} "
                              "from finite inputs: the kernel is wrong here")


def _early_prune(autotuner: Any) -> Callable[[KernelConfig, dict[str, Any]], bool] | None:
    """The autotuner's ``prune_configs_by["early_config_prune"]`` as a test of one config
    against a launch's arguments (``perf_model``/``top_k`` rank rather than rule out: the
    search measures instead)."""
    prune = getattr(autotuner, "early_config_prune", None)
    if not callable(prune):
        return None

    def keeps(config: KernelConfig, args: dict[str, Any]) -> bool:
        return bool(prune([config.to_triton()], args))

    return keeps
