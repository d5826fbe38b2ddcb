"""Device fingerprints: which machine a measurement belongs to.

A stored config is only served as exact for the same ``key``: the full GPU name plus compute
capability (an H100 is not an H200). The CPU interpreter and replay tables get keys of their own so
that their results are never served for a real GPU. ``detect_cuda`` initialises CUDA and is only
called inside a measuring child process, never in the API or the worker's parent process.

A worker's device index counts among the GPUs ``CUDA_VISIBLE_DEVICES`` makes visible (as CUDA
numbers them): ``visible_device_for`` turns it into the one entry its children make visible.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tuner.identity import DeviceKind

INTERPRETER_NAME = "Triton interpreter (CPU)"


@dataclass(frozen=True)
class DeviceFingerprint:
    kind: DeviceKind
    name: str
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_bytes: int | None = None
    smem_per_block: int | None = None
    triton_version: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    driver_version: str | None = None
    #: this GPU's UUID ("GPU-..." or "MIG-..."): tells two GPUs of one model apart (not part
    #: of the key: a config is served for every GPU of the model)
    uuid: str | None = None

    @property
    def key(self) -> str:
        if self.kind == DeviceKind.CUDA:
            cc = (self.compute_capability or "").replace(".", "")
            return f"cuda:{self.name}:sm{cc}"
        if self.kind == DeviceKind.INTERPRET:
            return "interpret:cpu"
        return f"replay:{self.name}"

    @property
    def is_gpu(self) -> bool:
        return self.kind == DeviceKind.CUDA

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "key": self.key}


def _versions() -> dict[str, str | None]:
    import torch
    import triton

    # plain strings: torch.__version__ is a TorchVersion, and unpickling one (the GPU child's
    # fingerprint, in the worker) imports torch: measured 3.7 s of a worker's start on an H100
    cuda = torch.version.cuda
    return {"triton_version": str(triton.__version__), "torch_version": str(torch.__version__),
            "cuda_version": None if cuda is None else str(cuda)}


def interpreter_fingerprint() -> DeviceFingerprint:
    return DeviceFingerprint(kind=DeviceKind.INTERPRET, name=INTERPRETER_NAME,
                             compute_capability=None, sm_count=None, memory_bytes=None,
                             smem_per_block=None, driver_version=platform.machine(),
                             **_versions())


def replay_fingerprint(device: str, triton_version: str | None,
                       torch_version: str | None) -> DeviceFingerprint:
    return DeviceFingerprint(kind=DeviceKind.REPLAY, name=device, triton_version=triton_version,
                             torch_version=torch_version)


def detect_cuda(index: int = 0) -> DeviceFingerprint:
    """The fingerprint of CUDA device ``index``. Initialises CUDA: call in a GPU child only."""
    import torch

    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    return DeviceFingerprint(
        kind=DeviceKind.CUDA, name=props.name, compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
        smem_per_block=int(smem) if smem else None, driver_version=_driver_version(),
        uuid=_uuid_of(props), **_versions(),
    )


def _uuid_of(props: Any) -> str | None:
    """The device's UUID as nvidia-smi writes it (torch gives it without the "GPU-")."""
    raw = getattr(props, "uuid", None)
    if raw is None:
        return None
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


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
    import shutil

    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        return True
    return shutil.which("nvidia-smi") is not None


def visible_device_for(index: int, env: Mapping[str, str] | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that makes a worker's device ``index`` (counted
    among the devices visible under ``env``, default ``os.environ``) its children's device 0:
    the index itself when nothing is set, else the visible list's entry (an index, a
    ``GPU-...`` UUID or a ``MIG-...`` id). ValueError when the list has no such entry."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if index < 0:
        raise ValueError(f"device index {index} is negative")
    if value is None:
        return str(index)
    entries = _visible_entries(value)
    if index >= len(entries):
        raise ValueError(f"device index {index}: CUDA_VISIBLE_DEVICES={value!r} makes "
                         f"{len(entries)} device(s) visible")
    return entries[index]


def _visible_entries(value: str) -> list[str]:
    """The entries of a CUDA_VISIBLE_DEVICES value up to the first that makes CUDA stop
    reading (a negative index, such as -1)."""
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or re.fullmatch(r"-\d+", entry):
            break
        entries.append(entry)
    return entries


def count_visible(value: str | None, listing: str) -> int:
    """How many devices CUDA makes visible, from ``CUDA_VISIBLE_DEVICES`` (None: unset) and
    the output of ``nvidia-smi -L``: every GPU when unset, else the listed entries that exist
    (an index below the GPU count, or a prefix of a GPU's or MIG device's UUID), up to the
    first that does not (CUDA ignores the rest of the list from there)."""
    gpus = [line for line in listing.splitlines() if line.startswith("GPU ")]
    if value is None:
        return len(gpus)
    uuids = re.findall(r"UUID: ((?:GPU|MIG)-[^)\s]+)", listing)
    count = 0
    for entry in _visible_entries(value):
        exists = (int(entry) < len(gpus) if entry.isdigit()
                  else any(u.startswith(entry) for u in uuids))
        if not exists:
            break
        count += 1
    return count


def gpu_device_files(dev: str = "/dev") -> int:
    """How many GPU device files (``/dev/nvidia0``, ``/dev/nvidia1``, ...) there are: the GPUs
    of this machine, or of this container."""
    try:
        return sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


def count_gpus_without_init(dev: str = "/dev") -> int:
    """How many GPUs this process's CUDA would see: the GPU device files under
    ``CUDA_VISIBLE_DEVICES`` when it is unset or lists indices (``tuner serve`` asks before
    starting its workers, and ``nvidia-smi`` can take seconds to answer where the driver is
    not kept loaded), else ``nvidia-smi -L`` (UUIDs); 0 when neither is there."""
    import shutil
    import subprocess

    if not cuda_available_without_init():
        return 0
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    files = gpu_device_files(dev)
    if files and (value is None or all(e.isdigit() for e in _visible_entries(value))):
        return count_visible(value, "".join(f"GPU {i}: /dev/nvidia{i}\n" for i in range(files)))
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return count_visible(os.environ.get("CUDA_VISIBLE_DEVICES"), out.stdout)
