"""bench/tuning_time.py's issue-33 report: the worker's ready line is read back, and the table
puts each phase in its column and says which targets were met."""

from __future__ import annotations

import datetime

from bench.tuning_time import markdown_service, ready_after, ready_line

LINE = ("2026-11-26 20:14:41,358 INFO tuner.app.service: worker w serving device cuda:X (cuda; "
        "dispatch: embedded): ready_s=4.20 store_s=1.65 child_s=3.10 calibration_s=0.02 "
        "calibration=reused\n")


def test_the_ready_line_is_read_back():
    assert ready_line("noise\n" + LINE) == {"ready_s": 4.2, "calibrated": "reused",
                                            "store": 1.65, "child": 3.1, "calibration": 0.02}
    assert ready_line("no such line") == {}


def _row(problem: str, wall: float, ref: float | None) -> dict:
    phases = {"queued": 0.1, "setup": 0.01, "compile_wait": 0.5, "compile_child": 0.2,
              "measuring": 2.0, "retiming": 1.2, "storing": 0.1, "search": 0.3, "total": 4.4,
              "compiled_ahead": 30, "reused_compiles": 2, "compile_ahead_cpu": 12.5}
    return {"problem": problem, "wall_s": wall, "trials": 16, "stop": "no expected gain",
            "best_ms": 0.1, "phases": phases, "vs_reference": ref, "reference_trials": 96}


def test_the_report_has_each_phase_in_its_column_and_the_targets():
    report = {"device": "cuda:X", "start": {"wall_s": 4.5, "ready_s": 4.2, "child": 3.1,
                                            "calibrated": "reused"},
              "rows": [_row("matmul M=1 bfloat16", 4.6, 1.004),
                       _row("softmax M=2 float16", 12.0, 1.05)],
              "sweep": {"wall_s": 61.0, "trials": 100, "status": "succeeded", "tasks": []}}
    text = markdown_service(report, "python3 -m bench.tuning_time --service")
    header = next(line for line in text.splitlines() if line.startswith("| problem"))
    row = next(line for line in text.splitlines() if line.startswith("| matmul"))
    cells = dict(zip([c.strip() for c in header.split("|")],
                     [c.strip() for c in row.split("|")], strict=True))
    assert cells["measuring"] == "2.00" and cells["re-timing"] == "1.20"
    assert cells["other (HTTP, polling)"] == "0.10"  # 4.6 - 0.1 queued - 4.4 total
    assert cells["compiled ahead"] == "30" and cells["reused"] == "2"
    assert cells["vs reference"] == "1.004 (96)"
    assert "**4.5 s** from the command to an idle worker (met" in text
    assert "child 3.10 s; the calibration reused" in text
    assert "median **8.3 s** (missed" in text and "max **12.0 s** (missed" in text
    assert "1 of 2 within 1%" in text
    assert "**61.0 s** (missed the 60 s target)" in text


def test_the_worker_s_ready_time_is_counted_from_the_command_by_the_log_s_clock():
    command = datetime.datetime(2026, 11, 26, 20, 14, 37, 158000).timestamp()
    log = ("API on http://127.0.0.1:1 (docs at /docs), 1 process(es); 1 cuda worker(s), "
           "started 0.37 s after this command; database x\n" + LINE)
    got = ready_after(log, command)
    assert abs(got["worker_ready_after_command"] - 4.2) < 1e-6  # 20:14:41.358 - 37.158
    assert got["workers_started_after_command"] == 0.37
    assert "pool_warm_after_command" not in got
    assert ready_after("no such lines", command) == {}
    report = {"start": {"wall_s": 6.5, "ready_s": 3.8, "worker_ready_after_command": 4.2,
                        "workers_started_after_command": 0.37, "calibrated": "reused"},
              "rows": []}
    text = markdown_service(report, "cmd")
    assert ("the worker ready to measure **4.2 s** after the command (its log line's time) "
            "(met the 5 s target)") in text
    assert "/healthz showed it idle after 6.5 s" in text


def test_the_compile_pool_s_warm_line_counts_in_the_start_target():
    command = datetime.datetime(2026, 11, 26, 20, 14, 37, 158000).timestamp()
    log = (LINE + "\n2026-11-26 20:14:43,158 INFO tuner.backends.compile_pool: compile pool "
           "warm: 15 of 15 processes ready 2.40 s after it started\n")
    got = ready_after(log, command)
    assert abs(got["pool_warm_after_command"] - 6.0) < 1e-6
    report = {"start": {"wall_s": 6.5, "ready_s": 3.8, **got, "calibrated": "reused"},
              "rows": []}
    text = markdown_service(report, "cmd")
    assert "its compile pool warm **6.0 s** after it" in text and "(missed the 5 s" in text
    assert "pool warm after command" not in text  # shown once, not again among the steps


def test_a_saved_store_keeps_what_only_its_write_ahead_log_holds(tmp_path):
    """``--save`` copies a service's SQLite store; rows a running (or killed) service has not
    checkpointed live only in its ``-wal`` file: the copy must hold them (the references
    time the fast jobs' stored bests from it)."""
    import shutil

    from bench.tuning_time import copy_sqlite
    from tests.support_sqlite import row_count, writer_with_rows_only_in_its_log

    src = tmp_path / "service.db"
    writer = writer_with_rows_only_in_its_log(src, 5)  # open: nothing checkpointed
    assert (tmp_path / "service.db-wal").stat().st_size > 0

    shutil.copy(src, tmp_path / "plain.db")  # the main file alone
    assert row_count(tmp_path / "plain.db", "jobs") is None

    copy_sqlite(src, tmp_path / "saved.db")
    assert row_count(tmp_path / "saved.db", "jobs") == 5
    writer.close()
