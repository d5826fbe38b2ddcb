"""The fast tier's upkeep: scripts/slow_tests.py writes tests/slow_tests.txt from a JUnit report,
and tests/conftest.py fails a test that is not in the list and takes longer than the budget."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
CONFTEST = (ROOT / "tests" / "conftest.py").read_text()


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("slow_tests_script",
                                                  ROOT / "scripts" / "slow_tests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TESTS = """
import time

import pytest


def test_quick():
    pass


def test_slow_unlisted():
    time.sleep(0.3)


def test_listed_slow():
    time.sleep(0.3)


def test_slow_and_failing():
    time.sleep(0.3)
    assert 1 == 2


class TestGroup:
    @pytest.mark.parametrize("n", [1, 2])
    def test_slow_param(self, n):
        time.sleep(0.3 if n == 2 else 0)
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A copy of tests/conftest.py (its default budget 0.1 s) beside a slow list and tests that
    sleep."""
    monkeypatch.delenv("TUNER_TEST_BUDGET_S", raising=False)
    assert "DEFAULT_BUDGET_S = 30.0" in CONFTEST
    pytester.makeconftest(CONFTEST.replace("DEFAULT_BUDGET_S = 30.0", "DEFAULT_BUDGET_S = 0.1"))
    pytester.makefile(".txt", slow_tests="# slow\ntest_tiers.py::test_listed_slow\n")
    pytester.makepyfile(test_tiers=TESTS)
    pytester.makeini("[pytest]\nmarkers =\n    slow: measured slow\n")
    return pytester


def test_the_fast_tier_fails_an_unlisted_test_over_its_budget_naming_the_script(
        project: pytest.Pytester) -> None:
    result = project.runpytest("-m", "not slow")
    result.assert_outcomes(passed=2, failed=3, deselected=1)
    result.stdout.fnmatch_lines([
        "*test_tiers.py::test_slow_unlisted took * s, over the fast tier's "
        "budget of 0.1 s (TUNER_TEST_BUDGET_S), and is not in tests/slow_tests.txt*",
        "*scripts/slow_tests.py /tmp/junit.xml*"])
    failed = {line.split()[1] for line in result.stdout.lines if line.startswith("FAILED")}
    assert failed == {"test_tiers.py::test_slow_unlisted", "test_tiers.py::test_slow_and_failing",
                      "test_tiers.py::TestGroup::test_slow_param[2]"}
    # a test that fails on its own keeps its own failure
    result.stdout.fnmatch_lines(["*assert 1 == 2*"])


def test_the_budget_is_off_in_the_full_suite_and_set_by_the_environment(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest().assert_outcomes(passed=5, failed=1)
    monkeypatch.setenv("TUNER_TEST_BUDGET_S", "0")
    project.runpytest("-m", "not slow").assert_outcomes(passed=4, failed=1,
                                                                   deselected=1)
    monkeypatch.setenv("TUNER_TEST_BUDGET_S", "0.1")
    project.runpytest().assert_outcomes(passed=3, failed=3)


def test_the_script_lists_the_tests_of_a_report_over_the_threshold_by_node_id(
        project: pytest.Pytester, tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    project.runpytest(f"--junitxml={report}")
    out = tmp_path / "slow_tests.txt"
    assert _script().main([str(report), "--out", str(out), "--threshold", "0.25"]) == 0
    lines = out.read_text().splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        "# tests that took >= 0.25 s in a full run; scripts/test.sh --fast leaves them out. "
        "Regenerate: .venv/bin/python -m pytest -q --junitxml=/tmp/junit.xml, then",
        "# .venv/bin/python scripts/slow_tests.py /tmp/junit.xml"]
    # the ids are pytest's own: the conftest marks them slow
    assert [line for line in lines if not line.startswith("#")] == [
        "test_tiers.py::TestGroup::test_slow_param[2]", "test_tiers.py::test_listed_slow",
        "test_tiers.py::test_slow_and_failing", "test_tiers.py::test_slow_unlisted"]


def test_the_script_reads_several_reports_and_keeps_one_line_a_test(tmp_path: Path) -> None:
    def report(name: str, cases: str) -> Path:
        path = tmp_path / name
        path.write_text('<?xml version="1.0"?><testsuites><testsuite>'
                        f'{cases}</testsuite></testsuites>')
        return path

    a = report("a.xml", '<testcase classname="tests.test_a" name="test_x[sqlite]" time="1.0"/>'
                        '<testcase classname="tests.test_a" name="test_y" time="0.99"/>')
    b = report("b.xml", '<testcase classname="tests.gpu.test_b.TestC" name="test_z" time="3"/>'
                        '<testcase classname="tests.test_a" name="test_x[sqlite]" time="2.5"/>')
    assert _script().slow_tests([a, b]) == ["tests/gpu/test_b.py::TestC::test_z",
                                            "tests/test_a.py::test_x[sqlite]"]
