"""Checks the kernel tests under the Triton CPU interpreter share: a kernel whose launch damages
its output (for verification to reject), the measuring child's verification of one launch, the
validity of a kernel's known-good configs, and a tune through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tests.support_processes import ROOT, interpreter_env
from tuner.backends.child import ChildState, _verify
from tuner.config import KernelConfig
from tuner.space import ProblemContext


class Damaged:
    """``kernel`` whose launch then damages one of its outputs (``damage(inputs[output])``),
    as a wrong kernel would; everything else is the kernel's own."""

    def __init__(self, kernel: Any, damage: Callable[[Any], None], output: str = "out") -> None:
        self._kernel, self._damage, self._output = kernel, damage, output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kernel, name)

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        self._kernel.launch(config, inputs)
        self._damage(inputs[self._output])


def verify(kernel: Any, config: KernelConfig, shape: Mapping[str, int], dtype: str,
           inputs: dict[str, Any]) -> str | None:
    """What the measuring child's verification says of one launch of ``kernel`` (None: right,
    else why not)."""
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = kernel, dict(shape), dtype
    return _verify(state, config, inputs)


def assert_known_good_configs_valid(kernel: Any, shapes: Iterable[Mapping[str, int]],
                                    dtype: str = "float16") -> None:
    """For each shape: the default config is among the known-good ones, and each of those is
    in the space and violates none of its constraints."""
    space = kernel.space()
    for shape in shapes:
        ctx = ProblemContext(dict(shape), dtype)
        configs = kernel.known_good_configs(shape, dtype)
        assert kernel.default_config(shape, dtype) in configs
        for config in configs:
            assert space.contains(config) and space.violation(config, ctx) is None, config


def tuner_cli(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    """``python -m tuner.app.cli --db DB ARGS...`` on the interpreter, from the checkout's root."""
    return subprocess.run([sys.executable, "-m", "tuner.app.cli", "--db", db, *args], cwd=ROOT,
                          env=interpreter_env(), capture_output=True, text=True, timeout=600)


def tune_on_interpreter(name: str, shape: str, db: str, *, dtype: str = "float16",
                        trials: int = 3) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``tuner tune NAME --shape SHAPE --backend interpret --json``: checks that it stored a
    verified best on the interpreter after ``trials`` trials and that ``tuner configs`` lists
    that best alone (the search's best, or the kernel's default where the search found nothing
    faster than it beyond noise: ``stored_config``); returns the tune's summary and the listed
    rows."""
    tuned = tuner_cli("tune", name, "--shape", shape, "--dtype", dtype, "--trials", str(trials),
                      "--backend", "interpret", "--json", db=db)
    assert tuned.returncode == 0, tuned.stderr
    summary = json.loads(tuned.stdout)
    assert summary["device"] == "interpret:cpu" and summary["stored"] is True
    assert summary["best_ms"] > 0 and summary["trials"] == trials
    rows = json.loads(tuner_cli("configs", "--kernel", name, "--json", db=db).stdout)
    assert len(rows) == 1 and rows[0]["config"] == summary["stored_config"]
    if summary["stored_config"] != summary["best_config"]:
        assert "stored the kernel's default" in summary["stored_note"], summary
    return summary, rows
