"""Wraps ``triton.compiler.compiler.get_cache_key`` (looked up at call time by Triton's
``compile`` in 3.6 and 3.9) to write the parts of each compile's key to
``<folder>/<pid>.jsonl``."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any


def _parts(src: Any, backend: Any, options: Any, env_vars: dict[str, Any]) -> dict[str, Any]:
    fn = getattr(src, "fn", None)
    constants = getattr(src, "constants", {}) or {}
    signature = getattr(src, "signature", {}) or {}
    out: dict[str, Any] = {
        "name": getattr(fn, "__name__", str(getattr(src, "name", "?"))),
        "fn_cache_key": getattr(fn, "cache_key", None),
        "attrs": str(getattr(src, "attrs", None)),
        "signature": str([v for _k, v in sorted(signature.items())]),
        "constants": str(sorted((str(k), str(getattr(v, "cache_key", v)))
                                for k, v in constants.items())),
        "backend_hash": backend.hash(),
        "options_hash": options.hash(),
        "options": {k: str(v) for k, v in sorted(vars(options).items())},
        "env_vars": str(sorted(env_vars.items())),
    }
    return out


def install(folder: str) -> None:
    import triton.compiler.compiler as compiler
    from triton.runtime.cache import get_cache_manager

    Path(folder).mkdir(parents=True, exist_ok=True)
    original = compiler.get_cache_key
    path = Path(folder) / f"{os.getpid()}.jsonl"

    def traced(src: Any, backend: Any, options: Any, env_vars: dict[str, Any]) -> str:
        key = original(src, backend, options, env_vars)
        try:
            digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
            parts = _parts(src, backend, options, env_vars)
            name = str(getattr(src, "name", parts["name"]))[:150]
            hit = bool(get_cache_manager(digest).get_group(f"{name}.json"))
            record = {"t": time.time(), "pid": os.getpid(),
                      "process": multiprocessing.current_process().name,
                      "argv": " ".join(sys.argv[:3]), "hash": digest, "hit": hit,
                      "triton_key_len": len(key), **parts}
            with path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        except Exception as exc:  # noqa: BLE001 - a diagnostic never breaks a compile
            with path.open("a") as f:
                f.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return key

    compiler.get_cache_key = traced
