"""Helpers of the browser tests: Debian's Chromium driven by Playwright (``scripts/test.sh``
installs both; where either is missing the tests that need them are skipped and say so), a
page that records the errors it raises, and the jobs of a running service over HTTP."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

CHROMIUM = os.environ.get("TUNER_TEST_CHROMIUM", "/usr/bin/chromium")


def require_chromium(*, allow_module_level: bool = False) -> Any:
    """Playwright's sync API; skips (the test, or the whole module) where Playwright or
    Chromium is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)",
                    allow_module_level=allow_module_level)
    return sync_api


def chromium() -> Iterator[Any]:
    """A headless Chromium for a fixture to yield from (closed after)."""
    sync_api = require_chromium()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


def new_page(context: Any, *, console: bool = True) -> tuple[Any, list[str]]:
    """A page of ``context`` (60 s default timeout) and the list its uncaught errors are
    recorded in, with the console's error messages too where ``console``."""
    page = context.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []
    if console:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, errors


def wait_done(base: str, job_id: str, timeout: float = 300) -> dict[str, Any]:
    """The job once it is no longer queued or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{base}/api/v1/jobs/{job_id}").json()
        if job["status"] not in ("queued", "running"):
            return dict(job)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish")
