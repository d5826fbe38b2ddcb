"""The stored-best decision after a search: the stored best of a task's identity when its
search started (``StoredBest``, ``stored_best``), whether the search's best replaces it from
times taken side by side in one process (``decide_best``), and that whatever is written
beats the kernel's default beyond the noise (``against_default``, ``_noise_margin``).
``BestDecision`` is what to write and why; ``tuner.app.worker`` applies it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from db import repo
from tuner.config import KernelConfig
from tuner.kernel import TunableKernel
from tuner.measurement import Measurement
from tuner.shapes import shape_key
from tuner.timing import DEFAULT_TIMING


class StoredBest(NamedTuple):
    """The stored best for a task's identity when its search started: its config (passed to
    the search as the incumbent, re-timed beside the finalists), its revision (replaced only
    at that one) and its stored p50."""

    config: KernelConfig
    revision: int
    p50_ms: float


def stored_best(session: Session, kernel: TunableKernel, fp: Any, dtype: str,
                shape: Mapping[str, int], timing: str = DEFAULT_TIMING) -> StoredBest | None:
    """The stored best of exactly this identity: device key, kernel, kernel version, dtype,
    shape, Triton version and timing method."""
    row = repo.get_best(session, device_key=fp.key, kernel=kernel.name, dtype=dtype,
                        shape_key=shape_key(shape), kernel_version=kernel.version,
                        triton_version=fp.triton_version or "", timing=timing)
    if row is None or row.triton_version != (fp.triton_version or ""):
        return None
    return StoredBest(KernelConfig(row.config), row.revision, row.p50_ms)


@dataclass(frozen=True)
class BestDecision:
    """What to write into the stored best after a search (``write``: None leaves the row as
    it is), how (``verdict``: ``inserted``, ``replaced``, ``kept``, ``unconfirmed``) and why,
    in words (``note``, kept in the task). Against the kernel's default (``against_default``):
    ``basis`` (``db.models.BASES``: ``search``, the written config beat the default beyond the
    noise; ``default``, it is the default; None: not compared), the default re-timed beside
    it (``default``), the noise margin applied (``margin``) and the search's best time
    compared with it (``search_ms``)."""

    write: Measurement | None
    verdict: str
    note: str
    basis: str | None = None
    default: Measurement | None = None
    margin: float | None = None
    search_ms: float | None = None


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def decide_best(best: Measurement, stored: StoredBest | None, incumbent: Measurement | None,
                margin: float, default: Measurement | None = None) -> BestDecision:
    """Whether the search's best replaces the stored one, from times taken side by side in
    one process: the best finalist's re-timed p50 against the stored config's (``incumbent``,
    re-timed beside the finalists), never against the stored p50 (taken in another process, at
    another clock). The best replaces it only when faster by ``margin`` (relative); otherwise
    the stored config stays and its row takes its re-timed numbers. A stored config that was
    not re-timed (the search was interrupted, or re-timing failed) is left as it is. Then
    whatever is written must beat the kernel's ``default`` re-timed beside it, or the default
    is written instead (``against_default``)."""
    return against_default(_against_stored(best, stored, incumbent, margin), best, stored,
                           default)


def _against_stored(best: Measurement, stored: StoredBest | None,
                    incumbent: Measurement | None, margin: float) -> BestDecision:
    """``decide_best`` between the search's best and the stored best alone."""
    retimed = best.extra.get("measured") == "retimed"
    if stored is None:
        return BestDecision(best, "inserted", "stored this search's best "
                            f"({'re-timed' if retimed else 'trial'} time): no config was "
                            "stored for this identity")
    if not retimed or incumbent is None or (
            incumbent.ok and incumbent.extra.get("measured") != "retimed"):
        why = ("the finalists were not re-timed" if not retimed
               else "the stored config could not be re-timed beside them")
        return BestDecision(None, "unconfirmed", f"kept the stored best ({stored.p50_ms:.4f} "
                            f"ms, not compared: {why}; a stored time from another process is "
                            "no yardstick)")
    if best.config == stored.config:
        return BestDecision(best, "kept", "the stored config is still the best; its row now "
                            f"holds its re-timed times ({best.p50_ms:.4f} ms, was "
                            f"{stored.p50_ms:.4f} ms)")
    if not incumbent.ok or incumbent.p50_ms is None:
        return BestDecision(best, "replaced", "replaced the stored best: re-timed beside the "
                            f"finalists it failed ({incumbent.outcome.value})")
    new_ms, old_ms = best.p50_ms or math.inf, incumbent.p50_ms
    if new_ms < old_ms * (1 - margin):
        return BestDecision(best, "replaced", f"replaced the stored best: {new_ms:.4f} ms "
                            f"against its {old_ms:.4f} ms re-timed beside it, "
                            f"{_pct(1 - new_ms / old_ms)} faster (noise margin {_pct(margin)})")
    return BestDecision(incumbent, "kept", f"kept the stored best: re-timed beside the "
                        f"finalists at {old_ms:.4f} ms (stored {stored.p50_ms:.4f} ms); this "
                        f"search's best {new_ms:.4f} ms is not faster by the noise margin "
                        f"({_pct(margin)}); its row now holds the re-timed times")


def _faster(gain: float) -> str:
    return f"{_pct(gain)} faster" if gain >= 0 else f"{_pct(-gain)} slower"


def against_default(decision: BestDecision, best: Measurement, stored: StoredBest | None,
                    default: Measurement | None) -> BestDecision:
    """Never worse than the default: the config ``decision`` writes is stored only when it
    beats the kernel's default (``default``: its ``default_config``, or the best of the user's
    list, re-timed beside the finalists in the same process) by more than the noise of the
    two (``_noise_margin``); else, unless the search's own best does, the default is written,
    with ``basis`` ``default``. Left as it is (``basis`` None) where nothing is written or
    the default was not re-timed beside a re-timed best; a default that failed (it no longer
    runs or verifies) is beaten by any verified config."""
    won = decision.write
    if won is None or default is None or best.extra.get("measured") != "retimed":
        return decision
    if not default.ok or default.p50_ms is None:
        return replace(decision, basis="search", default=default, note=(
            f"{decision.note}; the default failed beside the finalists "
            f"({default.outcome.value})"))
    if default.extra.get("measured") != "retimed":
        return decision
    default_ms = default.p50_ms
    if won.config == default.config:
        return replace(decision, basis="default", default=default, search_ms=best.p50_ms,
                       margin=_noise_margin(won, default),
                       note=f"{decision.note}; it is the kernel's default")
    for candidate in [won] if best.config == won.config else [won, best]:
        margin = _noise_margin(candidate, default)
        ms = candidate.p50_ms or math.inf
        if ms >= default_ms * (1 - margin):
            continue
        beats = (f"{_pct(1 - ms / default_ms)} faster than the default ({default_ms:.4f} ms "
                 f"re-timed beside it; noise margin {_pct(margin)})")
        if candidate is won:
            return replace(decision, basis="search", default=default, margin=margin,
                           search_ms=best.p50_ms, note=f"{decision.note}; {beats}")
        return BestDecision(best, "replaced", f"replaced the stored best, which is not faster "
                            f"than the default beyond the noise, with this search's best "
                            f"({ms:.4f} ms), {beats}", "search", default, margin, best.p50_ms)
    margin = _noise_margin(best, default)
    best_ms = best.p50_ms or math.inf
    verdict = ("inserted" if stored is None else
               "kept" if stored.config == default.config else "replaced")
    note = (f"stored the kernel's default: the search found nothing faster than the default "
            f"beyond noise (its best {best_ms:.4f} ms, {_faster(1 - best_ms / default_ms)} "
            f"than the default's {default_ms:.4f} ms re-timed beside it; noise margin "
            f"{_pct(margin)})")
    if verdict == "replaced":
        note += f"; it replaced the stored best (stored {stored.p50_ms:.4f} ms)" if stored else ""
    return BestDecision(default, verdict, note, "default", default, margin, best.p50_ms)


def _noise_margin(*measurements: Measurement | None) -> float:
    """The relative gap that counts as faster: the largest noise ((p80 - p20) / p50) of the
    measurements compared, at least 1%."""
    return max([0.01, *(m.noise for m in measurements if m is not None)])
