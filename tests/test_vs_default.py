"""Never worse than the default (issue 29): a stored best replaces the kernel's default only
when it beats it by more than the measured noise, both re-timed side by side in one process;
else the default is stored and served, labelled so, with the margin shown by the API and the
job page. Replayed from small tables written here (``replay-v1`` with recorded p20/p80:
``tests/test_search_replay.py`` tests that the replay backend returns them)."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import inspect

from db import repo
from db.engine import alembic_config, init_db, make_engine
from search_spaces import get_kernel
from tuner.app.worker import StoredBest, decide_best, execute_task
from tuner.backends.replay import ReplayBackend, load_table
from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome
from tuner.search import SearchOptions, run_search

KERNEL = get_kernel("vector_add")
SHAPE = {"N": 1 << 24}
DTYPE = "float32"
DEVICE = "replay:NVIDIA H200"
#: the kernel's default on this problem, and the configs the search finds around it
DEFAULT = KERNEL.default_config(SHAPE, DTYPE)
BEST = KernelConfig(BLOCK=8192, PROGRAMS_PER_SM=0, num_stages=1, num_warps=8)
OTHERS = [KernelConfig(BLOCK=2048, PROGRAMS_PER_SM=0, num_stages=1, num_warps=4),
          KernelConfig(BLOCK=1024, PROGRAMS_PER_SM=0, num_stages=1, num_warps=4),
          KernelConfig(BLOCK=4096, PROGRAMS_PER_SM=4, num_stages=2, num_warps=8)]
DEFAULT_MS = 1.0
NOISE = 0.02  # every config's recorded p20-p80 spread: 2% of its p50


def _entry(config: KernelConfig, ms: float, noise: float = NOISE) -> dict[str, Any]:
    return {"config": config.to_dict(), "ms": ms, "p20_ms": ms * (1 - noise / 2),
            "p80_ms": ms * (1 + noise / 2)}


def _table(tmp_path: Path, best_ms: float, *, default: bool = True) -> Any:
    """A recorded table of vector_add whose fastest config runs ``best_ms`` against the
    default's 1 ms, every time with a 2% p20-p80 spread; the others are far slower."""
    results = [_entry(BEST, best_ms), *(_entry(c, 1.3 + i / 10) for i, c in enumerate(OTHERS))]
    if default:
        results.append(_entry(DEFAULT, DEFAULT_MS))
    path = tmp_path / f"vector_add_{best_ms}.json"
    path.write_text(json.dumps({
        "format": "replay-v1", "kernel": "vector_add", "device": "NVIDIA H200",
        "triton_version": "3.6.0", "shape": SHAPE, "dtype": DTYPE,
        "params": sorted(DEFAULT), "reference_ms": {"torch.add": 1.1}, "results": results}))
    return load_table(path)


# -- the search: the default is re-timed beside the finalists -------------------------------

def test_the_default_is_retimed_beside_the_finalists_even_when_no_trial_measured_it(
        tmp_path: Path):
    table = _table(tmp_path, 0.8)
    options = SearchOptions(trials=1, warm_start=[BEST], default=DEFAULT, strategy="random")
    result = run_search(KERNEL, SHAPE, DTYPE, ReplayBackend(table), options)
    assert [m.config for m in result.trials] == [BEST]  # the budget never reached it
    assert result.default is not None and result.default.config == DEFAULT
    assert result.default.extra["measured"] == "retimed" and result.default.p50_ms == 1.0
    assert result.best is not None and result.best.config == BEST
    # a default the table cannot run (the space holds only the table's configs): none
    result = run_search(KERNEL, SHAPE, DTYPE, ReplayBackend(_table(tmp_path, 0.8, default=False)),
                        options)
    assert result.default is None and result.best is not None


def test_with_a_users_list_the_default_is_the_lists_fastest(tmp_path: Path):
    table = _table(tmp_path, 0.8)
    listed = [OTHERS[0], DEFAULT, OTHERS[1]]
    result = run_search(KERNEL, SHAPE, DTYPE, ReplayBackend(table),
                        SearchOptions(trials=4, listed=listed, default=OTHERS[0]))
    assert result.default is not None and result.default.config == DEFAULT
    assert result.default.extra["measured"] == "retimed"


# -- the decision ------------------------------------------------------------------------------

def _m(config: KernelConfig, ms: float | None, noise: float = NOISE,
       outcome: Outcome = Outcome.OK) -> Measurement:
    if ms is None:
        return Measurement(config, outcome, extra={"measured": "retimed"})
    return Measurement(config, outcome, p20_ms=ms * (1 - noise / 2), p50_ms=ms,
                       p80_ms=ms * (1 + noise / 2), extra={"measured": "retimed"})


def test_only_a_config_faster_than_the_default_beyond_the_noise_is_stored():
    default = _m(DEFAULT, 1.0)
    close = decide_best(_m(BEST, 0.995), None, None, 0.01, default)
    assert close.write is default and close.basis == "default" and close.verdict == "inserted"
    assert close.margin == pytest.approx(NOISE) and close.search_ms == 0.995
    assert "nothing faster than the default beyond noise" in close.note
    assert "0.5% faster" in close.note and "noise margin 2.0%" in close.note
    far = decide_best(_m(BEST, 0.8), None, None, 0.01, default)
    assert far.write is not None and far.write.config == BEST and far.basis == "search"
    assert "20.0% faster than the default" in far.note
    # a quiet pair: 1.5% faster beats a 1% margin, not a 2% one
    assert decide_best(_m(BEST, 0.985, 0.005), None, None, 0.01,
                       _m(DEFAULT, 1.0, 0.005)).basis == "search"
    assert decide_best(_m(BEST, 0.985), None, None, 0.01, default).basis == "default"
    # the search's best is the default itself
    same = decide_best(_m(DEFAULT, 1.0), None, None, 0.01, default)
    assert same.basis == "default" and same.write is not None and same.write.config == DEFAULT
    # no default, or one not re-timed beside the finalists: not compared
    assert decide_best(_m(BEST, 0.995), None, None, 0.01).basis is None
    trial = Measurement(DEFAULT, Outcome.OK, 1.0, 1.0, 1.0, extra={"measured": "trial"})
    assert decide_best(_m(BEST, 0.995), None, None, 0.01, trial).write.config == BEST
    # a default that no longer verifies loses to any verified config
    broken = decide_best(_m(BEST, 0.995), None, None, 0.01,
                         _m(DEFAULT, None, outcome=Outcome.WRONG_RESULT))
    assert broken.basis == "search" and broken.write.config == BEST
    assert "wrong_result" in broken.note


def test_a_stored_best_within_the_noise_of_the_default_gives_way_to_it():
    other = OTHERS[2]
    stored = StoredBest(other, 4, 0.9)
    default = _m(DEFAULT, 1.0)
    # the stored config re-times 0.5% under the default; the search's best is no faster
    gone = decide_best(_m(BEST, 0.996), stored, _m(other, 0.995), 0.02, default)
    assert gone.write is default and gone.verdict == "replaced" and gone.basis == "default"
    # the stored config beats the default beyond the noise: it stays, labelled so
    kept = decide_best(_m(BEST, 0.85), stored, _m(other, 0.84), 0.02, default)
    assert kept.verdict == "kept" and kept.write.config == other and kept.basis == "search"
    # the stored default stays the default
    stays = decide_best(_m(BEST, 0.995), StoredBest(DEFAULT, 2, 1.0), _m(DEFAULT, 1.0), 0.02,
                        default)
    assert stays.verdict == "kept" and stays.basis == "default"
    # the stored config (1% under the default) does not beat it beyond the noise; the
    # search's best (2.5% under) does, though not the stored config: the best replaces it
    best = decide_best(_m(BEST, 0.975), stored, _m(other, 0.99), 0.02, default)
    assert best.write is not None and best.write.config == BEST and best.basis == "search"
    assert best.verdict == "replaced" and "not faster than the default" in best.note


# -- through the worker, the store, the API and the job page ----------------------------------

def _tune(db_url: str, table: Any) -> tuple[int, Any]:
    factory = init_db(db_url)
    with factory() as s:
        job = repo.create_job(s, kernel=KERNEL.name, kernel_version=KERNEL.version, dtype=DTYPE,
                              shapes=[SHAPE], budget_trials=8, budget_seconds=None,
                              strategy="auto", force=True, seed=0, backend="replay",
                              device_key=None)
        task_id = int(job.tasks[0].id)
        repo.start_task_locally(s, task_id, worker_id="cli")
        s.commit()
    outcome = execute_task(factory, task_id, backend_kind="replay", replay_table=table,
                           worker_id="cli")
    assert outcome.status == "succeeded", outcome.error
    assert outcome.stored  # a best was stored: the search's, or the default
    return task_id, factory


def test_a_best_within_the_noise_of_the_default_stores_the_default_labelled(
        any_db_url: str, tmp_path: Path):
    """The issue's case: the search's best is 0.5% faster than the default, each with a 2%
    spread: the default is stored, labelled, with both times and the margin."""
    task_id, factory = _tune(any_db_url, _table(tmp_path, 0.995))
    with factory() as s:
        [row] = repo.list_best(s)
        task = repo.get_task(s, task_id)
    assert KernelConfig(row.config) == DEFAULT and row.basis == "default"
    assert row.p50_ms == row.default_ms == 1.0 and row.search_ms == 0.995
    assert row.noise_margin == pytest.approx(NOISE) and row.measured == "retimed"
    assert KernelConfig(task.best_config) == BEST and task.best_ms == 0.995
    assert KernelConfig(task.default_config) == DEFAULT and task.default_ms == 1.0
    assert task.best_basis == "default" and task.noise_margin == pytest.approx(NOISE)
    assert task.best_note.startswith("stored the kernel's default: the search found nothing "
                                     "faster than the default beyond noise")


def test_a_best_faster_than_the_default_beyond_the_noise_is_stored(any_db_url: str,
                                                                    tmp_path: Path):
    task_id, factory = _tune(any_db_url, _table(tmp_path, 0.8))
    with factory() as s:
        [row] = repo.list_best(s)
        task = repo.get_task(s, task_id)
    assert KernelConfig(row.config) == BEST and row.basis == "search"
    assert row.p50_ms == row.search_ms == 0.8 and row.default_ms == 1.0
    assert task.best_basis == "search" and task.default_ms == 1.0
    assert "20.0% faster than the default" in task.best_note


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", "", html)))


def test_lookups_the_job_and_its_page_say_the_default_was_kept(api_client, api_db_url: str,
                                                                tmp_path: Path):
    task_id, factory = _tune(api_db_url, _table(tmp_path, 0.995))
    params = {"kernel": KERNEL.name, "dtype": DTYPE, **SHAPE, "device": DEVICE}
    got = api_client.get("/api/v1/configs", params=params)
    assert got.status_code == 200, got.text
    answer = got.json()
    assert answer["match"] == "exact" and answer["config"] == DEFAULT.to_dict()
    assert answer["basis"] == "default" and answer["ms"] == answer["default_ms"] == 1.0
    assert answer["search_ms"] == 0.995 and answer["noise_margin"] == pytest.approx(NOISE)
    bulk = api_client.post("/api/v1/configs/query", json={"items": [
        {"kernel": KERNEL.name, "dtype": DTYPE, "shape": SHAPE, "device": DEVICE},
        {"kernel": KERNEL.name, "dtype": DTYPE, "shape": SHAPE, "device": "cuda:X:sm90"}]})
    first, nothing = bulk.json()["data"]
    assert first == answer
    assert nothing["match"] == "default" and nothing["basis"] is None  # never compared

    with factory() as s:
        job_id = repo.get_task(s, task_id).job_id
    [task] = api_client.get(f"/api/v1/jobs/{job_id}").json()["tasks"]
    assert task["best_basis"] == "default" and task["default_ms"] == 1.0
    assert task["default_config"] == DEFAULT.to_dict() and task["best_ms"] == 0.995
    assert task["noise_margin"] == pytest.approx(NOISE)
    text = _text(api_client.get(f"/jobs/{job_id}").text)
    assert ("(re-timed beside the finalists): served: the default; the search's best is 0.5% "
            "faster than the default (1.0000 ms), within the noise margin 2.0%.") in text
    assert "the default, kept" in _text(api_client.get("/configs").text)


def test_the_job_page_says_a_tuned_config_beat_the_default(api_client, api_db_url: str,
                                                          tmp_path: Path):
    task_id, factory = _tune(api_db_url, _table(tmp_path, 0.8))
    with factory() as s:
        job_id = repo.get_task(s, task_id).job_id
    text = _text(api_client.get(f"/jobs/{job_id}").text)
    assert ("served: a tuned config; the search's best is 20.0% faster than the default "
            "(1.0000 ms) (noise margin 2.0%)") in text
    answer = api_client.get("/api/v1/configs", params={
        "kernel": KERNEL.name, "dtype": DTYPE, **SHAPE, "device": DEVICE}).json()
    assert answer["basis"] == "search" and answer["config"] == BEST.to_dict()
    assert answer["default_ms"] == 1.0 and answer["ms"] == 0.8
    assert "the default, kept" not in _text(api_client.get("/configs").text)


def test_migration_0006_goes_down_and_up_again(any_db_url: str):
    init_db(any_db_url)
    engine = make_engine(any_db_url)
    config = alembic_config(engine)
    command.downgrade(config, "0005")
    assert "basis" not in {c["name"] for c in inspect(engine).get_columns("best_configs")}
    assert "default_ms" not in {c["name"] for c in inspect(engine).get_columns("tasks")}
    command.upgrade(config, "head")
    assert {"basis", "default_ms", "search_ms", "noise_margin"} <= {
        c["name"] for c in inspect(engine).get_columns("best_configs")}
    assert {"default_config", "default_ms", "best_basis", "noise_margin"} <= {
        c["name"] for c in inspect(engine).get_columns("tasks")}
    engine.dispose()
