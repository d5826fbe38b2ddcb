"""Stale configs (``GET /api/v1/configs/stale``, ``/dashboard/stale``) and the comparison page
(``/dashboard/compare``): over HTTP against the app with a real SQLite file, and in a real
browser (Debian's Chromium driven by Playwright, against ``tuner serve`` with a worker on the
Triton CPU interpreter; skipped, saying so, where either is missing)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from sqlalchemy import update

from db import views
from db.engine import init_db
from db.models import BestConfig
from search_spaces import get_kernel
from tests.api_support import GPU, INTERPRETER, run_worker_once, store
from tests.support_browser import wait_done
from tuner.identity import local_triton_version

SHAPE = {"M": 32, "N": 16, "K": 16}
OLD = "0ld5ource0ld"
H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"


def _register(db_url: str, device: str, triton: str | None, kind: str = "cuda") -> None:
    """A device as its workers registered it, with the Triton they run."""
    from db import repo

    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": device, "kind": kind, "name": device.split(":")[1],
                                     "triton_version": triton})
        session.commit()


def _stale(client: Any, **params: str) -> list[dict[str, Any]]:
    got = client.get("/api/v1/configs/stale", params=params)
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["count"] == len(body["data"])
    return list(body["data"])


# -- GET /api/v1/configs/stale -------------------------------------------------------------------

def test_a_best_of_an_old_kernel_version_is_stale_with_the_body_that_retunes_it(
        api_client, api_db_url):
    _register(api_db_url, GPU, "3.6.0")
    store(api_db_url, SHAPE, 0.5, kernel_version=OLD, triton_version="3.6.0")
    store(api_db_url, {"M": 64, "N": 16, "K": 16}, 0.6, triton_version="3.6.0")  # current
    [row] = _stale(api_client)
    assert row["reasons"] == ["kernel-version"] and row["shape"] == SHAPE
    assert row["kernel_version"] == OLD
    assert row["current_kernel_version"] == get_kernel("matmul").version
    assert row["current_triton_version"] == "3.6.0" and row["device"] == GPU
    assert row["retune"]["device"] == GPU and row["retune"]["force"] is True
    assert row["retune"]["shapes"] == [SHAPE] and row["retune"]["budget"]["trials"] == 48
    # the body is one the API takes: a job for that shape on that device
    created = api_client.post("/api/v1/jobs", json=row["retune"])
    assert created.status_code == 202, created.text
    job = api_client.get(created.json()["url"]).json()
    assert (job["kernel"], job["dtype"], job["device"]) == ("matmul", "float16", GPU)
    assert job["kernel_version"] == get_kernel("matmul").version
    assert [t["shape"] for t in job["tasks"]] == [SHAPE] and job["status"] == "queued"


def test_triton_staleness_is_by_minor_version_of_what_the_device_runs_now(api_client,
                                                                          api_db_url):
    _register(api_db_url, GPU, "3.6.1")
    store(api_db_url, SHAPE, 0.5, triton_version="3.6.0")  # a patch release apart: current
    store(api_db_url, {"M": 64, "N": 16, "K": 16}, 0.6, triton_version="3.5.1")
    store(api_db_url, {"M": 128, "N": 16, "K": 16}, 0.7, kernel_version=OLD,
          triton_version="3.4.0")
    rows = {r["shape"]["M"]: r for r in _stale(api_client)}
    assert set(rows) == {64, 128}
    assert rows[64]["reasons"] == ["triton-version"]
    assert rows[64]["triton_version"] == "3.5.1" and rows[64]["current_triton_version"] == "3.6.1"
    assert rows[128]["reasons"] == ["kernel-version", "triton-version"]


def test_a_device_whose_triton_is_not_on_record_is_compared_with_the_installed_one(
        api_client, api_db_url):
    installed = local_triton_version()
    assert installed
    major, minor = installed.split(".")[:2]
    other = f"{major}.{int(minor) + 1}.0"
    store(api_db_url, SHAPE, 0.5, device=H100, triton_version=other)  # device: no Triton
    store(api_db_url, {"M": 64, "N": 16, "K": 16}, 0.5, device=H100, triton_version=installed)
    [row] = _stale(api_client)
    assert row["shape"] == SHAPE and row["current_triton_version"] == installed


def test_a_shape_tuned_again_for_the_current_code_is_no_longer_stale(api_client, api_db_url):
    _register(api_db_url, GPU, "3.6.0")
    store(api_db_url, SHAPE, 0.5, kernel_version=OLD, triton_version="3.6.0")
    store(api_db_url, SHAPE, 0.4, kernel_version="0lder5ource0", triton_version="3.5.0")
    assert len(_stale(api_client)) == 1  # one row per device, kernel, dtype and shape
    [row] = _stale(api_client)
    assert row["kernel_version"] == "0lder5ource0"  # the most recently stored
    store(api_db_url, SHAPE, 0.45, triton_version="3.6.2")  # re-tuned: current code, minor
    assert _stale(api_client) == []
    # another device's and another dtype's old rows are their own
    store(api_db_url, SHAPE, 0.5, device=H100, kernel_version=OLD, triton_version="3.6.0")
    store(api_db_url, SHAPE, 0.5, dtype="float32", kernel_version=OLD, triton_version="3.6.0")
    assert sorted((r["device"], r["dtype"]) for r in _stale(api_client)) == [
        (H100, "float16"), (GPU, "float32")]


def test_kernel_filter_and_replayed_tables_are_not_retuned(api_client, api_db_url):
    store(api_db_url, SHAPE, 0.5, device="replay:NVIDIA H200", kind="replay",
          kernel_version=OLD, triton_version="3.6.0")
    [row] = _stale(api_client, kernel="matmul")
    assert row["retune"] is None and row["reasons"][0] == "kernel-version"
    assert _stale(api_client, kernel="softmax") == []


def test_a_stale_best_from_a_job_is_retuned_with_that_jobs_budget(api_client, api_db_url):
    """A best a worker stored (a real tuning job on the interpreter), made stale by its kernel
    source changing: its re-tune asks for the trials its job had."""
    job = api_client.post("/api/v1/jobs", json={
        "kernel": "matmul", "dtype": "float16", "shapes": [{"M": 16, "N": 16, "K": 16}],
        "budget": {"trials": 3}, "device": INTERPRETER, "future_device": True, "force": True})
    assert job.status_code == 202, job.text
    assert run_worker_once(api_db_url).status == "succeeded"
    assert _stale(api_client) == []
    with init_db(api_db_url)() as session:  # the kernel's source changes under it
        session.execute(update(BestConfig).values(kernel_version=OLD))
        session.commit()
    [row] = _stale(api_client)
    assert row["device"] == INTERPRETER and row["retune"]["budget"]["trials"] == 3
    assert row["retune"]["device"] == INTERPRETER


def test_the_stale_page_lists_them_with_a_retune_button(api_client, api_db_url):
    _register(api_db_url, GPU, "3.6.0")
    store(api_db_url, SHAPE, 0.5, kernel_version=OLD, triton_version="3.6.0")
    page = api_client.get("/dashboard/stale")
    assert page.status_code == 200
    rows = re.findall(r'<tr data-stale="\d+"', page.text)
    assert len(rows) == 1 and OLD in page.text and "kernel-version" in page.text
    [body] = re.findall(r'data-retune="([^"]+)"', page.text)
    retune = json.loads(body.replace("&#34;", '"'))
    assert retune["shapes"] == [SHAPE] and retune["device"] == GPU
    assert "/dashboard/compare?kernel=matmul&amp;dtype=float16&amp;shape=M%3D32" in page.text
    empty = api_client.get("/dashboard/stale", params={"kernel": "softmax"})
    assert "Nothing stale" in empty.text


# -- /dashboard/compare ------------------------------------------------------------------------

def _sweep(db_url: str, k: int = 16) -> None:
    """Bests of matmul fp16 for M = 16, 32, 64 (N = 16, K = ``k``) on the H200 under Triton
    3.6, two of them on an H100, one of an old kernel version, and a shape with another N."""
    for m, ms in ((16, 0.010), (32, 0.012), (64, 0.020)):
        store(db_url, {"M": m, "N": 16, "K": k}, ms, triton_version="3.6.0")
    for m, ms in ((16, 0.015), (32, 0.018)):
        store(db_url, {"M": m, "N": 16, "K": k}, ms, device=H100, triton_version="3.5.1")
    store(db_url, {"M": 32, "N": 16, "K": k}, 0.030, kernel_version=OLD, triton_version="3.6.0")
    store(db_url, {"M": 32, "N": 32, "K": k}, 0.5, triton_version="3.6.0")


def test_m_sweep_groups_shapes_that_differ_only_in_m(api_db_url, api_client):
    _sweep(api_db_url)
    with init_db(api_db_url)() as session:
        series = views.m_sweep(session, kernel="matmul", dtype="float16", shape=SHAPE)
        assert views.m_sweep(session, kernel="matmul", dtype="float16",
                             shape={"N": 16, "K": 16}) == []
    by = {(s.device, s.triton_version, s.kernel_version): (s.m, s.ms) for s in series}
    current = get_kernel("matmul").version
    assert by == {(GPU, "3.6.0", current): ([16, 32, 64], [0.010, 0.012, 0.020]),
                  (H100, "3.5.1", current): ([16, 32], [0.015, 0.018]),
                  (GPU, "3.6.0", OLD): ([32], [0.030])}


def test_the_compare_page_shows_one_shape_across_devices_and_versions(api_client, api_db_url):
    _sweep(api_db_url)
    page = api_client.get("/dashboard/compare", params={
        "kernel": "matmul", "dtype": "float16", "shape": "M=32,N=16,K=16"})
    assert page.status_code == 200
    bests = page.text[page.text.index('id="compare-bests"'):page.text.index('id="compare-jobs"')]
    assert bests.count("<tr data-device=") == 3 and "old</span>" in bests
    data = json.loads(re.search(r'id="compare-data">(.*?)</script>', page.text, re.S)[1])
    assert [b["ms"] for b in data["bests"]] == [0.012, 0.018, 0.030]  # fastest first
    assert data["m"] == 32 and len(data["sweep"]) == 3
    # the same page for the shape written in the kernel's dimension order
    again = api_client.get("/dashboard/compare", params={
        "kernel": "matmul", "dtype": "float16", "shape": "32x16x16"})
    assert json.loads(re.search(r'id="compare-data">(.*?)</script>', again.text, re.S)[1]) == data
    bad = api_client.get("/dashboard/compare", params={
        "kernel": "matmul", "dtype": "float16", "shape": "32x16"})
    assert bad.status_code == 400 and "has 3 dimensions" in bad.text
    index = api_client.get("/dashboard/compare")
    assert index.text.count("/dashboard/compare?kernel=matmul") == 4  # the stored shapes


def test_the_compare_page_lists_the_jobs_that_tuned_the_shape(api_client, api_db_url):
    shape = {"M": 16, "N": 16, "K": 16}
    job = api_client.post("/api/v1/jobs", json={
        "kernel": "matmul", "dtype": "float16", "shapes": [shape], "budget": {"trials": 2},
        "device": INTERPRETER, "future_device": True, "force": True}).json()
    assert run_worker_once(api_db_url).status == "succeeded"
    page = api_client.get("/dashboard/compare", params={
        "kernel": "matmul", "dtype": "float16", "shape": "M=16,N=16,K=16"})
    jobs = page.text[page.text.index('id="compare-jobs"'):]
    assert f'data-job-row="{job["id"]}"' in jobs and "succeeded" in jobs
    assert "2 / 2" in jobs


# -- in a browser -------------------------------------------------------------------------------

def _jobs(live_service: dict[str, Any]) -> list[dict[str, Any]]:
    return list(httpx.get(f"{live_service['base']}/api/v1/jobs").json()["data"])


def test_retune_a_stale_config_from_its_page(page, live_service):
    """A best of an older kernel source on the interpreter is listed; Re-tune asks first
    (dismissed: nothing is queued), then queues a job on its device with the trials typed in;
    once the worker has tuned it, the page no longer lists it."""
    shape = {"M": 16, "N": 16, "K": 16}
    store(live_service["db"], shape, 0.5, device=INTERPRETER, kind="interpret",
          kernel_version=OLD, triton_version=local_triton_version() or "")
    page.goto("/dashboard/stale")
    row = page.locator(f'tr[data-stale][data-device="{INTERPRETER}"]')
    assert row.count() == 1 and "kernel-version" in row.inner_text()
    assert OLD in row.inner_text() and INTERPRETER in row.inner_text()
    before = len(_jobs(live_service))
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    row.locator("button[data-retune]").click()
    page.locator("#retune-message").get_by_text("Not queued.").wait_for()
    assert len(_jobs(live_service)) == before and "with 48 trials" in asked[0]
    page.fill("#retune-trials", "2")
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    row.locator("button[data-retune]").click()
    link = row.locator("a[data-job]")
    link.wait_for()
    assert "with 2 trials" in asked[1] and INTERPRETER in asked[1]
    job_id = link.get_attribute("data-job")
    job = wait_done(live_service["base"], job_id)
    assert (job["kernel"], job["device"], job["budget_trials"]) == ("matmul", INTERPRETER, 2)
    assert job["kernel_version"] == get_kernel("matmul").version
    assert [t["shape"] for t in job["tasks"]] == [shape] and job["status"] == "succeeded"
    assert len(_jobs(live_service)) == before + 1
    page.reload()
    assert page.locator(f'tr[data-stale][data-device="{INTERPRETER}"]').count() == 0
    assert page.console_errors == []


def test_the_compare_page_draws_both_charts(page, live_service):
    # a K of its own: the service's other tests store K=16 shapes
    _sweep(live_service["db"], k=24)
    page.goto("/dashboard/compare?kernel=matmul&dtype=float16&shape=M%3D32,N%3D16,K%3D24")
    page.wait_for_selector("#compare-chart .main-svg")
    page.wait_for_selector("#sweep-chart .main-svg")
    bars = page.evaluate("document.getElementById('compare-chart').data[0].x")
    assert bars == [0.012, 0.018, 0.030]
    lines = page.evaluate("document.getElementById('sweep-chart').data"
                          ".map(t => [t.name, t.x, t.y])")
    assert sorted(lines, key=lambda t: t[0]) == sorted([
        [f"{GPU} · Triton 3.6.0", [16, 32, 64], [0.010, 0.012, 0.020]],
        [f"{GPU} · Triton 3.6.0 · kernel {OLD[:8]}", [32], [0.030]],
        [f"{H100} · Triton 3.5.1", [16, 32], [0.015, 0.018]]], key=lambda t: t[0])
    assert page.locator("#sweep-chart .scatterlayer .trace").count() == 3
    assert page.locator("#compare-chart .barlayer .point").count() == 3
    assert page.console_errors == []
