"""Hostile input over HTTP: text a database or a JSON response cannot carry (NUL, lone
surrogates), non-finite numbers and integers past what a column holds are 4xx naming the field,
on SQLite and PostgreSQL, never a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.api_support import JOB, SHAPE
from tuner.errors import InvalidShape
from tuner.kernel import Dim
from tuner.settings import Settings
from tuner.shapes import MAX_DIM, validate_shape

#: the JSON escapes of a lone surrogate and of NUL, as a hostile client writes them
SURROGATE, NUL = "\\ud800", "\\u0000"


@pytest.fixture
def client(any_db_url: str) -> Iterator[TestClient]:
    """The app on a fresh SQLite file or PostgreSQL database; server errors come back as 500s
    instead of being raised, so a test sees what a client sees."""
    with TestClient(create_app(Settings(database_url=any_db_url)),
                    raise_server_exceptions=False) as c:
        yield c


def post_text(client: TestClient, path: str, text: str) -> Any:
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})


def assert_422_at(response: Any, loc: list[Any]) -> None:
    assert response.status_code == 422, (response.status_code, response.text)
    detail = response.json()["detail"]
    assert any(d["loc"] == loc for d in detail), detail
    assert all(d["msg"] for d in detail)


def job_text(**fields: str) -> str:
    """JOB as JSON text with some fields' values replaced by raw JSON text."""
    text = json.dumps({**JOB, **{name: f"@{name}@" for name in fields}})
    for name, raw in fields.items():
        text = text.replace(f'"@{name}@"', raw)
    return text


@pytest.mark.parametrize("seconds", ["NaN", "Infinity", "-Infinity", "1e999",
                                     "1" + "0" * 400 + ".0"])
def test_non_finite_budget_seconds_is_422_not_a_500_or_no_limit(client, seconds):
    text = json.dumps(JOB).replace('"trials": 3}', f'"trials": 3, "seconds": {seconds}}}')
    assert_422_at(post_text(client, "/api/v1/jobs", text), ["body", "budget", "seconds"])
    assert client.get("/api/v1/jobs").json()["count"] == 0  # nothing stored as "no limit"


@pytest.mark.parametrize("escape", [SURROGATE, NUL])
@pytest.mark.parametrize("field", ["kernel", "dtype", "strategy", "device"])
def test_a_nul_or_a_lone_surrogate_in_a_job_field_is_422_naming_it(client, escape, field):
    raw = f'"float16{escape}"' if field == "dtype" else f'"x{escape}y"'
    assert_422_at(post_text(client, "/api/v1/jobs", job_text(**{field: raw})), ["body", field])


@pytest.mark.parametrize("escape", [SURROGATE, NUL])
def test_bad_text_in_nested_fields_and_keys_is_located(client, escape):
    shapes = json.dumps([SHAPE, {"M": 16, "N": 16, "K": 16}]).replace('"K": 16}]',
                                                                     f'"K{escape}": 16}}]')
    got = post_text(client, "/api/v1/jobs", job_text(shapes=shapes))
    assert got.status_code == 422 and got.json()["detail"][0]["loc"][:3] == ["body", "shapes", 1]
    item = {"kernel": "matmul", "dtype": "float16", "shape": SHAPE, "device": "@d@"}
    for path, body, loc in [
        ("/api/v1/configs/query", {"items": [item], "report_misses": True},
         ["body", "items", 0, "device"]),
        ("/api/v1/configs/query", {"items": [{**item, "device": "dev"}], "client": "@d@",
                                   "report_misses": True}, ["body", "client"]),
    ]:
        text = json.dumps(body).replace('"@d@"', f'"a{escape}"')
        assert_422_at(post_text(client, path, text), loc)
    assert client.get("/api/v1/misses").json()["count"] == 0


def test_a_nul_in_a_query_parameter_or_the_path_is_422_naming_it(client):
    for path, loc in [("/api/v1/jobs?kernel=%00", ["query", "kernel"]),
                      ("/api/v1/misses?kernel=a%00", ["query", "kernel"]),
                      ("/api/v1/configs?kernel=matmul&dtype=float16&M=16&N=16&K=16&device=%00",
                       ["query", "device"]),
                      ("/jobs?kernel=%00", ["query", "kernel"]),  # the dashboard too
                      ("/api/v1/jobs/%00", ["path"]),
                      ("/api/v1/jobs/a%00b/trials", ["path"]),
                      ("/jobs/%00", ["path"])]:
        assert_422_at(client.get(path), loc)
    # bytes that are not UTF-8 are decoded with replacement characters: no surrogate reaches
    # a route, and the request is answered
    assert client.get("/api/v1/jobs?kernel=%ED%A0%80").json()["count"] == 0


@pytest.mark.parametrize(("path", "loc"), [
    (f"/api/v1/jobs?offset={2**70}", ["query", "offset"]),
    (f"/api/v1/jobs?offset={2**63}", ["query", "offset"]),
    (f"/api/v1/misses?offset={2**70}", ["query", "offset"]),
    (f"/api/v1/jobs/x/tasks/{2**70}/trials", ["path", "task_id"]),
    (f"/api/v1/jobs/x/tasks/{2**31}/trials", ["path", "task_id"]),  # PostgreSQL's integer
    (f"/jobs?page={2**70}", ["query", "page"]),
    (f"/misses?page={2**70}", ["query", "page"]),
])
def test_integers_past_a_column_are_422_naming_the_parameter(client, path, loc):
    assert_422_at(client.get(path), loc)


def test_the_largest_accepted_integers_are_answered(client):
    assert client.get(f"/api/v1/jobs?offset={2**31 - 1}").json()["data"] == []
    got = client.get(f"/api/v1/jobs/x/tasks/{2**31 - 1}/trials")
    assert got.status_code == 404 and got.json()["detail"][0]["loc"] == ["path"]


def test_shape_dimensions_are_bounded_whatever_the_kernel_allows():
    dims = (Dim("M", 1, 2**40),)
    assert validate_shape(dims, {"M": MAX_DIM}) == {"M": MAX_DIM}
    with pytest.raises(InvalidShape) as err:
        validate_shape(dims, {"M": MAX_DIM + 1})
    assert err.value.field == "shape.M"


def test_a_valid_job_still_passes_the_guard(client):
    created = post_text(client, "/api/v1/jobs", json.dumps(
        {**JOB, "device": "caf\u00e9:\u00fcber", "budget": {"trials": 3, "seconds": 1e300}}))
    assert created.status_code == 422  # above a year: pydantic's bound, not the guard's
    created = post_text(client, "/api/v1/jobs", json.dumps(
        {**JOB, "device": "caf\u00e9:\u00fcber", "future_device": True,
         "budget": {"trials": 3, "seconds": 1.5e3}}))
    assert created.status_code == 202, created.text
    job = client.get(created.json()["url"]).json()
    assert job["device"] == "caf\u00e9:\u00fcber" and job["budget_seconds"] == 1500.0
