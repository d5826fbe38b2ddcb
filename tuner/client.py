"""``TunerClient``: fetch tuned launch parameters at model start-up, submit and wait for jobs.

A model's start-up never fails because of the service. When it is down, slow or answers an
error, lookups log ONE warning and answer from ``cache_file`` (the answers a previous run saved)
or else with the kernel's default config; after a connection failure the client does not try
the service again for ``retry_after_s``, so a model with many kernels pays the timeout once.
The only error a lookup raises is ``UnknownKernel``, for a kernel this installation does not
have (there is no default to give). ``submit``/``job``/``wait`` raise ``TunerClientError``.

Lookup order: this process's answers from the service -> the service -> ``cache_file`` ->
the kernel's default.
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

TERMINAL = ("succeeded", "failed", "cancelled")


class TunerClientError(Exception):
    """The service refused a request or could not be reached (submit, job, wait)."""


def default_config(kernel: str, shape: Mapping[str, int], dtype: str) -> KernelConfig:
    """The kernel's own default (imports the kernel registry only when needed)."""
    from search_spaces import get_kernel

    return KernelConfig(get_kernel(kernel).default_config(shape, dtype))


def _config_of(answer: Mapping[str, Any] | None) -> KernelConfig | None:
    """The config of a stored answer; None when the answer is unusable (an old or hand-edited
    cache file)."""
    try:
        return KernelConfig(answer["config"]) if answer is not None else None
    except (KeyError, TypeError):
        return None


class TunerClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 5.0,
                 transport: httpx.BaseTransport | None = None,
                 cache_file: str | Path | None = None, retry_after_s: float = 30.0) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                  headers=headers, transport=transport)
        self.cache_file = Path(cache_file).expanduser() if cache_file else None
        self.retry_after_s = retry_after_s
        self._answers: dict[str, dict[str, Any]] = {}
        self._saved: dict[str, dict[str, Any]] | None = None  # cache_file, read when needed
        self._down_until = 0.0
        self._warned = False

    # -- lookups (never raise for a known kernel) ---------------------------------------------

    @staticmethod
    def _key(kernel: str, shape: Mapping[str, int], dtype: str, device: str | None) -> str:
        return f"{kernel}|{dtype}|{device or '*'}|{shape_key(shape)}"

    def best_config(self, kernel: str, shape: Mapping[str, int], dtype: str,
                    device: str | None = None) -> KernelConfig:
        """The tuned config (exact, or the nearest tuned shape), else the kernel's default."""
        key = self._key(kernel, shape, dtype, device)
        if key not in self._answers:
            self.prefetch(kernel, [shape], dtype, device)
        config = _config_of(self.lookup(kernel, shape, dtype, device))
        return config if config is not None else default_config(kernel, shape, dtype)

    def lookup(self, kernel: str, shape: Mapping[str, int], dtype: str,
               device: str | None = None) -> dict[str, Any] | None:
        """The full answer (match, ms, ...) from the service or the cache file, if known;
        never contacts the service."""
        key = self._key(kernel, shape, dtype, device)
        return self._answers.get(key) or self._saved_answers().get(key)

    def prefetch(self, kernel: str, shapes: Sequence[Mapping[str, int]], dtype: str,
                 device: str | None = None) -> int:
        """Fetch many shapes in one request; returns how many the service answered (0 when it
        could not be asked: then lookups use the cache file or defaults)."""
        if time.monotonic() < self._down_until:
            return 0
        items = [{"kernel": kernel, "dtype": dtype, "shape": dict(s), "device": device}
                 for s in shapes]
        data = self._query(items)
        if data is None:
            return 0
        for shape, answer in zip(shapes, data, strict=True):
            self._answers[self._key(kernel, shape, dtype, device)] = answer
        self._save_cache()
        return len(data)

    def _query(self, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        try:
            response = self._http.post("/api/v1/configs/query", json={"items": items})
        except httpx.HTTPError as exc:
            self._down_until = time.monotonic() + self.retry_after_s
            self._warn(f"tuning service unreachable ({type(exc).__name__}: {exc})")
            return None
        if response.status_code >= 500:
            self._down_until = time.monotonic() + self.retry_after_s
        try:
            response.raise_for_status()
            data = response.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self._warn(f"tuning service answered {response.status_code}: "
                       f"{response.text[:300] or exc}")
            return None
        if not isinstance(data, list) or len(data) != len(items):
            self._warn("tuning service sent a malformed answer")
            return None
        return data

    def _warn(self, why: str) -> None:
        if not self._warned:
            source = "the cache file or defaults" if self.cache_file else "default configs"
            log.warning("%s; using %s (this warning is shown once)", why, source)
            self._warned = True

    def _saved_answers(self) -> dict[str, dict[str, Any]]:
        if self._saved is None:
            self._saved = self._load_cache()
        return self._saved

    def _load_cache(self) -> dict[str, dict[str, Any]]:
        if self.cache_file is None or not self.cache_file.is_file():
            return {}
        try:
            data = json.loads(self.cache_file.read_text())
        except (OSError, ValueError):
            log.warning("cache file %s is unreadable; ignoring it", self.cache_file)
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(
            data, dict) else {}

    def _save_cache(self) -> None:
        """Merge this process's answers into the cache file (atomically)."""
        if self.cache_file is None:
            return
        merged = {**self._saved_answers(), **self._answers}
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(self.cache_file.suffix + ".tmp")
            tmp.write_text(json.dumps(merged, indent=1, sort_keys=True))
            tmp.replace(self.cache_file)
        except OSError as exc:
            log.warning("could not write cache file %s: %s", self.cache_file, exc)

    # -- jobs (raise TunerClientError) ---------------------------------------------------------

    def _request(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise TunerClientError(f"{method} {url}: {exc}") from exc
        if response.status_code >= 400:
            raise TunerClientError(f"{method} {url}: {response.status_code} {response.text}")
        try:
            result: dict[str, Any] = response.json()
        except ValueError as exc:
            raise TunerClientError(f"{method} {url}: the answer is not JSON") from exc
        return result

    def submit(self, kernel: str, shapes: Sequence[Mapping[str, int]], dtype: str,
               trials: int = 48, seconds: float | None = None, strategy: str = "auto",
               force: bool = False, device: str | None = None) -> str:
        """Queue a tuning job; returns its id (an identical active job's id when there is
        one)."""
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
            if job["status"] in TERMINAL:
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
