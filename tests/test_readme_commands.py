"""The README's two commands, as a newcomer runs them: both exist as written, and the first,
``scripts/serve.sh``, sets up what serving needs and starts the service (on this CPU machine:
the interpreter worker, labelled as such), which answers its health and readiness checks and
shows its worker. The second, ``scripts/test.sh``, is what CI runs (``.ci/run``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import httpx
import pytest

from tests.plugins import ROOT
from tests.support_processes import free_port

README = (ROOT / "README.md").read_text()


def two_commands() -> list[str]:
    """The indented command lines of the README's "Two commands" section."""
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^    (\S.*)$", section, re.MULTILINE)


def test_the_readme_names_two_commands_that_exist_and_ci_runs_the_second():
    assert two_commands() == ["scripts/serve.sh", "scripts/test.sh"]
    for command in two_commands():
        assert os.access(ROOT / command, os.X_OK), command
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.timeout(600)
def test_serve_sh_as_written_starts_the_service_with_its_interpreter_worker(tmp_path):
    port = free_port()
    # the default database (SQLite in the data folder), the data folder a fresh one
    env = {**os.environ, "TUNER_DATA_DIR": str(tmp_path / "data")}
    for name in ("TUNER_URL", "TUNER_DATABASE_URL", "TRITON_INTERPRET"):
        env.pop(name, None)
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen([str(ROOT / "scripts" / "serve.sh"), "--host", "127.0.0.1",
                                "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        workers: list[dict[str, object]] = []
        while time.monotonic() < deadline and process.poll() is None:
            try:
                ready = httpx.get(f"{url}/readyz", timeout=2).status_code == 200
                if ready:
                    devices = httpx.get(f"{url}/api/v1/devices", timeout=5).json()["data"]
                    workers = [w for d in devices for w in d["workers"]]
                    if workers:
                        break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        assert workers, (tmp_path / "serve.log").read_text()[-3000:]
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        devices = httpx.get(f"{url}/api/v1/devices", timeout=5).json()["data"]
        assert [d["key"] for d in devices] == ["interpret:cpu"]
        overview = httpx.get(f"{url}/", timeout=10)
        assert overview.status_code == 200 and "not GPU timings" in overview.text
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()
