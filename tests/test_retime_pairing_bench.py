"""bench/retime_pairing_probe.py's CPU half: the finalists it re-times, read from a service's
store (the committed H200 store of ``tuning_time_33k``), and the regret of its picks. Its
timing needs a GPU (``bench/results/retime_pairing_h200/``)."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from bench.retime_pairing_probe import finalists, regret

STORE = (Path(__file__).resolve().parents[1] / "bench" / "results" / "tuning_time_33k"
         / "run_store_5a8cc2a_service.db.gz")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("store") / "service.db"
    with gzip.open(STORE, "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return str(path)


def test_each_task_s_re_timed_configs_fastest_first(store: str):
    found = finalists(store)
    assert len(found) == 14
    con = sqlite3.connect(store)
    try:
        for kernel, shape, dtype, configs in found:
            rows = con.execute(
                "select t.config, t.retimed_p50_ms from trials t join tasks k on k.id = "
                "t.task_id join jobs j on j.id = k.job_id where j.kernel = ? and k.shape = ? "
                "and j.dtype = ? and t.retimed_p50_ms is not null",
                (kernel, json.dumps(shape), dtype)).fetchall()
            assert 2 <= len(configs) == len(rows)
            by_config = {json.dumps(json.loads(c), sort_keys=True): ms for c, ms in rows}
            times = [by_config[json.dumps(c, sort_keys=True)] for c in configs]
            assert times == sorted(times)
    finally:
        con.close()
    names = {k for k, *_ in found}
    assert {"matmul", "softmax", "flash_attention", "conv2d_nhwc"} <= names


def test_a_store_without_two_re_timed_configs_a_task_gives_nothing(store: str, tmp_path):
    copy = tmp_path / "one.db"
    shutil.copy(store, copy)
    con = sqlite3.connect(copy)
    con.execute("update trials set retimed_p50_ms = null where id not in (select min(id) "
                "from trials where retimed_p50_ms is not null group by task_id)")
    con.commit()
    con.close()
    assert finalists(str(copy)) == []


def test_regret_is_the_picked_time_over_the_fastest():
    pooled = [1.02, 1.0, 1.05]
    assert regret([1, 1], pooled) == (1.0, 1.0)
    mean, worst = regret([1, 0, 2], pooled)
    assert worst == pytest.approx(1.05) and mean == pytest.approx((1.0 + 1.02 + 1.05) / 3)
