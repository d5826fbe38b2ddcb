"""``tuner.autotune``: a drop-in for ``@triton.autotune`` that launches with tuned configs.

    @tuner.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4), ...],
                    key=["M", "N"], name="rmsnorm")
    @triton.jit
    def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, M, N, eps, BLOCK: tl.constexpr): ...

It takes what ``triton.autotune`` takes plus the kernel's name (the name it is registered and
tuned under in the service). On the first launch for a key (the key arguments are the problem's
shape, values of any type; or ``problem(args)``; the first tensor's dtype, or ``dtype_arg``'s,
its dtype) it uses, in order:

1. an exported configs file (``TUNER_CONFIGS_FILE``/``configure(configs_file=...)``),
2. the service (``TUNER_URL``): one bulk request, prefetchable at start-up with ``prefetch``,
   under ONE deadline for the whole lookup; a shape it cannot answer exactly is reported as a
   miss, which the service queues for tuning so that the next start-up finds it tuned,
3. otherwise Triton's own autotuning over the given configs, exactly as ``triton.autotune``
   would: never worse than today. Where Triton cannot benchmark (the CPU interpreter, or no
   active GPU driver) and no ``do_bench`` was given, the list's first config instead (source
   ``first``): Triton's autotuner would fail there.

Only an exact answer (this GPU model, this kernel source, this Triton minor) is used; a launch
never fails because the service is slow or down. ``sources`` says where each key's config came
from (``file``, ``service``, ``triton``).

Exact also means timed the kernel's way (``timing``: ``TUNER_TIMING``, default ``eager-flushed``;
``cuda-graph`` for a kernel that runs in CUDA graphs, as a serving engine's decode step does).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.client import TunerClient
from tuner.config import KernelConfig
from tuner.errors import InvalidRequest
from tuner.launching import Hooks, Problem, ProblemFn, launch_kwargs, unwrap
from tuner.settings import ClientSettings
from tuner.shapes import shape_key
from tuner.timing import DEFAULT_TIMING, check_timing
from tuner.user_kernel import arg_names, config_from_triton, space_from_configs, user_version

log = logging.getLogger(__name__)

#: a config the tuner forces while it measures a decorated kernel (never set by users)
_forced: contextvars.ContextVar[KernelConfig | None] = contextvars.ContextVar(
    "tuner_forced_config", default=None)

ProblemKey = tuple[str, tuple[tuple[str, int], ...]]  # (dtype, sorted shape items)


@dataclass
class _Options:
    url: str | None = None
    api_key: str | None = None
    configs_file: str | None = None
    deadline_s: float = 2.0
    report_misses: bool = True
    timing: str = DEFAULT_TIMING
    keys_file: str | None = None


_options: _Options | None = None
_client: TunerClient | None = None
_state_lock = threading.Lock()


def _from_env() -> _Options:
    env = ClientSettings()
    return _Options(url=env.url or None, api_key=env.api_key or None,
                    configs_file=env.configs_file or None, deadline_s=env.lookup_deadline_s,
                    report_misses=env.report_misses, timing=env.timing,
                    keys_file=env.keys_file)


def default_keys_file(url: str | None) -> Path | None:
    """Where a process remembers the lookups it asked ``url`` (``TUNER_KEYS_FILE`` unset):
    ``$XDG_CACHE_HOME/tuner`` (else ``~/.cache/tuner``), one file per service."""
    if not url:
        return None
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    return Path(cache) / "tuner" / f"keys-{digest}.json"


def configure(*, url: str | None = None, api_key: str | None = None,
              configs_file: str | None = None, deadline_s: float | None = None,
              report_misses: bool | None = None, client: TunerClient | None = None,
              timing: str | None = None) -> None:
    """Where decorated kernels look configs up (overrides the ``TUNER_*`` environment).
    ``client``: a ready TunerClient (tests pass one with an in-process transport); ``timing``:
    the method kernels without their own choose configs by."""
    global _options, _client
    with _state_lock:
        options = _options or _from_env()
        if url is not None:
            options.url = url or None
        if api_key is not None:
            options.api_key = api_key
        if configs_file is not None:
            options.configs_file = configs_file or None
        if deadline_s is not None:
            options.deadline_s = deadline_s
        if report_misses is not None:
            options.report_misses = report_misses
        if timing is not None:
            options.timing = check_timing(timing)
        _options, _client = options, client


def shared_client() -> TunerClient:
    """The one client every decorated kernel of this process shares."""
    global _options, _client
    with _state_lock:
        if _client is None:
            options = _options = _options or _from_env()
            keys = options.keys_file if options.keys_file is not None else (
                default_keys_file(options.url))
            _client = TunerClient(options.url, api_key=options.api_key,
                                  timeout=options.deadline_s,
                                  configs_file=options.configs_file,
                                  report_misses=options.report_misses, timing=options.timing,
                                  keys_file=keys or None)
        return _client


@contextlib.contextmanager
def forced_config(config: KernelConfig) -> Iterator[None]:
    """Launch decorated kernels with ``config`` inside this block (how benchmarks and the
    tuner time one config of a decorated kernel)."""
    token = _forced.set(config)
    try:
        yield
    finally:
        _forced.reset(token)


class Autotuned:
    """A Triton kernel launched with configs from a file, the service, or Triton's autotuning.

    ``kernel[grid](*args, **kwargs)`` as with any Triton kernel.
    """

    def __init__(self, fn: Any, configs: Sequence[Any], key: Sequence[str], name: str,
                 triton_options: dict[str, Any], problem: ProblemFn | None = None,
                 dtype_arg: str | None = None, timing: str | None = None) -> None:
        self.fn = fn
        self.name = name
        #: the timing method its configs are chosen by (None: the shared client's)
        self.timing = check_timing(timing) if timing is not None else None
        self.configs = list(configs)
        self.key = list(key)
        self.arg_names = arg_names(fn)
        unknown = [k for k in [*self.key, *([dtype_arg] if dtype_arg else [])]
                   if k not in self.arg_names]
        if unknown:
            raise ValueError(f"tuner.autotune({name!r}): {unknown} are not arguments of "
                             f"the kernel ({', '.join(self.arg_names)})")
        #: how a launch's arguments name its problem (shared with ``tuner.Kernel``)
        self.problem_spec = Problem(tuple(self.key), tuple(self.arg_names), problem, dtype_arg)
        #: each listed config's pre_hook (a served config outside the list gets the shared one)
        self.hooks = Hooks.of(None, self.configs)
        #: what it runs and its configs (``user_version``): a ``tuner.Kernel`` of it agrees
        self.version = _version(fn, self.configs)
        self._triton_options = triton_options
        self._triton: Any = None
        #: whether Triton's autotuner can time configs here (None: not yet asked)
        self._can_bench: bool | None = None
        self._chosen: dict[ProblemKey, KernelConfig | None] = {}
        #: the hot path: a launch whose arguments are all positional, its key's values plain
        #: integers, goes from (its argument count, key values, the dtype of ``dtype_arg`` or
        #: the first argument) straight to its launch keywords (None: Triton's autotuner),
        #: without naming its arguments again (``fast_key``); a custom ``problem`` reads any
        #: argument, so it has none
        self._key_pos = (None if problem is not None else
                         tuple(self.arg_names.index(k) for k in self.key))
        self._dtype_pos = self.arg_names.index(dtype_arg) if dtype_arg else 0
        self._fast: dict[tuple[Any, ...], dict[str, Any] | None] = {}
        #: where each problem's config came from: "file", "service", "triton" or "first"
        self.sources: dict[ProblemKey, str] = {}
        self._lock = threading.Lock()

    # -- what a launch is ------------------------------------------------------------------------

    def problem(self, named: Mapping[str, Any]) -> ProblemKey | None:
        """(dtype, shape) of a launch: the key's values (of any type, as integers:
        ``tuner.shapes.key_value``) or the kernel's ``problem(args)``, and the dtype of
        ``dtype_arg`` (else the first tensor's). None when ``problem`` fails on these
        arguments (such launches are Triton's to autotune)."""
        try:
            shape = self.problem_spec.shape(named)
        except Exception as exc:  # noqa: BLE001 - a launch never fails for the lookup
            log.warning("%s: problem(args) failed (%s); Triton's autotuning decides",
                        self.name, exc)
            return None
        return (self.problem_spec.dtype(named), tuple(sorted(shape.items())))

    # -- choosing ---------------------------------------------------------------------------

    def prefetch(self, shapes: Sequence[Mapping[str, int]], dtype: str) -> int:
        """Ask the service for many shapes in one request (at model start-up); returns how
        many it answered. Later launches of these shapes need no request."""
        return shared_client().prefetch(self.name, shapes, dtype, kernel_version=self.version,
                                        timing=self.timing)

    def config_for(self, problem: ProblemKey) -> KernelConfig | None:
        """The tuned config for ``problem`` from the file or the service (None: Triton's own
        autotuning decides). Looked up once per problem."""
        with self._lock:
            if problem in self._chosen:
                return self._chosen[problem]
        dtype, items = problem
        found = shared_client().exact_config(self.name, dict(items), dtype,
                                             kernel_version=self.version, timing=self.timing)
        config, source = found if found else (None, "triton")
        with self._lock:
            self._chosen[problem] = config
            self.sources[problem] = source
        if config is not None:
            log.info("%s %s %s: tuned config from the %s: %s", self.name, dtype,
                     shape_key(dict(items)), source, config.key())
        return config

    def _untunable_fallback(self, problem: ProblemKey | None) -> KernelConfig | None:
        """The list's first config where Triton's autotuner cannot time configs here (the
        interpreter, no active GPU driver) and no ``do_bench`` stands in; else None (Triton's
        autotuning decides). Said once per problem."""
        if self._can_bench is None:
            self._can_bench = ("do_bench" in self._triton_options
                               or triton_can_benchmark())
        if self._can_bench or not self.configs:
            return None
        config = config_from_triton(self.configs[0])
        with self._lock:
            said = problem is not None and self.sources.get(problem) == "first"
            if problem is not None:
                self.sources[problem] = "first"
        if not said:
            where = (f"{problem[0]} {shape_key(dict(problem[1]))}" if problem is not None
                     else "a launch")
            log.warning("%s %s: no tuned config (configs file, service) and Triton cannot "
                        "benchmark here (CPU interpreter or no active GPU driver): launching "
                        "the first listed config %s", self.name, where, config.key())
        return config

    def _triton_autotuner(self) -> Any:
        if self._triton is None:
            import triton

            self._triton = triton.autotune(configs=self.configs, key=self.key,
                                           **self._triton_options)(self.fn)
            # looked up under this kernel's name already: ``tuner.install`` leaves it to Triton
            self._triton.tuner_unserved = True
        return self._triton

    # -- launching -------------------------------------------------------------------------

    def fast_key(self, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The hot path's key of a launch with positional arguments only: None where it has
        none (a custom ``problem``, a key argument missing or not a plain integer, or a
        dtype that is not the first tensor's)."""
        positions = self._key_pos
        if positions is None or len(args) <= max(positions, default=0):
            return None
        values = tuple(args[i] for i in positions)
        for value in values:
            if type(value) is not int:
                return None
        dtype = getattr(args[self._dtype_pos], "dtype", None) if self._dtype_pos < len(
            args) else None
        if dtype is None:  # the problem's dtype is a later argument's: the full path
            return None
        return (len(args), values, dtype)

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        fast = None
        if not kwargs and not warmup and _forced.get() is None:
            fast = self.fast_key(args)
            if fast is not None and fast in self._fast:
                launch = self._fast[fast]
                if launch is None:
                    return self._triton_autotuner().run(*args, grid=grid, warmup=False)
                return self.fn.run(*args, grid=grid, warmup=False, **launch)
        config = _forced.get()
        if config is None:
            named = {**dict(zip(self.arg_names, args, strict=False)), **kwargs}
            problem = self.problem(named)
            config = self.config_for(problem) if problem is not None else None
            if config is None:
                config = self._untunable_fallback(problem)
        if config is None:
            if fast is not None:
                self._fast[fast] = None
            return self._triton_autotuner().run(*args, grid=grid, warmup=warmup, **kwargs)
        hook = self.hooks.pre_hook(config)
        if fast is not None and hook is None:
            self._fast[fast] = launch_kwargs(config)
        if hook is not None:  # as Triton calls a config's pre_hook before its launch
            hook({**dict(zip(self.arg_names, args, strict=False)), **kwargs,
                  **launch_kwargs(config)})
        return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs, **launch_kwargs(config))

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def warmup(self, *args: Any, grid: Any, **kwargs: Any) -> Any:
        return self.run(*args, grid=grid, warmup=True, **kwargs)

    def __repr__(self) -> str:
        return f"tuner.autotune({self.name!r}, version={self.version})"


def triton_can_benchmark() -> bool:
    """Whether Triton's autotuner can time configs in this process: not on the CPU interpreter
    (``TRITON_INTERPRET=1``), nor where Triton finds no active GPU driver ("0 active
    drivers")."""
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        from triton.runtime import driver

        driver.active.get_current_device()
    except Exception:  # noqa: BLE001 - no usable driver, whatever Triton raises
        return False
    return True


def _version(fn: Any, configs: Sequence[Any]) -> str:
    """``user_version`` over the decorator's configs and the space around them (none where
    they set different parameters: Triton takes such a list, a ``tuner.Kernel`` does not)."""
    listed = [config_from_triton(c) for c in configs]
    try:
        space = space_from_configs(listed) if listed else None
    except InvalidRequest:
        space = None
    return user_version(fn, listed, space)


def autotune(configs: Sequence[Any], key: Sequence[str], *, name: str,
             problem: ProblemFn | None = None, dtype_arg: str | None = None,
             timing: str | None = None, **triton_options: Any) -> Any:
    """``@triton.autotune`` plus the kernel's name: see the module docstring. ``problem``:
    ``args -> {dimension: value}`` where the problem has dimensions beyond the key (batch,
    heads, causality); ``dtype_arg``: the argument whose dtype is the problem's (default: the
    first tensor); ``timing``: the timing method its configs are chosen by (``cuda-graph``
    where it runs in CUDA graphs; default ``TUNER_TIMING``, else ``eager-flushed``). Every
    other keyword (``prune_configs_by``, ``reset_to_zero``,
    ``restore_value``, ``do_bench``, ...) is passed to Triton's autotuner, which decides when
    neither the file nor the service has an exact config."""

    def decorator(fn: Any) -> Autotuned:
        unwrap(fn)  # fail now, not at the first launch, if this is not a Triton kernel
        for config in configs:
            config_from_triton(config)
        return Autotuned(fn, configs, key, name, triton_options, problem, dtype_arg, timing)

    return decorator
