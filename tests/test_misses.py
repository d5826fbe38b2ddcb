"""Tuning on misses: lookups not served exactly are recorded and queued once as jobs on the
caller's device (one a worker has registered), for callers that may write, within a per-client
rate and a per-kernel cap; GET /misses lists them. Real HTTP through the app, on SQLite and
PostgreSQL (``any_db_url``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, get_args

import httpx
import pytest
import triton
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from api.app import create_app
from api.schemas import MissOutcome, MissStatus
from db import repo
from db.engine import init_db
from db.models import Job, Miss, utcnow
from search_spaces import get_kernel
from tests.api_support import (
    GPU,
    INTERPRETER,
    register_devices,
    run_worker_once,
    running_app,
    store,
)
from tuner.settings import Settings

H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
TINY = {"M": 16, "N": 16, "K": 16}
QUERY = "/api/v1/configs/query"


def item(shape: dict[str, int] = TINY, device: str | None = GPU,
         **identity: str) -> dict[str, Any]:
    fields: dict[str, Any] = {"kernel": "matmul", "dtype": "float32", "shape": shape,
                              **identity}
    if device is not None:
        fields["device"] = device
    return fields


def reported(api: TestClient, *items: dict[str, Any], **body: Any) -> list[dict[str, Any]]:
    """The answers to a bulk query that reports misses."""
    got = api.post(QUERY, json={"items": list(items), "report_misses": True, **body})
    assert got.status_code == 200, got.text
    return list(got.json()["data"])


def outcomes(api: TestClient, *items: dict[str, Any], **body: Any) -> list[str | None]:
    return [a["miss"] for a in reported(api, *items, **body)]


def misses(api: TestClient, **params: Any) -> dict[str, Any]:
    got = api.get("/api/v1/misses", params=params)
    assert got.status_code == 200, got.text
    return dict(got.json())


def job_count(db_url: str) -> int:
    with init_db(db_url)() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


@pytest.fixture
def make_client(any_db_url: str) -> Iterator[Callable[..., TestClient]]:
    """Clients of apps on one fresh database, with the settings given; the GPU and the
    interpreter are registered devices."""
    opened: list[TestClient] = []

    def make(**settings: Any) -> TestClient:
        client = TestClient(create_app(Settings(database_url=any_db_url, **settings)))
        opened.append(client.__enter__())
        register_devices(any_db_url, GPU, INTERPRETER)
        return client

    yield make
    for client in opened:
        client.__exit__(None, None, None)


# -- recording and queueing -------------------------------------------------------------------

def test_a_miss_reported_many_times_is_queued_once_on_the_callers_device(make_client,
                                                                        any_db_url):
    client = make_client(miss_trials=7)
    assert outcomes(client, item()) == ["queued"]
    assert outcomes(client, item(), item()) == ["pending", "pending"]
    assert outcomes(client, item(), client="another-model") == ["pending"]
    listed = misses(client)
    assert listed["count"] == 1
    [miss] = listed["data"]
    assert (miss["count"], miss["status"], miss["device"]) == (4, "queued", GPU)
    assert miss["shape"] == TINY and miss["last_client"] == "another-model"
    assert miss["kernel_version"] == get_kernel("matmul").version
    assert job_count(any_db_url) == 1
    job = client.get(miss["job_url"]).json()
    assert (job["device"], job["budget_trials"], job["strategy"], job["dtype"]) == (
        GPU, 7, "auto", "float32")
    assert [t["shape"] for t in job["tasks"]] == [TINY]


def test_an_exact_answer_is_not_a_miss_and_unreported_misses_are_not_recorded(make_client,
                                                                              any_db_url):
    client = make_client()
    store(any_db_url, TINY, 0.01, dtype="float32")
    assert reported(client, item(triton_version="3.6.0"))[0]["match"] == "exact"
    assert outcomes(client, item(triton_version="3.6.0")) == [None]
    unreported = client.post(QUERY, json={"items": [item({"M": 32, "N": 16, "K": 16})]})
    assert unreported.json()["data"][0]["miss"] is None
    assert misses(client)["count"] == 0 and job_count(any_db_url) == 0


def test_a_fallback_answer_is_still_served_while_its_miss_is_queued(make_client, any_db_url):
    client = make_client()
    store(any_db_url, TINY, 0.01, device=H100, dtype="float32")
    [answer] = reported(client, item())
    assert (answer["match"], answer["device"], answer["miss"]) == ("other-device", H100,
                                                                   "queued")
    assert client.get(misses(client)["data"][0]["job_url"]).json()["device"] == GPU


def _report_once(db_url: str, barrier: threading.Barrier, client: str) -> str:
    limits = repo.MissLimits(rate_per_client=60, cap_per_kernel=32, trials=2)
    version = get_kernel("matmul").version
    with init_db(db_url)() as session:
        barrier.wait()
        outcome = repo.report_miss(session, device_key=GPU, kernel="matmul",
                                   kernel_version=version, registered_version=version,
                                   dtype="float32", shape=TINY, client=client, limits=limits)
        session.commit()
        return outcome


def test_sixteen_clients_reporting_one_miss_at_once_make_one_row_and_one_job(any_db_url):
    register_devices(any_db_url, GPU)
    barrier = threading.Barrier(16)
    results: list[str] = []
    errors: list[BaseException] = []

    def report(n: int) -> None:
        try:
            results.append(_report_once(any_db_url, barrier, f"client-{n}"))
        except BaseException as exc:  # noqa: BLE001 - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=report, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert sorted(results) == ["pending"] * 15 + ["queued"]
    with init_db(any_db_url)() as session:
        [miss] = session.scalars(select(Miss)).all()
        assert miss.count == 16 and miss.job_id is not None
    assert job_count(any_db_url) == 1


def test_sixteen_clients_over_http_at_once_queue_one_job(any_db_url):
    body = {"items": [item(), item({"M": 32, "N": 16, "K": 16})], "report_misses": True}
    barrier = threading.Barrier(16)
    answers: list[Any] = []

    with running_app(Settings(database_url=any_db_url)) as url:
        register_devices(any_db_url, GPU)

        def ask(n: int) -> None:
            barrier.wait()
            answers.append(httpx.post(url + QUERY, json={**body, "client": f"c{n}"},
                                      timeout=60))

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert [a.status_code for a in answers] == [200] * 16
    for i in (0, 1):
        seen = sorted(a.json()["data"][i]["miss"] for a in answers)
        assert seen == ["pending"] * 15 + ["queued"]
    assert job_count(any_db_url) == 2
    with init_db(any_db_url)() as session:
        assert sorted(m.count for m in session.scalars(select(Miss))) == [16, 16]


# -- why a miss is not queued -----------------------------------------------------------------

def test_a_key_queues_at_most_its_rate_per_hour_whatever_client_name_it_gives(make_client,
                                                                            any_db_url):
    client = make_client(miss_rate_per_client=2, api_keys="key-a,key-b")
    shapes = [{"M": m, "N": 16, "K": 16} for m in (16, 32, 64)]
    a, b = {"X-API-Key": "key-a"}, {"X-API-Key": "key-b"}

    def ask(headers: dict[str, str], *shapes: dict[str, int], name: str) -> list[str]:
        got = client.post(QUERY, headers=headers, json={
            "items": [item(s) for s in shapes], "report_misses": True, "client": name})
        return [answer["miss"] for answer in got.json()["data"]]

    assert ask(a, *shapes, name="model-a") == ["queued", "queued", "rate-limited"]
    # another name is the same caller: the limit counts the key, not a name it picks
    assert ask(a, shapes[2], name="model-b") == ["rate-limited"]
    assert ask(b, shapes[2], name="model-a") == ["queued"]
    assert job_count(any_db_url) == 3
    # an hour later the key may queue again
    with init_db(any_db_url)() as session:
        session.execute(update(Miss).values(queued_at=utcnow() - timedelta(hours=2)))
        session.commit()
    assert ask(a, {"M": 128, "N": 16, "K": 16}, name="model-a") == ["queued"]


def test_without_keys_the_callers_address_is_rate_limited_whatever_it_presents(make_client):
    client = make_client(miss_rate_per_client=1)
    first = client.post(QUERY, headers={"X-API-Key": "made-up"}, json={
        "items": [item()], "report_misses": True, "client": "model-a"})
    assert first.json()["data"][0]["miss"] == "queued"
    # no keys are configured: a header or a name is the caller's choice, its address is not
    second = client.post(QUERY, headers={"X-API-Key": "another"}, json={
        "items": [item({"M": 32, "N": 16, "K": 16})], "report_misses": True, "client": "b"})
    assert second.json()["data"][0]["miss"] == "rate-limited"
    assert "host:testclient" in misses(client, status="rate-limited")["data"][0]["note"]


def test_a_keys_digest_is_what_the_limit_counts_and_the_key_is_never_stored(make_client):
    client = make_client(miss_rate_per_client=1, api_keys="s3cret-key")
    keyed = {"X-API-Key": "s3cret-key"}
    got = [client.post(QUERY, headers=keyed, json={"items": [item({"M": m, "N": 16, "K": 16})],
                                                   "report_misses": True}).json()
           for m in (16, 32)]
    assert [g["data"][0]["miss"] for g in got] == ["queued", "rate-limited"]
    listed = client.get("/api/v1/misses")
    assert {m["last_client"].split(":")[0] for m in listed.json()["data"]} == {"key"}
    assert "s3cret-key" not in listed.text  # a key is a secret: only its digest is kept


# -- who may queue ----------------------------------------------------------------------------

def test_a_read_only_or_missing_keys_misses_are_recorded_not_queued(make_client, any_db_url):
    client = make_client(api_keys="writer,reader:ro")
    for headers in ({"X-API-Key": "reader"}, {}):
        got = client.post(QUERY, headers=headers,
                          json={"items": [item()], "report_misses": True})
        assert got.status_code == 200 and got.json()["data"][0]["miss"] == "read-only"
    [miss] = misses(client)["data"]  # recorded: the dashboard shows it
    assert (miss["status"], miss["count"], miss["job_id"]) == ("read-only", 2, None)
    assert "write access" in miss["note"]
    assert job_count(any_db_url) == 0
    writer = {"X-API-Key": "writer"}
    assert client.post(QUERY, headers=writer, json={"items": [item()], "report_misses": True}
                       ).json()["data"][0]["miss"] == "queued"
    # once queued, a read-only caller is told it is pending
    assert client.post(QUERY, headers={"X-API-Key": "reader"}, json={
        "items": [item()], "report_misses": True}).json()["data"][0]["miss"] == "pending"
    assert job_count(any_db_url) == 1


def test_misses_on_a_device_no_worker_registered_do_not_fill_the_kernels_cap(make_client,
                                                                            any_db_url):
    client = make_client(miss_cap_per_kernel=2)
    made_up = [item({"M": m, "N": 16, "K": 16}, device="cuda:Made Up GPU:sm99")
               for m in (16, 32, 64)]
    assert outcomes(client, *made_up) == ["unknown-device"] * 3
    noted = misses(client, status="unknown-device")
    assert noted["count"] == 3 and "no worker has registered" in noted["data"][0]["note"]
    assert job_count(any_db_url) == 0
    # a real model's miss on a registered GPU is still queued
    assert outcomes(client, item()) == ["queued"]


def test_a_kernel_has_at_most_its_cap_of_misses_queued_or_running(make_client, any_db_url):
    client = make_client(miss_cap_per_kernel=2)
    shapes = [{"M": m, "N": 16, "K": 16} for m in (16, 32, 64)]
    assert outcomes(client, *[item(s) for s in shapes]) == ["queued", "queued", "capped"]
    capped = misses(client, status="capped")["data"]
    assert [m["shape"] for m in capped] == [shapes[2]] and "2 misses" in capped[0]["note"]
    first_job = misses(client, status="queued")["data"][-1]["job_id"]
    assert client.post(f"/api/v1/jobs/{first_job}/cancel").status_code == 200
    assert outcomes(client, item(shapes[2])) == ["queued"]  # the cancelled job freed a place
    assert job_count(any_db_url) == 3


def test_another_kernel_version_is_recorded_not_queued(make_client, any_db_url):
    client = make_client()
    assert outcomes(client, item(kernel_version="0ld5ource")) == ["kernel-version-mismatch"]
    [miss] = misses(client)["data"]
    assert (miss["status"], miss["kernel_version"], miss["job_id"]) == (
        "kernel-version-mismatch", "0ld5ource", None)
    assert get_kernel("matmul").version in miss["note"]
    assert job_count(any_db_url) == 0


def test_without_a_device_a_miss_is_recorded_not_queued(make_client, any_db_url):
    client = make_client()
    assert outcomes(client, item(device=None), item(device=None)) == ["no-device"] * 2
    [miss] = misses(client)["data"]
    assert (miss["status"], miss["device"], miss["count"]) == ("no-device", None, 2)
    assert job_count(any_db_url) == 0


def test_a_failed_miss_is_queued_again_an_hour_later(make_client, any_db_url):
    client = make_client()
    assert outcomes(client, item()) == ["queued"]
    first = misses(client)["data"][0]["job_id"]
    client.post(f"/api/v1/jobs/{first}/cancel")
    [miss] = misses(client)["data"]
    assert (miss["status"], miss["note"]) == ("failed", "its job was cancelled")
    assert outcomes(client, item()) == ["failed"]
    with init_db(any_db_url)() as session:
        session.execute(update(Job).values(finished_at=utcnow() - timedelta(hours=2)))
        session.commit()
    assert outcomes(client, item()) == ["queued"]
    [miss] = misses(client)["data"]
    assert miss["job_id"] != first and miss["status"] == "queued"
    assert job_count(any_db_url) == 2


def test_a_misses_status_follows_its_job(make_client, any_db_url):
    client = make_client()
    assert outcomes(client, item()) == ["queued"]
    with init_db(any_db_url)() as session:
        task = repo.claim_task(session, worker_id="w", device_key=GPU, lease_seconds=60)
        session.commit()
        assert task is not None
        assert misses(client)["data"][0]["status"] == "running"
        assert outcomes(client, item()) == ["pending"]
        repo.finish_task(session, task.id, "failed", "out of memory", worker_id="w")
        session.commit()
    [miss] = misses(client)["data"]
    assert miss["status"] == "failed" and "out of memory" in miss["note"]
    assert outcomes(client, item()) == ["failed"]
    assert [m["status"] for m in misses(client, status="failed")["data"]] == ["failed"]


# -- the whole loop: a miss tuned by a worker is served exactly -------------------------------

def test_a_miss_tuned_by_the_interpreter_worker_is_then_served_exactly(make_client,
                                                                       any_db_url):
    client = make_client(miss_trials=2)
    mine = item(device=INTERPRETER, triton_version=triton.__version__,
                kernel_version=get_kernel("matmul").version)
    [before] = reported(client, mine)
    assert (before["match"], before["miss"]) == ("default", "queued")
    assert outcomes(client, mine) == ["pending"]
    outcome = run_worker_once(any_db_url)
    assert outcome.status == "succeeded" and outcome.stored
    [after] = reported(client, mine)
    assert (after["match"], after["miss"], after["device"]) == ("exact", None, INTERPRETER)
    [miss] = misses(client)["data"]
    assert miss["status"] == "tuned" and miss["count"] == 2
    job = client.get(miss["job_url"]).json()
    assert job["tasks"][0]["trials_done"] == 2
    assert after["config"] == job["tasks"][0]["best_config"]
    # a caller on another Triton minor still misses, and is told it was tuned
    other = {**mine, "triton_version": "2.9.0"}
    [answer] = reported(client, other)
    assert (answer["match"], answer["miss"]) == ("other-triton", "tuned")
    # and a GPU caller is never served the interpreter's result
    assert reported(client, item(device=GPU))[0]["match"] == "default"


# -- GET /misses ------------------------------------------------------------------------------

def test_misses_are_listed_newest_first_and_filtered(make_client):
    client = make_client()
    outcomes(client, item({"M": 16, "N": 16, "K": 16}))
    outcomes(client, item({"M": 32, "N": 16, "K": 16}, device=None))
    outcomes(client, item({"M": 64, "N": 16, "K": 16}))
    listed = misses(client)
    assert [m["shape"]["M"] for m in listed["data"]] == [64, 32, 16]
    assert [m["shape"]["M"] for m in misses(client, status="queued")["data"]] == [64, 16]
    assert misses(client, status="queued", limit=1) == {
        "data": misses(client, status="queued")["data"][:1], "count": 2}
    assert misses(client, kernel="softmax")["count"] == 0
    bad = client.get("/api/v1/misses", params={"status": "lost"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "status"]


def test_the_api_documents_every_status_a_miss_can_have():
    assert set(get_args(MissStatus)) == set(repo.MISS_STATUSES)
    assert set(get_args(MissOutcome)) == {*repo.MISS_STATUSES, "pending", "deferred"} - {
        "running"}


def test_the_client_name_is_at_most_100_characters(make_client):
    client = make_client()
    got = client.post(QUERY, json={"items": [item()], "report_misses": True,
                                   "client": "x" * 101})
    assert got.status_code == 422 and got.json()["detail"][0]["loc"] == ["body", "client"]
