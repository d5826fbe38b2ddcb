"""The compose files (issue 32, item 7): with docker-compose.postgres.yml the API and worker
use PostgreSQL and wait for it, its port can be opened to other machines, and the worker's
health check reads something real (the age of the file its database beats touch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from db.engine import init_db
from tests.support_processes import ROOT

compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose is not installed (scripts/test.sh installs it)")
POSTGRES = ["-f", "docker-compose.yml", "-f", "docker-compose.postgres.yml"]


def _config(*args: str, **env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    out = subprocess.run(["docker-compose", *args, "config"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**clean, **env})
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)["services"]  # type: ignore[no-any-return]


@compose
def test_with_postgres_the_api_and_worker_use_it_once_it_answers():
    services = _config(*POSTGRES, TUNER_POSTGRES_PASSWORD="s3cret")
    for name in ("api", "worker"):
        assert services[name]["environment"]["TUNER_DATABASE_URL"] == (
            "postgresql://tuner:s3cret@postgres:5432/tuner")
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    pg = services["postgres"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert pg["environment"]["POSTGRES_PASSWORD"] == "s3cret"
    assert "profiles" not in pg  # the override file is what turns it on


@compose
def test_postgres_is_published_to_other_machines_only_when_told():
    def ports(**env: str) -> str:
        return str(_config(*POSTGRES, **env)["postgres"]["ports"])

    assert "127.0.0.1" in ports() and "5432" in ports()
    assert "0.0.0.0" in ports(TUNER_POSTGRES_BIND="0.0.0.0")


@compose
def test_one_machine_stays_on_sqlite_without_postgres():
    services = _config()
    assert "postgres" not in services
    assert services["worker"]["environment"]["TUNER_DATABASE_URL"] == ""
    assert "postgres" not in services["worker"]["depends_on"]


def _worker_health(path: Path) -> int:
    """The exit status of the worker's compose health check, run here on ``path``."""
    test = yaml.safe_load((ROOT / "docker-compose.yml").read_text())[
        "services"]["worker"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]
    return subprocess.run([sys.executable, *test[2:]], timeout=60,
                          env={**os.environ, "TUNER_WORKER_HEALTH_FILE": str(path)}).returncode


def test_the_worker_health_check_fails_once_its_beats_stop(tmp_path):
    worker = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    assert worker["environment"]["TUNER_WORKER_HEALTH_FILE"]
    beat = tmp_path / "health"
    assert _worker_health(beat) != 0  # no beat yet
    beat.touch()
    assert _worker_health(beat) == 0
    old = time.time() - 120
    os.utime(beat, (old, old))
    assert _worker_health(beat) != 0


def test_a_worker_touches_its_health_file_at_each_beat_that_reached_the_database(tmp_path):
    from db import repo
    from tuner.app.service import keep_present

    factory = init_db(f"sqlite:///{tmp_path / 'w.db'}")
    with factory() as session:
        repo.upsert_device(session, {"key": "interpret:cpu", "kind": "interpret",
                                     "name": "cpu"})
        session.commit()
    def beats(factory: Any, path: Path, seconds: float) -> None:
        stopping = threading.Event()
        thread = threading.Thread(target=keep_present, args=(
            factory, "interpret:cpu", 0.05, stopping, None, None, str(path)), daemon=True)
        thread.start()
        deadline = time.monotonic() + seconds
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stopping.set()
        thread.join(5)

    beats(factory, tmp_path / "health", 10)
    assert (tmp_path / "health").exists()

    def unreachable() -> Any:
        raise OSError("connection refused")

    beats(unreachable, tmp_path / "unhealthy", 0.5)  # no beat written: no touch
    assert not (tmp_path / "unhealthy").exists()
