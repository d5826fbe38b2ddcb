"""``tuner worker`` and ``tuner serve``: the long-running processes of the service."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from tuner.backends import resolve_backend_kind
from tuner.device import count_gpus_without_init, interpreter_fingerprint
from tuner.settings import Settings

log = logging.getLogger(__name__)


def _gpu_fingerprint_and_calibration(device_index: int) -> tuple[Any, dict[str, Any]]:
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


def run_worker(settings: Settings, backend: str = "auto", device_index: int = 0) -> int:
    from db import repo
    from db.engine import init_db
    from tuner.worker import Worker, reap_forever

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    kind = resolve_backend_kind(backend)
    factory = init_db(settings.resolved_database_url)
    if kind == "cuda":
        fingerprint, calibration = _gpu_fingerprint_and_calibration(device_index)
    else:
        fingerprint, calibration = interpreter_fingerprint(), {}
        log.warning("no GPU: this worker runs kernels on the Triton CPU interpreter; its "
                    "timings are not GPU timings and are stored under 'interpret:cpu'")
    with factory() as session:
        repo.upsert_device(session, fingerprint.to_dict())
        if calibration.get("copy_gbps"):
            repo.set_calibration(session, fingerprint.key, calibration["copy_gbps"],
                                 calibration["matmul_tflops"])
        session.commit()
    worker = Worker(factory, backend_kind=kind, device_key=fingerprint.key,
                    device_index=device_index, lease_seconds=settings.lease_seconds)
    _stop_on_signals(worker.stopping)
    reaper = threading.Thread(target=reap_forever, daemon=True, name="reaper",
                              args=(factory, settings.reap_interval_seconds, worker.stopping))
    reaper.start()
    log.info("worker %s serving device %s (%s)", worker.id, fingerprint.key, kind)
    worker.run_forever()
    return 0


def _stop_on_signals(event: threading.Event) -> None:
    def handler(signum: int, _frame: Any) -> None:
        log.info("signal %s: finishing the current trial and stopping", signum)
        event.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8000,
          workers: int | None = None, backend: str | None = None) -> int:
    """The API in this process plus worker processes: one per local GPU, or one interpreter
    worker on a machine without a GPU."""
    import uvicorn

    kind = resolve_backend_kind(backend or settings.backend)
    gpus = count_gpus_without_init() if kind == "cuda" else 0
    count = workers if workers is not None and workers >= 0 else (
        settings.workers if settings.workers >= 0 else max(1, gpus))
    if kind == "interpret":
        print("no GPU found: starting one worker on the Triton CPU interpreter "
              "(timings are not GPU timings; results are stored under 'interpret:cpu')",
              flush=True)
    env = {**os.environ, "TUNER_DATABASE_URL": settings.resolved_database_url}
    from db.engine import init_db

    init_db(settings.resolved_database_url)  # migrate once, before workers race to do it
    procs = [subprocess.Popen([sys.executable, "-m", "tuner.cli", "worker", "--backend", kind,
                               "--device-index", str(i if kind == "cuda" else 0)], env=env)
             for i in range(count)]
    print(f"API on http://{host}:{port} (dashboard at /, docs at /docs); {count} {kind} "
          f"worker(s); database {settings.resolved_database_url}", flush=True)
    os.environ["TUNER_DATABASE_URL"] = settings.resolved_database_url
    try:
        uvicorn.run("api.app:app", host=host, port=port, log_level="info")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0
