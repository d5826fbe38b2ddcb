"""Launching a user's Triton kernel the way ``triton.autotune`` would, with a config of ours.

One home for what a launch of a wrapped kernel needs, shared by ``tuner.Kernel`` (tuning) and
``tuner.autotune`` (serving):

- ``unwrap``: the autotuner (``triton.autotune``, a library's subclass of Triton's
  ``Autotuner`` such as fla-core's ``CachedAutotuner``, or ``tuner.autotune``), what sits under
  it (``triton.heuristics`` or the ``@triton.jit`` function: launched as it is, so stacked
  heuristics still fill in their meta-parameters) and the plain Python function;
- ``Problem``: a launch's problem (dimensions and dtype) from its arguments: the autotune key
  (values of any type, ``tuner.shapes.key_value``), or the user's ``problem(args)`` for
  dimensions beyond the key (batch, heads, causality); the dtype of the first tensor argument
  or of the one named by ``dtype_arg``;
- ``Hooks``: what ``triton.autotune`` does around a launch: ``reset_to_zero``,
  ``restore_value``, and each config's ``pre_hook`` (a config the list does not hold gets the
  hook the list's configs share).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.config import LAUNCH_OPTIONS, KernelConfig
from tuner.shapes import key_value


@dataclass(frozen=True)
class Unwrapped:
    """A (possibly wrapped) Triton kernel taken apart."""

    #: the autotuner object, if the kernel was decorated with one (else None)
    autotuner: Any
    #: what a launch with a config of ours runs: the jit function, or a ``Chain`` of the
    #: heuristics layers around it (the autotuner left out)
    runner: Any
    #: the ``@triton.jit`` function (``JITFunction`` / ``InterpretedFunction``)
    jit: Any
    #: the plain Python function the kernel was written as
    python: Callable[..., Any]


def _is_autotuner(obj: Any) -> bool:
    return hasattr(obj, "configs") and (hasattr(obj, "keys") or hasattr(obj, "key")) \
        and hasattr(obj, "fn")


class Chain:
    """The layers of a wrapped kernel without its autotuner: each ``triton.heuristics`` layer
    (outside or inside the autotuner) adds its meta-parameters, as ``Heuristics.run`` does,
    then the jit function runs. fla-core stacks heuristics over ``triton.autotune`` in 203 of
    its 258 autotuned kernels, so the autotuner is not always the outermost layer."""

    def __init__(self, heuristics: Sequence[Any], jit: Any) -> None:
        self.heuristics, self.jit = tuple(heuristics), jit

    def run(self, *args: Any, **kwargs: Any) -> Any:
        for layer in self.heuristics:
            for name, heur in layer.values.items():
                kwargs[name] = heur({**dict(zip(layer.arg_names, args, strict=False)),
                                     **kwargs})
        return self.jit.run(*args, **kwargs)


def unwrap(fn: Any) -> Unwrapped:
    """Take ``fn`` apart: its autotuner (at any layer), what a launch with a config of ours
    runs (every heuristics layer, then the jit function), its jit function, its Python
    function. Raises TypeError for something that is not a Triton kernel."""
    autotuner, heuristics, layer = None, [], fn
    while hasattr(layer, "fn") and not inspect.isfunction(layer.fn):
        if autotuner is None and _is_autotuner(layer):
            autotuner = layer
        elif isinstance(getattr(layer, "values", None), dict):
            heuristics.append(layer)
        layer = layer.fn
    python = getattr(layer, "fn", None)
    if not inspect.isfunction(python):
        raise TypeError(f"{fn!r} is not a Triton kernel (a @triton.jit function, possibly "
                        "under triton.autotune / triton.heuristics)")
    runner = Chain(heuristics, layer) if heuristics else layer
    return Unwrapped(autotuner, runner, layer, python)


def autotune_keys(autotuner: Any) -> list[str]:
    """The key argument names of an autotuner (Triton's ``keys``, ours ``key``)."""
    if autotuner is None:
        return []
    keys = getattr(autotuner, "keys", None)
    if keys is None or callable(keys):  # a dict-like ``keys()`` method is not a key list
        keys = getattr(autotuner, "key", [])
    return list(keys or [])


def output_tensor(value: Any) -> Any:
    """The tensor an output argument writes: itself, or a tensor descriptor's base."""
    base = getattr(value, "base", None)
    return base if base is not None and hasattr(base, "data_ptr") else value


def with_output(value: Any, tensor: Any) -> Any:
    """``value`` writing to ``tensor`` instead: the tensor, or a copy of a tensor descriptor
    over it (same shape, strides and block shape)."""
    if value is tensor or output_tensor(value) is value:
        return tensor
    return dataclasses.replace(value, base=tensor)


def dtype_name(value: Any) -> str | None:
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        base = getattr(value, "base", None)  # a tensor descriptor: its tensor's dtype
        dtype = getattr(base, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


ProblemFn = Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class Problem:
    """How a launch's arguments name its problem (see the module docstring)."""

    key: tuple[str, ...]
    arg_names: tuple[str, ...]
    problem: ProblemFn | None = None
    dtype_arg: str | None = None

    def shape(self, named: Mapping[str, Any]) -> dict[str, int]:
        """The launch's problem dimensions, every value an integer (``key_value``)."""
        values = self.problem(named) if self.problem is not None else {
            k: named.get(k) for k in self.key}
        return {str(k): key_value(v) for k, v in values.items()}

    def dtype(self, named: Mapping[str, Any]) -> str:
        """The dtype of ``dtype_arg``, else of the first tensor argument; "none" without one."""
        if self.dtype_arg is not None:
            return dtype_name(named.get(self.dtype_arg)) or "none"
        for name in self.arg_names:
            found = dtype_name(named.get(name))
            if found:
                return found
        return "none"


Hook = Callable[[dict[str, Any]], Any]


@dataclass
class Hooks:
    """What ``triton.autotune`` does around each launch of a config."""

    reset_to_zero: tuple[str, ...] = ()
    restore_value: tuple[str, ...] = ()
    #: each listed config's pre_hook, by config
    pre_hooks: dict[KernelConfig, Hook] = field(default_factory=dict)
    #: the hook for configs the list does not hold: the one the list's configs share (None
    #: where they have none or disagree)
    shared_pre_hook: Hook | None = None

    @classmethod
    def of(cls, autotuner: Any, configs: Sequence[Any],
           reset_to_zero: Sequence[str] | None = None,
           restore_value: Sequence[str] | None = None) -> Hooks:
        from tuner.user_kernel import config_from_triton

        hooks = {config_from_triton(c): c.pre_hook for c in configs
                 if getattr(c, "pre_hook", None) is not None}
        distinct = {id(h) for h in hooks.values()}
        codes = {getattr(h, "__code__", None) for h in hooks.values()}
        shared = next(iter(hooks.values())) if hooks and (
            len(distinct) == 1 or (len(codes) == 1 and None not in codes)) else None
        zero = reset_to_zero if reset_to_zero is not None else getattr(
            autotuner, "reset_to_zero", None) or ()
        restore = restore_value if restore_value is not None else getattr(
            autotuner, "restore_value", None) or ()
        return cls(tuple(zero), tuple(restore), hooks, shared)

    def pre_hook(self, config: KernelConfig) -> Hook | None:
        return self.pre_hooks.get(config, self.shared_pre_hook)

    def before(self, config: KernelConfig, args: dict[str, Any],
               pristine: Mapping[str, Any] | None = None) -> None:
        """Zero ``reset_to_zero``, put back ``restore_value`` from ``pristine``, run the
        config's pre_hook (with the arguments and the config, as Triton calls it)."""
        for name in self.reset_to_zero:
            args[name].zero_()
        for name in self.restore_value:
            if pristine is not None and name in pristine:
                args[name].copy_(pristine[name])
        hook = self.pre_hook(config)
        if hook is not None:
            hook({**args, **launch_kwargs(config)})


def launch_kwargs(config: KernelConfig) -> dict[str, Any]:
    """The keyword arguments a config adds to a launch: its meta-parameters and launch
    options (``num_ctas`` and ``maxnreg`` only where the config sets them)."""
    options = {k: config[k] for k in LAUNCH_OPTIONS if k in config}
    return {**config.meta, **options, "num_warps": config.num_warps,
            "num_stages": config.num_stages}


class _Captured(Exception):
    """Raised by the stand-in ``run`` once the library's launcher reached the kernel."""


@dataclass(frozen=True)
class Capture:
    """What a library's launcher passed to the kernel: its grid and its arguments by name."""

    grid: Any
    args: dict[str, Any]


def capture_launch(fn: Any, call: Callable[[], Any]) -> Capture:
    """Run ``call`` (the library's own launcher, e.g. ``lambda: l2norm_fwd(x)``) with the
    launch of ``fn`` intercepted: the grid and arguments it passes, by name, and nothing of the
    kernel launched (the launcher stops there). The autotuner's ``run`` (or, for a kernel with
    none, the jit function's) is replaced on the object for the call: heuristics layers outside
    it have added their values already, and they are recomputed the same at each launch."""
    parts = unwrap(fn)
    target = parts.autotuner if parts.autotuner is not None else parts.jit
    names = list(inspect.signature(parts.python).parameters)
    seen: list[Capture] = []

    def record(*args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        seen.append(Capture(grid, {**dict(zip(names, args, strict=False)), **{
            k: v for k, v in kwargs.items() if k in names}}))
        raise _Captured

    had = "run" in vars(target)
    saved = vars(target).get("run")
    target.run = record
    try:
        call()
    except _Captured:
        pass
    finally:
        if had:
            target.run = saved
        else:
            del target.run
    if not seen:
        raise ValueError(f"the call never launched {parts.python.__name__}: give the "
                         "library function that launches this kernel")
    return seen[0]
