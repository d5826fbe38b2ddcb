"""A job's target device: a key no worker has registered (a typo: ``interpret`` for
``interpret:cpu``) is refused naming the ``device`` field and the known devices, unless the
caller says it is for a worker yet to come (``future_device``); the device is shown on the jobs
list, and ``tuner wait`` says why a job is waiting. Real HTTP through the app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.api_support import INTERPRETER, register_devices, running_app
from tuner.app.cli import main
from tuner.settings import Settings

JOB = {"kernel": "matmul", "dtype": "float16", "shapes": [{"M": 16, "N": 16, "K": 16}],
       "budget": {"trials": 2}}
FUTURE = "cuda:NVIDIA B300:sm103"


def test_a_device_no_worker_registered_is_refused_unless_meant_for_a_future_worker(
        api_client, api_db_url):
    register_devices(api_db_url, INTERPRETER)
    typo = api_client.post("/api/v1/jobs", json={**JOB, "device": "interpret"})
    assert typo.status_code == 422, typo.text
    [detail] = typo.json()["detail"]
    assert detail["loc"] == ["body", "device"]
    assert "'interpret'" in detail["msg"] and INTERPRETER in detail["msg"]
    assert "future_device" in detail["msg"]
    assert api_client.post("/api/v1/jobs", json={**JOB, "device": INTERPRETER}).status_code == 202
    future = api_client.post("/api/v1/jobs", json={**JOB, "device": FUTURE,
                                                   "future_device": True})
    assert future.status_code == 202, future.text
    listed = api_client.get("/api/v1/jobs").json()["data"]
    assert sorted(j["device"] for j in listed) == sorted([INTERPRETER, FUTURE])


@pytest.fixture
def service_url(tmp_path: Path, monkeypatch) -> str:
    for name in ("TUNER_URL", "TUNER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    db_url = f"sqlite:///{tmp_path / 'service.db'}"
    with running_app(Settings(database_url=db_url, lease_seconds=1.5)) as url:
        register_devices(db_url, INTERPRETER)
        yield url


def test_tuner_submit_refuses_a_typo_lists_the_device_and_wait_says_why_it_waits(
        service_url, capsys):
    submit = ["submit", "matmul", "--shape", "M=16,N=16,K=16", "--trials", "2",
              "--url", service_url]
    assert main([*submit, "--device", "interpret"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("tuner: error: device: ") and INTERPRETER in line, line
    assert main([*submit, "--device", FUTURE, "--future-device", "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["status", "--url", service_url]) == 0
    assert f"device {FUTURE}" in capsys.readouterr().out
    # no worker serves it: once it has waited one lease length, wait says so (and gives up)
    assert main(["wait", job_id, "--url", service_url, "--timeout", "3", "--poll", "0.2",
                 "--quiet"]) == 4
    err = capsys.readouterr().err
    assert f"is waiting: no worker has served device {FUTURE!r}" in err, err
    assert err.count("is waiting:") == 1  # said once, not at every poll


def test_the_dashboard_lists_a_jobs_device(api_client, api_db_url):
    register_devices(api_db_url, INTERPRETER)
    api_client.post("/api/v1/jobs", json={**JOB, "device": FUTURE, "future_device": True})
    for page in ("/", "/jobs"):
        html = api_client.get(page).text
        assert f"on <code>{FUTURE}</code>" in html, page
