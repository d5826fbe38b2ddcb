"""Timing methods (issue 29, ``tuner/timing.py``): how every result was timed (eager-flushed,
cuda-graph, eager-hot), chosen per job, carried to the measuring child, stored with every best
as part of its identity, and asked for by lookups; on SQLite and PostgreSQL. The GPU side (the
three methods timing a real kernel) is tests/gpu/test_timing_methods.py."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from db import repo
from db.engine import alembic_config, init_db, make_engine
from search_spaces import get_kernel
from tests.api_support import CONFIG, GPU, INTERPRETER, SHAPE, config_params, store
from tuner import gpu_timer
from tuner.app.worker import execute_task
from tuner.backends.child import ChildState, _time_fn
from tuner.backends.replay import ReplayBackend, ReplayTableError, load_table, parse_table
from tuner.client import TunerClient
from tuner.config import KernelConfig
from tuner.configs_file import ConfigsEntry, ConfigsFile, write_tuner, write_vllm
from tuner.errors import InvalidRequest
from tuner.identity import local_triton_version
from tuner.timing import TIMING_METHODS as TIMINGS

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests/data/replay/matmul_16x4096x4096_float16_h200.json"
SMALL = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
         "num_stages": 2}
CUBE = {"M": 64, "N": 64, "K": 64}
JOB: dict[str, Any] = {"kernel": "matmul", "dtype": "float16", "shapes": [SHAPE],
                       "budget": {"trials": 3}}


# -- the job option ---------------------------------------------------------------------------

def test_a_job_says_how_it_is_timed_and_an_unknown_method_is_a_422_naming_timing(api_client):
    default = api_client.post("/api/v1/jobs", json=JOB)
    graph = api_client.post("/api/v1/jobs", json={**JOB, "timing": "cuda-graph"})
    assert default.status_code == graph.status_code == 202
    # two submissions differing only in timing are two jobs, not duplicates
    assert not graph.json()["deduplicated"] and graph.json()["id"] != default.json()["id"]
    assert api_client.get(default.json()["url"]).json()["timing"] == "eager-flushed"
    assert api_client.get(graph.json()["url"]).json()["timing"] == "cuda-graph"
    again = api_client.post("/api/v1/jobs", json={**JOB, "timing": "cuda-graph"})
    assert again.json()["deduplicated"] and again.json()["id"] == graph.json()["id"]
    bad = api_client.post("/api/v1/jobs", json={**JOB, "timing": "graphs"})
    assert bad.status_code == 422
    [detail] = bad.json()["detail"]
    assert detail["loc"] == ["body", "timing"] and "cuda-graph" in detail["msg"]


def test_cuda_graph_timing_is_refused_where_only_the_interpreter_can_run_the_job(api_client):
    refused = api_client.post("/api/v1/jobs", json={**JOB, "backend": "interpret",
                                                    "timing": "cuda-graph"})
    assert refused.status_code == 422
    [detail] = refused.json()["detail"]
    assert detail["loc"] == ["body", "timing"]
    assert "interpreter cannot replay CUDA graphs" in detail["msg"]
    for timing in ("eager-flushed", "eager-hot"):  # wall time either way: accepted
        ok = api_client.post("/api/v1/jobs", json={**JOB, "backend": "interpret",
                                                   "timing": timing})
        assert ok.status_code == 202, ok.text


def test_a_job_tuned_one_way_is_not_answered_from_the_store_for_another(api_client,
                                                                         api_db_url):
    store(api_db_url, SHAPE, 0.1, device=GPU)  # eager-flushed
    answered = api_client.post("/api/v1/jobs", json={**JOB, "device": GPU}).json()
    assert answered["answered_from_store"] == 1
    graph = api_client.post("/api/v1/jobs", json={**JOB, "device": GPU,
                                                  "timing": "cuda-graph"}).json()
    assert graph["answered_from_store"] == 0 and graph["status"] == "queued"


# -- the measuring child and the worker ---------------------------------------------------------

def _queue(factory: Any, kernel: str, shape: dict[str, int], dtype: str, timing: str,
           trials: int = 2) -> int:
    with factory() as session:
        job = repo.create_job(session, kernel=kernel, kernel_version=get_kernel(kernel).version,
                              dtype=dtype, shapes=[shape], budget_trials=trials,
                              budget_seconds=None, strategy="auto", force=True, seed=0,
                              backend="interpret", device_key=None, timing=timing)
        task_id = int(job.tasks[0].id)
        repo.start_task_locally(session, task_id, worker_id="cli")
        session.commit()
    return task_id


def test_the_interpreter_times_an_eager_method_and_stores_it_with_the_best(tmp_path):
    factory = init_db(f"sqlite:///{tmp_path / 'hot.db'}")
    task_id = _queue(factory, "vector_add", {"N": 4096}, "float32", "eager-hot")
    seen: list[Any] = []
    outcome = execute_task(factory, task_id, backend_kind="interpret", worker_id="cli",
                           on_trial=lambda _n, m: seen.append(m))
    assert outcome.status == "succeeded", outcome.error
    # the child timed every trial with the method the job asked for, and says so
    assert seen and {m.extra.get("timing") for m in seen if m.ok} == {"eager-hot"}
    with factory() as s:
        [best] = repo.list_best(s, kernel="vector_add")
        task = repo.get_task(s, task_id)
        assert best.timing == "eager-hot" and task.timing == "eager-hot"
        assert repo.get_best(s, device_key=INTERPRETER, kernel="vector_add", dtype="float32",
                             shape_key=best.shape_key) is None  # not an eager-flushed best


def test_a_cuda_graph_task_on_the_interpreter_fails_with_a_sentence_storing_nothing(tmp_path):
    factory = init_db(f"sqlite:///{tmp_path / 'graph.db'}")
    task_id = _queue(factory, "vector_add", {"N": 4096}, "float32", "cuda-graph")
    outcome = execute_task(factory, task_id, backend_kind="interpret", worker_id="cli")
    assert outcome.status == "failed"
    assert "cannot replay CUDA graphs" in (outcome.error or "")
    with factory() as s:
        assert repo.list_best(s, kernel="vector_add") == []
        assert repo.trials_for_task(s, task_id) == []


def test_the_interpreter_child_refuses_to_time_a_cuda_graph():
    from tuner.backends import TimingOptions

    state = ChildState("interpret")
    calls: list[int] = []
    p20, p50, p80, quick = _time_fn(state, lambda: calls.append(1),
                                    TimingOptions(method="eager-hot"))
    assert len(calls) == 3 and 0 <= p20 <= p50 <= p80 and not quick
    with pytest.raises(RuntimeError, match="cannot replay CUDA graphs"):
        _time_fn(state, lambda: calls.append(1), TimingOptions(method="cuda-graph"))


def _table(tmp_path: Path, method: str | None) -> Any:
    data = json.loads(TABLE.read_text())
    if method is not None:
        data["timing_method"] = method
    path = tmp_path / f"table-{method}.json"
    path.write_text(json.dumps(data))
    return load_table(path)


def _replay(factory: Any, table: Any, timing: str, trials: int = 6) -> Any:
    with factory() as session:
        job = repo.create_job(session, kernel="matmul",
                              kernel_version=get_kernel("matmul").version, dtype=table.dtype,
                              shapes=[table.shape], budget_trials=trials, budget_seconds=None,
                              strategy="auto", force=True, seed=0, backend="replay",
                              device_key=None, timing=timing)
        task_id = int(job.tasks[0].id)
        repo.start_task_locally(session, task_id, worker_id="cli")
        session.commit()
    outcome = execute_task(factory, task_id, backend_kind="replay", replay_table=table,
                           worker_id="cli")
    assert outcome.status == "succeeded", outcome.error
    return task_id


def test_a_replay_stores_its_tables_method_and_bests_of_two_methods_coexist(any_db_url,
                                                                            tmp_path):
    factory = init_db(any_db_url)
    flushed, graph = _table(tmp_path, None), _table(tmp_path, "cuda-graph")
    assert flushed.timing == "eager-flushed" and graph.timing == "cuda-graph"
    # a cuda-graph job replayed from an eager-flushed table: stored as what was timed
    first = _replay(factory, flushed, "cuda-graph")
    second = _replay(factory, graph, "eager-flushed")
    with factory() as s:
        rows = repo.list_best(s, kernel="matmul")
        assert sorted(r.timing for r in rows) == ["cuda-graph", "eager-flushed"]
        assert len({(r.device_key, r.shape_key, r.triton_version) for r in rows}) == 1
        assert repo.get_task(s, first).timing == "eager-flushed"
        assert repo.get_task(s, second).timing == "cuda-graph"
        by_timing = {r.timing: r for r in rows}
        assert by_timing["eager-flushed"].task_id == first
        assert by_timing["cuda-graph"].task_id == second
    # another cuda-graph search meets the cuda-graph best as its stored best (its incumbent)
    third = _replay(factory, graph, "cuda-graph")
    with factory() as s:
        assert repo.get_task(s, third).incumbent_ms is not None
        assert len(repo.list_best(s, kernel="matmul")) == 2


def test_a_replay_answers_as_its_table_was_timed_whatever_is_asked(tmp_path: Path):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({**json.loads(TABLE.read_text()), "timing_method": "cuda-graph"}))
    for table, method in ((load_table(TABLE), "eager-flushed"), (load_table(path), "cuda-graph")):
        backend = ReplayBackend(table)
        assert backend.use_timing("eager-hot") == method == backend.timing_method
        config = next(c for c, v in table.results.items() if isinstance(v, float))
        [trial] = backend.measure([config])
        [retimed] = backend.retime([config], 1)
        assert trial.extra["timing"] == retimed.extra["timing"] == method


def test_a_replay_table_with_an_unknown_method_is_refused():
    data = json.loads(TABLE.read_text())
    with pytest.raises(ReplayTableError, match="timing_method"):
        parse_table({**data, "timing_method": "graphs"})


def test_a_backend_without_the_notion_times_the_default():
    from tuner.backends.base import use_timing

    assert use_timing(object(), "cuda-graph") == "eager-flushed"


# -- gpu_timer (its timings need a GPU: tests/gpu/test_timing_methods.py) ----------------------

def test_a_graph_captures_enough_launches_for_a_replay_of_a_twentieth_of_rep():
    assert gpu_timer.graph_launches(0.005, 40.0) == 400  # 2 ms replays of 5 us launches
    assert gpu_timer.graph_launches(1e-6, 40.0) == gpu_timer.GRAPH_MAX_LAUNCHES
    assert gpu_timer.graph_launches(50.0, 40.0) == 1  # a launch longer than the budget


def test_an_unknown_method_is_not_timed():
    with pytest.raises(ValueError, match="timing method 'graph'"):
        gpu_timer.bench("graph", lambda: None)


# -- the store ---------------------------------------------------------------------------------

def test_the_migration_keeps_every_stored_result_as_eager_flushed_and_goes_down(any_db_url):
    engine = make_engine(any_db_url)
    config = alembic_config(engine)
    mine = ScriptDirectory.from_config(config).get_revision("0007")
    before = str(mine.down_revision)
    command.upgrade(config, before)
    version = get_kernel("matmul").version
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO best_configs (device_key, kernel, kernel_version, dtype, shape_key, "
            "shape, triton_version, config, p20_ms, p50_ms, p80_ms, updated_at) VALUES "
            "(:device, 'matmul', :version, 'float16', 'K=64,M=64,N=64', :shape, '3.6.0', "
            ":config, 0.1, 0.1, 0.1, :at)"),
            {"device": GPU, "version": version, "shape": json.dumps(CUBE),
             "config": json.dumps(CONFIG), "at": "2026-01-01 00:00:00"})
        conn.execute(text(
            "INSERT INTO jobs (id, kernel, kernel_version, dtype, status, backend, strategy, "
            "budget_trials, force, seed, request_key, created_at) VALUES ('j' , 'matmul', "
            ":version, 'float16', 'succeeded', 'auto', 'auto', 8, false, 0, 'k', :at)"),
            {"version": version, "at": "2026-01-01 00:00:00"})
    command.upgrade(config, "head")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT timing FROM best_configs")).all() == [
            ("eager-flushed",)]
        assert conn.execute(text("SELECT timing FROM jobs")).all() == [("eager-flushed",)]
    keys = {u["name"]: set(u["column_names"])
            for u in inspect(engine).get_unique_constraints("best_configs")}
    assert "timing" in keys["uq_best_key"]
    factory = init_db(any_db_url)
    with factory() as s:  # the same shape timed with cuda-graph is a row of its own
        _, written = repo.store_best(s, device_key=GPU, kernel="matmul", kernel_version=version,
                                     dtype="float16", shape=CUBE, triton_version="3.6.0",
                                     config=SMALL, p20_ms=0.2, p50_ms=0.2, p80_ms=0.2,
                                     tflops=None, gbps=None, torch_version=None,
                                     cuda_version=None, task_id=None, timing="cuda-graph")
        s.commit()
        assert written and len(repo.list_best(s)) == 2
    command.downgrade(config, before)  # the narrower key keeps the default's rows alone
    with engine.connect() as conn:
        assert conn.execute(text("SELECT p50_ms FROM best_configs")).all() == [(0.1,)]
    assert "timing" not in {c["name"] for c in inspect(engine).get_columns("best_configs")}
    command.upgrade(config, "head")
    engine.dispose()


def test_a_task_that_gives_up_keeps_its_fastest_trial_under_its_method(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        repo.upsert_device(s, {"key": GPU, "kind": "cuda", "name": "NVIDIA H200",
                               "triton_version": "3.6.0"})
        s.commit()
    task_id = _queue(factory, "matmul", CUBE, "float16", "cuda-graph")
    with factory() as s:
        repo.set_task_device(s, task_id, GPU, "cuda-graph")
        repo.record_trial(s, task_id, 1, {"config": SMALL, "p50_ms": 0.5, "outcome": "ok"})
        repo.finish_task(s, task_id, "failed", error="the device died")
        s.commit()
        [best] = repo.list_best(s, kernel="matmul")
        assert (best.config, best.timing) == (SMALL, "cuda-graph")


def test_a_stale_best_is_listed_per_method_with_a_retune_of_its_method(api_client,
                                                                       api_db_url):
    here = local_triton_version() or ""  # the device's Triton where none is registered
    store(api_db_url, CUBE, 0.01, config=SMALL, timing="cuda-graph", kernel_version="0ld",
          triton_version=here)
    store(api_db_url, CUBE, 0.02, triton_version=here)  # the current code's, eager-flushed
    [stale] = api_client.get("/api/v1/configs/stale").json()["data"]
    assert stale["timing"] == "cuda-graph" and stale["reasons"] == ["kernel-version"]
    assert stale["retune"]["timing"] == "cuda-graph"


# -- configs files -----------------------------------------------------------------------------

def test_a_configs_file_keeps_each_entrys_timing(tmp_path):
    entries = [ConfigsEntry("matmul", "v1", "float16", GPU, "3.6.0", dict(CUBE),
                            KernelConfig(CONFIG), ms=0.02),
               ConfigsEntry("matmul", "v1", "float16", GPU, "3.6.0", dict(CUBE),
                            KernelConfig(SMALL), ms=0.03, timing="cuda-graph")]
    path = tmp_path / "configs.json"
    write_tuner(entries, path)
    loaded = ConfigsFile.load(path)
    assert [e.timing for e in loaded.entries] == ["eager-flushed", "cuda-graph"]
    found = loaded.lookup("matmul", "float16", CUBE, device=GPU, timing="cuda-graph")
    assert found is not None and found.config == KernelConfig(SMALL)  # though slower
    with pytest.raises(InvalidRequest, match="timing method"):
        write_vllm([*entries, ConfigsEntry("matmul", "v1", "float16", GPU, "3.6.0",
                                           {**CUBE, "M": 32}, KernelConfig(SMALL))],
                   tmp_path / "vllm.json")


# -- the CLI -----------------------------------------------------------------------------------

def _tuner(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tuner.app.cli", "--db", db, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


def test_tuner_tune_timing_reaches_the_stored_best_and_export(tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    table = tmp_path / "graph.json"
    table.write_text(json.dumps({**json.loads(TABLE.read_text()), "timing_method": "cuda-graph"}))
    tuned = _tuner("tune", "matmul", "--replay", str(table), "--trials", "4", "--timing",
                   "cuda-graph", "--json", "--no-progress", db=db)
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["timing"] == "cuda-graph"
    listed = _tuner("configs", "--json", db=db)
    assert [c["timing"] for c in json.loads(listed.stdout)] == ["cuda-graph"]
    refused = _tuner("tune", "vector_add", "--shape", "N=1024", "--dtype", "float32",
                     "--backend", "interpret", "--timing", "cuda-graph", db=db)
    assert refused.returncode == 2 and "--timing" in refused.stderr
    assert "cannot replay CUDA graphs" in refused.stderr
    out = tmp_path / "out.json"
    exported = _tuner("export", "--timing", "cuda-graph", "--out", str(out), db=db)
    assert exported.returncode == 0, exported.stderr
    assert [e["timing"] for e in json.loads(out.read_text())["configs"]] == ["cuda-graph"]
    none = _tuner("export", "--timing", "eager-hot", "--out", str(out), db=db)
    assert none.returncode == 1 and "timing=eager-hot" in none.stderr
    imported_db = f"sqlite:///{tmp_path / 'imported.db'}"
    assert _tuner("import", str(tmp_path / "out.json"), db=imported_db).returncode == 0
    with init_db(imported_db)() as s:
        assert [r.timing for r in repo.list_best(s)] == ["cuda-graph"]


# -- lookups -----------------------------------------------------------------------------------

def _lookup(client: Any, shape: dict[str, int], **params: str) -> Any:
    return client.get("/api/v1/configs", params={**config_params(shape, GPU), **params})


def test_a_lookup_is_served_the_config_timed_its_way_and_the_answer_says_how(api_client,
                                                                           api_db_url):
    store(api_db_url, CUBE, 0.02)
    store(api_db_url, CUBE, 0.01, config=SMALL, timing="cuda-graph")
    default = _lookup(api_client, CUBE).json()
    assert default["config"] == CONFIG and default["timing"] == "eager-flushed"
    assert default["match"] == "exact" and not default["timing_fallback"]
    graph = _lookup(api_client, CUBE, timing="cuda-graph").json()
    assert graph["config"] == SMALL and graph["timing"] == "cuda-graph"
    assert graph["match"] == "exact" and not graph["timing_fallback"] and graph["ms"] == 0.01
    bad = _lookup(api_client, CUBE, timing="graph")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "timing"]


def test_another_methods_config_is_a_labelled_fallback_only_where_it_matches_better(
        api_client, api_db_url):
    store(api_db_url, CUBE, 0.02)  # this shape: eager-flushed only
    fallback = _lookup(api_client, CUBE, timing="cuda-graph").json()
    assert fallback["match"] == "exact" and fallback["config"] == CONFIG
    assert fallback["timing"] == "eager-flushed" and fallback["timing_fallback"]
    # a nearer match timed the asked way does not lose to it; a worse one does
    store(api_db_url, {"M": 128, "N": 64, "K": 64}, 0.01, config=SMALL, timing="cuda-graph")
    near = {"M": 100, "N": 64, "K": 64}
    assert _lookup(api_client, CUBE, timing="cuda-graph").json()["timing_fallback"]
    nearest = _lookup(api_client, near, timing="cuda-graph").json()
    assert nearest["match"] == "nearest" and nearest["timing"] == "cuda-graph"
    assert not nearest["timing_fallback"] and nearest["config"] == SMALL
    # the other way round: a default lookup falls back to a cuda-graph config, labelled
    other = {"M": 256, "N": 256, "K": 256}
    store(api_db_url, other, 0.03, config=SMALL, timing="cuda-graph")
    labelled = _lookup(api_client, other).json()
    assert labelled["match"] == "exact" and labelled["timing"] == "cuda-graph"
    assert labelled["timing_fallback"]
    default = _lookup(api_client, CUBE, dtype="bfloat16", timing="cuda-graph")
    assert default.status_code == 404 and default.json()["match"] == "default"
    assert default.json()["timing"] is None and not default.json()["timing_fallback"]


def test_the_serving_index_answers_each_method_as_the_database_ladder(any_db_url):
    from api.serving import ServingIndex

    h100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
    rows = [(GPU, "eager-flushed", CUBE), (GPU, "cuda-graph", {"M": 128, "N": 64, "K": 64}),
            (GPU, "eager-hot", {"M": 16, "N": 64, "K": 64}), (h100, "cuda-graph", CUBE),
            (h100, "eager-flushed", {"M": 256, "N": 64, "K": 64})]
    for i, (device, timing, shape) in enumerate(rows):
        store(any_db_url, shape, 0.01 * (i + 1), device=device, timing=timing)
    factory = init_db(any_db_url)
    index = ServingIndex(factory, refresh_s=60)
    version = get_kernel("matmul").version
    with factory() as s:
        candidates = repo.serving_candidates(s, kernel="matmul", kernel_version=version,
                                             dtype="float16")
    seen = set()
    for m, device, timing in itertools.product((16, 64, 100, 128, 256, 1024),
                                               (GPU, h100, None), TIMINGS):
        shape = {"M": m, "N": 64, "K": 64}
        expected = repo.serve_timed(lambda method, shape=shape, device=device: repo.serve_best(
            candidates, shape=shape, device_key=device, triton_version="3.6.0",
            timing=method), timing)
        got = index.group("matmul", version, "float16").serve(shape, device, "3.6.0", timing)
        assert got is not None and expected is not None
        assert (got.match, got.row.id) == (expected.match, expected.row.id), (shape, device,
                                                                              timing)
        seen.add((got.match, got.row.timing == timing))
    # answers timed the asked way and labelled fallbacks, exact and not
    assert {("exact", True), ("exact", False), ("nearest", True)} <= seen


def test_a_bulk_query_asks_per_item_and_a_fallback_is_a_miss_tuned_its_way(api_client,
                                                                          api_db_url):
    from tests.api_support import register_devices

    register_devices(api_db_url, GPU)
    store(api_db_url, CUBE, 0.02)
    items = [{"kernel": "matmul", "dtype": "float16", "shape": CUBE, "device": GPU},
             {"kernel": "matmul", "dtype": "float16", "shape": CUBE, "device": GPU,
              "timing": "cuda-graph"}]
    body = api_client.post("/api/v1/configs/query",
                           json={"items": items, "report_misses": True}).json()
    plain, graph = body["data"]
    assert plain["timing"] == "eager-flushed" and plain["miss"] is None
    assert graph["timing"] == "eager-flushed" and graph["timing_fallback"]
    assert graph["miss"] == "queued"
    [miss] = api_client.get("/api/v1/misses").json()["data"]
    assert miss["timing"] == "cuda-graph"
    job = api_client.get(miss["job_url"]).json()
    assert job["timing"] == "cuda-graph" and job["device"] == GPU


# -- clients -----------------------------------------------------------------------------------

def test_the_client_asks_for_its_timing_and_takes_only_a_config_timed_that_way(api_client,
                                                                              api_db_url,
                                                                              monkeypatch):
    here = local_triton_version() or ""  # what the client sends
    store(api_db_url, CUBE, 0.02, triton_version=here)
    transport = api_client._transport  # the app, in-process
    graph = TunerClient("http://testserver", transport=transport, device=GPU,
                        timing="cuda-graph")
    assert graph.exact_config("matmul", CUBE, "float16") is None  # only a fallback
    answer = graph.lookup("matmul", CUBE, "float16")
    assert answer["match"] == "exact" and answer["timing_fallback"]
    store(api_db_url, CUBE, 0.01, config=SMALL, timing="cuda-graph", triton_version=here)
    fresh = TunerClient("http://testserver", transport=transport, device=GPU,
                        timing="cuda-graph")
    assert fresh.exact_config("matmul", CUBE, "float16") == (KernelConfig(SMALL), "service")
    monkeypatch.setenv("TUNER_TIMING", "cuda-graph")
    from_env = TunerClient("http://testserver", transport=transport, device=GPU)
    assert from_env.timing == "cuda-graph"
    assert from_env.best_config("matmul", CUBE, "float16") == KernelConfig(SMALL)
    eager = from_env.exact_config("matmul", CUBE, "float16", timing="eager-flushed")
    assert eager == (KernelConfig(CONFIG), "service")
    monkeypatch.setenv("TUNER_TIMING", "graphs")
    with pytest.raises(InvalidRequest, match="TUNER_TIMING"):
        TunerClient("http://testserver", transport=transport)


def test_autotune_chooses_by_its_timing(api_client, api_db_url, monkeypatch):
    import tuner

    store(api_db_url, CUBE, 0.01, config=SMALL, timing="cuda-graph",
          triton_version=local_triton_version() or "")
    client = TunerClient("http://testserver", transport=api_client._transport, device=GPU)
    tuner.configure(client=client)
    try:
        seen: list[str | None] = []
        real = client.exact_config

        def spy(*args: Any, **kwargs: Any) -> Any:
            seen.append(kwargs.get("timing"))
            return real(*args, **kwargs)

        monkeypatch.setattr(client, "exact_config", spy)
        for timing in ("cuda-graph", None):
            kernel = tuner.autotune(configs=[], key=["M", "N", "K"], name="matmul",
                                    timing=timing)(_jit())
            kernel.version = get_kernel("matmul").version
            found = kernel.config_for(("float16", tuple(sorted(CUBE.items()))))
            assert found == (KernelConfig(SMALL) if timing else None)
        assert seen == ["cuda-graph", None]
    finally:
        tuner.configure(client=None)


def _jit() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, M, N, K, BLOCK_M: tl.constexpr):
        pass

    return kernel


# -- gpu_timer's graph timing, against a simulated GPU (tests/gpu times a real one) ------------

class _SimulatedCuda:
    """torch.cuda as do_bench_graph uses it, over a clock that launches advance: an eager
    launch costs ``gap`` + ``kernel`` ms, a launch replayed from a graph ``kernel`` alone."""

    def __init__(self, kernel: float, gap: float) -> None:
        self.kernel, self.gap, self.now = kernel, gap, 0.0
        self.capturing: list[int] | None = None
        self.captured: list[int] = []
        self.replays = 0
        sim = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0.0

            def record(self) -> None:
                self.at = sim.now

            def elapsed_time(self, end: Any) -> float:
                return float(end.at - self.at)

        class Graph:
            def __init__(self) -> None:
                self.launches = 0

            def replay(self) -> None:
                sim.replays += 1
                sim.now += self.launches * sim.kernel

            def reset(self) -> None:
                self.launches = 0

        class Capture:
            def __init__(self, graph: Graph) -> None:
                self.graph = graph

            def __enter__(self) -> None:
                sim.capturing = []

            def __exit__(self, *exc: Any) -> None:
                self.graph.launches = len(sim.capturing or [])
                sim.captured.append(self.graph.launches)
                sim.capturing = None

        class Stream:
            def wait_stream(self, _other: Any) -> None:
                pass

        self.Event, self.CUDAGraph, self.graph, self.Stream = Event, Graph, Capture, Stream
        self.current_stream = Stream
        self.synchronize = lambda: None

    def stream(self, _s: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def _sleep(self, _cycles: int) -> None:  # the spin before an eager run: not timed
        pass

    def launch(self) -> None:
        if self.capturing is not None:
            self.capturing.append(1)
        else:
            self.now += self.gap + self.kernel


def test_graph_timing_is_a_replay_of_n_captured_launches_divided_by_n(monkeypatch):
    import torch

    sim = _SimulatedCuda(kernel=0.004, gap=0.006)
    monkeypatch.setattr(torch, "cuda", sim)
    p20, p50, p80 = gpu_timer.do_bench_graph(sim.launch, warmup=1.0, rep=40.0)
    # per launch: the kernel alone, without the eager launches' gap
    assert p20 == pytest.approx(0.004) and p50 == pytest.approx(0.004)
    assert p80 == pytest.approx(0.004)
    # the graph holds as many launches as a twentieth of rep takes at the eager estimate
    assert sim.captured == [gpu_timer.graph_launches(0.010, 40.0)]
    assert sim.replays > gpu_timer.GRAPH_REPLAYS  # the upload, the warm-up, the timed ones


@pytest.mark.parametrize("flush", [True, False])
def test_eager_hot_is_eager_flushed_without_the_flush(monkeypatch, flush: bool):
    import torch

    sim = _SimulatedCuda(kernel=0.004, gap=0.006)
    flushes: list[float] = []

    class Cache:
        def zero_(self) -> None:
            flushes.append(sim.now)
            sim.now += 0.06  # a 256 MB memset

    real_empty = torch.empty
    monkeypatch.setattr(torch, "cuda", sim)
    monkeypatch.setattr(torch, "empty", lambda *a, **k: Cache() if k.get("device") == "cuda"
                        else real_empty(*a, **k))
    p20, p50, _ = gpu_timer.do_bench(sim.launch, warmup=1.0, rep=2.0, flush=flush)
    assert p20 == pytest.approx(0.010) and p50 == pytest.approx(0.010)  # the flush not timed
    assert bool(flushes) is flush
    flushes.clear()  # and bench times each method so
    method = "eager-flushed" if flush else "eager-hot"
    assert gpu_timer.bench(method, sim.launch, warmup=1.0, rep=2.0)[1] == pytest.approx(0.010)
    assert bool(flushes) is flush
