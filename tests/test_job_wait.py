"""Waiting for a job: ``GET /api/v1/jobs/{id}?wait_s=N`` answers once the job changes (or
finishes, or after N s), so ``TunerClient.wait`` and ``tuner tune`` hear of a finish within
~50 ms instead of up to a poll interval late. Real HTTP through the app, a real SQLite file."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.api_support import JOB
from tuner.client import TunerClient


def _cancel_after(client: Any, url: str, delay_s: float) -> tuple[threading.Thread,
                                                                  threading.Event]:
    """A thread that cancels the job ``delay_s`` after the returned event is set (set it
    right before the wait begins)."""
    begun = threading.Event()

    def cancel() -> None:
        begun.wait(30)
        time.sleep(delay_s)
        assert client.post(f"{url}/cancel").status_code == 200

    thread = threading.Thread(target=cancel)
    thread.start()
    return thread, begun


def test_a_wait_is_answered_when_the_job_changes_not_at_its_end(api_client):
    url = api_client.post("/api/v1/jobs", json=JOB).json()["url"]
    canceller, begun = _cancel_after(api_client, url, 0.3)
    t0 = time.monotonic()
    begun.set()
    job = api_client.get(url, params={"wait_s": 20}).json()
    took = time.monotonic() - t0
    canceller.join()
    # asked while queued (the cancel came 0.3 s later): answered at the change, not at once
    # with the queued job, nor after 20 s
    assert job["status"] == "cancelled"
    assert took < 5.0


def test_a_wait_on_an_unchanged_job_lasts_wait_s_and_a_finished_job_is_answered_at_once(
        api_client):
    url = api_client.post("/api/v1/jobs", json=JOB).json()["url"]
    t0 = time.monotonic()
    job = api_client.get(url, params={"wait_s": 0.6}).json()
    assert job["status"] == "queued" and time.monotonic() - t0 >= 0.55
    assert api_client.post(f"{url}/cancel").status_code == 200
    t0 = time.monotonic()
    assert api_client.get(url, params={"wait_s": 20}).json()["status"] == "cancelled"
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("wait_s", ["-1", "61", "soon"])
def test_a_bad_wait_is_a_422_naming_it(api_client, wait_s):
    url = api_client.post("/api/v1/jobs", json=JOB).json()["url"]
    answer = api_client.get(url, params={"wait_s": wait_s})
    assert answer.status_code == 422
    assert "wait_s" in answer.text


def test_the_client_hears_of_the_finish_at_once_not_a_poll_later(api_client):
    """``TunerClient.wait`` with a 10 s poll: the job is cancelled 0.3 s in; the old client
    would have looked again only after 10 s."""
    url = api_client.post("/api/v1/jobs", json=JOB).json()["url"]
    client = TunerClient("http://testserver", timeout=30.0,
                         transport=api_client._transport)  # the app's own transport
    seen: list[str] = []
    canceller, begun = _cancel_after(api_client, url, 0.3)
    t0 = time.monotonic()
    begun.set()
    job = client.wait(url.rsplit("/", 1)[1], timeout=60, poll=10.0,
                      on_poll=lambda j: seen.append(j["status"]))
    took = time.monotonic() - t0
    canceller.join()
    assert job["status"] == "cancelled" and took < 5.0
    assert seen[0] == "queued" and seen[-1] == "cancelled"


def test_the_client_paces_its_reads_where_the_service_answers_without_waiting():
    """A service that ignores ``wait_s`` (an older one) is read every ``poll`` seconds, not in
    a loop as fast as it answers."""
    reads: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        reads.append(time.monotonic())
        status = "succeeded" if len(reads) >= 4 else "running"
        return httpx.Response(200, json={"id": "abcd1234", "status": status, "tasks": []})

    client = TunerClient("http://old.service", transport=httpx.MockTransport(answer))
    t0 = time.monotonic()
    assert client.wait("abcd1234", timeout=30, poll=0.2)["status"] == "succeeded"
    assert len(reads) == 4
    # the second read follows the first at once (it asks to wait); every later one is paced
    gaps = [b - a for a, b in zip(reads, reads[1:], strict=False)]
    assert gaps[1] >= 0.15 and gaps[2] >= 0.15 and time.monotonic() - t0 >= 0.35


def test_over_uvicorn_a_waiting_request_holds_up_no_other_and_a_client_may_give_up(tmp_path):
    """The service's own HTTP stack (uvicorn with ``api.connections.GuardedHTTP``): a request
    waiting on a queued job does not hold up other requests, a client that gives up
    mid-wait leaves the service answering, and the wait still ends at the job's change."""
    from tests.api_support import running_app
    from tuner.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", data_dir=tmp_path)
    with running_app(settings, http="api.connections:GuardedHTTP") as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        url = client.post("/api/v1/jobs", json=JOB).json()["url"]
        with pytest.raises(httpx.ReadTimeout):  # this client gives up after 0.3 s
            httpx.get(f"{base}{url}", params={"wait_s": 30}, timeout=0.3)
        answers: list[dict[str, Any]] = []
        waiter = threading.Thread(target=lambda: answers.append(
            httpx.get(f"{base}{url}", params={"wait_s": 30}, timeout=60).json()))
        waiter.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        assert client.get("/healthz").status_code == 200  # not held up by the waiter
        assert client.get(url).json()["status"] == "queued"
        assert time.monotonic() - t0 < 2.0
        assert client.post(f"{url}/cancel").status_code == 200
        waiter.join(timeout=10)
        assert answers and answers[0]["status"] == "cancelled"


def test_a_long_poll_interval_asks_for_no_longer_than_the_service_holds_a_look():
    """``poll`` of minutes with a long HTTP timeout: each look asks for at most the service's
    60 s (more would be a 422)."""
    from api.routes.jobs import MAX_WAIT_S
    from tuner.client import MAX_WAIT_S as CLIENT_MAX_WAIT_S

    assert CLIENT_MAX_WAIT_S == MAX_WAIT_S
    asked: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(float(request.url.params.get("wait_s", 0)))
        status = "succeeded" if len(asked) >= 2 else "running"
        return httpx.Response(200, json={"id": "abcd1234", "status": status, "tasks": []})

    client = TunerClient("http://svc", timeout=600.0, transport=httpx.MockTransport(answer))
    assert client.wait("abcd1234", timeout=3600, poll=300.0)["status"] == "succeeded"
    assert asked == [0.0, MAX_WAIT_S]
