"""What ``tuner tune`` (one shape, or a sweep: ``tuner.app.sweep``) reports of a finished task
(``--json``: ``summary_of``'s object), and its refusal of a timing method the CPU interpreter
cannot time with: shared by the CLI's commands and the sweep, which import it, not each other."""

from __future__ import annotations

from typing import Any

from tuner.errors import InvalidRequest
from tuner.kernel import TunableKernel


def check_interpreter_timing(timing: str) -> None:
    """``--timing`` the CPU interpreter cannot time with (``cuda-graph``): refused before a job
    is created."""
    from tuner.timing import interpreter_refusal

    refusal = interpreter_refusal(timing)
    if refusal is not None:
        raise InvalidRequest(f"--timing: {refusal}; run it with --backend cuda",
                             field="timing")


def summary_of(kernel: TunableKernel, shape: dict[str, int], dtype: str, backend: str,
               outcome: Any, wall: float) -> dict[str, Any]:
    """What ``tuner tune`` reports (``--json``: this object). ``best_ms`` is the best config's
    re-timed p50 (``best_measured`` ``retimed``; ``trial`` when the finalists were not
    re-timed), the same number the task, the API and the dashboard show; ``vs_baseline`` is
    computed only from the baseline timed interleaved with the finalists; ``finalists``: each
    one's trial and re-timed p50 and the GPU's state as its trial was timed."""
    from db.models import vs_baseline

    result = outcome.result
    best = result.best if result else None
    ms = best.p50_ms if best else None
    measured = str(best.extra.get("measured", "trial")) if best else None
    baseline = result.baseline if result and result.baseline and result.baseline.ok else None
    incumbent = result.incumbent if result else None
    return {
        "kernel": kernel.name, "kernel_version": kernel.version, "shape": shape, "dtype": dtype,
        "backend": backend, "device": outcome.device_key, "status": outcome.status,
        "best_config": best.config.to_dict() if best else None,
        "best_ms": ms, "best_measured": measured, "best_p20_ms": best.p20_ms if best else None,
        "best_p80_ms": best.p80_ms if best else None,
        "best_gpu": best.extra.get("gpu") if best else None,
        "baseline_ms": baseline.p50_ms if baseline else None,
        "baseline_name": str(baseline.extra.get("baseline", "baseline")) if baseline else None,
        "vs_baseline": vs_baseline(ms, measured, baseline.p50_ms if baseline else None),
        "incumbent_ms": incumbent.p50_ms if incumbent is not None and incumbent.ok else None,
        "finalists": finalists_of(result) if result else [],
        "tflops": kernel.flops(shape) / (ms * 1e-3) / 1e12 if ms else None,
        "gbps": kernel.bytes(shape, dtype) / (ms * 1e-3) / 1e9 if ms else None,
        "trials": len(result.trials) if result else 0,
        "outcomes": result.counts if result else {},
        "pruned": result.pruned if result else 0,
        "stop_reason": result.stop_reason if result else None,
        "stored": outcome.stored, "stored_note": outcome.note, "wall_s": round(wall, 3),
        "error": outcome.error, "timings_meaningful": backend != "interpret",
        "timing": best.extra.get("timing") if best else None,
    }


def finalists_of(result: Any) -> list[dict[str, Any]]:
    """Each finalist's trial p50 and re-timed p50 side by side, with the GPU's state as the
    trial was timed."""
    trials = {m.config: m for m in result.trials if m.ok}
    rows = []
    for m in result.finalists:
        trial = trials.get(m.config)
        retimed = m.extra.get("measured") == "retimed"
        rows.append({"config": m.config.to_dict(),
                     "trial_p50_ms": trial.p50_ms if trial else None,
                     "retimed_p50_ms": m.p50_ms if retimed else None,
                     "gpu": (trial.extra.get("gpu") if trial else None)})
    return rows
