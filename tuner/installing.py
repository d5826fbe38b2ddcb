"""``tuner.install()``: every ``triton.autotune`` kernel of the process gets its configs from
this project, with no change to its source.

    import tuner
    tuner.install()   # or TUNER_INSTALL=1 before ``import tuner``,
                      # or ``python -m tuner.run SCRIPT [ARGS]``

From then on every Triton ``Autotuner`` in the process (already built or built later,
third-party libraries' included, and subclasses such as fla-core's ``CachedAutotuner``), on
the first launch of each key, uses in order: the exported configs file, the service (the
shared ``TunerClient``: one request under its deadline, misses reported), then Triton's own
benchmarking over the kernel's list (``Autotuner.run`` as it is). With ``pinned``
(``TUNER_PINNED=1``) nothing is benchmarked at run time: the store's answer, else the
kernel's first config, so that every process makes the same choice. Where Triton benchmarked,
every config's timings are sent to the service in the background (``POST /configs/measured``),
stored as the key's best labelled ``client-measured``, below any worker's.

How (Triton has no hook before it benchmarks: ``knobs.autotuning.listener`` is told after):
``Autotuner.run`` asks ``key not in self.cache`` before it benchmarks a key, so each
autotuner's ``cache`` (Triton's own dict, keyed by Triton's own key: the autotune key's values
then every tensor argument's dtype) is replaced by a ``ServedCache``, a dict whose
``__contains__`` answers a key it does not hold by one lookup and stores the config found,
which ``run`` then launches as it launches a cached choice (its ``pre_hook`` included); for
that one launch ``autotuner.fn`` is wrapped so that a served config that fails to launch is
launched again as Triton would. A launch of a key decided costs one dict lookup more than
Triton's. The caches of autotuners
that exist are replaced at ``install`` (found through ``gc``); ``Autotuner.__init__`` is
patched at class level so that every one built later gets one. ``uninstall`` restores
``__init__`` and plain dicts (keys decided stay decided, as in Triton's own cache).

Identity: a kernel is its qualified name (``module.qualname`` of its Python function), its
version (the kernel version helper over its jit function and its config list) and the
process's device and Triton version; a problem is the autotune key's values by name (any type,
``tuner.shapes.key_value``) and the first tensor's dtype. A served config the list does not
hold gets the pre_hook the list's configs share; one that sets other parameters, a lookup that
fails and a malformed answer leave the key to Triton, with one warning per kernel.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any

from tuner.config import KernelConfig
from tuner.launching import Hooks, unwrap
from tuner.shapes import key_value

log = logging.getLogger(__name__)

#: the original ``Autotuner.__init__`` while installed (None: not installed)
_original_init: Any = None
_pinned = False
_hooked: weakref.WeakSet[Any] = weakref.WeakSet()
#: background sends of measured timings (``flush_reports``)
_reports: list[threading.Thread] = []
_lock = threading.Lock()


def _autotuner_class() -> Any:
    from triton.runtime.autotuner import Autotuner

    return Autotuner


def kernel_name(autotuner: Any) -> str:
    """The name a hooked kernel is known by: its Python function's module and qualname."""
    python = unwrap(autotuner).python
    return f"{python.__module__}.{python.__qualname__}"


def kernel_version(autotuner: Any) -> str:
    """The kernel's version: the version helper ``tuner.autotune`` uses, over the autotuner (its
    jit function and what that reaches) and its config list."""
    from tuner.autotuning import _version

    return _version(autotuner, list(autotuner.configs))


class ServedCache(dict[Any, Any]):
    """An autotuner's ``cache`` that answers a key it does not hold from the configs file or
    the service (see the module docstring). ``sources``: Triton's key -> ``"file"``,
    ``"service"``, ``"pinned"`` (the first config, pinned mode) or ``"triton"``."""

    def __init__(self, autotuner: Any, *args: Any) -> None:
        super().__init__(*args)
        self._autotuner = weakref.ref(autotuner)
        self.sources: dict[Any, str] = {}
        self._identity: tuple[str, str] | None = None
        self._warned = False

    def __setitem__(self, key: Any, config: Any) -> None:
        """Triton stores its own decision (benchmarked, or its one config left after pruning):
        what it measured is sent to the service after (``_Measured``)."""
        dict.__setitem__(self, key, config)
        autotuner = self._autotuner()
        if autotuner is not None and not _pinned and not isinstance(autotuner.fn, _Measured):
            autotuner.fn = _Measured(autotuner, self, key)

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        if key in self.sources:  # asked already: Triton's to decide (it is benchmarking)
            return False
        return self._serve(key)

    def _serve(self, key: Any) -> bool:
        autotuner = self._autotuner()
        config, source = None, "triton"
        if autotuner is not None:
            try:
                config, source = self._choose(autotuner, key)
            except Exception as exc:  # noqa: BLE001 - a launch never fails for the lookup
                self._warn(f"the lookup failed ({type(exc).__name__}: {exc})")
                config, source = None, "triton"
        self.sources[key] = source
        if config is None:
            return False
        dict.__setitem__(self, key, config)
        if autotuner is not None and source != "pinned":
            if isinstance(autotuner.fn, _FirstLaunch | _Measured):  # one that never launched
                autotuner.fn = autotuner.fn.fn
            autotuner.fn = _FirstLaunch(autotuner, self, key, config)
        return True

    def failed(self, key: Any, exc: BaseException) -> None:
        """A launch with the config served for ``key`` raised: the key is Triton's again (the
        list's first config in pinned mode)."""
        dict.pop(self, key, None)
        self._warn(f"the launch with the served config failed ({type(exc).__name__}: "
                   f"{str(exc)[:200]})")
        autotuner = self._autotuner()
        if _pinned and autotuner is not None:
            dict.__setitem__(self, key, autotuner.configs[0])
            self.sources[key] = "pinned"
        else:
            self.sources[key] = "triton"

    def identity(self, autotuner: Any) -> tuple[str, str]:
        """(name, version) of the kernel, computed once."""
        if self._identity is None:
            self._identity = (kernel_name(autotuner), kernel_version(autotuner))
        return self._identity

    def _choose(self, autotuner: Any, key: Any) -> tuple[Any, str]:
        """The listed (or rebuilt) ``triton.Config`` for Triton's ``key`` and its source."""
        from tuner.autotuning import shared_client

        if vars(autotuner).get("tuner_unserved"):  # ``tuner.autotune``'s own fallback
            return (autotuner.configs[0], "pinned") if _pinned else (None, "triton")
        problem = problem_of(autotuner, key)
        found = None
        if problem is not None:
            name, version = self.identity(autotuner)
            shape, dtype = problem
            found = shared_client().exact_config(name, shape, dtype, kernel_version=version)
        if found is not None:
            config = self._triton_config(autotuner, found[0])
            if config is not None:
                log.info("%s %s: tuned config from the %s: %s", self.identity(autotuner)[0],
                         key, found[1], found[0].key())
                return config, found[1]
        if _pinned:
            return autotuner.configs[0], "pinned"
        return None, "triton"

    def _triton_config(self, autotuner: Any, config: KernelConfig) -> Any:
        """The list's ``triton.Config`` equal to ``config``, else one built with the pre_hook
        the list's configs share; None (one warning) where the list sets other parameters or
        its configs' pre_hooks differ."""
        from tuner.user_kernel import config_from_triton

        listed = list(autotuner.configs)
        for candidate in listed:
            if config_from_triton(candidate) == config:
                return candidate
        names = {frozenset(c.kwargs) for c in listed}
        if names != {frozenset(config.meta)}:
            self._warn(f"the served config {config.key()} sets other parameters than the "
                       "kernel's configs")
            return None
        hooks = Hooks.of(autotuner, listed)
        if hooks.pre_hooks and hooks.shared_pre_hook is None:
            self._warn(f"the served config {config.key()} is not listed and the listed "
                       "configs' pre_hooks differ")
            return None
        import triton

        extra = {k: config[k] for k in ("num_ctas", "maxnreg") if k in config}
        return triton.Config(dict(config.meta), num_warps=config.num_warps,
                             num_stages=config.num_stages, pre_hook=hooks.shared_pre_hook,
                             **extra)

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            autotuner = self._autotuner()
            name = kernel_name(autotuner) if autotuner is not None else "a kernel"
            log.warning("%s: %s; Triton's autotuning decides (shown once per kernel)", name,
                        why)


class _Measured:
    """Stands in for ``autotuner.fn`` from Triton's decision on a key to the launch that
    follows it, and puts it back: where Triton benchmarked (``configs_timings`` set anew),
    every config's timings are sent to the service in the background as a client-measured
    result (``report_measured``)."""

    def __init__(self, autotuner: Any, cache: ServedCache, key: Any) -> None:
        self.fn, self._autotuner, self._cache, self._key = autotuner.fn, autotuner, cache, key
        self._before = vars(autotuner).get("configs_timings")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        autotuner = self._autotuner
        autotuner.fn = self.fn
        timings = vars(autotuner).get("configs_timings")
        if timings and timings is not self._before:
            thread = threading.Thread(target=_report, args=(autotuner, self._cache, self._key,
                                                            dict(timings)),
                                      daemon=True, name="tuner-measured")
            _reports.append(thread)
            thread.start()
        return self.fn.run(*args, **kwargs)


def _report(autotuner: Any, cache: ServedCache, key: Any, timings: dict[Any, Any]) -> None:
    """Send Triton's timings of ``key`` (each config's p50, p20, p80) to the service."""
    from tuner.autotuning import shared_client
    from tuner.user_kernel import config_from_triton

    try:
        client = shared_client()
        problem = problem_of(autotuner, key)
        if client.base_url is None or problem is None or client.device is None:
            return
        name, version = cache.identity(autotuner)
        measured = []
        for config, times in timings.items():
            p50, p20, p80 = (list(times) * 3)[:3] if isinstance(times, list | tuple) else (
                [float(times)] * 3)
            if all(0 < t < float("inf") for t in (p50, p20, p80)):
                measured.append({"config": config_from_triton(config).to_dict(),
                                 "p20_ms": p20, "p50_ms": p50, "p80_ms": p80})
        if measured:
            gpu = {k: v for k, v in _gpu_sample().items() if v is not None}
            client.report_measured([{
                "kernel": name, "kernel_version": version, "dtype": problem[1],
                "shape": problem[0], "device": client.device,
                "triton_version": client.triton_version or "", "timings": measured,
                "timed_by": TIMED_BY, **({"gpu": gpu} if gpu else {}),
                **({"triton_key": list(key)} if _json_scalars(key) else {})}])
    except Exception as exc:  # noqa: BLE001 - a background report never fails a launch
        cache._warn(f"measured timings not sent ({type(exc).__name__}: {exc})")


#: how Triton's autotuner times each config (``Autotuner._bench``: ``do_bench``, eager, its L2
#: flushed before each run; the 50th, 20th and 80th percentiles)
TIMED_BY = "triton.autotune (do_bench: eager, L2 flushed)"
_monitor: Any = None


def _gpu_sample() -> dict[str, Any]:
    """The GPU's clocks, power, temperature and throttle reasons now (NVML; empty without a GPU
    or NVML), sampled right after Triton's benchmark, reported with its timings."""
    global _monitor
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        if _monitor is None:
            from tuner.gpu_state import open_monitor, torch_device_ids

            _monitor = open_monitor(*torch_device_ids(torch.cuda.current_device()))
        return dict(_monitor.sample())
    except Exception:  # noqa: BLE001 - the GPU's state is a label, never a failure
        return {}


def _json_scalars(key: Any) -> bool:
    """Whether Triton's key is a tuple of JSON scalars (sent as it is: ``tuner export
    --format fla`` writes it as the key libraries like fla look their files up by)."""
    return isinstance(key, tuple) and len(key) <= 64 and all(
        v is None or isinstance(v, bool | int | float | str) and (
            not isinstance(v, str) or len(v) <= 100) for v in key)


def flush_reports(timeout_s: float = 10.0) -> None:
    """Wait for the measured timings being sent (tests, and a process about to exit)."""
    deadline = time.monotonic() + timeout_s
    while _reports:
        _reports.pop().join(max(0.0, deadline - time.monotonic()))


class _FirstLaunch:
    """Stands in for ``autotuner.fn`` (what ``run`` launches with the chosen config) for the
    first launch after a key was served, and puts it back: a launch with a served config that
    raises (it does not compile here) is launched again as Triton would, with the key Triton's
    (the list's first config in pinned mode). Later launches meet ``fn`` itself: the hot path
    is untouched."""

    def __init__(self, autotuner: Any, cache: ServedCache, key: Any, config: Any) -> None:
        self.fn, self._autotuner, self._cache = autotuner.fn, autotuner, cache
        self._key, self._config = key, config

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        autotuner = self._autotuner
        autotuner.fn = self.fn
        try:
            return self.fn.run(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - never a failed launch for a served config
            self._cache.failed(self._key, exc)
            tuned = self._config.all_kwargs()
            rest = {k: v for k, v in kwargs.items() if k not in tuned}
            return type(autotuner).run(autotuner, *args, **rest)


def problem_of(autotuner: Any, key: Any) -> tuple[dict[str, int], str] | None:
    """(shape, dtype) of Triton's key: the autotune key's values by name, then the first
    tensor's dtype (``"none"`` without one); None for a key not shaped so."""
    names = list(autotuner.keys)
    if not isinstance(key, tuple) or len(key) < len(names):
        return None
    dtypes = key[len(names):]
    if not all(isinstance(d, str) for d in dtypes):
        return None
    shape = {name: key_value(value) for name, value in zip(names, key, strict=False)}
    dtype = dtypes[0].removeprefix("torch.") if dtypes else "none"
    return shape, dtype


def hook(autotuner: Any) -> ServedCache:
    """Give ``autotuner`` a ``ServedCache`` (keeping what its cache holds); returns it."""
    cache = getattr(autotuner, "cache", None)
    if not isinstance(cache, ServedCache):
        cache = ServedCache(autotuner, cache or {})
        autotuner.cache = cache
        _hooked.add(autotuner)
    return cache


def sources(kernel: Any) -> dict[Any, str]:
    """Where each of a hooked kernel's keys got its config (Triton's key -> source); the
    kernel may be given at any layer (heuristics over the autotuner)."""
    autotuner = unwrap(kernel).autotuner
    cache = getattr(autotuner, "cache", None)
    return dict(cache.sources) if isinstance(cache, ServedCache) else {}


def installed() -> bool:
    return _original_init is not None


def install(*, pinned: bool | None = None) -> None:
    """Serve every Triton autotuner of this process (see the module docstring). ``pinned``:
    never benchmark at run time (default: ``TUNER_PINNED=1``). Calling it again only updates
    ``pinned``."""
    global _original_init, _pinned
    autotuner_class = _autotuner_class()
    with _lock:
        _pinned = os.environ.get("TUNER_PINNED", "") == "1" if pinned is None else pinned
        if _original_init is not None:
            return
        original = _original_init = autotuner_class.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            hook(self)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        autotuner_class.__init__ = __init__
        for autotuner in _existing(autotuner_class):
            hook(autotuner)


def _existing(autotuner_class: Any) -> list[Any]:
    """The autotuners that exist: those the garbage collector tracks, and those reachable from
    a module's globals through ``fn`` layers (``gc.freeze()``, which servers call, hides
    objects from ``gc.get_objects``)."""
    found = {id(o): o for o in gc.get_objects()
             if issubclass(type(o), autotuner_class)}  # type(): no lazy proxy is asked
    from triton.runtime.jit import KernelInterface

    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            while issubclass(type(value), KernelInterface):  # autotune / heuristics / jit
                if issubclass(type(value), autotuner_class):
                    found[id(value)] = value
                value = vars(value).get("fn")
    return list(found.values())


def uninstall() -> None:
    """Triton's own behaviour again: ``Autotuner.__init__`` restored, every hooked cache a
    plain dict of what it held."""
    global _original_init
    with _lock:
        if _original_init is None:
            return
        _autotuner_class().__init__ = _original_init
        _original_init = None
        for autotuner in list(_hooked):
            cache = getattr(autotuner, "cache", None)
            if isinstance(cache, ServedCache):
                autotuner.cache = dict(cache)
            if isinstance(autotuner.fn, _FirstLaunch | _Measured):
                autotuner.fn = autotuner.fn.fn
        _hooked.clear()
