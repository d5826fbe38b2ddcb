"""Every operation of the app's OpenAPI schema fuzzed by schemathesis over real HTTP (the app
served by uvicorn on a SQLite file holding kernels, jobs, trials and configs): no response is a
server error, and each documented response matches its schema. Valid (positive) and invalid
(negative) requests, ``MAX_EXAMPLES`` of each per operation, derandomized so a run is
reproducible; the number of cases run is printed and asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

from tests.api_support import GPU, JOB, run_worker_once, store
from tuner.settings import Settings

#: examples per operation and generation mode (about a minute for the whole schema on 2 cores)
MAX_EXAMPLES = 40
CHECKS = [not_a_server_error, response_schema_conformance]


def seeded(db_url: str, base: str) -> dict[str, Any]:
    """Jobs (one run by an interpreter worker, with trials), stored configs; the ids a path
    can name."""
    with httpx.Client(base_url=base) as client:
        ran = client.post("/api/v1/jobs", json=JOB).json()
        run_worker_once(db_url)
        client.post("/api/v1/jobs", json={**JOB, "kernel": "softmax",
                                          "shapes": [{"M": 4, "N": 64}]})
        task_id = client.get(ran["url"]).json()["tasks"][0]["id"]
    store(db_url, {"M": 64, "N": 64, "K": 64}, 0.01, GPU)
    return {"job_id": ran["id"], "task_id": task_id}


def run_operation(operation: Any, base: str, mode: GenerationMode,
                  path_parameters: dict[str, Any] | None) -> int:
    """Cases run against one operation in one mode."""
    count = 0

    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        nonlocal count
        count += 1
        case.call_and_validate(base_url=base, checks=CHECKS, timeout=30)

    check()
    return count


def report(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal, past pytest's output capture (shown with -q too)."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin("capturemanager")
    if reporter is None or capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(f"\n{line}")


def test_no_operation_answers_a_server_error_or_breaks_its_schema(
        api_db_url: str, tmp_path: Path, request: pytest.FixtureRequest,
        record_property: Any) -> None:
    from tests.api_support import running_app

    total, failures = 0, []
    with running_app(Settings(database_url=api_db_url, data_dir=tmp_path)) as base:
        ids = seeded(api_db_url, base)
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation in operations:
            names = {p.name for p in operation.path_parameters}
            pinned = {k: v for k, v in ids.items() if k in names} or None
            runs = [(mode, None) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
            if pinned:  # also on the rows that exist, not only on 404s
                runs.append((GenerationMode.POSITIVE, pinned))
            for mode, path_parameters in runs:
                try:
                    total += run_operation(operation, base, mode, path_parameters)
                except Unsatisfiable:
                    # no request can be invalid (no parameters, or only free-form strings)
                    assert mode == GenerationMode.NEGATIVE, operation.label
                except Exception as exc:  # noqa: BLE001 - collect every operation's failure
                    failures.append(f"{operation.label} ({mode.value}): {exc}")
    line = (f"schemathesis: {total} cases over {len(operations)} operations, "
            f"{len(failures)} failing")
    report(request, line)
    record_property("schemathesis_cases", total)
    assert not failures, "\n\n".join(failures)
    assert len(operations) >= 9 and total >= len(operations) * MAX_EXAMPLES, line

