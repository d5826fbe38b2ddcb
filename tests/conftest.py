"""Shared fixtures: a real database per test, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

POSTGRES_URL = os.environ.get("TUNER_TEST_POSTGRES_URL")
# no test (nor a process it starts) remembers its lookups in the user's cache folder: the tests
# of the keys file name one
os.environ.setdefault("TUNER_KEYS_FILE", "")
#: tests measured slow in a full run (scripts/slow_tests.py): marked ``slow``, left out by the
#: fast tier (``scripts/test.sh --fast``)
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def _slow_ids() -> set[str]:
    if not SLOW_TESTS.exists():
        return set()
    return {line.strip() for line in SLOW_TESTS.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = _slow_ids()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


#: the fast tier's time budget: a test not in tests/slow_tests.txt whose call takes longer (wall
#: time; not its setup, which starts the module's shared fixtures for whichever test comes first)
#: fails, saying to regenerate the list. TUNER_TEST_BUDGET_S sets it in seconds (0: off); unset,
#: it is 30 s in a run that leaves the slow tests out (``-m`` naming ``not slow``: scripts/test.sh
#: --fast) and off otherwise, so that the full suite (CI) never fails on a loaded machine's slow
#: spell. The fast tier's slowest test took 18 s on a loaded 2-core machine, most of it its
#: module's service and browser starting; the next two 8 s and 5 s.
BUDGET_ENV = "TUNER_TEST_BUDGET_S"
DEFAULT_BUDGET_S = 30.0
_budget_s = pytest.StashKey[float]()


def pytest_configure(config: pytest.Config) -> None:
    value = os.environ.get(BUDGET_ENV, "").strip()
    if value:
        config.stash[_budget_s] = float(value)
    else:
        fast_tier = "not slow" in (config.option.markexpr or "")
        config.stash[_budget_s] = DEFAULT_BUDGET_S if fast_tier else 0.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    budget = item.config.stash.get(_budget_s, 0.0)
    if report.when != "call" or not report.passed or budget <= 0 \
            or item.get_closest_marker("slow") is not None:
        return report
    if report.duration > budget:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {report.duration:.1f} s, over the fast tier's budget of "
            f"{budget:g} s ({BUDGET_ENV}), and is not in tests/slow_tests.txt: regenerate the "
            "list from a full run (.venv/bin/python -m pytest -q --junitxml=/tmp/junit.xml, then "
            ".venv/bin/python scripts/slow_tests.py /tmp/junit.xml), or make the test faster")
    return report


@pytest.fixture(autouse=True)
def _close_tuner_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``TunerClient`` a test makes is closed when it ends (but the one ``tuner.autotune``
    still shares): a client's open connection, left to the garbage collector, is a
    ResourceWarning in whichever later test the collection falls, and warnings are errors."""
    from tuner import autotuning
    from tuner.client import TunerClient

    made: list[TunerClient] = []  # held, so that none is collected before it is closed
    init = TunerClient.__init__

    def recorded(self: TunerClient, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(TunerClient, "__init__", recorded)
    yield
    for client in made:
        if client is not autotuning._client:
            client.close()


def _postgres_database() -> Iterator[str]:
    assert POSTGRES_URL is not None
    admin_url = POSTGRES_URL.rsplit("/", 1)[0] + "/postgres"
    name = f"tuner_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url.replace("postgresql://", "postgresql+psycopg://"),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from db.engine import dispose

        dispose(POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("TUNER_TEST_POSTGRES_URL is not set (scripts/test.sh sets it when a "
                    "PostgreSQL server answers)")
    yield from _postgres_database()


# -- the HTTP service (tests/test_api*.py, test_client.py) --------------------------------------

@pytest.fixture
def api_db_url(tmp_path: Path) -> str:
    """A fresh SQLite file for one app."""
    return f"sqlite:///{tmp_path / 'api.db'}"


@pytest.fixture
def api_client(api_db_url: str) -> Iterator[Any]:
    """Real HTTP requests through the app (lifespan run, database migrated)."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.settings import Settings

    with TestClient(create_app(Settings(database_url=api_db_url))) as client:
        yield client


# -- a browser against ``tuner serve`` (test_dashboard_browser.py, test_stale_compare.py,
# test_docs_offline.py) ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module's tests; they are skipped, saying so, where
    Chromium or Playwright is missing."""
    from tests.support_browser import chromium

    yield from chromium()


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``tuner serve`` as a user starts it (a subprocess, real HTTP, a worker on the Triton CPU
    interpreter) for the module's tests: its ``base`` URL and its database's URL (``db``)."""
    from tests.support_processes import serving

    with serving(tmp_path_factory.mktemp("serve")) as served:
        yield {"base": served.base, "db": served.db}


@pytest.fixture
def page(browser: Any, live_service: dict[str, str]) -> Iterator[Any]:
    """A page on ``live_service`` (1400x900, clipboard allowed); ``page.console_errors`` lists
    the console's errors and uncaught exceptions."""
    from tests.support_browser import new_page

    base = live_service["base"]
    context = browser.new_context(base_url=base, viewport={"width": 1400, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    page, errors = new_page(context)
    page.console_errors = errors
    yield page
    context.close()
