"""Write tests/slow_tests.txt from JUnit XML reports: the tests that took at least THRESHOLD
seconds (1 s; setup, call and teardown, as the report counts them), which tests/conftest.py marks
``slow`` and ``scripts/test.sh --fast`` leaves out. A fast-tier test that takes longer than the
fast tier's budget (tests/conftest.py, TUNER_TEST_BUDGET_S) fails, saying to run this.

    .venv/bin/python -m pytest -q --junitxml=/tmp/junit.xml      # the full suite
    .venv/bin/python scripts/slow_tests.py /tmp/junit.xml [--threshold 1.0]

Several reports (a suite run in parts) are read together; a test in none of them is left out of
the list, so give it the whole suite's.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "slow_tests.txt"
THRESHOLD_S = 1.0


def node_id(classname: str, name: str) -> str:
    """``tests.test_api`` + ``test_x[sqlite]`` -> ``tests/test_api.py::test_x[sqlite]``
    (a test class: ``tests.test_api.TestX`` -> ``tests/test_api.py::TestX::test_x``)."""
    parts = classname.split(".")
    module = [p for p in parts if not p[:1].isupper()]
    classes = [p for p in parts if p[:1].isupper()]
    return "::".join(["/".join(module) + ".py", *classes, name])


def slow_tests(reports: list[Path], threshold: float = THRESHOLD_S) -> list[str]:
    """The node ids of the reports' tests that took ``threshold`` seconds or more, sorted."""
    return sorted({node_id(tc.get("classname", ""), tc.get("name", ""))
                   for report in reports for tc in ET.parse(report).iter("testcase")
                   if float(tc.get("time") or 0.0) >= threshold})


def header(threshold: float) -> str:
    return (f"# tests that took >= {threshold:g} s in a full run; scripts/test.sh --fast leaves "
            "them out. Regenerate: .venv/bin/python -m pytest -q --junitxml=/tmp/junit.xml, then\n"
            "# .venv/bin/python scripts/slow_tests.py /tmp/junit.xml\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("reports", type=Path, nargs="+", help="JUnit XML reports (pytest --junitxml)")
    ap.add_argument("--threshold", type=float, default=THRESHOLD_S, help="seconds (default 1)")
    ap.add_argument("--out", type=Path, default=OUT, help="default tests/slow_tests.txt")
    args = ap.parse_args(argv)
    ids = slow_tests(args.reports, args.threshold)
    args.out.write_text(header(args.threshold) + "".join(f"{i}\n" for i in ids))
    print(f"{len(ids)} slow tests written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
