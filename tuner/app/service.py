"""``tuner worker`` and ``tuner serve``: the long-running processes of the service.

A worker owns one device. Its parent process never initialises CUDA: every measurement happens in
the backend's children. A worker starts its measuring child and compile pool first (they are
kept across tasks), takes the GPU's fingerprint from that child, reuses the device's calibration
from the store (or calibrates in the same child), and is ready (``ready_s`` in its log line).
``serve`` runs the API in its own process and one worker process per local GPU (or one
interpreter worker without a GPU), restarts a worker that dies, and stops them all on exit.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.app.supervision import exit_reason, restart_delay, write_state
from tuner.backends import resolve_backend_kind
from tuner.device import DeviceFingerprint, count_gpus_without_init, interpreter_fingerprint
from tuner.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

#: what ``serve`` prints when it falls back to the CPU interpreter
NO_GPU_NOTE = ("no GPU found: one worker on the Triton CPU interpreter (timings are not GPU "
               "timings; results are stored under 'interpret:cpu' and never served for a GPU)")


# -- the database, waited for at start ----------------------------------------------------------

#: seconds between attempts to reach the database at start, doubling from the first up to the
#: second: a database restarted by its supervisor answers within seconds, and one down for an
#: hour costs 240 lines on stderr, not 3,600
FIRST_RETRY_S = 1.0
#: comma-separated logger names logged at DEBUG by ``tuner serve`` and ``tuner worker``
DEBUG_LOGGERS_ENV = "TUNER_DEBUG_LOGGERS"
MAX_RETRY_S = 15.0


def wait_for_database(settings: Settings, sleep: Callable[[float], None] = time.sleep,
                      who: str = "tuner") -> sessionmaker[Session]:
    """The service database's session factory (``init_db``), once it answers. Until then (a
    PostgreSQL server down, a SQLite folder missing or unwritable) one line on stderr per
    attempt, starting with ``who`` (``tuner serve``'s workers say ``tuner worker``: they wait
    beside it), and waits doubling up to ``MAX_RETRY_S``. A URL that can never work raises
    DatabaseUrlError at once (the CLI: one line, exit 2). The embedded default's folder is
    created; an explicit SQLite URL's folder is waited for: missing, it may be a volume not
    mounted yet, and a file created under the mount point would vanish when it is mounted."""
    from sqlalchemy.exc import OperationalError

    from db.engine import check_url, init_db, shown_url, unreachable_reason

    url = settings.resolved_database_url
    check_url(url)
    delay = FIRST_RETRY_S
    while True:
        try:
            return init_db(url, create_folder=not settings.database_url,
                           bounds=settings.database_bounds)
        except (OperationalError, OSError) as exc:
            print(f"{who}: database {shown_url(url)} unreachable ({unreachable_reason(exc)}); "
                  f"retrying in {delay:g} s (Ctrl-C to stop)", file=sys.stderr, flush=True)
        sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S)


# -- one worker ---------------------------------------------------------------------------------

def _gpu_fingerprint_and_calibration(device_index: int) -> tuple[DeviceFingerprint,
                                                                 dict[str, Any]]:
    """Ask a short-lived child for its GPU's fingerprint and calibration, so that this process
    never initialises CUDA."""
    from tuner.backends.process import ChildProcess

    child = ChildProcess("cuda", device_index, start_timeout_s=180)
    try:
        child.send(("calibrate",))
        reply = child.receive(600)
        calibration = dict(reply[1]) if reply[0] == "calibration" else {}
        return child.fingerprint, calibration
    finally:
        child.close()


def _stored_calibration(factory: Any, device_key: str, max_age_hours: float
                        ) -> dict[str, Any] | None:
    """The device's calibration from the store when it is younger than ``max_age_hours``
    (``TUNER_CALIBRATION_MAX_AGE_HOURS``; 0: never reused), else None: calibrate again."""
    from datetime import timedelta

    from db import repo
    from db.models import utcnow

    if max_age_hours <= 0:
        return None
    with factory() as session:
        device = repo.get_device(session, device_key)
        if (device is None or not device.copy_gbps or device.calibrated_at is None
                or utcnow() - device.calibrated_at > timedelta(hours=max_age_hours)):
            return None
        return {"copy_gbps": device.copy_gbps, "matmul_tflops": device.matmul_tflops,
                "copy_gbps_spread": device.copy_gbps_spread,
                "matmul_tflops_spread": device.matmul_tflops_spread,
                "runs": device.calibration_runs, "reused": True}


def _start_first(settings: Settings, kind: str, device_index: int,
                 compile_workers: int | None, who: str = "tuner",
                 warmed: threading.Event | None = None) -> tuple[Any, dict[str, Any]]:
    """The worker's measuring child and compile pool, started first (this thread spawns them:
    it outlives them), while another thread reaches the store (``wait_for_database``: its
    lines alone on stderr until the database answers) and imports the worker's modules, then
    (with ``warmed``, set when done) what its tasks import (``warm_imports``), still beside
    the child's start. Returns the backend (None: not kept, or it failed to start: logged,
    the first task starts its own) and ``{"factory": the store's session factory,
    "child_and_pool": seconds, "store": seconds}``. An error reaching the store (a URL that
    can never work) is raised here, after the backend is closed."""
    from tuner.app.prestart import start_measuring

    reached: dict[str, Any] = {}

    def reach() -> None:
        t0 = time.monotonic()
        try:
            reached["factory"] = wait_for_database(settings, who=who)
            import tuner.app.worker  # noqa: F401 - imported here, beside the child's start
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
            reached["error"] = exc
        reached["store"] = time.monotonic() - t0
        if warmed is not None and "error" not in reached:
            _start_thread("warm-imports", warm_imports, warmed)

    thread = threading.Thread(target=reach, name="reach-store", daemon=True)
    thread.start()
    early, t0 = None, time.monotonic()
    if settings.worker_keep_seconds > 0 and kind != "replay":
        try:
            early = start_measuring(kind, device_index, compile_workers=compile_workers)
        except Exception:  # noqa: BLE001 - the first task starts its own and says why
            log.exception("starting the measuring child failed")
    opened = time.monotonic() - t0
    thread.join()
    if "error" in reached:
        if early is not None:
            early.close()
        raise reached["error"]
    steps = {"factory": reached["factory"], "store": reached["store"]}
    if early is not None:
        steps["child_and_pool"] = opened
    return early, steps


def _start_measuring(factory: Any, worker: Any, settings: Settings) -> tuple[
        DeviceFingerprint, dict[str, Any], dict[str, float]]:
    """Start the worker's measuring child and compile pool (kept for its tasks), take the
    GPU's fingerprint from that child, and the device's calibration from the store or, when
    there is none recent, from the same child: no second CUDA start. Returns the fingerprint,
    the calibration and the seconds each step took."""
    t0 = time.monotonic()
    had = worker.keeper is not None and worker.keeper.backend is not None
    backend = worker.prestart()
    started = time.monotonic()
    if backend is None:  # it failed (logged): the first task starts its own
        fingerprint, calibration = _gpu_fingerprint_and_calibration(worker.device_index)
        return fingerprint, calibration, {"calibration": time.monotonic() - started}
    fingerprint = backend.fingerprint
    stored = _stored_calibration(factory, fingerprint.key, settings.calibration_max_age_hours)
    calibration = stored if stored is not None else dict(backend.calibrate())
    steps = {**({} if had else {"child_and_pool": started - t0}), **backend.start_seconds,
             "calibration": time.monotonic() - started}
    return fingerprint, calibration, steps


def _register_device(factory: Any, fingerprint: DeviceFingerprint,
                     calibration: dict[str, Any], settings: Settings | None = None) -> None:
    """Write the device's row (and calibration); then, with ``settings``, queue the shapes
    tuned there under an older Triton minor for re-tuning under this one
    (``repo.queue_upgrade_retunes``: at most ``TUNER_MISS_CAP_PER_KERNEL`` shapes a kernel,
    ``TUNER_MISS_TRIALS`` trials). A failure to queue them is logged, never fatal."""
    from db import repo

    with factory() as session:
        repo.upsert_device(session, fingerprint.to_dict())
        if calibration.get("copy_gbps") and not calibration.get("reused"):
            repo.set_calibration(session, fingerprint.key, calibration["copy_gbps"],
                                 calibration.get("matmul_tflops"),
                                 copy_gbps_spread=calibration.get("copy_gbps_spread"),
                                 matmul_tflops_spread=calibration.get("matmul_tflops_spread"),
                                 runs=calibration.get("runs"))
        session.commit()
    if settings is None:
        return
    try:
        with factory() as session:
            jobs = repo.queue_upgrade_retunes(
                session, device_key=fingerprint.key, triton_version=fingerprint.triton_version,
                version_of=_installed_version, cap_per_kernel=settings.miss_cap_per_kernel,
                trials=settings.miss_trials)
            queued = [f"job {job.id}: {job.reason}, {job.kernel} {job.dtype}, "
                      f"{len(job.tasks)} shape(s)" for job in jobs]
            session.commit()
    except Exception:  # noqa: BLE001 - the worker runs whatever became of the re-tunes
        log.exception("%s: queueing re-tunes after a Triton upgrade failed", fingerprint.key)
        return
    for line in queued:
        log.info("%s: %s", fingerprint.key, line)


def _installed_version(kernel: str) -> str | None:
    """The version of ``kernel`` as installed here; None when it is not (or fails to load)."""
    from search_spaces import get_kernel

    try:
        return str(get_kernel(kernel).version)
    except Exception:  # noqa: BLE001 - a kernel that does not load is re-tuned by no one
        log.warning("kernel %s does not load here: its configs are not re-tuned", kernel,
                    exc_info=True)
        return None


def run_worker(settings: Settings, backend: str = "auto", device_index: int = 0, *,
               parent_pid: int | None = None, workers_on_host: int = 1) -> int:
    """Claim and run tasks for one device until SIGTERM/SIGINT (the current task is stopped at
    its next check and re-queued; a second signal exits at once). ``parent_pid``: stop when
    that process is gone (``serve`` passes its own pid so that no worker outlives it).
    ``workers_on_host``: GPU workers sharing this machine's cores (``serve`` passes its count):
    each compiles ahead on its share (``TUNER_COMPILE_WORKERS`` overrides it)."""
    started = time.monotonic()
    before_main = process_age_s()
    kind = resolve_backend_kind(backend)
    compile_workers = compile_workers_for(settings, kind, workers_on_host)
    # serve's workers wait for the database beside serve itself: their lines say whose they are
    warmed = threading.Event()
    early, steps = _start_first(settings, kind, device_index, compile_workers,
                                "tuner" if parent_pid is None else "tuner worker", warmed)
    if before_main is not None:  # this process's Python start and imports, before all that
        steps["worker_python"] = before_main
    from db.engine import close_engine
    from tuner.app.dispatch import make_dispatcher
    from tuner.app.worker import WARM_WAIT_S, Worker

    _log_at_info()
    factory = steps.pop("factory")
    worker = Worker(factory, backend_kind=kind, device_key="",
                    device_index=device_index, lease_seconds=settings.lease_seconds,
                    poll_seconds=settings.worker_poll_seconds,
                    compile_workers=compile_workers,
                    keep_seconds=settings.worker_keep_seconds, settings=settings)
    if early is not None and worker.keeper is not None:
        worker.keeper.adopt(early)
    if kind == "cuda" and worker.keeper is not None:
        fingerprint, calibration, measured = _start_measuring(factory, worker, settings)
        steps.update(measured)
    elif kind == "cuda":  # no child kept: a short-lived one for the fingerprint
        fingerprint, calibration = _gpu_fingerprint_and_calibration(device_index)
    else:
        fingerprint, calibration = interpreter_fingerprint(), {}
        log.warning("no GPU: this worker runs kernels on the Triton CPU interpreter; its "
                    "timings are not GPU timings and are stored under 'interpret:cpu'")
    worker.device_key = fingerprint.key
    t0 = time.monotonic()
    _register_device(factory, fingerprint, calibration, settings)
    _register_worker(factory, worker.id, fingerprint, kind,
                     device_index if kind == "cuda" else None)
    _stop_on_signals(worker.stopping)
    dispatcher = make_dispatcher(settings, factory)
    steps["register"] = time.monotonic() - t0
    _start_thread("presence", keep_present, factory, fingerprint.key,
                  settings.lease_seconds / 3, worker.stopping, parent_pid, worker.id,
                  settings.worker_health_file or None)
    try:
        worker.prestart()  # started above on a GPU; on the interpreter, here
        # ready once its tasks' imports are done too (begun once the store answered, beside
        # the child's start): a task claimed before would wait for them
        worker.warmed = warmed
        t0 = time.monotonic()
        if not warmed.wait(WARM_WAIT_S):
            log.warning("the worker's imports took over %.0f s; its first task waits for them",
                        WARM_WAIT_S)
        steps["imports_wait"] = time.monotonic() - t0
        ready = "".join(f" {k}_s={v:.2f}" for k, v in steps.items())
        log.info("worker %s serving device %s (%s; dispatch: %s): ready_s=%.2f%s "
                 "calibration=%s", worker.id, fingerprint.key, kind, dispatcher.name,
                 time.monotonic() - started, ready,
                 "reused" if calibration.get("reused") else
                 "measured" if calibration.get("copy_gbps") else "none")
        worker.report("idle")
        dispatcher.serve(worker)  # the embedded one runs the reaper beside the worker
    finally:
        dispatcher.close()
        _stop_worker_row(factory, worker.id)
        close_engine(settings.resolved_database_url)  # a SQLite log checkpointed: file whole
    log.info("worker %s stopped", worker.id)
    return 0


def process_age_s() -> float | None:
    """Seconds since this process was created (Linux: ``/proc``), else None."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def compile_workers_for(settings: Settings, kind: str, workers_on_host: int) -> int | None:
    """Compile processes of each of this worker's tasks: ``TUNER_COMPILE_WORKERS`` when set,
    else the cores shared among the host's GPU workers; None on the interpreter (the backend
    compiles nothing ahead there)."""
    from tuner.backends.compile_pool import default_pool_size

    if kind != "cuda":
        return None
    if settings.compile_workers >= 0:
        return settings.compile_workers
    return default_pool_size(workers_on_host)


def _register_worker(factory: Any, worker_id: str, fingerprint: DeviceFingerprint, kind: str,
                     gpu_index: int | None) -> None:
    """The worker's own row: each GPU reported separately (its index and UUID)."""
    from db import repo

    with factory() as session:
        repo.register_worker(session, worker_id=worker_id, host=socket.gethostname(),
                             pid=os.getpid(), device_key=fingerprint.key, kind=kind,
                             gpu_index=gpu_index, gpu_uuid=fingerprint.uuid)
        session.commit()


def _stop_worker_row(factory: Any, worker_id: str) -> None:
    from db import repo

    try:
        with factory() as session:
            repo.stop_worker(session, worker_id)
            session.commit()
    except Exception:  # noqa: BLE001 - exiting anyway; the row goes stale
        log.exception("worker %s: could not mark itself stopped", worker_id)


def _log_at_info() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    root = logging.getLogger()
    if root.level > logging.INFO:  # the CLI configured WARNING; a worker reports its work
        root.setLevel(logging.INFO)
    # loggers an operator wants at DEBUG (e.g. the timeline of each batch's compiles and
    # timings: tuner.backends.process,tuner.backends.compile_pool,tuner.search)
    for name in filter(None, os.environ.get(DEBUG_LOGGERS_ENV, "").split(",")):
        logging.getLogger(name.strip()).setLevel(logging.DEBUG)


def warm_imports(done: threading.Event | None = None) -> None:
    """Import what a worker's tasks need (torch, Triton, the built-in kernels' modules) beside
    its GPU child's start, then set ``done``: the worker says it is ready once this is done
    too (the first task of the eleventh session's H100 runs waited 3.8 s for these imports,
    begun only once the worker was ready). A module that fails to import is left to the task
    that needs it (which says why)."""
    import importlib

    from search_spaces.registry import BUILTINS

    try:
        for module in ("torch", "triton",
                       *dict.fromkeys(r.split(":")[0] for r in BUILTINS.values())):
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - the task that loads it reports the error
                log.debug("warming: %s did not import", module, exc_info=True)
    finally:
        if done is not None:
            done.set()


def _start_thread(name: str, target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True, name=name)
    thread.start()
    return thread


def keep_present(factory: Any, device_key: str, interval_s: float, stopping: threading.Event,
                 parent_pid: int | None = None, worker_id: str | None = None,
                 health_file: str | None = None) -> None:
    """Refresh the device's and the worker's ``last_seen_at`` (``/healthz`` reports devices
    seen recently), and stop the worker when the process that started it is gone. Each beat
    written also touches ``health_file`` (``TUNER_WORKER_HEALTH_FILE``): its age is how long
    this worker has not reached the database (a container's health check)."""
    from db import repo

    while not stopping.wait(interval_s):
        if parent_pid is not None and os.getppid() != parent_pid:
            log.warning("the serving process %s is gone; stopping", parent_pid)
            stopping.set()
            return
        try:
            with factory() as session:
                repo.touch_device(session, device_key)
                if worker_id is not None:
                    repo.beat_worker(session, worker_id)
                session.commit()
        except Exception:  # noqa: BLE001 - a missed beat only makes the device look stale
            log.exception("presence beat of %s failed", device_key)
            continue
        if health_file:
            _touch(health_file)


def _touch(path: str) -> None:
    try:
        Path(path).touch()
    except OSError as exc:  # the health check will say so; the worker goes on
        log.warning("touching the health file %s failed: %s", path, exc)


def _stop_on_signals(event: threading.Event) -> None:
    def handler(signum: int, _frame: Any) -> None:
        if event.is_set():
            log.warning("signal %s again: exiting now", signum)
            raise SystemExit(128 + signum)
        log.info("signal %s: stopping the current task at its next check (send it again to "
                 "exit at once)", signum)
        event.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


# -- serve: the API and a pool of workers -------------------------------------------------------

@dataclass
class _Slot:
    device_index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    #: exits in a row, each within ``quick_s`` of its start (0 once a worker stayed up)
    quick_failures: int = 0
    restarts: int = 0
    last_exit: str | None = None
    #: while no worker runs: when (``time.monotonic()``) the next one starts
    restart_at: float | None = None

    def public(self) -> dict[str, Any]:
        """What ``/healthz`` shows of this slot (``api.routes.health``)."""
        waiting = None if self.restart_at is None else self.restart_at - time.monotonic()
        return {"device_index": self.device_index,
                "state": "running" if self.proc is not None else "restarting",
                "pid": self.proc.pid if self.proc is not None else None,
                "restarts": self.restarts, "exits_in_a_row": self.quick_failures,
                "last_exit": self.last_exit,
                "restart_at": None if waiting is None else time.time() + max(0.0, waiting)}


@dataclass
class WorkerPool:
    """Worker processes of ``serve``: each in its own session (a Ctrl-C at the terminal reaches
    only ``serve``, which then stops each worker exactly once), restarted whenever one exits,
    forever: at once after one that ran ``quick_s`` or more, else after a back-off doubling
    from ``first_delay_s`` up to ``max_delay_s`` (``supervision.restart_delay``). Each change
    is written to ``state_file`` for ``/healthz``."""

    kind: str
    device_indices: list[int]
    env: dict[str, str]
    grace_s: float = 60.0
    #: a worker that exits within this many seconds of starting counts as a quick failure; one
    #: that stays up this long resets the back-off
    quick_s: float = 30.0
    first_delay_s: float = 1.0
    max_delay_s: float = 60.0
    #: seconds between two looks at the workers
    poll_s: float = 0.5
    state_file: Path | None = None
    slots: list[_Slot] = field(default_factory=list)
    started_after_s: float | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.slots = [_Slot(i) for i in self.device_indices]
        for slot in self.slots:
            self._spawn(slot)
        self.started_after_s = process_age_s()  # for the start's line
        self._publish()
        _start_thread("worker-pool", self._watch)

    def command(self, slot: _Slot) -> list[str]:
        """The command line of the worker of ``slot``."""
        return [sys.executable, "-m", "tuner.app.cli", "worker", "--backend", self.kind,
                "--device-index", str(slot.device_index), "--parent-pid", str(os.getpid()),
                "--workers-on-host", str(len(self.slots))]

    def _spawn(self, slot: _Slot) -> None:
        slot.proc = subprocess.Popen(self.command(slot), env=self.env, start_new_session=True)
        slot.started = time.monotonic()
        slot.restart_at = None

    def _watch(self) -> None:
        # this thread starts the restarted workers, whose parent-death signal fires when it
        # ends (tuner.app.supervision): it must outlive any one failed restart
        while not self.stopping.wait(self.poll_s):
            for slot in self.slots:
                try:
                    self._tend(slot)
                except Exception:  # noqa: BLE001 - tried again at the next look
                    log.exception("restarting the worker for device %d failed",
                                  slot.device_index)

    def _tend(self, slot: _Slot) -> None:
        """Note a worker's exit, start its successor when its back-off has passed, and reset
        the back-off of one that stayed up ``quick_s``."""
        now = time.monotonic()
        if slot.proc is not None:
            code = slot.proc.poll()
            if code is None:
                if slot.quick_failures and now - slot.started >= self.quick_s:
                    slot.quick_failures = 0
                    self._publish()
                return
            self._exited(slot, code, now)
        if slot.restart_at is not None and now >= slot.restart_at and not self.stopping.is_set():
            self._spawn(slot)
            slot.restarts += 1
            self._publish()

    def _exited(self, slot: _Slot, code: int, now: float) -> None:
        ran = now - slot.started
        slot.quick_failures = slot.quick_failures + 1 if ran < self.quick_s else 0
        delay = restart_delay(slot.quick_failures, self.first_delay_s, self.max_delay_s)
        slot.last_exit = exit_reason(code, ran)
        slot.proc = None
        slot.restart_at = now + delay
        log.warning("worker for device %d %s; restarting it in %.0f s (%d exits in a row "
                    "right after starting)", slot.device_index, slot.last_exit, delay,
                    slot.quick_failures)
        self._publish()

    def _publish(self) -> None:
        if self.state_file is None:
            return
        try:
            write_state(self.state_file, {"serve_pid": os.getpid(),
                                          "workers": [s.public() for s in self.slots]})
        except OSError as exc:  # /healthz shows the last state written
            log.warning("could not write the workers' state to %s: %s", self.state_file, exc)

    def stop(self) -> None:
        """SIGTERM every worker (each re-queues its task), SIGKILL what is left after
        ``grace_s``, including the worker's own measuring children."""
        self.stopping.set()
        live = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in live:
            proc.terminate()
        deadline = time.monotonic() + self.grace_s
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop in %.0f s; killing it", proc.pid,
                            self.grace_s)
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def worker_plan(settings: Settings, workers: int | None, backend: str | None
                ) -> tuple[str, list[int], str | None]:
    """(backend kind, device index per worker, a note for the user)."""
    requested = backend or settings.backend
    kind = resolve_backend_kind(requested)
    gpus = count_gpus_without_init() if kind == "cuda" else 0
    if workers is not None and workers >= 0:
        count = workers
    else:
        count = settings.workers if settings.workers >= 0 else max(1, gpus)
    indices = [i % gpus if gpus else 0 for i in range(count)]
    note = None
    if kind == "interpret" and count:
        note = NO_GPU_NOTE if requested == "auto" else (
            f"backend interpret: {count} worker(s) on the Triton CPU interpreter (timings are "
            "not GPU timings; results are stored under 'interpret:cpu')")
    return kind, indices, note


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8000,
          workers: int | None = None, backend: str | None = None,
          api_workers: int | None = None) -> int:
    """The API in this process (or ``api_workers`` uvicorn worker processes under it: default
    ``TUNER_API_WORKERS``, 0 = one per CPU core) plus worker processes: one per local GPU, or
    one interpreter worker on a machine without a GPU. Returns when the API stops
    (SIGINT/SIGTERM)."""
    from db.engine import check_url, close_engine, create_sqlite_folder
    from tuner.app.supervision import SERVE_PID_ENV, STATE_ENV, check_address

    check_address(host, port)  # a port in use: one line naming its holder, before any wait
    url = settings.resolved_database_url
    check_url(url)  # a URL that can never work: one line, before any worker starts
    if not settings.database_url:  # the default file: its folder, before the workers open it
        create_sqlite_folder(url)
    kind, indices, note = worker_plan(settings, workers, backend)
    if note:
        print(note, flush=True)
    os.environ["TUNER_DATABASE_URL"] = url  # the app (built by uvicorn) and the workers
    os.environ[SERVE_PID_ENV] = str(os.getpid())  # API processes die with this one
    if not settings.allowed_hosts.strip():  # the Host headers the API answers (api.gate)
        os.environ["TUNER_ALLOWED_HOSTS"] = default_allowed_hosts(host)
    state_file = _state_file()
    os.environ[STATE_ENV] = str(state_file)  # /healthz of the API processes reads it
    # The workers first: a GPU worker's start is its measuring child's (torch's import, the
    # device's start: seconds), which then overlaps this process's migrations and the API's
    # start. Migrating at once is safe (``db.engine.upgrade``: processes take turns).
    pool = WorkerPool(kind, indices, env=dict(os.environ), state_file=state_file)
    pool.start()
    # uvicorn re-raises the SIGTERM it caught once it has shut down, under the handler that was
    # there before it; with the default one the process would die before stopping its workers.
    # With several API processes its supervisor takes SIGTERM itself and returns.
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        import uvicorn

        wait_for_database(settings)
        processes = api_processes(settings, api_workers)
        check_address(host, port)  # again: the database may have taken a while
        spawned = ("" if pool.started_after_s is None
                   else f", started {pool.started_after_s:.2f} s after this command")
        print(f"API on http://{host}:{port} (docs at /docs), {processes} process(es); "
              f"{len(indices)} {kind} worker(s){spawned}; database {url}", flush=True)
        uvicorn.run("api.app:app", host=host, port=port, log_level="info",
                    workers=processes, http="api.connections:GuardedHTTP",
                    timeout_keep_alive=settings.keep_alive_s)
    except _Terminated:
        log.info("SIGTERM: stopping the workers")
    finally:
        pool.stop()
        state_file.unlink(missing_ok=True)
        # every worker and API process has closed the store: its write-ahead log goes into
        # the file, so that a copy of a stopped service's SQLite file holds everything
        close_engine(url)
    return 0


def _state_file() -> Path:
    """A new file of this ``serve``'s worker states (``tuner.app.supervision``), in the temporary
    folder: the data folder may be read-only, or absent with PostgreSQL. Those a killed
    ``serve`` left behind (its pid gone) are removed."""
    import tempfile

    from tuner.app.supervision import remove_stale_states

    remove_stale_states(Path(tempfile.gettempdir()))
    fd, name = tempfile.mkstemp(prefix=f"tuner-serve-{os.getpid()}-", suffix=".json")
    os.close(fd)
    return Path(name)


#: the loopback names every ``serve`` not bound to all addresses answers for
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def default_allowed_hosts(host: str) -> str:
    """``TUNER_ALLOWED_HOSTS`` for ``serve --host host`` where it is not set: ``*`` (any)
    where it binds every address (0.0.0.0, ::), since its clients may name it anyhow; else
    the loopback names and ``host``."""
    bare = host.strip("[]").lower()
    if bare in ("", "0.0.0.0", "::"):
        return "*"
    return ",".join(dict.fromkeys((*LOOPBACK_HOSTS, bare)))


def api_processes(settings: Settings, requested: int | None = None) -> int:
    """How many API processes ``serve`` runs: ``requested``, else ``TUNER_API_WORKERS``; 0 is
    one per CPU core (at most 8: lookups are served from memory, see ``api/serving.py``)."""
    count = settings.api_workers if requested is None else requested
    return count if count > 0 else max(1, min(8, os.cpu_count() or 1))


class _Terminated(Exception):
    """SIGTERM reached ``serve``."""


def _raise_terminated(_signum: int, _frame: Any) -> None:
    raise _Terminated
