"""What the service refuses before a route runs: a request that changes state without the key
its route needs (before its body is read), a body over ``TUNER_MAX_BODY_BYTES`` (413), a form
content type on a write route and a cross-site browser request (so that a page of another site
cannot cancel jobs of a service without keys), and keys that are only separators. Real HTTP:
uvicorn on a local socket, spoken to byte by byte where the timing of the body matters."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.app import create_app
from tests.api_support import GPU, JOB, SHAPE, running_app
from tuner.settings import Settings

MB = 1_000_000
WRITER = {"X-API-Key": "writer"}


def send_head(base: str, method: str, path: str, headers: dict[str, str]) -> socket.socket:
    """A connection to the app on which a request's line and headers were sent, no body."""
    url = urlsplit(base)
    assert url.hostname is not None and url.port is not None
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {url.netloc}",
             *[f"{name}: {value}" for name, value in headers.items()], "", ""]
    sock.sendall("\r\n".join(lines).encode())
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the answer on ``sock`` (the app closes after refusing)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.fixture
def keyed_url(api_db_url: str) -> Iterator[str]:
    with running_app(Settings(database_url=api_db_url, api_keys="writer,reader:ro")) as url:
        yield url


# -- the key before the body ------------------------------------------------------------------

def test_a_50_mb_body_without_a_key_is_refused_before_a_byte_of_it_is_sent(keyed_url):
    sock = send_head(keyed_url, "POST", "/api/v1/jobs", {
        "Content-Type": "application/json", "Content-Length": str(50 * MB)})
    with sock:  # nothing of the body was sent: an answer now was given without it
        status, body = read_response(sock)
    assert status == 401 and "API key" in body["detail"][0]["msg"]


def test_a_read_only_key_is_refused_a_write_before_its_body(keyed_url):
    sock = send_head(keyed_url, "POST", "/api/v1/jobs", {
        "Content-Type": "application/json", "Content-Length": str(50 * MB),
        "X-API-Key": "reader"})
    with sock:
        status, body = read_response(sock)
    assert status == 403 and body["detail"][0]["type"] == "api_key_read_only"


# -- the body limit ---------------------------------------------------------------------------

def test_a_2_mb_body_with_a_key_is_413_naming_the_limit_before_it_is_read(keyed_url):
    sock = send_head(keyed_url, "POST", "/api/v1/jobs", {
        "Content-Type": "application/json", "Content-Length": str(2 * MB), **WRITER})
    with sock:
        status, body = read_response(sock)
    assert status == 413
    assert "1,572,864 bytes (TUNER_MAX_BODY_BYTES)" in body["detail"][0]["msg"]


@pytest.mark.parametrize(("path", "kind"), [("/api/v1/jobs", "application/json"),
                                            ("/api/v1/configs/query", "text/plain"),
                                            ("/key", "application/x-www-form-urlencoded")])
def test_a_chunked_body_is_cut_off_with_413_once_it_passes_the_limit(api_db_url, path, kind):
    settings = Settings(database_url=api_db_url, api_keys="writer", max_body_bytes=1000)
    chunk = b"x" * 600
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
    with running_app(settings) as url:
        sock = send_head(url, "POST", path, {"Content-Type": kind,
                                             "Transfer-Encoding": "chunked", **WRITER})
        with sock:
            sock.sendall(body)
            status, answer = read_response(sock)
    assert status == 413 and "1,000 bytes" in answer["detail"][0]["msg"]


def test_the_largest_bulk_query_fits_the_default_limit(api_client):
    shapes = [{"M": m, "N": 4096, "K": 4096} for m in range(1, 4097)]
    items = [{"kernel": "matmul", "dtype": "float16", "shape": s, "device": GPU,
              "kernel_version": "0" * 40, "triton_version": "3.6.0"} for s in shapes]
    body = json.dumps({"items": items, "report_misses": False}).encode()
    assert 800_000 < len(body) < Settings().max_body_bytes
    got = api_client.post("/api/v1/configs/query", content=body,
                          headers={"Content-Type": "application/json"})
    assert got.status_code == 200 and got.json()["count"] == 4096


# -- browsers of other sites ------------------------------------------------------------------

@pytest.fixture
def queued_job(api_client: TestClient) -> str:
    created = api_client.post("/api/v1/jobs", json=JOB)
    assert created.status_code == 202
    return str(created.json()["id"])


@pytest.mark.parametrize("kind", ["application/x-www-form-urlencoded", "multipart/form-data",
                                  "text/plain;charset=UTF-8"])
def test_a_form_encoded_cancel_is_415_without_keys(api_client, queued_job, kind):
    got = api_client.post(f"/api/v1/jobs/{queued_job}/cancel", content=b"a=1",
                          headers={"Content-Type": kind})
    assert got.status_code == 415 and got.json()["detail"][0]["loc"] == [
        "header", "content-type"]
    assert api_client.post("/api/v1/jobs", content=b"a=1", headers={
        "Content-Type": kind}).status_code == 415
    assert api_client.get(f"/api/v1/jobs/{queued_job}").json()["status"] == "queued"
    # a program's cancel (no body, or JSON) still works
    assert api_client.post(f"/api/v1/jobs/{queued_job}/cancel").json()["status"] == "cancelled"


@pytest.mark.parametrize("headers", [{"Sec-Fetch-Site": "cross-site"},
                                     {"Sec-Fetch-Site": "same-site"},
                                     {"Origin": "https://evil.example"}, {"Origin": "null"}])
def test_a_cross_site_browser_request_cannot_cancel(api_client, queued_job, headers):
    for path in (f"/api/v1/jobs/{queued_job}/cancel", f"/jobs/{queued_job}/cancel"):
        got = api_client.post(path, headers=headers)
        assert got.status_code == 403 and got.json()["detail"][0]["type"] == "cross_site"
    assert api_client.get(f"/api/v1/jobs/{queued_job}").json()["status"] == "queued"


def test_the_dashboards_own_cancel_form_still_cancels(api_client, queued_job):
    got = api_client.post(f"/jobs/{queued_job}/cancel", data={"api_key": ""},
                          headers={"Sec-Fetch-Site": "same-origin",
                                   "Origin": "http://testserver"}, follow_redirects=False)
    assert got.status_code == 303
    assert api_client.get(f"/api/v1/jobs/{queued_job}").json()["status"] == "cancelled"


# -- keys configured wrongly or not at all ----------------------------------------------------

@pytest.mark.parametrize("keys", [",", " , ", ",,,"])
def test_keys_that_are_only_separators_stop_start_up(keys, monkeypatch):
    monkeypatch.setenv("TUNER_API_KEYS", keys)
    with pytest.raises(ValidationError) as err:
        Settings()
    assert "TUNER_API_KEYS holds separators but no key" in str(err.value)


def test_an_api_without_keys_warns_once_at_start(api_db_url, caplog):
    with caplog.at_level(logging.WARNING, logger="api.app"), TestClient(
            create_app(Settings(database_url=api_db_url))) as client:
        client.get("/api/v1/kernels")
        client.get("/api/v1/kernels")
    warned = [r for r in caplog.records if "no API keys are configured" in r.getMessage()]
    assert len(warned) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="api.app"), TestClient(
            create_app(Settings(database_url=api_db_url, api_keys="k"))):
        pass
    assert not [r for r in caplog.records if "no API keys" in r.getMessage()]


def test_a_lookup_is_not_slowed_or_changed_by_the_gate(api_client):
    got = api_client.get("/api/v1/configs", params={"kernel": "matmul", "dtype": "float16",
                                                    **SHAPE})
    assert got.status_code == 404 and got.json()["match"] == "default"


# -- the Host header ----------------------------------------------------------------------------

ALLOWED = "tuner.example.com,*.corp.example,[::1]"


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/healthz"), ("GET", "/api/v1/kernels"), ("GET", "/"), ("POST", "/api/v1/jobs")])
def test_a_host_not_allowed_is_refused_with_a_sentence_on_every_route(api_db_url, method,
                                                                      path):
    with TestClient(create_app(Settings(database_url=api_db_url, allowed_hosts=ALLOWED)),
                    base_url="http://rebound.attacker.example") as client:
        got = client.request(method, path, json=JOB if method == "POST" else None)
    assert got.status_code == 400
    [error] = got.json()["detail"]
    assert error["loc"] == ["header", "host"] and error["type"] == "host_not_allowed"
    assert error["msg"] == ("this service refuses requests for a host it does not serve; it "
                            "answers for tuner.example.com, *.corp.example, ::1 "
                            "(TUNER_ALLOWED_HOSTS)")


@pytest.mark.parametrize("host", [
    "tuner.example.com", "TUNER.example.com:8000", "gpu.corp.example", "a.b.corp.example.",
    "[::1]:8000"])
def test_an_allowed_host_is_answered(api_db_url, host):
    with TestClient(create_app(Settings(database_url=api_db_url, allowed_hosts=ALLOWED))
                    ) as client:
        assert client.get("/healthz", headers={"host": host}).status_code == 200


@pytest.mark.parametrize("host", ["corp.example", "evilcorp.example", "tuner.example.com.evil",
                                  "[::2]:8000", ""])
def test_a_host_that_only_resembles_an_allowed_one_is_refused(api_db_url, host):
    with TestClient(create_app(Settings(database_url=api_db_url, allowed_hosts=ALLOWED))
                    ) as client:
        assert client.get("/healthz", headers={"host": host}).status_code == 400


def test_without_allowed_hosts_an_app_answers_any_host(api_client):
    assert api_client.get("/healthz", headers={"host": "anything.example"}).status_code == 200


@pytest.mark.parametrize("hosts", ["http://tuner.example.com", "tuner.example.com:8000",
                                   "a b", "example.com/x"])
def test_an_allowed_host_with_a_scheme_port_or_path_stops_start_up(hosts, monkeypatch):
    monkeypatch.setenv("TUNER_ALLOWED_HOSTS", hosts)
    with pytest.raises(ValidationError) as err:
        Settings()
    assert "TUNER_ALLOWED_HOSTS: entry 1 is not a host name" in str(err.value)


def test_serve_answers_its_loopback_names_and_its_host_or_any_on_every_address():
    from tuner.app.service import default_allowed_hosts

    assert default_allowed_hosts("127.0.0.1") == "localhost,127.0.0.1,::1"
    assert default_allowed_hosts("tuner-1.cluster") == "localhost,127.0.0.1,::1,tuner-1.cluster"
    assert default_allowed_hosts("10.0.0.5") == "localhost,127.0.0.1,::1,10.0.0.5"
    assert default_allowed_hosts("0.0.0.0") == default_allowed_hosts("::") == "*"


def test_a_request_without_a_host_header_is_refused_where_hosts_are_listed(api_db_url):
    with running_app(Settings(database_url=api_db_url, allowed_hosts=ALLOWED)) as base:
        url = urlsplit(base)
        assert url.hostname is not None and url.port is not None
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")  # HTTP/1.0 may omit Host
            status, body = read_response(sock)
    assert status == 400 and body["detail"][0]["msg"].startswith(
        "this service refuses requests without a Host header")
