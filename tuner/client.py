"""``TunerClient``: fetch tuned launch parameters at model start-up, submit and wait for jobs.

A model's start-up never fails because of the service. When it is down, slow or answers an
error, lookups log ONE warning and answer from ``cache_file`` (the answers a previous run saved)
or else with the kernel's default config; after a failure the client does not try the service
again for ``retry_after_s``, so a model with many kernels pays the deadline once. ``timeout`` is
ONE deadline for a whole lookup request (connecting, sending, and reading the answer however
slowly the server trickles it), not a per-read timeout. The only error a lookup raises is
``UnknownKernel``, for a kernel this installation does not have (there is no default to give).
The job methods (``submit``, ``job``, ``jobs``, ``wait``, ``cancel``) raise ``TunerClientError``:
``ServiceUnreachable`` when no answer came, ``JobTimeout`` when ``wait`` gave up.

The client sends who is asking with every lookup: its device key (detected: the current CUDA
GPU, or the interpreter under ``TRITON_INTERPRET=1``), its Triton version and the kernel's
source version, so that ``"match": "exact"`` means this GPU model, this kernel source and this
Triton minor version. With ``report_misses``, the service queues a tuning job for every shape it
could not answer exactly, so the next start-up finds it tuned (a service with API keys queues
them only for a read-write ``api_key``; others' misses are recorded, answered ``read-only``).

Lookup order: ``configs_file`` (an exported file: exact identity only) -> this process's answers
from the service -> the service -> ``cache_file`` -> the kernel's default.

Timing: lookups ask for configs timed with the client's ``timing`` (``tuner/timing.py``; default
``TUNER_TIMING``, else ``eager-flushed``): ``cuda-graph`` where the kernels run in CUDA graphs
(a serving engine's decode step). ``exact_config`` takes only a config timed that way.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tuner.config import KernelConfig
from tuner.identity import local_device_key, local_triton_version
from tuner.lifecycle import TERMINAL
from tuner.shapes import shape_key
from tuner.timing import DEFAULT_TIMING, check_timing, timing_from_env

log = logging.getLogger(__name__)

#: the longest the service holds a look at a job (``GET /api/v1/jobs/{id}?wait_s=``)
MAX_WAIT_S = 60.0

#: ``device=AUTO``: detect this process's device on the first lookup
AUTO = "auto"
#: the most items of one POST /configs/query (the service refuses more)
QUERY_ITEMS_MAX = 4_096
#: the most lookups a keys file remembers (the newest)
KEYS_FILE_MAX = 4_000


#: how many times a job request answered 503 is sent again (``TunerClient._request``)
JOB_REQUEST_RETRIES = 3
#: the longest wait between those retries, whatever ``Retry-After`` says
RETRY_AFTER_MAX_S = 5.0


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(RETRY_AFTER_MAX_S, max(0.0, float(response.headers.get("retry-after", 1))))
    except ValueError:  # an HTTP date: not worth parsing for a wait this short
        return 1.0


class TunerClientError(Exception):
    """The service refused a job request or could not be reached (submit, job, jobs, wait,
    cancel). ``status``: the HTTP status of the answer (None: there was none); ``detail``: the
    service's error items (``{"loc": [...], "msg": ..., "type": ...}``, the shape of every
    error the API sends; empty when it sent none)."""

    def __init__(self, message: str, status: int | None = None,
                 detail: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.detail = [dict(d) for d in detail]

    @property
    def field(self) -> str | None:
        """The input the service named, dotted and without its place in the request
        (``shapes.0.K``, ``budget.trials``, ``job_id``); None when it named none."""
        loc = self.detail[0].get("loc") if self.detail else None
        parts = [str(p) for p in loc[1:]] if isinstance(loc, list) and loc else []
        return ".".join(parts) or None

    @property
    def reason(self) -> str:
        """What the service said was wrong (its messages), else this error's message."""
        said = [str(d["msg"]) for d in self.detail if d.get("msg")]
        return "; ".join(said) or str(self)


class ServiceUnreachable(TunerClientError):
    """No answer came: the service is down, the address is wrong or the network failed."""


class JobTimeout(TunerClientError):
    """``wait`` gave up before the job finished (the job goes on). ``job``: as last seen."""

    def __init__(self, message: str, job: dict[str, Any]) -> None:
        super().__init__(message)
        self.job = job


def _error_detail(response: httpx.Response) -> list[dict[str, Any]]:
    """The error items of an answer: the API's ``detail`` list, or its text as one item (a
    401/403 from the key check, a proxy's error page)."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list) and all(isinstance(d, dict) for d in detail):
        return detail
    text = detail if isinstance(detail, str) else response.text[:300]
    return [{"loc": [], "msg": text or response.reason_phrase, "type": "http_error"}]


class _DeadlineExceeded(Exception):
    """A lookup request did not finish within the client's deadline."""


def default_config(kernel: str, shape: Mapping[str, int], dtype: str) -> KernelConfig:
    """The kernel's own default (imports the kernel registry only when needed)."""
    from search_spaces import get_kernel

    return KernelConfig(get_kernel(kernel).default_config(shape, dtype))


def local_kernel_version(kernel: str) -> str | None:
    """The source version of ``kernel`` as installed here; None when it is not installed
    (the service then assumes its own version)."""
    from search_spaces import get_kernel
    from tuner.errors import UnknownKernel

    try:
        return get_kernel(kernel).version
    except UnknownKernel:
        return None


def _config_of(answer: Mapping[str, Any] | None) -> KernelConfig | None:
    """The config of a stored answer; None when the answer is unusable (an old or hand-edited
    cache file)."""
    try:
        return KernelConfig(answer["config"]) if answer is not None else None
    except (KeyError, TypeError):
        return None


def _with_deadline(call: Any, deadline_s: float) -> Any:
    """``call()`` in a daemon thread, abandoned after ``deadline_s``: httpx's timeouts are per
    socket operation, so a server that trickles one byte a second would otherwise hold a
    lookup for as long as it likes."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="tuner-client-lookup")
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise _DeadlineExceeded(f"no complete answer within {deadline_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _job_path(job_id: str) -> str:
    """The API path of a job; the id is quoted whole (a ``/`` or ``?`` typed into it must not
    name another resource)."""
    return f"/api/v1/jobs/{quote(job_id, safe='')}"


class TunerClient:
    def __init__(self, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 5.0, transport: httpx.BaseTransport | None = None,
                 cache_file: str | Path | None = None, retry_after_s: float = 30.0, *,
                 configs_file: str | Path | None = None, device: str | None = AUTO,
                 report_misses: bool = False, client_name: str | None = None,
                 timing: str | None = None, keys_file: str | Path | None = None) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        self.base_url = base_url.rstrip("/") if base_url else None
        self._http = httpx.Client(base_url=self.base_url or "http://service.invalid",
                                  timeout=timeout, headers=headers, transport=transport)
        self.timeout = timeout
        self.cache_file = Path(cache_file).expanduser() if cache_file else None
        self.configs_file = Path(configs_file).expanduser() if configs_file else None
        #: the lookups this client's processes asked the service (``recall``): the first
        #: request of a process asks them all at once, so a restart asks once
        self.keys_file = Path(keys_file).expanduser() if keys_file else None
        self._recalled = False
        self.retry_after_s = retry_after_s
        self.report_misses = report_misses
        self.client_name = client_name or socket.gethostname()
        #: the timing method lookups ask for unless one is named (InvalidRequest: unknown)
        self.timing = check_timing(timing) if timing else timing_from_env()
        self._device = device
        self._triton_version: str | None = None
        self._answers: dict[str, dict[str, Any]] = {}
        self._saved: dict[str, dict[str, Any]] | None = None  # cache_file, read when needed
        self._file: Any = None  # configs_file, read when needed
        self._down_until = 0.0
        self._warned = False
        self._lock = threading.Lock()

    # -- identity ------------------------------------------------------------------------------

    @property
    def device(self) -> str | None:
        """The device key lookups are for (detected on first use unless given)."""
        if self._device == AUTO:
            self._device = local_device_key()
        return self._device

    @property
    def triton_version(self) -> str | None:
        if self._triton_version is None:
            self._triton_version = local_triton_version() or ""
        return self._triton_version or None

    # -- lookups (never raise for a known kernel) ---------------------------------------------

    def _key(self, kernel: str, shape: Mapping[str, int], dtype: str, device: str | None,
             kernel_version: str | None = None, timing: str = DEFAULT_TIMING) -> str:
        version = f"@{kernel_version}" if kernel_version else ""
        method = "" if timing == DEFAULT_TIMING else f"|{timing}"  # older cache files' keys
        return f"{kernel}{version}|{dtype}|{device or '*'}|{shape_key(shape)}{method}"

    def best_config(self, kernel: str, shape: Mapping[str, int], dtype: str,
                    device: str | None = None,
                    kernel_version: str | None = None,
                    timing: str | None = None) -> KernelConfig:
        """The tuned config (exact, or the service's labelled fallback), else the kernel's
        default. ``timing``: the method to choose by (default: the client's)."""
        device, timing = device or self.device, timing or self.timing
        key = self._key(kernel, shape, dtype, device, kernel_version, timing)
        in_file = self._file_entry(kernel, shape, dtype, device, kernel_version,
                                   timing) is not None
        if not in_file and key not in self._answers:
            self.prefetch(kernel, [shape], dtype, device, kernel_version, timing)
        answer = self.lookup(kernel, shape, dtype, device, kernel_version, timing)
        config = _config_of(answer)
        return config if config is not None else default_config(kernel, shape, dtype)

    def exact_config(self, kernel: str, shape: Mapping[str, int], dtype: str, *,
                     kernel_version: str | None = None, timing: str | None = None
                     ) -> tuple[KernelConfig, str] | None:
        """A config tuned for exactly this device, kernel source and Triton minor and timed
        with ``timing`` (default: the client's), and where it came from (``"file"`` or
        ``"service"``); None when neither has one (what ``tuner.autotune`` asks before falling
        back to Triton's own autotuning)."""
        timing = timing or self.timing
        entry = self._file_entry(kernel, shape, dtype, self.device, kernel_version, timing)
        if entry is not None:
            return entry["config"], "file"
        key = self._key(kernel, shape, dtype, self.device, kernel_version, timing)
        if key not in self._answers:
            self.prefetch(kernel, [shape], dtype, None, kernel_version, timing)
        answer = self._answers.get(key)
        config = _config_of(answer)
        if answer is not None and answer.get("match") == "exact" and config is not None \
                and not answer.get("timing_fallback"):
            return config, "service"
        return None

    def lookup(self, kernel: str, shape: Mapping[str, int], dtype: str,
               device: str | None = None,
               kernel_version: str | None = None,
               timing: str | None = None) -> dict[str, Any] | None:
        """The full answer (match, ms, timing, ...) from the configs file, this process's
        answers or the cache file, if known; never contacts the service."""
        device, timing = device or self.device, timing or self.timing
        entry = self._file_entry(kernel, shape, dtype, device, kernel_version, timing)
        if entry is not None:
            return entry
        key = self._key(kernel, shape, dtype, device, kernel_version, timing)
        return self._answers.get(key) or self._saved_answers().get(key)

    def prefetch(self, kernel: str, shapes: Sequence[Mapping[str, int]], dtype: str,
                 device: str | None = None, kernel_version: str | None = None,
                 timing: str | None = None) -> int:
        """Fetch many shapes in one request; returns how many the service answered (0 when it
        could not be asked: then lookups use the files or defaults)."""
        if self.base_url is None or time.monotonic() < self._down_until:
            return 0
        device, timing = device or self.device, timing or self.timing
        version = kernel_version or local_kernel_version(kernel)
        # the default method is not named: a service older than timing methods answers too
        method = {} if timing == DEFAULT_TIMING else {"timing": timing}
        items = [{"kernel": kernel, "dtype": dtype, "shape": dict(s), "device": device,
                  "kernel_version": version, "triton_version": self.triton_version, **method}
                 for s in shapes]
        keys = [self._key(kernel, shape, dtype, device, kernel_version, timing)
                for shape in shapes]
        recalled = self._recall(set(keys), QUERY_ITEMS_MAX - len(items))
        data = self._query(items + [item for _, item in recalled])
        if data is None and recalled and time.monotonic() >= self._down_until:
            # the service answered, refusing an earlier process's lookup (a kernel gone)
            self._forget()
            recalled, data = [], self._query(items)
        if data is None:
            return 0
        for key, answer in zip(keys + [k for k, _ in recalled], data, strict=True):
            self._answers[key] = answer
        self._remember(zip(keys, items, strict=True))
        self._save_cache()
        return len(items)

    def _read_keys(self) -> dict[str, dict[str, Any]]:
        assert self.keys_file is not None
        try:
            data = json.loads(self.keys_file.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(
            data, dict) else {}

    def _recall(self, asking: set[str], room: int) -> list[tuple[str, dict[str, Any]]]:
        """On this client's first request: the lookups earlier processes asked (the keys
        file) for this device and Triton, not answered yet, to ask in the same request."""
        if self._recalled or self.keys_file is None or room <= 0:
            return []
        self._recalled = True
        saved = self._read_keys()
        return [(key, item) for key, item in saved.items()
                if key not in asking and key not in self._answers
                and item.get("device") == self.device
                and item.get("triton_version") == self.triton_version][:room]

    def _remember(self, asked: Any) -> None:
        """Add this process's lookups to the keys file (atomically; the newest
        ``KEYS_FILE_MAX``)."""
        if self.keys_file is None:
            return
        with self._lock:
            saved = self._read_keys()
            new = {key: item for key, item in asked if key not in saved}
            if not new:
                return
            merged = list({**saved, **new}.items())[-KEYS_FILE_MAX:]
            try:
                self.keys_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.keys_file.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(dict(merged), sort_keys=False))
                tmp.replace(self.keys_file)
            except OSError as exc:
                log.warning("could not write keys file %s: %s", self.keys_file, exc)

    def _forget(self) -> None:
        """The keys file named a lookup the service refused: it is started anew."""
        if self.keys_file is not None:
            log.warning("the service refused a lookup of %s: starting it anew", self.keys_file)
            self.keys_file.unlink(missing_ok=True)

    def _query(self, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        body: dict[str, Any] = {"items": items}
        if self.report_misses:
            body.update(report_misses=True, client=self.client_name)
        try:
            response = _with_deadline(
                lambda: self._http.post("/api/v1/configs/query", json=body), self.timeout)
        except (httpx.HTTPError, _DeadlineExceeded) as exc:
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

    def report_measured(self, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Send what Triton's own autotuning measured in this process (``POST
        /configs/measured``: per item the kernel's identity, the shape and every config's
        timings), one request under the deadline; the service's answers, or None when it
        could not be told (one warning)."""
        if self.base_url is None or time.monotonic() < self._down_until:
            return None
        try:
            response = _with_deadline(lambda: self._http.post(
                "/api/v1/configs/measured", json={"items": items}), self.timeout)
            response.raise_for_status()
            data = response.json()["data"]
        except (httpx.HTTPError, _DeadlineExceeded, ValueError, KeyError, TypeError) as exc:
            self._warn(f"tuning service did not take measured timings ({type(exc).__name__}: "
                       f"{str(exc)[:300]})")
            return None
        return data if isinstance(data, list) else None

    def _warn(self, why: str) -> None:
        if not self._warned:
            known = "the configs file" if self.configs_file else ""
            if self.cache_file:
                known = f"{known} and the cache file" if known else "the cache file"
            known = f"answers from {known}, else " if known else ""
            log.warning("%s; until it answers, kernels launch with %sno tuned config: "
                        "best_config gives the kernel's default config, and tuner.autotune "
                        "runs Triton's own autotuning over the listed configs (their first "
                        "config where Triton cannot benchmark: CPU interpreter, no GPU "
                        "driver) (this warning is shown once)", why, known)
            self._warned = True

    def _file_entry(self, kernel: str, shape: Mapping[str, int], dtype: str,
                    device: str | None, kernel_version: str | None,
                    timing: str = DEFAULT_TIMING) -> dict[str, Any] | None:
        """The exported file's exact entry (timed ``timing``) as an answer, if it has one."""
        if self.configs_file is None or device is None:
            return None
        with self._lock:
            if self._file is None:
                self._file = self._load_configs_file()
        if not self._file:
            return None
        entry = self._file.lookup(kernel, dtype, shape, device=device,
                                  kernel_version=kernel_version or local_kernel_version(kernel),
                                  triton_version=self.triton_version, timing=timing)
        if entry is None:
            return None
        return {"match": "exact", "source": "file", "kernel": kernel, "dtype": dtype,
                "shape": dict(shape), "device": entry.device, "config": entry.config,
                "ms": entry.ms, "kernel_version": entry.kernel_version,
                "triton_version": entry.triton_version, "timing": entry.timing,
                "timing_fallback": False}

    def _load_configs_file(self) -> Any:
        from tuner.configs_file import ConfigsFile
        from tuner.errors import ConfigsFileError

        assert self.configs_file is not None
        try:
            return ConfigsFile.load(self.configs_file)
        except ConfigsFileError as exc:
            log.warning("%s; not using it", exc)
            return False

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
        """One job request. A 503 (the service's database busy or briefly away) is retried
        after the ``Retry-After`` the service gives (at most ``RETRY_AFTER_MAX_S``), up to
        ``JOB_REQUEST_RETRIES`` times: every job request is safe to repeat (a repeated
        submission is answered with the job the first one created)."""
        if self.base_url is None:
            raise TunerClientError("this client has no service URL (base_url=None)")
        for attempt in range(JOB_REQUEST_RETRIES + 1):
            try:
                response = self._http.request(method, url, **kwargs)
            except httpx.TransportError as exc:
                raise ServiceUnreachable(f"cannot reach the tuning service at {self.base_url} "
                                         f"({type(exc).__name__}: {exc})") from exc
            except httpx.HTTPError as exc:
                raise TunerClientError(f"{method} {url}: {exc}") from exc
            if response.status_code != 503 or attempt == JOB_REQUEST_RETRIES:
                break
            log.info("%s %s: 503 (%s); retrying", method, url, response.text[:200])
            time.sleep(_retry_after(response))
        if response.status_code >= 400:
            raise TunerClientError(f"{method} {url}: {response.status_code} {response.text}",
                                   status=response.status_code, detail=_error_detail(response))
        try:
            result: dict[str, Any] = response.json()
        except ValueError as exc:
            raise TunerClientError(f"{method} {url}: the answer is not JSON") from exc
        return result

    def submit(self, kernel: str, shapes: Sequence[Mapping[str, int]], dtype: str,
               trials: int = 48, seconds: float | None = None, strategy: str = "auto",
               force: bool = False, device: str | None = None,
               timing: str | None = None) -> str:
        """Queue a tuning job; returns its id (an identical active job's id when there is
        one)."""
        return str(self.submit_job(kernel, shapes, dtype, trials=trials, seconds=seconds,
                                   strategy=strategy, force=force, device=device,
                                   timing=timing)["id"])

    def submit_job(self, kernel: str, shapes: Sequence[Mapping[str, int]], dtype: str, *,
                   trials: int = 48, seconds: float | None = None, strategy: str = "auto",
                   force: bool = False, device: str | None = None, seed: int = 0,
                   backend: str = "auto", timing: str | None = None,
                   future_device: bool = False) -> dict[str, Any]:
        """Queue a tuning job timed with ``timing`` (default: the client's); the service's
        answer: ``id``, ``status``, ``url``, ``deduplicated`` (an identical active job was
        returned) and ``answered_from_store`` (shapes already tuned, answered at once).
        ``future_device``: ``device`` is for a worker that has not registered yet (else the
        service refuses a key it does not know)."""
        timing = timing or self.timing
        body: dict[str, Any] = {
            "kernel": kernel, "dtype": dtype, "shapes": [dict(s) for s in shapes],
            "budget": {"trials": trials, "seconds": seconds}, "strategy": strategy,
            "force": force, "device": device, "seed": seed, "backend": backend}
        if timing != DEFAULT_TIMING:  # unnamed, an older service takes the body too
            body["timing"] = timing
        if future_device:
            body["future_device"] = True
        return self._request("POST", "/api/v1/jobs", json=body)

    def stored_configs(self, kernel: str | None = None, dtype: str | None = None,
                       device: str | None = None) -> list[dict[str, Any]]:
        """Every stored best config of the service (``GET /configs/stored``) of ``kernel``,
        ``dtype`` and ``device`` where given, each with its whole identity and times."""
        params = {k: v for k, v in (("kernel", kernel), ("dtype", dtype), ("device", device))
                  if v}
        return list(self._request("GET", "/api/v1/configs/stored", params=params)["data"])

    def job(self, job_id: str) -> dict[str, Any]:
        """The job and its tasks; ``job_id``: its id or a unique prefix of it (4 characters
        or more)."""
        return self._request("GET", _job_path(job_id))

    def jobs(self, status: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The newest jobs (of that status), newest first."""
        params: dict[str, Any] = {"limit": limit, **({"status": status} if status else {})}
        return list(self._request("GET", "/api/v1/jobs", params=params)["data"])

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued or running job (id or unique prefix); the job as it is now (a
        finished job is left as it was)."""
        return self._request("POST", f"{_job_path(job_id)}/cancel")

    def wait(self, job_id: str, timeout: float = 3600.0, poll: float = 1.0,
             on_poll: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Wait until the job is finished and return it; ``on_poll`` sees the job each time
        it is read (progress). Each read after the first asks the service to answer once the
        job changes (``wait_s``, at most ``poll`` seconds), so the finish is heard within
        ~50 ms, not up to ``poll`` late; a service that answers at once anyway (an older
        one) is read every ``poll`` seconds. JobTimeout, with the job as last seen, when
        ``timeout`` passes first (the job goes on)."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while True:
            asked = time.monotonic()
            # within the client's own HTTP timeout, with room for the answer, and the
            # service's longest wait
            wait_s = (0.0 if last is None
                      else max(0.0, min(poll, deadline - asked, 0.8 * self.timeout,
                                        MAX_WAIT_S)))
            job = self._request("GET", _job_path(job_id),
                                params={"wait_s": round(wait_s, 3)} if wait_s else None)
            if on_poll is not None:
                on_poll(job)
            if job["status"] in TERMINAL:
                return job
            if time.monotonic() >= deadline:
                raise JobTimeout(f"job {job['id']} still {job['status']} after {timeout:g} s",
                                 job)
            if job == last:  # unchanged, and maybe answered without waiting: pace the reads
                time.sleep(max(0.0, min(poll - (time.monotonic() - asked),
                                        deadline - time.monotonic())))
            last = job

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TunerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
