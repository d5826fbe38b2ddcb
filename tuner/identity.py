"""Who is asking for a config: the caller's device key and Triton version.

A stored config is served as ``exact`` only for the same device key (GPU model and compute
capability), the same kernel source version and the same Triton *minor* version (3.6.0 and 3.6.1
compile a kernel alike; 3.5 and 3.6 may not). Clients detect their own identity here and send it
with every lookup; the service and the exported-file reader compare with ``same_triton_minor``.
"""

from __future__ import annotations

import importlib
import os
import sys
from enum import StrEnum


class DeviceKind(StrEnum):
    """What a device is (``tuner.device.DeviceFingerprint.kind``, the ``devices.kind`` and
    ``workers.kind`` columns): a CUDA GPU, the Triton CPU interpreter, or a replay table. A
    ``StrEnum``: each member is the string it names (stored rows and JSON are unchanged)."""

    CUDA = "cuda"
    INTERPRET = "interpret"
    REPLAY = "replay"


class Match(StrEnum):
    """How a served config matches the caller's identity (an answer's ``match``), best first:
    ``EXACT`` (its device, Triton minor and shape), ``NEAREST`` (the nearest tuned shape), then
    ``OTHER_TRITON`` (another Triton minor), ``OTHER_DEVICE`` (another GPU), ``DEFAULT`` (the
    kernel's default config) and ``NONE`` (no config at all). The first four are the serving
    ladder's (``db.repo.bests.LADDER``). A ``StrEnum``: each member is the string it names."""

    EXACT = "exact"
    NEAREST = "nearest"
    OTHER_TRITON = "other-triton"
    OTHER_DEVICE = "other-device"
    DEFAULT = "default"
    NONE = "none"

#: the device key of the Triton CPU interpreter (``tuner.device.DeviceFingerprint.key``)
INTERPRETER_KEY = "interpret:cpu"


def triton_minor(version: str | None) -> str | None:
    """``"3.6.0"`` -> ``"3.6"``; None stays None; a version without a dot is kept whole."""
    if not version:
        return None
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


def same_triton_minor(a: str | None, b: str | None) -> bool:
    """Whether two Triton versions share major.minor (an unknown version matches anything)."""
    if not a or not b:
        return True
    return triton_minor(a) == triton_minor(b)


def cuda_device_key(name: str, major: int, minor: int) -> str:
    """The key of a CUDA device (same format as ``DeviceFingerprint.key``)."""
    return f"cuda:{name}:sm{major}{minor}"


def local_device_key() -> str | None:
    """This process's device key: the interpreter's under ``TRITON_INTERPRET=1``, else the
    current CUDA device's (initialises CUDA, as the caller's model does anyway), else None."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return INTERPRETER_KEY
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return cuda_device_key(props.name, props.major, props.minor)


def local_triton_version() -> str | None:
    """The installed Triton's version (None when Triton is not installed)."""
    module = sys.modules.get("triton")
    if module is None:
        try:
            module = importlib.import_module("triton")
        except ImportError:
            return None
    return str(getattr(module, "__version__", "")) or None
