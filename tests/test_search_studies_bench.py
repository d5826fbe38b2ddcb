"""The search studies of ``bench/`` whose tables are committed: the model strategy's variants
(``search_variants_study``), the roofline stop (``roofline_stop_study``) and the search under
measurement noise (``noisy_replay_study``), each on one recorded table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.strategies.model_based import ModelStrategy

REPLAY = Path(__file__).resolve().parent / "data" / "replay"


def test_a_variant_setting_sets_the_strategy_and_none_turns_the_spread_off(monkeypatch):
    from bench import search_variants_study as study

    # recorded so that the settings below are undone after the test
    monkeypatch.setattr(ModelStrategy, "program_spread", ModelStrategy.program_spread)
    monkeypatch.setattr(ModelStrategy, "program_free", ModelStrategy.program_free)
    study.patch("program:0.2:1")
    assert (ModelStrategy.program_spread, ModelStrategy.program_free) == (0.2, 1)
    study.patch("none")
    assert ModelStrategy.program_spread == 0.0
    with pytest.raises(SystemExit, match="unknown setting"):
        study.patch("tiles:3")


def test_the_fixed_budget_run_reports_the_best_after_each_count():
    from bench import search_variants_study as study

    ratios = study.fixed_run(str(REPLAY / "matmul_2048x2048x2048_bfloat16_h200.json"), 0)
    assert len(ratios) == len(study.FIXED_AT)
    assert all(r >= 1.0 for r in ratios) and ratios == sorted(ratios, reverse=True)


def test_the_roofline_stop_study_stops_near_the_floor_only_when_asked():
    """4096x2048x8192 fp16's optimum beats the study's compute floor (cuBLAS's peak): with the
    stop at 0.95 a run may end "near roofline" once the model stop's minimum of trials is
    measured; with it off (0) never."""
    from bench import roofline_stop_study as study

    path = str(REPLAY / "holdout" / "matmul_4096x2048x8192_float16_h200.json")
    off = study.run(path, 0, 0.0)
    on = study.run(path, 0, 0.95)
    assert off[2] != "near roofline" and off[1] >= 1.0
    assert on[3] is not None and on[3] > 1.0  # floor / optimum: the optimum beats the floor
    assert on[2] == "near roofline" and on[0] >= 16
    # the worker's rule: a compute floor never stops a search
    assert study.run(path, 0, 0.95, memory_only=True)[2] != "near roofline"


def test_the_noisy_replay_draws_noise_a_re_timing_averages_and_the_run_judges_by_the_table():
    from bench import noisy_replay_study as study
    from tuner.backends.replay import load_table

    table = load_table(REPLAY / "matmul_2048x2048x2048_bfloat16_h200.json")
    config = next(c for c, v in table.results.items() if isinstance(v, float))
    noisy = study.noisy_backend(table, 0.05, 0)
    trials = [noisy.measure([config])[0].p50_ms / table.results[config] for _ in range(200)]
    retimed = [noisy.retime([config], 9)[0].p50_ms / table.results[config] for _ in range(200)]
    spread = max(trials) / min(trials)
    assert spread > 1.2  # 5% noise: +-3 sigma
    assert max(retimed) / min(retimed) < spread  # the median of 9 draws varies less
    quiet = study.noisy_backend(table, 0.0, 0)
    assert quiet.measure([config])[0].p50_ms == table.results[config]
    used, kept, measured = study.run(str(REPLAY / "matmul_2048x2048x2048_bfloat16_h200.json"),
                                     0, study.Setting(0.0))
    assert 1.0 <= measured <= kept and used <= 48


def test_finalist_noise_reads_each_re_timed_trial_of_a_real_store(tmp_path):
    """``bench/finalist_noise.py`` on a store made by the repository: trials with a re-timed
    time are read (log trial / re-timed), the others not."""
    from bench import finalist_noise
    from db import repo
    from db.engine import init_db
    from search_spaces import get_kernel
    from tuner.config import KernelConfig

    path = tmp_path / "store.db"
    factory = init_db(f"sqlite:///{path}")
    shape = {"M": 64, "N": 64, "K": 64}
    with factory() as s:
        job = repo.create_job(s, kernel="matmul", kernel_version=get_kernel("matmul").version,
                              dtype="float16", shapes=[shape], budget_trials=3,
                              budget_seconds=None, strategy="auto", force=True, seed=0,
                              backend="replay", device_key=None)
        task_id = job.tasks[0].id
        repo.start_task_locally(s, task_id, worker_id="cli")
        configs = [KernelConfig({"BLOCK_M": 16 * (i + 1)}) for i in range(3)]
        for i, (config, ms) in enumerate(zip(configs, (0.10, 0.11, 0.12), strict=True)):
            repo.record_trial(s, task_id, i + 1, {"config": dict(config), "outcome": "ok",
                                                  "p20_ms": ms, "p50_ms": ms, "p80_ms": ms},
                              worker_id="cli")
        repo.record_retimed(s, task_id, [{"config": dict(configs[0]), "outcome": "ok",
                                          "p50_ms": 0.098},
                                         {"config": dict(configs[1]), "outcome": "ok",
                                          "p50_ms": 0.11}])
        s.commit()
    found = finalist_noise.rows(str(path))
    assert [(p, t, r) for p, _, t, r in found] == [("matmul M=64,N=64,K=64", 0.10, 0.098),
                                                    ("matmul M=64,N=64,K=64", 0.11, 0.11)]
    out = tmp_path / "noise.md"
    assert finalist_noise.main([str(path), "--out", str(out)]) == 0
    assert "| all | 2 | +1.01 |" in out.read_text()
