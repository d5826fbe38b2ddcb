"""The service's one Settings object (environment variables with the ``TUNER_`` prefix).

Only entry points (the CLI, ``tuner serve``, ``tuner worker``, the API app) read it; engine code
takes explicit arguments. Invalid values fail at start-up with the variable's name.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """``$TUNER_DATA_DIR``, else ``./data`` (absolute)."""
    return data_dir_path(os.environ.get("TUNER_DATA_DIR") or "data")


def data_dir_path(path: str | Path) -> Path:
    """A data folder as given (``~`` expanded), made absolute."""
    return Path(path).expanduser().resolve()


def sqlite_database_url(data_dir: Path) -> str:
    """The embedded database of a data folder: ``sqlite:///<data_dir>/tuner.db``. The one
    spelling of the default database (``Settings.resolved_database_url``,
    ``db.engine.default_database_url``)."""
    return f"sqlite:///{data_dir / 'tuner.db'}"


def default_database_url() -> str:
    """The database used when ``TUNER_DATABASE_URL`` is not set: the SQLite file in the
    default data folder."""
    return sqlite_database_url(default_data_dir())


class DatabaseBounds(NamedTuple):
    """Limits the PostgreSQL server enforces on every connection the service opens (seconds;
    0: none), so that a process frozen in a transaction (SIGSTOP, a debugger, a swap storm)
    cannot hold up the others: ``lock_timeout``, the longest a statement waits for a lock
    before it fails (transiently: it is retried, ``db.transient``) instead of queueing behind
    a frozen holder; ``idle_in_transaction_session_timeout``, after which the server aborts
    a transaction whose client went silent, releasing its locks (the client's next use
    fails transiently; its writes are fenced by the task's lease). SQLite has no server:
    a frozen writer holds its lock until it resumes or dies."""

    lock_timeout_s: float = 5.0
    idle_in_transaction_s: float = 10.0

    @property
    def frozen_holder_s(self) -> float:
        """How long a lock held by a frozen process can fail a statement that needs it: until
        the server aborts the holder's transaction, and one lock wait more."""
        return self.idle_in_transaction_s + self.lock_timeout_s


class Settings(BaseSettings):
    # errors name the variable but never echo its value (TUNER_API_KEYS holds secrets)
    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore",
                                      hide_input_in_errors=True)

    #: folder for the default SQLite database and exported config files
    data_dir: Path = Field(default_factory=default_data_dir)
    #: SQLAlchemy URL; default: SQLite file ``<data_dir>/tuner.db``
    database_url: str = ""
    #: comma-separated API keys: ``key`` or ``key:rw`` may write (submit, cancel), ``key:ro``
    #: only read; anything else stops start-up (a typo must not make a key read-write)
    api_keys: str = ""
    #: when true, reads need a key too
    auth_reads: bool = False
    #: the largest request body accepted, in bytes (larger: 413, before it is read). The
    #: largest bulk lookup (4,096 items of POST /configs/query) takes 785,333 B as the client
    #: sends it for matmul, 1,059,815 B for a 19-letter kernel with 40-character versions
    max_body_bytes: int = Field(default=3 * 2**19, gt=0)
    #: seconds a claimed task's lease lasts without a heartbeat
    lease_seconds: float = Field(default=60.0, gt=1)
    #: seconds between reaper passes (re-queueing tasks whose lease expired)
    reap_interval_seconds: float = Field(default=15.0, gt=0)
    #: how queued tasks reach workers (tuner.app.dispatch): auto = procrastinate on PostgreSQL,
    #: embedded on SQLite; or embedded, procrastinate
    dispatch: str = "auto"
    #: procrastinate dispatch: seconds without a worker's heartbeat before its running task is
    #: given to another worker (heartbeats every quarter of it)
    stalled_after_s: float = Field(default=15.0, ge=2)
    #: seconds a worker retries a database write that failed transiently (a dropped
    #: connection, a lock held past SQLite's busy timeout) before it re-queues its task
    db_retry_seconds: float = Field(default=60.0, ge=0)
    #: seconds a PostgreSQL statement waits for a lock before failing transiently (and being
    #: retried), instead of queueing behind a transaction that does not end (0: no limit)
    db_lock_timeout_s: float = Field(default=DatabaseBounds().lock_timeout_s, ge=0)
    #: seconds PostgreSQL lets a transaction sit idle before it aborts it and releases its
    #: locks: a frozen process's (0: no limit). No worker transaction spans a measurement
    db_idle_in_transaction_s: float = Field(default=DatabaseBounds().idle_in_transaction_s,
                                            ge=0)
    #: workers ``tuner serve`` starts: -1 = one per local GPU (or one interpreter worker)
    workers: int = -1
    #: backend of the workers ``tuner serve`` starts
    backend: str = "auto"
    #: API processes (uvicorn workers) ``tuner serve`` starts: 0 = one per CPU core, at most 8
    api_workers: int = Field(default=2, ge=0)
    #: seconds between an API process's checks that the stored best configs changed (its
    #: in-memory serving index, ``api/serving.py``); 0: every lookup reads the database
    serving_refresh_s: float = Field(default=0.5, ge=0)
    max_trials: int = Field(default=2000, gt=0)
    max_shapes_per_job: int = Field(default=256, gt=0)
    #: workers stop a search after this many trials without an improvement beyond the noise
    #: (0: never; the budget decides)
    patience: int = Field(default=0, ge=0)
    #: workers stop a search once the model's chance that an untried config beats the best by
    #: over 2% falls under this (after 16 trials, 6 of them without an improvement; strategies
    #: without a model never stop this way); 0: never, the trial budget decides
    stop_chance: float = Field(default=0.05, ge=0, lt=1)
    #: workers stop a search once its best reaches this fraction of the device's roofline for
    #: the problem, where that floor is the copy bandwidth's (a memory-bound problem; a
    #: compute-bound one's floor is the vendor GEMM's speed, which a tuned kernel can pass)
    #: (0: never)
    roofline_stop: float = Field(default=0.95, ge=0, le=1)
    #: configs a model-guided search keeps in flight (asked, compiling or timed, not yet told
    #: to the model); a systematic strategy keeps a compile pool's worth. More: more compiles
    #: at once on a cold cache (a search waits on a config's own 1-2 s compile, so four in
    #: flight measure ~2.7 configs a second), each asked knowing less
    search_in_flight: int = Field(default=4, ge=1, le=64)
    #: a file each worker of this process touches at every presence beat it wrote to the
    #: database (every third of ``lease_seconds``): a container's health check reads its age
    #: (docker-compose.yml); empty: none
    worker_health_file: str = ""
    #: seconds a worker keeps its measuring child (and compile pool) after a task, for the
    #: next task to reuse: their start (imports, CUDA, the pool) is paid once, not per task;
    #: an idle worker closes them after this long, freeing the GPU's memory; 0: a fresh child
    #: per task
    worker_keep_seconds: float = Field(default=600.0, ge=0)
    #: seconds an idle worker of the embedded dispatch waits between looks for a queued task
    #: (a look finding nothing is one indexed SELECT): half of it on average is added to a
    #: job's wait before its first trial
    worker_poll_seconds: float = Field(default=0.2, gt=0)
    #: hours a device's calibration (its copy bandwidth and GEMM ceiling, the roofline's
    #: limits) stays good: a worker starting on a device calibrated more recently reuses it
    #: instead of measuring again (~10 s); 0: calibrate at every start
    calibration_max_age_hours: float = Field(default=168.0, ge=0)
    #: compile processes per GPU worker (compiling candidates ahead of the GPU); -1: the
    #: machine's cores shared among the workers ``tuner serve`` starts on it, less one each
    compile_workers: int = Field(default=-1, ge=-1)
    #: new misses (lookups not served exactly) one client may have queued as tuning jobs in
    #: the last hour; later ones are recorded, not queued (0: record misses, never queue)
    miss_rate_per_client: int = Field(default=60, ge=0)
    #: misses of one kernel whose jobs may be queued or running at once (0: never queue)
    miss_cap_per_kernel: int = Field(default=32, ge=0)
    #: trial budget of the job queued for a miss
    miss_trials: int = Field(default=48, gt=0)
    #: jobs that only the CPU interpreter can run are refused when one trial of a shape is
    #: estimated to take longer than this many seconds (``api/validation.py``)
    interpreter_trial_limit_s: float = Field(default=600.0, gt=0)
    #: seconds each kernel plugin's import may take (``search_spaces.registry``, which reads
    #: it): one that hangs longer is reported and skipped
    plugin_import_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    #: the host names the API answers for (its requests' Host header), comma-separated:
    #: ``name``, ``*.example.com`` (its subdomains), ``*`` (any); others are refused (400).
    #: Empty: any, except under ``tuner serve``, which sets it from ``--host``: localhost,
    #: 127.0.0.1, ::1 and that host, or any where it binds every address (0.0.0.0, ::)
    allowed_hosts: str = ""
    #: seconds ``tuner serve`` keeps an idle connection open, before its first request as
    #: between two (uvicorn's keep-alive timeout; ``api.connections``)
    keep_alive_s: int = Field(default=5, gt=0)
    #: seconds a request's head and body may take to arrive, from its first byte, under
    #: ``tuner serve``; slower (a client trickling bytes to hold connections open): a 408 and
    #: the connection closed (``api.connections``)
    request_read_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)

    @field_validator("data_dir", mode="before")
    @classmethod
    def _absolute_data_dir(cls, value: str | Path) -> Path:
        # TUNER_DATA_DIR set to "" means the default, as default_data_dir reads it
        return data_dir_path(value) if str(value) else default_data_dir()

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in ("auto", "cuda", "interpret"):
            raise ValueError("TUNER_BACKEND must be auto, cuda or interpret")
        return value

    @field_validator("dispatch")
    @classmethod
    def _known_dispatch(cls, value: str) -> str:
        if value not in ("auto", "embedded", "procrastinate"):
            raise ValueError("TUNER_DISPATCH must be auto, embedded or procrastinate")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: str) -> str:
        parse_allowed_hosts(value)  # ValueError naming TUNER_ALLOWED_HOSTS
        return value

    @field_validator("api_keys")
    @classmethod
    def _known_key_modes(cls, value: str) -> str:
        if value.strip() and not _parse_api_keys(value):
            # "," or " , " would otherwise start the service with authentication off
            raise ValueError("TUNER_API_KEYS holds separators but no key; give key, key:rw or "
                             "key:ro, comma-separated, or leave it unset to run without keys")
        return value

    @model_validator(mode="after")
    def _miss_trials_within_limit(self) -> Settings:
        if self.miss_trials > self.max_trials:
            raise ValueError(f"TUNER_MISS_TRIALS ({self.miss_trials}) is above TUNER_MAX_TRIALS "
                             f"({self.max_trials})")
        return self

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or sqlite_database_url(self.data_dir)

    @property
    def database_bounds(self) -> DatabaseBounds:
        """The server-side limits of the service's PostgreSQL connections."""
        return DatabaseBounds(self.db_lock_timeout_s, self.db_idle_in_transaction_s)

    def parsed_allowed_hosts(self) -> tuple[str, ...] | None:
        """The host names the API answers for (``parse_allowed_hosts``); None: any."""
        return parse_allowed_hosts(self.allowed_hosts)

    def parsed_api_keys(self) -> dict[str, str]:
        """key -> "rw" | "ro"."""
        return _parse_api_keys(self.api_keys)


def parse_allowed_hosts(text: str) -> tuple[str, ...] | None:
    """``"Example.com, *.corp.example, [::1]"`` -> ``("example.com", "*.corp.example",
    "::1")`` (lower case, IPv6 addresses without brackets, no trailing dot); None for ``""`` or
    ``*`` anywhere (any host). ValueError naming TUNER_ALLOWED_HOSTS for an entry with a
    scheme, a path, a port or spaces."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names or "*" in names:
        return None
    parsed = []
    for number, name in enumerate(names, start=1):
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        bare = name[2:] if name.startswith("*.") else name
        ipv6 = ":" in bare and _is_ipv6(bare)
        if not bare or any(c in bare for c in "/ *[]@") or (":" in bare and not ipv6):
            raise ValueError(f"TUNER_ALLOWED_HOSTS: entry {number} is not a host name; list "
                             "names or addresses without scheme, port or path (example.com, "
                             "*.example.com for its subdomains, 10.0.0.5, ::1), or * for any")
        parsed.append(name.rstrip("."))
    return tuple(parsed)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _parse_api_keys(text: str) -> dict[str, str]:
    """``"a,b:rw,c:ro"`` -> ``{"a": "rw", "b": "rw", "c": "ro"}``; ValueError naming
    TUNER_API_KEYS for an empty key or a mode other than rw and ro."""
    keys: dict[str, str] = {}
    # the messages never quote an entry: it is a secret, and start-up errors end up in logs
    for number, raw in enumerate(text.split(","), start=1):
        raw = raw.strip()
        if not raw:
            continue
        key, sep, mode = raw.partition(":")
        if not key.strip():
            raise ValueError(f"TUNER_API_KEYS: entry {number} has an empty key; write key, "
                             "key:rw or key:ro, comma-separated")
        if sep and mode not in ("rw", "ro"):
            raise ValueError(f"TUNER_API_KEYS: entry {number} has an unknown mode after ':' "
                             "(keys contain no ':'); the mode is rw (read-write, the default) "
                             "or ro (read-only), in lower case")
        keys[key.strip()] = mode or "rw"
    return keys


class ClientSettings(BaseSettings):
    """What a model process using ``tuner.autotune`` reads from its environment (``TUNER_``
    prefix); ``tuner.configure(...)`` overrides any of them in code."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    #: the tuning service (e.g. http://tuner:8000); empty: no service, files and Triton only
    url: str = ""
    api_key: str = ""
    #: an exported configs file (``tuner export``), consulted before the service
    configs_file: str = ""
    #: the lookups earlier processes asked the service, asked all at once by the next process's
    #: first lookup (unset: ``~/.cache/tuner/keys-<service>.json`` when ``url`` is set; empty:
    #: none)
    keys_file: str | None = None
    #: one deadline, in seconds, for a whole lookup request, however slowly the server answers
    lookup_deadline_s: float = Field(default=2.0, gt=0, le=600)
    #: ask the service to tune shapes it could not answer exactly (for the next start-up)
    report_misses: bool = True
    #: the timing method configs are chosen by (``tuner/timing.py``): ``cuda-graph`` where the
    #: kernels run in CUDA graphs
    timing: Literal["eager-flushed", "cuda-graph", "eager-hot"] = "eager-flushed"
