"""Offline configs files: the store's best configs in a file that a model reads with no service.

``tuner-configs-v1`` is this project's format (``tuner export`` writes it, ``tuner import`` and
``ConfigsFile`` read it)::

    {"format": "tuner-configs-v1", "exported_at": "2026-01-01T00:00:00Z",
     "configs": [{"kernel": "matmul", "kernel_version": "1", "dtype": "float16",
                  "device": "cuda:NVIDIA H200:sm90", "triton_version": "3.6.0",
                  "shape": {"M": 16, ...}, "config": {"BLOCK_M": 64, ..., "num_warps": 4},
                  "ms": 0.04, "tflops": 1.2, "gbps": 2900.0,
                  "torch_version": "2.13.0", "cuda_version": "12.8",
                  "timing": "eager-flushed"}, ...]}

``ConfigsFile.lookup`` serves only exact identities, the same rule as the service's ``exact``
match (``tuner.identity``): a file carries no nearest-shape fallback, the caller keeps its
defaults. ``write_vllm`` / ``read_vllm`` handle the flat ``{"<M>": {"BLOCK_SIZE_M": ...}}`` files
vLLM's fused-MoE kernels read, named as vLLM names them (``vllm_file_name``:
``E=8,N=14336,device_name=NVIDIA_H200.json``) and looked up by the nearest M as vLLM does
(``nearest_m``). Engine side: nothing here imports ``db`` or ``api``.

``timing`` (``tuner/timing.py``; ``eager-flushed`` where an entry has none) says how ``ms`` was
taken; it is part of an entry's identity.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tuner.config import KernelConfig
from tuner.device import INTERPRETER_NAME
from tuner.errors import ConfigsFileError, InvalidRequest
from tuner.identity import same_triton_minor, triton_minor
from tuner.shapes import shape_key
from tuner.timing import DEFAULT_TIMING, TIMING_METHODS

FORMAT = "tuner-configs-v1"
STDOUT = "-"

#: this project's parameter names -> the names vLLM's tuned-config files use
VLLM_NAMES = {"BLOCK_M": "BLOCK_SIZE_M", "BLOCK_N": "BLOCK_SIZE_N", "BLOCK_K": "BLOCK_SIZE_K",
              "GROUP_M": "GROUP_SIZE_M"}
_FROM_VLLM = {v: k for k, v in VLLM_NAMES.items()}

_CUDA_KEY = re.compile(r"cuda:(?P<name>[^:]+):sm(?P<cc>\d{2,3})")


@dataclass(frozen=True)
class ConfigsEntry:
    """One stored best config and the identity it is exact for."""

    kernel: str
    kernel_version: str
    dtype: str
    device: str
    triton_version: str
    shape: dict[str, int] = field(hash=False)
    config: KernelConfig
    ms: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    #: how ``ms`` was taken (``tuner/timing.py``)
    timing: str = DEFAULT_TIMING

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "kernel_version": self.kernel_version,
                "dtype": self.dtype, "device": self.device,
                "triton_version": self.triton_version, "shape": dict(self.shape),
                "config": self.config.to_dict(), "ms": self.ms, "tflops": self.tflops,
                "gbps": self.gbps, "torch_version": self.torch_version,
                "cuda_version": self.cuda_version, "timing": self.timing}

    @classmethod
    def from_dict(cls, data: Any) -> ConfigsEntry:
        """Parse one entry; ValueError says which field is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"an entry must be a JSON object, not {type(data).__name__}")
        device = _text(data, "device")
        device_fingerprint(device)  # refused here, not half-way through an import
        return cls(kernel=_text(data, "kernel"), kernel_version=_text(data, "kernel_version"),
                   dtype=_text(data, "dtype"), device=device,
                   triton_version=_text(data, "triton_version"), shape=_ints(data, "shape"),
                   config=KernelConfig(_ints(data, "config")), ms=_number(data, "ms"),
                   tflops=_number(data, "tflops"), gbps=_number(data, "gbps"),
                   torch_version=_optional_text(data, "torch_version"),
                   cuda_version=_optional_text(data, "cuda_version"), timing=_timing(data))


def _text(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name!r} must be a non-empty string, not {value!r}")
    return value


def _timing(data: dict[str, Any]) -> str:
    value = data.get("timing", DEFAULT_TIMING)
    if value not in TIMING_METHODS:
        raise ValueError(f"'timing' must be one of {', '.join(TIMING_METHODS)}, not {value!r}")
    return str(value)


def _optional_text(data: dict[str, Any], name: str) -> str | None:
    return None if data.get(name) is None else _text(data, name)


def _number(data: dict[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 0:
        raise ValueError(f"{name!r} must be a non-negative number or null, not {value!r}")
    return float(value)


def _ints(data: dict[str, Any], name: str) -> dict[str, int]:
    value = data.get(name)
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{name!r} must be a non-empty object of name -> integer")
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, int):
            raise ValueError(f"{name}.{key} must be an integer, not {item!r}")
    return dict(value)


def device_fingerprint(key: str) -> dict[str, str]:
    """What a device key says about its device, as ``db.repo.upsert_device`` takes it:
    ``"cuda:NVIDIA H200:sm90"`` -> kind cuda, name "NVIDIA H200", compute capability "9.0";
    ``"interpret:cpu"`` and ``"replay:NAME"`` likewise. ValueError for any other key."""
    cuda = _CUDA_KEY.fullmatch(key)
    if cuda:
        cc = cuda["cc"]
        return {"key": key, "kind": "cuda", "name": cuda["name"],
                "compute_capability": f"{cc[:-1]}.{cc[-1]}"}
    if key == "interpret:cpu":
        # the name a local interpreter worker gives the same row
        return {"key": key, "kind": "interpret", "name": INTERPRETER_NAME}
    if key.startswith("replay:") and len(key) > len("replay:"):
        return {"key": key, "kind": "replay", "name": key.removeprefix("replay:")}
    raise ValueError(f"device {key!r} is not a device key (cuda:NAME:smXY, interpret:cpu or "
                     "replay:NAME)")


def _identity(kernel: str, dtype: str, shape: Mapping[str, int], device: str) -> tuple[str, ...]:
    return (kernel, dtype, shape_key(shape), device)


def _speed_order(entry: ConfigsEntry) -> tuple[bool, float]:
    """Fastest first; an entry without a time after every timed one."""
    return (entry.ms is None, entry.ms or 0.0)


class ConfigsFile:
    """The entries of a ``tuner-configs-v1`` file, indexed for exact lookups."""

    def __init__(self, entries: Sequence[ConfigsEntry], exported_at: str | None = None) -> None:
        self.entries: tuple[ConfigsEntry, ...] = tuple(entries)
        self.exported_at = exported_at
        # thousands of entries: lookups go through this index, each bucket fastest first
        self._index: dict[tuple[str, ...], list[ConfigsEntry]] = {}
        for entry in self.entries:
            key = _identity(entry.kernel, entry.dtype, entry.shape, entry.device)
            self._index.setdefault(key, []).append(entry)
        for bucket in self._index.values():
            bucket.sort(key=_speed_order)

    @classmethod
    def load(cls, path: str | Path) -> ConfigsFile:
        """Read a file (``-``: standard input), or raise ConfigsFileError naming the file and
        what is wrong with it."""
        data = _read_json(path)
        where = f"configs file {str(path)!r}"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigsFileError(f"{where} is not a {FORMAT} file (\"format\" must be "
                                   f"\"{FORMAT}\")")
        if not isinstance(data.get("configs"), list):
            raise ConfigsFileError(f"{where}: \"configs\" must be a list of entries")
        entries = []
        for i, item in enumerate(data["configs"]):
            try:
                entries.append(ConfigsEntry.from_dict(item))
            except (ValueError, TypeError) as exc:
                raise ConfigsFileError(f"{where}: malformed entry {i}: {exc}") from None
        exported_at = data.get("exported_at")
        return cls(entries, exported_at if isinstance(exported_at, str) else None)

    def lookup(self, kernel: str, dtype: str, shape: Mapping[str, int], *, device: str,
               kernel_version: str | None = None, triton_version: str | None = None,
               timing: str | None = None) -> ConfigsEntry | None:
        """The fastest entry exact for this identity: same kernel, dtype, shape and device key,
        the same kernel version, Triton major.minor and timing method when given; None when
        there is none."""
        for entry in self._index.get(_identity(kernel, dtype, shape, device), ()):
            if kernel_version is not None and entry.kernel_version != kernel_version:
                continue
            if timing is not None and entry.timing != timing:
                continue

            if triton_version is not None and not same_triton_minor(entry.triton_version,
                                                                    triton_version):
                continue
            return entry
        return None


def _read_json(path: str | Path) -> Any:
    where = f"configs file {str(path)!r}"
    try:
        text = sys.stdin.read() if str(path) == STDOUT else Path(path).read_text()
    except FileNotFoundError:
        raise ConfigsFileError(f"{where} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigsFileError(f"{where} cannot be read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigsFileError(f"{where} is not valid JSON: {exc}") from None


def write_tuner(entries: Iterable[ConfigsEntry], path: str | Path) -> int:
    """Write a ``tuner-configs-v1`` file (``-``: standard output); returns how many entries."""
    exported_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    configs = [e.to_dict() for e in entries]
    _write_json({"format": FORMAT, "exported_at": exported_at, "configs": configs}, path)
    return len(configs)


def _write_json(data: Any, path: str | Path) -> None:
    """Serialise, then replace ``path`` in one rename: a reader (or a failed export) never
    sees a half-written file."""
    if str(path) == STDOUT:
        text = json.dumps(data, indent=2, allow_nan=False)  # all or nothing here too
        sys.stdout.write(text + "\n")
        return
    if _names_folder(str(path)):
        raise InvalidRequest(f"--out {str(path)!r} is a folder: give the file's name in it, "
                             f"e.g. {str(Path(path) / 'configs.json')!r}", field="out")
    target = Path(path)
    try:
        _replace_atomically(target, lambda f: json.dump(data, f, indent=2, allow_nan=False))
    except OSError as exc:
        raise ConfigsFileError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None


def _names_folder(out: str) -> bool:
    """``out`` is a folder: one that exists, or a name ending in a slash (``DIR/``)."""
    return out.endswith(("/", os.sep)) or Path(out).is_dir()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _replace_atomically(target: Path, write: Callable[[Any], None]) -> None:
    # the temporary file lives next to the target so that the rename stays on one file system
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        # mkstemp makes it 0600: an exported file is read by other users' processes (a
        # serving engine's), so it gets a new file's mode, 0644 under the usual umask
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            write(f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- vLLM's fused-MoE tuned-config files -------------------------------------------------------

def write_vllm(entries: Iterable[ConfigsEntry], path: str | Path) -> int:
    """Write a vLLM tuned-config file: ``{"<M>": {"BLOCK_SIZE_M": .., "num_warps": ..}, ..}``
    with M ascending. vLLM looks configs up by M alone, so the entries must share one kernel,
    dtype, device, kernel version and Triton minor and differ only in M (InvalidRequest
    otherwise, naming the values and the option that narrows them). Of several Triton patch
    releases for one M, the fastest is written. Returns how many M entries were written."""
    chosen = _by_m(list(entries))
    data = {str(m): {VLLM_NAMES.get(k, k): v for k, v in e.config.items()}
            for m, e in sorted(chosen.items())}
    _write_json(data, path)
    return len(data)


def _by_m(entries: list[ConfigsEntry]) -> dict[int, ConfigsEntry]:
    _one_value(entries, "kernel", lambda e: e.kernel, "--kernel")
    _one_value(entries, "dtype", lambda e: e.dtype, "--dtype")
    _one_value(entries, "device", lambda e: e.device, "--device")
    _one_value(entries, "kernel version", lambda e: e.kernel_version, "--kernel-version")
    _one_value(entries, "Triton minor version", lambda e: triton_minor(e.triton_version) or "",
               "--triton")
    _one_value(entries, "timing method", lambda e: e.timing, "--timing")
    without_m = [shape_key(e.shape) for e in entries if "M" not in e.shape]
    if without_m:
        raise InvalidRequest(f"the vllm format is keyed by M, but shape {without_m[0]} has no M "
                             "dimension: export it with --format tuner", field="format")
    _same_other_dims(entries)
    chosen: dict[int, ConfigsEntry] = {}
    for entry in sorted(entries, key=_speed_order, reverse=True):
        chosen[entry.shape["M"]] = entry  # the fastest comes last and wins
    return chosen


def _one_value(entries: list[ConfigsEntry], what: str, get: Callable[[ConfigsEntry], str],
               option: str) -> None:
    values = sorted({get(e) for e in entries})
    if len(values) > 1:
        raise InvalidRequest(f"the vllm format holds one {what}, but the selection has "
                             f"{', '.join(map(repr, values))}: narrow it, e.g. "
                             f"{option} {values[0]!r}", field=option.lstrip("-"))


def _same_other_dims(entries: list[ConfigsEntry]) -> None:
    dims = sorted({d for e in entries for d in e.shape if d != "M"})
    differing = {d: sorted({e.shape.get(d, 0) for e in entries}) for d in dims}
    differing = {d: v for d, v in differing.items() if len(v) > 1}
    if differing:
        spread = "; ".join(f"{d} takes {', '.join(map(str, v))}" for d, v in differing.items())
        example = ",".join(f"{d}={v[-1]}" for d, v in differing.items())
        raise InvalidRequest(f"the vllm format needs shapes that differ only in M, but {spread}:"
                             f" narrow the selection, e.g. --where {example}", field="where")


def vllm_file_name(entries: Sequence[ConfigsEntry]) -> str:
    """The name vLLM's ``get_config_file_name`` gives this selection's file:
    ``E=8,N=14336,device_name=NVIDIA_H200.json`` (the device's name, spaces as underscores),
    with ``,dtype=float32`` for fp32 (vLLM keeps fp32 configs apart; fp16 and bf16 share the
    unsuffixed file). vLLM names the file after the experts and N alone: the entries must
    share one device, dtype, E and N (InvalidRequest otherwise, or when a shape has no E)."""
    shapes = [e.shape for e in entries]
    if not entries or any("E" not in s or "N" not in s for s in shapes):
        raise InvalidRequest("vLLM names its file after E and N, but the selection's shapes "
                             "have no E: give --out a file name, not a directory", field="out")
    _one_value(list(entries), "device", lambda e: e.device, "--device")
    _one_value(list(entries), "dtype", lambda e: e.dtype, "--dtype")
    _same_other_dims(list(entries))
    device = device_fingerprint(entries[0].device)["name"].replace(" ", "_")
    dtype = ",dtype=float32" if entries[0].dtype == "float32" else ""
    return f"E={shapes[0]['E']},N={shapes[0]['N']},device_name={device}{dtype}.json"


def vllm_target(entries: Sequence[ConfigsEntry], out: str) -> str:
    """Where ``write_vllm`` writes: ``out`` itself, or, when ``out`` is a directory (vLLM's
    ``VLLM_TUNED_CONFIG_FOLDER`` or its ``configs/`` folder; ``DIR/``, with its slash, is one
    that is created where missing), the file vLLM looks for in it."""
    if out != STDOUT and _names_folder(out):
        name = vllm_file_name(entries)
        try:
            Path(out).mkdir(exist_ok=True)
        except OSError as exc:
            raise ConfigsFileError(f"cannot create the folder {out!r}: "
                                   f"{exc.strerror or exc}") from None
        return str(Path(out) / name)
    return out


def nearest_m(configs: Mapping[int, Any], m: int) -> Any:
    """The config vLLM's ``try_get_optimal_moe_config`` takes for a batch of ``m`` tokens: the
    entry whose M is nearest, the first in the file's order on a tie."""
    return configs[min(configs, key=lambda key: abs(key - m))]


def read_vllm(path: str | Path, *, vllm_names: bool = False) -> dict[int, dict[str, int]]:
    """A vLLM tuned-config file read the way vLLM reads it (``int(key)`` per entry, the file's
    order kept), with this project's matmul parameter names: ``{16: {"BLOCK_M": 64, ...,
    "num_warps": 4}, ...}``; with ``vllm_names``, the file's own (``BLOCK_SIZE_M``: the names
    the moe_gemm kernel tunes)."""
    data = _read_json(path)
    where = f"vllm configs file {str(path)!r}"
    if not isinstance(data, dict):
        raise ConfigsFileError(f"{where} must be a JSON object of M -> config")
    rename = {} if vllm_names else _FROM_VLLM
    try:
        return {int(m): {rename.get(k, k): _int(v) for k, v in config.items()}
                for m, config in data.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigsFileError(f"{where}: malformed entry: {exc}") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    return value
