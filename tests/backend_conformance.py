"""The Backend contract (``tuner/backends/base.py``), checked on a real backend: what the search
loop and the worker rely on, whatever measures (the CPU interpreter's child, a replay table, the
GPU's child in ``tests/gpu/``). Each ``check_*`` takes an open backend and configs of its
problem (``good``: configs it can run; ``bad``: one it cannot, e.g. not in a replay table, or
one that fails to compile), and asserts one clause of the contract."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from typing import Any

import pytest

from tuner.backends.base import (
    BatchesAhead,
    Calibrates,
    CompilesAhead,
    Interruptible,
    Retargetable,
    TimesWithMethods,
)
from tuner.config import KernelConfig
from tuner.device import DeviceFingerprint
from tuner.errors import InvalidRequest
from tuner.measurement import Measurement, Outcome
from tuner.space import SearchSpace
from tuner.timing import DEFAULT_TIMING, TIMING_METHODS


def check_identity(backend: Any) -> None:
    """A device fingerprint with a key, and a healthy backend once opened."""
    assert isinstance(backend.fingerprint, DeviceFingerprint)
    assert isinstance(backend.fingerprint.key, str) and backend.fingerprint.key
    assert backend.healthy is True


def check_restrict(backend: Any, space: SearchSpace, good: Sequence[KernelConfig]) -> None:
    """``restrict`` answers a part of the space it was given that still holds the configs it
    can run."""
    part = backend.restrict(space)
    assert isinstance(part, SearchSpace)
    for config in good:
        assert part.contains(config), config
    for config in itertools.islice(iter(part), 50):
        assert space.contains(config), config


def _well_formed(m: Measurement, config: KernelConfig) -> None:
    assert isinstance(m, Measurement) and m.config == config
    if m.ok:
        assert m.p20_ms is not None and m.p50_ms is not None and m.p80_ms is not None
        assert 0 < m.p20_ms <= m.p50_ms <= m.p80_ms, m
    else:
        assert m.outcome is not Outcome.OK and m.error, m


def check_measure(backend: Any, good: Sequence[KernelConfig], bad: KernelConfig) -> None:
    """One measurement per config, in order, the same ones passed to ``on_result`` as they are
    taken (once per distinct config); a config the backend cannot run is a failed measurement
    with its reason, never an exception; the good ones are timed."""
    configs = [good[0], bad, *good[1:], good[0]]  # a repeat: measured, reported once
    seen: list[Measurement] = []
    results = backend.measure(configs, on_result=seen.append)
    assert len(results) == len(configs)
    for m, config in zip(results, configs, strict=True):
        _well_formed(m, config)
    assert [m.config for m in seen] == list(dict.fromkeys(configs))
    by_config = {m.config: m for m in seen}
    for m in results:
        assert by_config[m.config].outcome == m.outcome
    assert all(m.ok for m in results if m.config != bad)
    assert not results[1].ok
    assert backend.healthy is True  # a bad config is the config's failure, not the device's


def check_on_result_raising_stops_the_batch(backend: Any,
                                             good: Sequence[KernelConfig]) -> None:
    """An exception from ``on_result`` stops the batch and reaches the caller."""
    class Stop(Exception):
        pass

    calls: list[KernelConfig] = []

    def stop(m: Measurement) -> None:
        calls.append(m.config)
        raise Stop

    with pytest.raises(Stop):
        backend.measure(list(good[:2]), on_result=stop)
    assert calls == [good[0]]


def check_retime(backend: Any, good: Sequence[KernelConfig]) -> None:
    """Re-timing: one measurement per config, in order, each marked ``retimed``; with the
    baseline, at most one more, marked with its name."""
    retimed = backend.retime(list(good[:2]), rounds=2)
    assert [m.config for m in retimed] == list(good[:2])
    for m in retimed:
        _well_formed(m, m.config)
        assert m.extra.get("measured") == "retimed"
    with_baseline = backend.retime(list(good[:2]), rounds=1, baseline=True)
    assert [m.config for m in with_baseline[:2]] == list(good[:2])
    assert len(with_baseline) in (2, 3)
    if len(with_baseline) == 3:
        assert with_baseline[2].config == KernelConfig({})
        assert with_baseline[2].extra.get("baseline")


def check_timing_methods(backend: Any, refuses: Sequence[str] = ()) -> None:
    """``use_timing`` answers the method it will time with; one it cannot time with is an
    InvalidRequest, and leaves it timing as before."""
    method = backend.use_timing(DEFAULT_TIMING)
    assert method in TIMING_METHODS
    for name in refuses:
        with pytest.raises(InvalidRequest):
            backend.use_timing(name)
        assert backend.timing_method == method


#: the optional members a backend may have (``tuner/backends/base.py``), each its own protocol
OPTIONAL_PROTOCOLS = (BatchesAhead, CompilesAhead, Interruptible, Retargetable, Calibrates,
                      TimesWithMethods)


def check_optional_members(backend: Any, declares: Collection[type] | None = None) -> None:
    """The optional protocols ``backend`` has are ``declares`` (when given: those the search
    loop and the worker will find by isinstance), and each one it has is kept: a preferred
    batch of at least one, an ``interrupt`` that is None or callable."""
    has = {p for p in OPTIONAL_PROTOCOLS if isinstance(backend, p)}
    if declares is not None:
        assert {p.__name__ for p in has} == {p.__name__ for p in declares}
    if BatchesAhead in has:
        assert isinstance(backend.preferred_batch, int) and backend.preferred_batch >= 1
    if Interruptible in has:
        assert backend.interrupt is None or callable(backend.interrupt)


def check_close(backend: Any) -> None:
    """``close`` may be called again."""
    backend.close()
    backend.close()


def check_backend(open_: Callable[[], Any], space: SearchSpace, good: Sequence[KernelConfig],
                  bad: KernelConfig, refuses: Sequence[str] = (),
                  declares: Collection[type] | None = None) -> None:
    """Every clause, on one backend ``open_()`` opens (closed at the end); ``declares``: the
    optional protocols it must have, and only those."""
    assert len(good) >= 2
    backend = open_()
    try:
        check_identity(backend)
        check_optional_members(backend, declares)
        check_restrict(backend, space, good)
        check_timing_methods(backend, refuses)
        check_measure(backend, good, bad)
        check_on_result_raising_stops_the_batch(backend, good)
        check_retime(backend, good)
    finally:
        check_close(backend)
