"""``tuner submit / status / wait / cancel`` as a user runs them: real subprocesses against the
real service (uvicorn on a free local port, a SQLite file), jobs run by a real interpreter
worker; ``--json`` output parsed, exit statuses checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from db import repo
from db.engine import init_db
from tests.api_support import run_worker_once, running_app
from tests.test_client import free_port
from tests.test_ids import TWINS, add_job
from tuner.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests/data/replay/matmul_4096x4096x4096_float16_h200.json"
#: a job the interpreter runs in seconds
SUBMIT = ["submit", "matmul", "--shape", "M=16,N=16,K=16", "--trials", "2"]


class Service:
    def __init__(self, url: str, db_url: str) -> None:
        self.url, self.db_url = url, db_url

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("TUNER_URL", "TUNER_API_KEY", "TUNER_DATABASE_URL")}
        return {**env, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), **extra}

    def command(self, *args: str, url: bool = True) -> list[str]:
        url_args = ["--url", self.url] if url else []
        return [sys.executable, "-m", "tuner.app.cli", *args, *url_args]

    def run(self, *args: str, url: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args, url=url), cwd=ROOT, env=self.env(**env),
                              capture_output=True, text=True, timeout=300)

    def start(self, *args: str) -> subprocess.Popen[str]:
        """A command left running (``wait``, ``submit --wait``), its stderr read line by line."""
        return subprocess.Popen(self.command(*args), cwd=ROOT, env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    db_url = f"sqlite:///{tmp_path / 'service.db'}"
    with running_app(Settings(database_url=db_url)) as url:
        yield Service(url, db_url)


def submitted(service: Service, *extra: str) -> str:
    out = service.run(*SUBMIT, *extra, "--json")
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["id"])


def one_line_error(out: subprocess.CompletedProcess[str], status: int) -> str:
    assert out.returncode == status, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), out.stderr
    return lines[0]


def first_progress(proc: subprocess.Popen[str], job_id: str) -> str:
    """The first progress line of a following command: it has seen the job before it runs."""
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        assert line, f"no progress line; exit {proc.wait()}"
        if line.startswith(f"job {job_id[:8]} "):
            return line.strip()


def finished(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    stdout, stderr = proc.communicate(timeout=300)
    return proc.returncode, json.loads(stdout), stderr


def test_submit_prints_the_job_id_and_its_dashboard_page(service):
    out = service.run(*SUBMIT)
    assert out.returncode == 0, out.stderr
    match = re.search(r"^job ([0-9a-f]{32}) queued$", out.stdout, re.M)
    assert match, out.stdout
    job_id = match.group(1)
    assert f"dashboard {service.url}/jobs/{job_id}" in out.stdout
    again = json.loads(service.run(*SUBMIT, "--json").stdout)
    assert again["id"] == job_id and again["deduplicated"] is True
    assert again["dashboard_url"] == f"{service.url}/jobs/{job_id}"


def test_status_by_id_prefix_shows_each_shape_and_lists_the_newest_jobs(service):
    job_id = submitted(service, "--shape", "M=32,N=16,K=16")
    text = service.run("status", job_id[:8])
    assert text.returncode == 0, text.stderr
    assert f"job       {job_id} queued" in text.stdout and "progress  0/4 trials" in text.stdout
    assert "16x16x16" in text.stdout and "32x16x16" in text.stdout
    data = json.loads(service.run("status", job_id[:8], "--json").stdout)
    assert data["id"] == job_id and data["status"] == "queued" and len(data["tasks"]) == 2
    assert data["dashboard_url"] == f"{service.url}/jobs/{job_id}"
    listed = service.run("status")
    assert listed.stdout.startswith(f"{job_id[:8]}  queued") and "0/4 trials" in listed.stdout
    assert [j["id"] for j in json.loads(service.run("status", "--json").stdout)] == [job_id]
    assert json.loads(service.run("status", "--status", "running", "--json").stdout) == []


def test_wait_shows_progress_and_exits_0_when_the_job_succeeds(service):
    job_id = submitted(service)
    waiting = service.start("wait", job_id[:8], "--json", "--poll", "0.1")
    assert first_progress(waiting, job_id) == f"job {job_id[:8]} queued: 0/2 trials, best -"
    run_worker_once(service.db_url)
    status, job, stderr = finished(waiting)
    assert status == 0, stderr
    assert job["id"] == job_id and job["status"] == "succeeded"
    task = job["tasks"][0]
    assert task["trials_done"] == 2 and task["best_config"]["BLOCK_M"] > 0
    last = stderr.strip().splitlines()[-1]
    assert last == f"job {job_id[:8]} succeeded: 2/2 trials, best {task['best_ms']:.4f} ms"


def test_submit_wait_follows_the_new_job_to_its_end(service):
    following = service.start(*SUBMIT, "--wait", "--poll", "0.1")
    assert following.stderr is not None
    header = following.stderr.readline()
    job_id = re.fullmatch(r"job ([0-9a-f]{32}) queued\n", header).group(1)  # type: ignore[union-attr]
    first_progress(following, job_id)
    run_worker_once(service.db_url)
    stdout, stderr = following.communicate(timeout=300)
    assert following.returncode == 0, stderr
    assert f"job       {job_id} succeeded" in stdout and "2/2 trials  best " in stdout


def test_cancel_ends_a_queued_job_and_wait_exits_1(service):
    job_id = submitted(service)
    waiting = service.start("wait", job_id, "--json", "--poll", "0.1")
    first_progress(waiting, job_id)
    out = service.run("cancel", job_id[:8])
    assert out.returncode == 0 and out.stdout.strip() == f"job {job_id} cancelled"
    status, job, _ = finished(waiting)
    assert status == 1 and job["status"] == "cancelled"
    again = service.run("cancel", job_id[:8], "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "cancelled"
    assert "already cancelled: nothing to cancel" in service.run("cancel", job_id).stdout
    with init_db(service.db_url)() as session:
        assert repo.get_job(session, job_id).tasks[0].status == "cancelled"


def test_wait_gives_up_at_its_timeout_with_status_4_and_the_job_goes_on(service):
    job_id = submitted(service)
    out = service.run("wait", job_id[:8], "--timeout", "0.3", "--poll", "0.1", "--quiet")
    assert out.returncode == 4 and out.stdout == ""
    assert f"job {job_id} still queued after 0.3 s; it goes on" in out.stderr
    assert json.loads(service.run("status", job_id, "--json").stdout)["status"] == "queued"


@pytest.mark.parametrize(("args", "message"), [
    (["submit", "nope", "--shape", "M=1"], "kernel: unknown kernel 'nope'; known kernels: "),
    (["submit", "matmul", "--shape", "M=16,N=16,K=0"], "shapes.0.K: shape K=0: every "
                                                       "dimension must be between 1"),
    (["submit", "matmul", "--shape", "M=16,N=16,K=16", "--shape", "M=16,N=16"],
     "shapes.1.K: shape is missing dimension K"),
    (["submit", "matmul", "--shape", "M=16,N=16,K=16", "--trials", "0"], "budget.trials: "),
    (["submit", "matmul", "--shape", "M=16,N=16,K=16", "--dtype", "int7"],
     "dtype: dtype 'int7' is not supported by matmul"),
    (["submit", "matmul", "--shape", "M=16,N=16,K=16", "--strategy", "guess"],
     "strategy: unknown strategy 'guess'"),
    (["submit", "matmul", "--shape", "M=16,N=16,K=16", "--dtype", "bfloat16",
      "--backend", "interpret"], "dtype: dtype 'bfloat16' cannot be checked on the interpret "
                                 "backend"),
    (["submit", "matmul", "--shape", "M=16,N=x,K=16"], "shape N='x': the value must be an "
                                                       "integer"),
    (["submit", "matmul"], "--shape is required"),
    (["status", "deadbeef"], "no job 'deadbeef' (tuner status lists the newest jobs)"),
    (["wait", "abc"], "job_id: job id 'abc' is too short to name a job: give at least 4"),
    (["cancel", "0123456789abcdef0123456789abcdef"], "no job '0123456789abcdef0123456789abcd"),
])
def test_bad_input_is_one_line_naming_the_field_and_exit_2(service, args, message):
    assert message in one_line_error(service.run(*args), 2)


def test_an_ambiguous_job_prefix_lists_the_candidates(service):
    for job_id in TWINS:
        add_job(service.db_url, job_id)
    line = one_line_error(service.run("status", "abcd1234"), 2)
    assert line.startswith("tuner: error: job_id: job id prefix 'abcd1234' is ambiguous")
    assert all(job_id in line for job_id in TWINS)
    ok = service.run("status", TWINS[1][:9], "--json")
    assert json.loads(ok.stdout)["id"] == TWINS[1]


def test_an_unreachable_service_is_one_line_and_exit_3(service):
    down = f"http://127.0.0.1:{free_port()}"
    for args in (["status"], ["wait", "abcd"], [*SUBMIT], ["cancel", "abcd"]):
        line = one_line_error(service.run(*args, "--url", down, url=False), 3)
        assert f"cannot reach the tuning service at {down}" in line


def test_the_service_is_tuner_url_without_url(service):
    job_id = submitted(service)
    out = service.run("status", "--json", url=False, TUNER_URL=service.url)
    assert out.returncode == 0 and json.loads(out.stdout)[0]["id"] == job_id


def test_a_service_with_keys_takes_the_key_from_tuner_api_key(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'keys.db'}"
    with running_app(Settings(database_url=db_url, api_keys="s3cret,look:ro")) as url:
        service = Service(url, db_url)
        refused = one_line_error(service.run(*SUBMIT), 2)
        assert "refused the request (401)" in refused and "TUNER_API_KEY" in refused
        read_only = one_line_error(service.run(*SUBMIT, TUNER_API_KEY="look"), 2)
        assert "(403)" in read_only and "read-only" in read_only
        out = service.run(*SUBMIT, "--json", TUNER_API_KEY="s3cret")
        assert out.returncode == 0 and json.loads(out.stdout)["status"] == "queued"


def test_tune_prints_its_job_id_which_status_finds_on_the_same_database(service):
    tuned = service.run("--db", service.db_url, "tune", "matmul", "--replay", str(TABLE),
                        "--trials", "3", "--json", url=False, TUNER_URL=service.url)
    assert tuned.returncode == 0, tuned.stderr
    summary = json.loads(tuned.stdout)
    job_id = summary["job_id"]
    assert summary["dashboard_url"] == f"{service.url}/jobs/{job_id}"
    job = json.loads(service.run("status", job_id[:8], "--json").stdout)
    assert job["status"] == "succeeded" and job["tasks"][0]["trials_done"] == 3
    text = service.run("--db", service.db_url, "tune", "matmul", "--replay", str(TABLE),
                       "--trials", "2", url=False, TUNER_URL=service.url)
    assert re.search(rf"^job +[0-9a-f]{{32}}  {re.escape(service.url)}/jobs/[0-9a-f]{{32}} ",
                     text.stdout, re.M), text.stdout
