"""Write tests/slow_tests.txt from a JUnit XML report: the tests that took at least THRESHOLD
seconds, which ``scripts/test.sh --fast`` leaves out (tests/conftest.py marks them ``slow``).

    .venv/bin/python -m pytest -q --junitxml=/tmp/junit.xml      # the full suite
    .venv/bin/python scripts/slow_tests.py /tmp/junit.xml [--threshold 1.0]
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "slow_tests.txt"


def node_id(classname: str, name: str) -> str:
    """``tests.test_api`` + ``test_x[sqlite]`` -> ``tests/test_api.py::test_x[sqlite]``
    (a test class: ``tests.test_api.TestX`` -> ``tests/test_api.py::TestX::test_x``)."""
    parts = classname.split(".")
    module = [p for p in parts if not p[:1].isupper()]
    classes = [p for p in parts if p[:1].isupper()]
    return "::".join(["/".join(module) + ".py", *classes, name])


def slow_tests(report: Path, threshold: float) -> list[str]:
    return sorted(node_id(tc.get("classname", ""), tc.get("name", ""))
                  for tc in ET.parse(report).iter("testcase")
                  if float(tc.get("time") or 0.0) >= threshold)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--threshold", type=float, default=1.0)
    args = ap.parse_args()
    ids = slow_tests(args.report, args.threshold)
    OUT.write_text(f"# tests that took >= {args.threshold:g} s in a full run "
                   "(scripts/slow_tests.py); scripts/test.sh --fast leaves them out\n"
                   + "".join(f"{i}\n" for i in ids))
    print(f"{len(ids)} slow tests written to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
