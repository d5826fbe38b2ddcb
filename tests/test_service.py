"""``tuner serve`` as a user starts it: a real process, real HTTP, an interpreter worker."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tuner.client import TunerClient

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "tuner serve exited early"
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("the service did not become ready")


def test_serve_runs_a_job_end_to_end_on_the_interpreter(tmp_path: Path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
           "TUNER_DATA_DIR": str(tmp_path), "TUNER_DATABASE_URL": ""}
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--port", str(port),
                             "--backend", "interpret"], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(base, proc)
        client = TunerClient(base, timeout=10)
        job_id = client.submit("matmul", [{"M": 32, "N": 16, "K": 16}], "float16", trials=2)
        job = client.wait(job_id, timeout=240, poll=0.5)
        assert job["status"] == "succeeded", job
        config = client.best_config("matmul", {"M": 32, "N": 16, "K": 16}, "float16",
                                    device="interpret:cpu")
        assert config.to_dict() == job["tasks"][0]["best_config"]
        assert (tmp_path / "tuner.db").is_file()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    assert "Triton CPU interpreter" in (tmp_path / "serve.log").read_text()


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose is not installed (scripts/test.sh installs it)")
def test_docker_compose_file_is_valid_for_both_profiles():
    for args in ([], ["--profile", "postgres"]):
        out = subprocess.run(["docker-compose", *args, "config"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "worker" in out.stdout and "api" in out.stdout
    assert "postgres:" in subprocess.run(["docker-compose", "--profile", "postgres", "config"],
                                         cwd=ROOT, capture_output=True, text=True).stdout
