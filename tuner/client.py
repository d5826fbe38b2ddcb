"""``TunerClient``: fetch tuned launch parameters at model start-up, submit and wait for jobs.

A model's start-up never fails because of the service: when it is down, slow or answers an
error, lookups log one warning and return the kernel's default config (or the last results
saved in ``cache_file``). Errors of ``submit``/``wait`` are raised as ``TunerClientError``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from tuner.config import KernelConfig
from tuner.shapes import shape_key

log = logging.getLogger(__name__)


class TunerClientError(Exception):
    """The service refused a request or could not be reached (submit, wait)."""


def _default_config(kernel: str, shape: Mapping[str, int], dtype: str) -> KernelConfig:
    from search_spaces import get_kernel

    return KernelConfig(get_kernel(kernel).default_config(shape, dtype))


class TunerClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 5.0,
                 transport: httpx.BaseTransport | None = None,
                 cache_file: str | Path | None = None) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                  headers=headers, transport=transport)
        self.cache_file = Path(cache_file) if cache_file else None
        self._cache: dict[str, dict[str, Any]] = self._load_cache()
        self._warned = False

    # -- lookups (never raise) ----------------------------------------------------------------

    @staticmethod
    def _key(kernel: str, shape: Mapping[str, int], dtype: str, device: str | None) -> str:
        return f"{kernel}|{dtype}|{device or '*'}|{shape_key(shape)}"

    def best_config(self, kernel: str, shape: Mapping[str, int], dtype: str,
                    device: str | None = None) -> KernelConfig:
        """The tuned config (exact, or the nearest tuned shape), else the kernel's default."""
        key = self._key(kernel, shape, dtype, device)
        if key not in self._cache:
            self.prefetch(kernel, [shape], dtype, device)
        hit = self._cache.get(key)
        if hit is not None:
            return KernelConfig(hit["config"])
        return _default_config(kernel, shape, dtype)

    def lookup(self, kernel: str, shape: Mapping[str, int], dtype: str,
               device: str | None = None) -> dict[str, Any] | None:
        """The full answer the service gave (match, ms, ...) if one is known."""
        return self._cache.get(self._key(kernel, shape, dtype, device))

    def prefetch(self, kernel: str, shapes: Sequence[Mapping[str, int]], dtype: str,
                 device: str | None = None) -> int:
        """Fetch many shapes in one request; returns how many the service answered."""
        items = [{"kernel": kernel, "dtype": dtype, "shape": dict(s), "device": device}
                 for s in shapes]
        try:
            response = self._http.post("/api/v1/configs/query", json={"items": items})
            response.raise_for_status()
            data = response.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self._warn(f"tuning service unavailable ({type(exc).__name__}: {exc}); using "
                       f"{'cached' if self._cache else 'default'} configs")
            return 0
        for shape, answer in zip(shapes, data, strict=True):
            self._cache[self._key(kernel, shape, dtype, device)] = answer
        self._save_cache()
        return len(data)

    def _warn(self, message: str) -> None:
        if not self._warned:
            log.warning(message)
            self._warned = True

    def _load_cache(self) -> dict[str, dict[str, Any]]:
        if self.cache_file is None or not self.cache_file.is_file():
            return {}
        try:
            data = json.loads(self.cache_file.read_text())
            return dict(data) if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_cache(self) -> None:
        if self.cache_file is None:
            return
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._cache, indent=1, sort_keys=True))
        tmp.replace(self.cache_file)

    # -- jobs (raise TunerClientError) ---------------------------------------------------------

    def _request(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise TunerClientError(f"{method} {url}: {exc}") from exc
        if response.status_code >= 400:
            raise TunerClientError(f"{method} {url}: {response.status_code} {response.text}")
        result: dict[str, Any] = response.json()
        return result

    def submit(self, kernel: str, shapes: Sequence[Mapping[str, int]], dtype: str,
               trials: int = 48, seconds: float | None = None, strategy: str = "auto",
               force: bool = False, device: str | None = None) -> str:
        body = {"kernel": kernel, "dtype": dtype, "shapes": [dict(s) for s in shapes],
                "budget": {"trials": trials, "seconds": seconds}, "strategy": strategy,
                "force": force, "device": device}
        return str(self._request("POST", "/api/v1/jobs", json=body)["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/api/v1/jobs/{job_id}")

    def wait(self, job_id: str, timeout: float = 3600.0, poll: float = 1.0) -> dict[str, Any]:
        """Poll until the job is finished; TunerClientError when ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            if time.monotonic() > deadline:
                raise TunerClientError(f"job {job_id} still {job['status']} after {timeout} s")
            time.sleep(poll)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TunerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
