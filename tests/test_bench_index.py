"""bench/results/README.md is bench/index_results.py's output for the tree as committed: a
result added, moved or removed without regenerating the index fails here
(``python3 -m bench.index_results`` rewrites it)."""

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bench import index_results

ROOT = Path(__file__).resolve().parent.parent


def _git_history() -> bool:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return False
    run = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                         capture_output=True, text=True)
    return run.returncode == 0 and run.stdout.strip() == "false"


@pytest.mark.skipif(not _git_history(), reason="needs the repository's full git history")
def test_results_index_is_current():
    start = time.monotonic()
    expected = index_results.generate(ROOT)
    assert time.monotonic() - start < 5, "the index should take one git call, not one a file"
    current = (ROOT / index_results.INDEX).read_text()
    assert current == expected, (
        "bench/results/README.md is stale: run `python3 -m bench.index_results` and commit it")


def test_every_result_says_what_it_is():
    results = index_results.collect(ROOT)
    assert len(results) > 50
    for res in results:
        assert res.what, res.name
    assert index_results.topic_of("targets_14_softmax_final_h200", "bench/targets.py") == "Softmax"
    assert index_results.topic_of("search_quality_nongemm", "") == "Search and strategies"


def test_a_moved_file_keeps_the_commit_that_added_it(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    res = tmp_path / "bench" / "results"
    res.mkdir(parents=True)
    (res / "timing_x_rerun_h200.md").write_text("# A timing run\n\n"
                                                 "Command: `python3 -m bench.timing_spread`\n")
    git("add", ".")
    git("commit", "-qm", "first")
    first = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=tmp_path,
                           capture_output=True, text=True).stdout.strip()
    (res / "archive").mkdir()
    git("mv", "bench/results/timing_x_rerun_h200.md", "bench/results/archive/")
    git("commit", "-qm", "move")
    added = index_results.added_commits(tmp_path)
    assert added["bench/results/archive/timing_x_rerun_h200.md"][0].startswith(first[:7])
