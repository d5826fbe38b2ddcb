"""The dashboard in a real browser: Debian's Chromium driven by Playwright against ``tuner serve``
running as a user starts it (a subprocess, real HTTP, a worker on the Triton CPU interpreter).

Needs ``/usr/bin/chromium`` and the ``playwright`` package (``scripts/test.sh`` installs both);
where either is missing these tests are skipped and say so."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import triton

from tests.api_support import GPU, store
from tests.test_service import _free_port, _wait_ready

CHROMIUM = os.environ.get("TUNER_TEST_CHROMIUM", "/usr/bin/chromium")
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
if not shutil.which(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"M": 32, "N": 16, "K": 16}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("dashboard")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT),
           "TUNER_DATA_DIR": str(data), "TUNER_DATABASE_URL": ""}
    log = open(data / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", "serve", "--port", str(port),
                             "--backend", "interpret"], cwd=data, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(base, proc)
        yield {"base": base, "db": f"sqlite:///{data / 'tuner.db'}"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, service: dict[str, Any]) -> Iterator[Any]:
    context = browser.new_context(base_url=service["base"], viewport={"width": 1400,
                                                                      "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=service["base"])
    page = context.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.console_errors = errors
    yield page
    context.close()


def _submit(service: dict[str, Any], trials: int, shape: dict[str, int] = SHAPE) -> str:
    r = httpx.post(f"{service['base']}/api/v1/jobs", json={
        "kernel": "matmul", "dtype": "float16", "shapes": [shape], "budget": {"trials": trials},
        "force": True})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _wait_done(service: dict[str, Any], job_id: str) -> None:
    import time

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if httpx.get(f"{service['base']}/api/v1/jobs/{job_id}").json()["status"] not in (
                "queued", "running"):
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish")


def test_overview_loads(page):
    page.goto("/")
    assert page.locator("h1").inner_text() == "Overview"
    assert page.locator(".status-card").count() == 5
    assert page.locator("table.kernels").inner_text().count("matmul") >= 1
    assert page.console_errors == []


def test_a_submitted_job_shows_its_progress_changing_without_a_reload(page, service):
    job_id = _submit(service, trials=6)
    page.goto("/jobs")
    row = page.locator(f'tr[data-job="{job_id}"]')
    first = row.locator('[data-field="trials"]').inner_text()
    page.evaluate("window.__sameDocument = true")
    # the counter moves as the worker measures, then the job finishes: one document throughout
    page.wait_for_function(
        "([id, first]) => document.querySelector(`tr[data-job='${id}'] [data-field=trials]`)"
        ".textContent !== first", arg=[job_id, first])
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job='${id}'] [data-field=status]`)"
        ".textContent === 'succeeded'", arg=job_id, timeout=240_000)
    assert row.locator('[data-field="trials"]').inner_text() == "6 / 6"
    assert page.evaluate("window.__sameDocument") is True
    assert row.locator("[data-cancel]").count() == 0  # nothing left to cancel
    assert page.console_errors == []


def test_the_job_page_draws_its_charts(page, service):
    job_id = _submit(service, trials=4, shape={"M": 16, "N": 32, "K": 16})
    _wait_done(service, job_id)
    page.goto(f"/jobs/{job_id}")
    for chart in ("best", "trials", "importance", "parcoords"):
        page.locator(f'[data-chart="{chart}"] svg.main-svg').first.wait_for()
    # the best-so-far line and the trial markers are drawn as SVG paths
    assert page.locator('[data-chart="best"] .scatterlayer path.js-line').count() >= 1
    assert page.locator('[data-chart="trials"] .scatterlayer path.point').count() == 4
    assert page.locator('[data-chart="parcoords"] .scatterlayer path.js-line').count() >= 1
    assert page.locator("table.top tbody tr").count() == 4
    assert page.console_errors == []


def test_a_running_jobs_page_redraws_its_charts_as_trials_arrive(page, service):
    job_id = _submit(service, trials=40, shape={"M": 64, "N": 16, "K": 16})
    page.goto(f"/jobs/{job_id}")
    page.evaluate("window.__sameDocument = true")
    points = "document.querySelectorAll('[data-chart=trials] .scatterlayer path.point').length"
    first = page.evaluate(points)
    page.wait_for_function(f"window.__sameDocument && {points} >= {first} + 2")
    assert page.evaluate("window.__sameDocument") is True
    httpx.post(f"{service['base']}/api/v1/jobs/{job_id}/cancel")
    assert page.console_errors == []


def test_cancel_from_the_jobs_page(page, service):
    job_id = _submit(service, trials=200, shape={"M": 48, "N": 16, "K": 16})
    page.goto("/jobs")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f'button[data-cancel="{job_id}"]').click()
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job='${id}'] [data-field=status]`)"
        ".textContent === 'cancelled'", arg=job_id)
    assert httpx.get(f"{service['base']}/api/v1/jobs/{job_id}").json()["status"] == "cancelled"
    assert page.console_errors == []


def _seed_configs(service: dict[str, Any]) -> None:
    store(service["db"], {"M": 4096, "N": 4096, "K": 4096}, 0.217)
    store(service["db"], {"M": 16, "N": 4096, "K": 4096}, 0.0164,
          config={"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1, "num_warps": 4,
                  "num_stages": 5})
    store(service["db"], {"M": 2048, "N": 2048, "K": 2048}, 0.0279, dtype="bfloat16")


def test_the_configs_filter_narrows_the_table(page, service):
    _seed_configs(service)
    page.goto(f"/configs?device={GPU}")
    rows = page.locator("#configs-table tbody tr[data-kernel]:visible")
    assert rows.count() == 3
    page.select_option("select[name=dtype]", "bfloat16")
    assert rows.count() == 1 and "2048x2048x2048" in rows.first.inner_text()
    page.select_option("select[name=dtype]", "")
    page.fill("input[name=shape]", "16x4096")
    assert rows.count() == 1 and "16x4096x4096" in rows.first.inner_text()
    assert "shape=16x4096" in page.url  # the filtered view has a shareable address
    assert page.console_errors == []


def test_a_copy_button_yields_a_valid_triton_config(page, service):
    _seed_configs(service)
    page.goto(f"/configs?device={GPU}&shape=16x4096x4096")
    page.locator("#configs-table tbody tr[data-kernel]").first.locator(
        'button[data-copy="triton"]').click()
    page.locator("#copied[data-text]").wait_for()
    text = page.evaluate("navigator.clipboard.readText()")
    assert text == page.locator("#copied").get_attribute("data-text")
    config = eval(text, {"triton": triton})  # noqa: S307 - what a user pastes into autotune
    assert isinstance(config, triton.Config)
    assert config.kwargs == {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1}
    assert (config.num_warps, config.num_stages) == (4, 5)
    assert page.console_errors == []
