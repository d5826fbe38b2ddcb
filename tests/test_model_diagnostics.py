"""bench/model_diagnostics.py: the stop rule's chance traced over stored trials, and the prior's
fit to a replay table (CPU)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from bench.model_diagnostics import prior_fit, trace

SHAPE = {"M": 256, "N": 256, "K": 256}


def _config(m: int, n: int, warps: int) -> dict[str, int]:
    return {"VARIANT": 0, "SPLIT_K": 1, "ALIGN": 0, "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64,
            "GROUP_M": 8, "num_warps": warps, "num_stages": 3}


TRIALS = [(_config(64, 64, 4), 0.020), (_config(128, 128, 8), 0.012),
          (_config(64, 128, 4), None), (_config(128, 64, 4), 0.015)]


def test_the_trace_prints_the_chance_after_every_stored_trial(tmp_path: Path):
    db = tmp_path / "trials.db"
    con = sqlite3.connect(db)
    con.execute("create table trials (task_id int, number int, config text, p50_ms real)")
    con.executemany("insert into trials values (7, ?, ?, ?)",
                    [(i + 1, json.dumps(c), ms) for i, (c, ms) in enumerate(TRIALS)])
    con.execute("insert into trials values (8, 1, ?, 0.001)", (json.dumps(TRIALS[0][0]),))
    con.commit()
    lines: list[str] = []
    trace(str(db), 7, SHAPE, "float16", log=lines.append)
    assert "feasible configs" in lines[0] and len(lines) == 1 + len(TRIALS)  # task 7 alone
    rows = [line.split() for line in lines[1:]]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4]
    assert [float(r[1]) for r in rows] == [0.02, 0.012, 0.012, 0.012]  # the best so far
    assert all(0.0 <= float(r[2]) <= 1.0 and float(r[3]) > 0 for r in rows)


def test_the_prior_fit_has_a_row_per_table_and_align_value(tmp_path: Path):
    results = [{"config": c, "ms": ms} for c, ms in TRIALS if ms] + [
        {"config": {**_config(64, 64, 4), "num_stages": 4}, "ms": 0.018},
        {"config": _config(256, 256, 2), "error": "OutOfResources: smem"}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"shape": SHAPE, "dtype": "float16", "results": results}))
    lines: list[str] = []
    prior_fit([str(path)], log=lines.append)
    assert lines[0].startswith("| table | ALIGN | configs | Spearman")
    assert len(lines) == 3 and lines[2].startswith("| t.json | 0 | 4 | ")
