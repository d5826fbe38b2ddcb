"""``tuner export --format fla``: stored configs as flash-linear-attention's own config files,
the ones its ``CachedAutotuner`` reads (``FLA_CONFIG_DIR/<kernel function>.json``, selected by
``FLA_CACHE_MODE``), so that fla's kernels pick them up with no tuner at run time.

fla finds an entry by the md5 of Triton's own autotune key (the key arguments' values, then
every tensor argument's dtype, as ``torch.float16``): a stored best carries that key only where
a model's process measured it (``tuner.install()`` sends it with the client-measured result,
``client_state["triton_key"]``); other rows are left out and counted. One file per kernel
function holds one device's and one Triton's configs (fla keeps one folder per GPU)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuner.errors import InvalidRequest


def autotune_key_hash(key: list[Any]) -> str:
    """fla's ``AutotuneKey.key_hash``: md5 of the key as compact, key-sorted JSON."""
    return hashlib.md5(json.dumps(key, separators=(",", ":"), sort_keys=True).encode(),
                       usedforsecurity=False).hexdigest()


def fla_config(config: dict[str, int]) -> dict[str, Any]:
    """A stored config as fla's file holds one (``triton.Config``'s fields)."""
    launch = {"num_warps", "num_stages", "num_ctas", "maxnreg"}
    return {"kwargs": {k: v for k, v in config.items() if k not in launch},
            "num_warps": config.get("num_warps", 4), "num_stages": config.get("num_stages", 3),
            "num_ctas": config.get("num_ctas", 1), "maxnreg": config.get("maxnreg")}


def fla_files(rows: Iterable[Any]) -> tuple[dict[str, dict[str, Any]], int]:
    """fla's file contents by file name, and how many rows had no Triton key to write. The
    rows must be of one device and one Triton version (InvalidRequest naming the filter)."""
    keyed, skipped = [], 0
    for row in rows:
        key = (getattr(row, "client_state", None) or {}).get("triton_key")
        if isinstance(key, list):
            keyed.append((row, key))
        else:
            skipped += 1
    for attribute, option in (("device_key", "--device"), ("triton_version", "--triton")):
        values = sorted({getattr(row, attribute) for row, _ in keyed})
        if len(values) > 1:
            raise InvalidRequest(f"fla keeps one folder per GPU and Triton: the configs are of "
                                 f"{len(values)} ({', '.join(values)}); choose one with "
                                 f"{option}", field=option.lstrip("-"))
    files: dict[str, dict[str, Any]] = {}
    for row, key in keyed:
        name = row.kernel.rsplit(".", 1)[-1]
        file = files.setdefault(f"{name}.json", {"kernel_name": name,
                                                 "triton_version": row.triton_version,
                                                 "autotune_entries": {}})
        file["autotune_entries"][autotune_key_hash(key)] = {
            "autotune_key": key, "config": fla_config(dict(row.config))}
    return files, skipped


def write_fla(rows: Iterable[Any], out: str | Path) -> tuple[int, int]:
    """Write fla's files into the folder ``out`` (created); returns (entries written, rows
    without a Triton key)."""
    files, skipped = fla_files(rows)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
    return sum(len(f["autotune_entries"]) for f in files.values()), skipped
