"""GPU tests: the real CUDA paths of the measuring pipeline (device detection, quick and full
timing, calibration, faulting kernels, the GPU state recorded with each timing, the compile
pool feeding the child's cache, a SIGKILLed worker leaving the GPU).

Every test here is marked ``gpu`` (one left unmarked is marked here). The default run
deselects them (``addopts = -m 'not gpu'`` in pyproject.toml); ``scripts/gpu_tests.sh OUT_DIR``
runs them on a GPU machine (``python3 -m pytest -m gpu tests/gpu``). Selected on a machine
without a CUDA GPU (or with a CPU build of torch) every test FAILS at setup, saying why: a GPU
test that skipped there would read as passing.

The pytest process never initialises CUDA: the measuring children do (``tests/gpu/smi.py``
reads the GPUs through nvidia-smi).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu.smi import Gpu, visible_gpus

GPU_DIR = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before ``-m`` selects: a test of this folder without the marker gets it, so that the
    CPU suite never runs one."""
    for item in items:
        if GPU_DIR in Path(str(item.fspath)).resolve().parents and not item.get_closest_marker(
                "gpu"):
            item.add_marker(pytest.mark.gpu)


def _why_no_gpu() -> str | None:
    import torch

    from tuner.device import count_gpus_without_init

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH"
    if count_gpus_without_init() == 0:
        return ("no GPU is visible (nvidia-smi -L under CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    return None


@pytest.fixture(scope="session")
def cuda_machine() -> list[Gpu]:
    """The visible GPUs; FAILS (never skips) on a machine without one."""
    why = _why_no_gpu()
    if why:
        pytest.fail(f"the gpu tests need a CUDA GPU: {why}", pytrace=False)
    gpus = visible_gpus()
    if not gpus:
        pytest.fail("nvidia-smi lists none of the GPUs CUDA_VISIBLE_DEVICES names",
                    pytrace=False)
    return gpus


@pytest.fixture(scope="session", autouse=True)
def _gpu_env(cuda_machine: list[Gpu]) -> Iterator[list[Gpu]]:
    """Children spawned by these tests run real kernels: never the interpreter that the root
    conftest selects unless TUNER_TEST_GPU=1."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRITON_INTERPRET", raising=False)
        yield cuda_machine
