"""Jobs named by a prefix of their id (the 8 characters the dashboard and the CLI show), over
real HTTP through the app, on SQLite and PostgreSQL: a unique prefix names its job, an
ambiguous one is a 409 listing the candidates, one under 4 characters a 422, an unknown one a
404; each error names the path parameter."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from db import repo
from db.engine import init_db
from db.models import Job, Task
from search_spaces import get_kernel
from tests.api_support import JOB, SHAPE
from tuner.settings import Settings
from tuner.shapes import shape_key

#: two jobs whose ids share their first 8 characters (the dashboard's short id)
TWINS = ("abcd1234" + "0" * 24, "abcd1234" + "f" * 24)


@pytest.fixture
def client(any_db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=any_db_url))) as c:
        yield c


def add_job(db_url: str, job_id: str) -> None:
    """A queued matmul job with this id (submissions get random ids: twins need choosing)."""
    with init_db(db_url)() as session:
        job = Job(id=job_id, kernel="matmul", kernel_version=get_kernel("matmul").version,
                  dtype="float16", status="queued", budget_trials=3, request_key=job_id * 2)
        job.tasks = [Task(shape=SHAPE, shape_key=shape_key(SHAPE), status="queued",
                          outcome_counts={})]
        session.add(job)
        session.commit()


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["path", "job_id"] and detail["msg"]
    return dict(detail)


def test_a_unique_prefix_names_the_job_in_every_job_path(client):
    job_id = client.post("/api/v1/jobs", json=JOB).json()["id"]
    short = job_id[:8]
    got = client.get(f"/api/v1/jobs/{short}")
    assert got.status_code == 200 and got.json()["id"] == job_id
    assert client.get(f"/api/v1/jobs/{job_id[:4]}").json()["id"] == job_id
    assert client.get(f"/api/v1/jobs/{short.upper()}").json()["id"] == job_id
    task_id = got.json()["tasks"][0]["id"]
    assert client.get(f"/api/v1/jobs/{short}/trials").json()["count"] == 0
    assert client.get(f"/api/v1/jobs/{short}/tasks/{task_id}/trials").status_code == 200
    cancelled = client.post(f"/api/v1/jobs/{short}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["id"] == job_id
    assert client.get(f"/api/v1/jobs/{job_id}").json()["status"] == "cancelled"


def test_an_ambiguous_prefix_is_a_409_listing_the_candidates(client, any_db_url):
    for job_id in TWINS:
        add_job(any_db_url, job_id)
    for path in ("/api/v1/jobs/abcd1234", "/api/v1/jobs/abcd/trials"):
        detail = error_of(client.get(path), 409)
        assert sorted(detail["candidates"]) == sorted(TWINS)
        assert all(job_id in detail["msg"] for job_id in TWINS)
    error_of(client.post("/api/v1/jobs/abcd1234/cancel"), 409)
    # nothing was cancelled; one more character tells them apart
    assert client.get(f"/api/v1/jobs/{TWINS[0]}").json()["status"] == "queued"
    assert client.get("/api/v1/jobs/abcd1234f").json()["id"] == TWINS[1]


def test_a_prefix_under_four_characters_is_a_422(client):
    job_id = client.post("/api/v1/jobs", json=JOB).json()["id"]
    detail = error_of(client.get(f"/api/v1/jobs/{job_id[:3]}"), 422)
    assert "at least 4" in detail["msg"]
    error_of(client.post(f"/api/v1/jobs/{job_id[:3]}/cancel"), 422)
    error_of(client.get(f"/api/v1/jobs/{job_id[:1]}/trials"), 422)


@pytest.mark.parametrize("job_id", [
    "abcd",                      # hex, no job's id starts with it
    uuid.uuid4().hex,            # a whole id of no job
    "doesnotexist",              # not hex: no job's id can start with it
    "a" * 33,                    # longer than any id
    "abcd%",                     # a LIKE wildcard is not a wildcard
])
def test_a_prefix_of_no_job_is_a_404(client, any_db_url, job_id):
    add_job(any_db_url, "abce" + "0" * 28)
    got = client.get(f"/api/v1/jobs/{job_id}")
    assert got.status_code == 404 and got.json()["detail"][0]["loc"] == ["path"]
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 404


def test_an_ambiguous_prefix_lists_at_most_ten_jobs_oldest_first(any_db_url):
    ids = [f"beef{i:02d}" + "0" * 26 for i in range(12)]
    for job_id in ids:
        add_job(any_db_url, job_id)
    with init_db(any_db_url)() as session:
        with pytest.raises(repo.AmbiguousJobId) as err:
            repo.resolve_job_id(session, "beef")
        assert err.value.candidates == ids[:10] and err.value.more is True
        assert "..." in str(err.value)
        assert repo.resolve_job_id(session, "beef11") == ids[11]


def test_the_dashboard_job_page_takes_the_short_id_it_shows(client):
    job_id = client.post("/api/v1/jobs", json=JOB).json()["id"]
    page = client.get(f"/jobs/{job_id[:8]}")
    assert page.status_code == 200 and job_id in page.text
    live = client.get(f"/jobs/{job_id[:8]}/live")
    assert live.status_code == 200 and live.json()["parts"]["job"]
    csv = client.get(f"/jobs/{job_id[:8]}/trials.csv")
    assert csv.status_code == 200 and csv.text.splitlines()[0].startswith("job")
    short = client.get(f"/jobs/{job_id[:3]}")
    assert short.status_code == 422 and "Job id too short" in short.text
    assert client.get("/jobs/0123456789abcdef/live").status_code == 404
