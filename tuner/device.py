"""Device fingerprints: which machine a measurement belongs to.

A stored config is only served as exact for the same ``key``: the full GPU name plus compute
capability (an H100 is not an H200). The CPU interpreter and replay tables get keys of their own so
that their results are never served for a real GPU. ``detect_cuda`` initialises CUDA and is only
called inside a measuring child process, never in the API or the worker's parent process.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from typing import Any

INTERPRETER_NAME = "Triton interpreter (CPU)"


@dataclass(frozen=True)
class DeviceFingerprint:
    kind: str  # "cuda" | "interpret" | "replay"
    name: str
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    smem_per_block: int | None = None
    triton_version: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    driver_version: str | None = None

    @property
    def key(self) -> str:
        if self.kind == "cuda":
            cc = (self.compute_capability or "").replace(".", "")
            return f"cuda:{self.name}:sm{cc}"
        if self.kind == "interpret":
            return "interpret:cpu"
        return f"replay:{self.name}"

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "key": self.key}


def _versions() -> dict[str, str | None]:
    import torch
    import triton

    return {"triton_version": triton.__version__, "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda}


def interpreter_fingerprint() -> DeviceFingerprint:
    return DeviceFingerprint(kind="interpret", name=INTERPRETER_NAME,
                             compute_capability=None, sm_count=None, memory_bytes=None,
                             smem_per_block=None, driver_version=platform.machine(),
                             **_versions())


def replay_fingerprint(device: str, triton_version: str | None,
                       torch_version: str | None) -> DeviceFingerprint:
    return DeviceFingerprint(kind="replay", name=device, triton_version=triton_version,
                             torch_version=torch_version)


def detect_cuda(index: int = 0) -> DeviceFingerprint:
    """The fingerprint of CUDA device ``index``. Initialises CUDA: call in a GPU child only."""
    import torch

    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    return DeviceFingerprint(
        kind="cuda", name=props.name, compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
        smem_per_block=int(smem) if smem else None, driver_version=_driver_version(),
        **_versions(),
    )


def _driver_version() -> str | None:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None


def cuda_available_without_init() -> bool:
    """Whether a CUDA GPU is visible, without initialising CUDA in this process."""
    import os
    import shutil

    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        return True
    return shutil.which("nvidia-smi") is not None


def count_gpus_without_init() -> int:
    """How many GPUs ``nvidia-smi -L`` lists (0 when it is missing)."""
    import shutil
    import subprocess

    if not cuda_available_without_init() or shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
