"""The dashboard's pages over real HTTP through the app: what a browser without JavaScript gets
(every table is in the HTML), the chart data, live progress events, cancel and the config
renderings. The browser tests are in test_dashboard_browser.py."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timedelta
from html import unescape
from typing import Any

import pytest
import triton
from fastapi.testclient import TestClient

from api.app import create_app
from api.dashboard import as_vllm_entry, importance, parcoords
from db import repo
from db.engine import init_db
from db.models import Trial
from search_spaces import get_kernel
from tests.api_support import GPU, JOB, register_devices, run_worker_once, store
from tuner.config import triton_config_text
from tuner.settings import Settings


def _job(client: TestClient, **changes: Any) -> str:
    r = client.post("/api/v1/jobs", json={**JOB, **changes})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _calibrate(db_url: str, device: str = GPU) -> None:
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": device, "kind": "cuda", "name": "NVIDIA H200",
                                     "sm_count": 132})
        repo.set_calibration(session, device, copy_gbps=4218.9, matmul_tflops=712.4)
        session.commit()


def _cells(html: str, table_class: str) -> list[list[str]]:
    """The text of each body row of the table with that class."""
    table = re.search(rf'<table class="{table_class}"[^>]*>(.*?)</table>', html, re.S)
    assert table, f"no table {table_class}"
    body = table.group(1).split("<tbody>", 1)[1]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    return [[unescape(re.sub(r"<[^>]+>", "", c)).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


def test_overview_shows_devices_with_calibration_kernels_and_job_counts(api_client, api_db_url):
    _calibrate(api_db_url)
    _job(api_client)
    html = api_client.get("/").text
    assert "cuda:NVIDIA H200:sm90" in html and "4219 GB/s" in html and "712 TFLOP/s" in html
    assert 'href="/kernels/matmul"' in html
    assert re.search(r'data-count="queued"><span class="num">1<', html)
    [row] = _cells(html, "jobs")
    assert row[1] == "matmul" and row[4] == "queued" and "0 / 3" in row[5]


def test_an_empty_service_says_what_to_do(api_client):
    html = api_client.get("/").text
    assert "No worker has registered yet" in html and "No jobs yet" in html
    assert "No tuned config matches" in api_client.get("/configs").text


def test_jobs_page_lists_filters_and_pages(api_client, api_db_url):
    first = _job(api_client)
    second = _job(api_client, dtype="float32")
    api_client.post(f"/api/v1/jobs/{first}/cancel")
    html = api_client.get("/jobs").text
    assert [r[0] for r in _cells(html, "jobs")] == [second[:8], first[:8]]  # newest first
    only = _cells(api_client.get("/jobs", params={"status": "cancelled"}).text, "jobs")
    assert [r[0] for r in only] == [first[:8]]
    # a queued job offers cancel, a cancelled one does not
    assert f'data-cancel="{second}"' in html and f'data-cancel="{first}"' not in html
    assert api_client.get("/jobs", params={"page": 0}).status_code == 422


def test_job_page_has_tables_and_chart_data_from_real_trials(api_client, api_db_url):
    job_id = _job(api_client)
    run_worker_once(api_db_url)
    html = api_client.get(f"/jobs/{job_id}").text
    assert "succeeded" in html and "16x16x16" in html
    top = _cells(html, "top")
    assert len(top) == 3 and all(float(r[2]) > 0 for r in top)  # three ok trials, fastest first
    assert [float(r[2]) for r in top] == sorted(float(r[2]) for r in top)
    data = json.loads(unescape(re.search(
        r'<script type="application/json" id="chart-data-\d+">(.*?)</script>', html, re.S)
        .group(1)))
    assert data["numbers"] == [1, 2, 3]
    assert data["best"] == sorted(data["best"], reverse=True)  # best-so-far never rises
    assert set(data["outcomes"]) == {"ok"} and len(data["outcomes"]["ok"]["y"]) == 3
    names = list(get_kernel("matmul").space().names)
    assert {d["param"] for d in data["importance"]} == set(names)
    assert len(data["parcoords"]["rows"]) == 3
    assert len(data["parcoords"]["axes"]) == len(names) + 1  # and the time
    assert '<script src="/static/plotly.min.js"' in html


def test_the_live_chart_data_is_the_pages_own(api_client, api_db_url):
    job_id = _job(api_client)
    run_worker_once(api_db_url)
    [(task_id, shape)] = api_client.get(f"/jobs/{job_id}/live").json()["shapes"].items()
    html = api_client.get(f"/jobs/{job_id}").text
    embedded = re.search(rf'id="chart-data-{task_id}">(.*?)</script>', html, re.S).group(1)
    assert json.loads(unescape(embedded)) == shape["data"]


def test_failed_trials_are_listed_with_their_reason(api_client, api_db_url):
    job_id = _job(api_client)
    factory = init_db(api_db_url)
    with factory() as session:
        task = repo.get_job(session, job_id).tasks[0]
        config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4,
                  "num_stages": 2}
        session.add(Trial(task_id=task.id, number=1, config=config, config_key="k",
                          outcome="crash", error="CUDA error: an illegal memory access"))
        session.commit()
    html = api_client.get(f"/jobs/{job_id}").text
    [row] = _cells(html, "failures")
    assert row[1] == "crash" and "illegal memory access" in row[3]


def test_unknown_job_and_kernel_pages_are_404_pages(api_client):
    r = api_client.get("/jobs/nope")
    assert r.status_code == 404 and "There is no job" in r.text
    assert api_client.get("/kernels/nope").status_code == 404


def test_progress_events_carry_every_listed_job(api_client, api_db_url):
    job_id = _job(api_client)
    with api_client.stream("GET", "/events/jobs", params={"ids": job_id, "once": 1}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    event = re.search(r"event: progress\ndata: (.*)\n", body)
    assert event and "event: end" in body
    [job] = json.loads(event.group(1))["jobs"]
    assert job["id"] == job_id and job["status"] == "queued"
    assert job["trials_done"] == 0 and job["budget"] == 3


def test_progress_stream_ends_when_the_jobs_are_done(api_client, api_db_url):
    job_id = _job(api_client)
    run_worker_once(api_db_url)
    with api_client.stream("GET", "/events/jobs", params={"ids": job_id}) as r:
        body = "".join(r.iter_text())  # ends by itself: the job has finished
    [job] = json.loads(re.search(r"data: (.*)\n", body.split("event: progress", 1)[1])
                       .group(1))["jobs"]
    assert job["status"] == "succeeded" and job["trials_done"] == 3 and job["best_ms"] > 0


def test_the_cancel_form_needs_a_write_key_when_keys_are_set(api_db_url):
    settings = Settings(database_url=api_db_url, api_keys="writer,reader:ro")
    with TestClient(create_app(settings)) as client:
        job_id = _job_with_key(client)
        r = client.post(f"/jobs/{job_id}/cancel", data={"api_key": "reader"})
        assert r.status_code == 403 and "write access" in r.text
        assert client.post(f"/jobs/{job_id}/cancel").status_code == 401
        r = client.post(f"/jobs/{job_id}/cancel", data={"api_key": "writer"},
                        follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == f"/jobs/{job_id}"
        assert client.get(f"/api/v1/jobs/{job_id}").json()["status"] == "cancelled"


def _job_with_key(client: TestClient) -> str:
    r = client.post("/api/v1/jobs", json=JOB, headers={"X-API-Key": "writer"})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_pages_need_a_key_only_when_reads_do_and_take_it_from_the_cookie(api_db_url):
    settings = Settings(database_url=api_db_url, api_keys="writer,reader:ro", auth_reads=True)
    with TestClient(create_app(settings)) as client:
        assert client.get("/").status_code == 401
        assert client.get("/key").status_code == 200  # where the key is typed
        r = client.post("/key", data={"api_key": "reader"}, follow_redirects=False)
        assert r.status_code == 303 and "tuner_api_key=reader" in r.headers["set-cookie"]
        assert client.get("/").status_code == 200
        # the cookie reads, but never writes
        assert client.post("/api/v1/jobs", json=JOB).status_code == 401


def test_configs_page_filters_on_the_server_and_renders_three_copy_formats(api_client,
                                                                           api_db_url):
    store(api_db_url, {"M": 4096, "N": 4096, "K": 4096}, 0.2)
    store(api_db_url, {"M": 16, "N": 4096, "K": 4096}, 0.02, dtype="bfloat16")
    html = api_client.get("/configs").text
    assert len(_cells(html, "configs")) == 2
    for params in ({"dtype": "bfloat16"}, {"shape": "16x"}, {"shape": "16X4096"}):
        rows = _cells(api_client.get("/configs", params=params).text, "configs")
        assert [r[2] for r in rows] == ["16x4096x4096"], params
    assert _cells(api_client.get("/configs", params={"device": "nope"}).text,
                  "configs")[0][0] == "No tuned config matches."
    triton_text = unescape(re.search(r'<pre data-format="triton">(.*?)</pre>', html).group(1))
    config = eval(triton_text, {"triton": triton})  # noqa: S307 - what a user pastes
    assert isinstance(config, triton.Config) and config.num_warps == 8
    assert config.kwargs == {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8}


def test_config_renderings():
    config = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4,
              "num_stages": 3}
    c = eval(triton_config_text(config), {"triton": triton})  # noqa: S307
    assert c.kwargs == {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}
    assert (c.num_warps, c.num_stages) == (4, 3)
    assert json.loads(as_vllm_entry(config, {"M": 16, "N": 4096, "K": 4096})) == {
        "16": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
               "num_warps": 4, "num_stages": 3}}


def test_kernel_page_shows_its_space_constraints_and_bests(api_client, api_db_url):
    store(api_db_url, {"M": 4096, "N": 4096, "K": 4096}, 0.2)
    html = api_client.get("/kernels/matmul").text
    rows = _cells(html, "space")
    assert [r[0] for r in rows] == list(get_kernel("matmul").space().names)
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps"} <= {r[0] for r in rows}
    assert "accumulator registers" in html and "shared memory" in html
    assert [r[2] for r in _cells(html, "configs")] == ["4096x4096x4096"]


def test_roofline_places_each_result_under_the_one_floor_the_workers_stop_at(api_client,
                                                                            api_db_url):
    """Each stored best's floor is tuner.roofline's (the workers' early stop uses the same):
    the larger of the two limits, the 16-bit matmul peak only for 16-bit dtypes. Before, the
    page computed its own roof and held float32 to the 16-bit peak (compute-bound, 24%)."""
    from search_spaces import get_kernel
    from tuner.roofline import floor_ms

    _calibrate(api_db_url)
    kernel = get_kernel("matmul")
    big, skinny = {"M": 4096, "N": 4096, "K": 4096}, {"M": 16, "N": 4096, "K": 4096}
    results = ((big, "float16", 0.2171), (skinny, "float16", 0.03977), (big, "float32", 0.80))
    with init_db(api_db_url)() as session:
        for shape, dtype, ms in results:
            repo.store_best(session, device_key=GPU, kernel="matmul", kernel_version="v",
                            dtype=dtype, shape=shape, triton_version="3.6.0",
                            config={"BLOCK_M": 64}, p20_ms=ms, p50_ms=ms, p80_ms=ms,
                            tflops=kernel.flops(shape) / ms * 1e-9,
                            gbps=kernel.bytes(shape, dtype) / ms * 1e-6,
                            torch_version=None, cuda_version=None, task_id=None,
                            measured="retimed")
        session.commit()
    html = api_client.get("/roofline").text
    rows = {(r[1], r[2]): r for r in _cells(html, "roofline")}
    half, small, single = (rows[("float16", "4096x4096x4096")], rows[("float16", "16x4096x4096")],
                           rows[("float32", "4096x4096x4096")])
    for row, (shape, dtype, ms) in zip((half, small, single), results, strict=True):
        floor = floor_ms(kernel, shape, dtype, 4218.9, 712.4)
        assert floor is not None and row[7] == f"{floor:.4f}"
        assert row[9] == f"{100 * floor / ms:.0f}%"
    # 633 TFLOP/s: compute-bound, 2 * 4096^3 FLOP at 712.4 TFLOP/s is 0.1929 ms: 89% of roof
    assert half[10] == "compute" and half[9] == "89%" and half[6] == "0.2171 (retimed)"
    # 16x4096x4096: memory-bound, 33.8 MB at 4219 GB/s is 0.0080 ms: 20% of roof
    assert small[10] == "memory" and small[9] == "20%"
    # float32: the 16-bit peak does not apply, the bandwidth limit alone: 0.0477 ms, 6%
    assert single[10] == "memory (bandwidth only)" and single[9] == "6%"
    assert 'data-roofline' in html


def test_importance_and_parcoords_math():
    def trial(ms: float, **config: int) -> Trial:
        return Trial(number=0, config=config, outcome="ok", p50_ms=ms)

    # num_warps decides the time, BLOCK_M does nothing
    ok = [trial(1.0, BLOCK_M=16, num_warps=4), trial(1.0, BLOCK_M=32, num_warps=4),
          trial(4.0, BLOCK_M=16, num_warps=8), trial(4.0, BLOCK_M=32, num_warps=8)]
    shares = {d["param"]: d["share"] for d in importance(ok, ["BLOCK_M", "num_warps"])}
    assert shares == {"num_warps": 1.0, "BLOCK_M": 0.0}
    assert importance(ok[:2], ["BLOCK_M"]) == []
    p = parcoords(sorted(ok, key=lambda t: t.p50_ms), ["BLOCK_M", "num_warps"])
    assert [a["name"] for a in p["axes"]] == ["BLOCK_M", "num_warps", "time (ms, log)"]
    assert p["rows"][0] == [0.0, 0.0, 0.0] and p["rows"][-1] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("path", ["/", "/jobs", "/configs", "/misses", "/roofline",
                                  "/kernels/matmul"])
def test_every_page_is_html_with_the_navigation(api_client, path):
    r = api_client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert all(f'href="{p}"' in r.text for p in ("/jobs", "/configs", "/misses", "/roofline",
                                                 "/dashboard/stale", "/dashboard/compare"))


def test_misses_page_lists_reported_misses_with_their_jobs_and_the_overview_counts_them(
        api_client, api_db_url):
    register_devices(api_db_url, GPU)

    def item(m: int, **fields: str) -> dict[str, Any]:
        return {"kernel": "matmul", "dtype": "float32", "shape": {"M": m, "N": 16, "K": 16},
                **fields}

    items = [item(16, device=GPU), item(32), item(64, device=GPU, kernel_version="0ld")]
    for _ in range(2):
        api_client.post("/api/v1/configs/query", json={"items": items, "report_misses": True})
    assert "No misses reported" in api_client.get("/misses", params={"kernel": "softmax"}).text
    html = api_client.get("/misses").text
    rows = _cells(html, "misses")
    assert [(r[0].split()[0], r[1], r[2], r[3], r[4], r[7].split()[0]) for r in rows] == [
        ("matmul", "float32", "64x16x16", GPU, "2", "kernel-version-mismatch"),
        ("matmul", "float32", "32x16x16", "not given", "2", "no-device"),
        ("matmul", "float32", "16x16x16", GPU, "2", "queued")]
    job_id = api_client.get("/api/v1/misses", params={"status": "queued"}).json()["data"][0][
        "job_id"]
    assert f'href="/jobs/{job_id}"' in html and rows[0][8] == rows[1][8] == "-"
    only = _cells(api_client.get("/misses", params={"status": "no-device"}).text, "misses")
    assert [r[2] for r in only] == ["32x16x16"]
    overview = api_client.get("/").text
    assert re.search(r'data-count="misses"><span class="num">3<', overview)
    assert "1 being tuned" in overview


def test_plotly_is_served_from_the_installed_package(api_client):
    r = api_client.get("/static/plotly.min.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert len(r.content) > 1_000_000 and b"plotly" in r.content[:2000].lower()
    assert api_client.get("/static/dashboard.js").status_code == 200


def test_a_job_waiting_for_a_device_no_worker_has_is_flagged_on_its_page_and_the_list(
        api_client, api_db_url):
    waiting = _job(api_client, device="cuda:Made Up:sm00", future_device=True)
    fresh = _job(api_client, device="cuda:Made Up:sm00", future_device=True,
                 budget={"trials": 4})
    with init_db(api_db_url)() as session:
        job = repo.get_job(session, waiting)
        job.created_at = job.created_at - timedelta(minutes=5)  # waited past a lease length
        session.commit()
    page = unescape(api_client.get(f"/jobs/{waiting}").text)
    assert "<dt>waiting</dt>" in page and "no worker has served device 'cuda:Made Up:sm00'" in page
    assert "<dt>waiting</dt>" not in api_client.get(f"/jobs/{fresh}").text
    rows = {r[0]: r[4] for r in _cells(api_client.get("/jobs").text, "jobs")}
    assert rows[waiting[:8]] == "queued waiting: no live worker for its device"
    assert rows[fresh[:8]] == "queued"


# -- a job page's numbers, its live refresh and the CSV export ----------------------------------

WORKER = "dashboard-test"
TEST_GPU = "cuda:Test GPU:sm90"
#: low ceilings, so that the 64x64x32 shape's floor is a visible share of its time
CEILINGS = {"copy_gbps": 2.0, "matmul_tflops": 0.05}
DRIVEN = {"M": 64, "N": 64, "K": 32}
#: what the page says of the baseline before the finalists were re-timed beside it
AT_END = "timed beside the finalists at the end"


def _measurement(block_m: int, ms: float | None, outcome: str = "ok", compile_s: float = 1.0,
                 error: str | None = None) -> dict[str, Any]:
    config = {"BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4,
              "num_stages": 2}
    times = {"p20_ms": ms * 0.9, "p50_ms": ms, "p80_ms": ms * 1.1} if ms else {}
    return {"config": config, "outcome": outcome, "compile_s": compile_s, "error": error,
            **times, "extra": {"gpu": {"sm_mhz": 1980, "mem_mhz": 2619, "power_w": 500.0,
                                       "temp_c": 60, "throttle": 4}}}


def _driven_job(client: TestClient, db_url: str) -> tuple[str, int]:
    """A job on a calibrated test GPU whose task runs under this test's lease (no trial yet)."""
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": TEST_GPU, "kind": "cuda", "name": "Test GPU"})
        repo.set_calibration(session, TEST_GPU, **CEILINGS)
        session.commit()
    job_id = _job(client, shapes=[DRIVEN], device=TEST_GPU, budget={"trials": 5})
    with init_db(db_url)() as session:
        task_id = repo.get_job(session, job_id).tasks[0].id
        repo.start_task_locally(session, task_id, WORKER)
        repo.set_task_device(session, task_id, TEST_GPU)
        session.commit()
    return job_id, task_id


def _record(db_url: str, task_id: int, *measurements: dict[str, Any]) -> None:
    with init_db(db_url)() as session:
        done = len(repo.trials_for_task(session, task_id))
        for i, m in enumerate(measurements, start=done + 1):
            repo.record_trial(session, task_id, i, m, worker_id=WORKER)
        session.commit()


def _finish(db_url: str, task_id: int, best: dict[str, Any], ms: float, torch_ms: float) -> None:
    with init_db(db_url)() as session:
        repo.record_retimed(session, task_id, [{**best, "p20_ms": ms, "p50_ms": ms,
                                                "p80_ms": ms}])
        repo.set_task_best(session, task_id, ms, best["config"], worker_id=WORKER,
                           measured="retimed", baseline_ms=torch_ms, baseline_name="torch")
        repo.finish_task(session, task_id, "succeeded", worker_id=WORKER)
        session.commit()


def _stats(html: str) -> dict[str, str]:
    return {name: unescape(re.sub(r"<[^>]+>", "", cell)).strip() for name, cell in
            re.findall(r'<td data-field="stat-([a-z-]+)">(.*?)</td>', html, re.S)}


def test_job_page_shows_each_shapes_numbers_of_its_best_and_every_trial(api_client, api_db_url):
    from tuner.roofline import roofline

    job_id, task_id = _driven_job(api_client, api_db_url)
    html = api_client.get(f"/jobs/{job_id}").text
    text = unescape(re.sub(r"<[^>]+>", "", html))
    assert "0 trials (none yet)" in text and "No successful trial yet" in text
    assert _stats(html)["ms"] == "-" and _stats(html)["vs"] == AT_END
    best = _measurement(32, 0.030, compile_s=2.0)
    _record(api_db_url, task_id, _measurement(16, 0.050, compile_s=1.0),
            _measurement(64, None, "compile_error", 4.0, "out of shared memory"), best,
            _measurement(128, 0.090, compile_s=3.0))
    running = _stats(api_client.get(f"/jobs/{job_id}").text)
    assert running["ms"] == "0.0300 (trial)" and running["vs"] == AT_END
    _finish(api_db_url, task_id, best, 0.024, 0.036)

    html = api_client.get(f"/jobs/{job_id}").text
    stats = _stats(html)
    kernel = get_kernel("matmul")
    roof = roofline(kernel, DRIVEN, "float16", **CEILINGS)
    assert roof is not None and roof.bound == "memory"
    assert stats["ms"] == "0.0240 (re-timed)"
    assert stats["tflops"] == f"{kernel.flops(DRIVEN) / 0.024e-3 / 1e12:.2f}"
    assert stats["gbps"] == f"{kernel.bytes(DRIVEN, 'float16') / 0.024e-3 / 1e9:.1f}"
    assert stats["of-roof"] == f"{100 * roof.floor_ms / 0.024:.1f}% (memory-bound)"
    assert stats["floor"] == f"{roof.floor_ms:.4f}"
    assert (stats["baseline"], stats["vs"]) == ("0.0360", "1.50x")
    assert stats["compile"] == "2.50 / 4.00 (4 compiled)" and stats["compile-total"] == "10.0"
    # every trial, not only the fastest: the failure too, with its config's columns
    rows = _cells(html, "trials")
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert [r[1] for r in rows] == ["ok", "compile_error", "ok", "ok"]
    # a parameter's heading may break after its underscores (``BLOCK_<wbr>M``)
    heads = re.findall(r'<th data-sort="num">(.*?)</th>',
                       re.search(r'<table class="trials".*?</thead>', html, re.S).group(0))
    names = [n for n in (re.sub(r"<[^>]+>", "", h) for h in heads) if re.fullmatch(r"\w+", n)]
    assert [r[2 + names.index("BLOCK_M")] for r in rows] == ["16", "64", "32", "128"]
    ms_at = 2 + len(names)
    # the best config's one number is its re-timed time, labelled; the others' are trial times
    assert [r[ms_at] for r in rows] == ["0.0500 trial", "-", "0.0240 re-timed", "0.0900 trial"]
    assert [r[ms_at + 1] for r in rows] == ["0.0500", "-", "0.0300", "0.0900"]
    assert "out of shared memory" in rows[1][-1]


def test_the_live_parts_are_the_pages_own_and_follow_new_trials(api_client, api_db_url):
    job_id, task_id = _driven_job(api_client, api_db_url)
    _record(api_db_url, task_id, _measurement(16, 0.05))
    html = api_client.get(f"/jobs/{job_id}").text
    live = api_client.get(f"/jobs/{job_id}/live").json()
    shape = live["shapes"][str(task_id)]
    for name, part in shape["parts"].items():
        assert f'data-live="{name}">{part}</div>' in html, name  # the page's parts, verbatim
    assert shape["data"]["numbers"] == [1]
    assert live["progress"]["trials_done"] == 1 and live["progress"]["status"] == "running"
    _record(api_db_url, task_id, _measurement(32, 0.02), _measurement(64, 0.03))
    live = api_client.get(f"/jobs/{job_id}/live").json()
    shape = live["shapes"][str(task_id)]
    assert ">3</span> trials (" in shape["parts"]["head"] and "3 ok" in shape["parts"]["head"]
    assert shape["parts"]["trials"].count("<tr data-outcome=") == 3
    assert shape["data"]["numbers"] == [1, 2, 3] and shape["data"]["best"][-1] == 0.02
    assert "3 / 5" in live["parts"]["job"]
    assert api_client.get("/jobs/nope/live").status_code == 404


def test_progress_events_change_when_the_best_is_re_timed(api_client, api_db_url):
    """The job page refreshes when a progress event differs: re-timing the best at the end
    must change the event even where neither the trial count nor the time does."""
    job_id, task_id = _driven_job(api_client, api_db_url)
    best = _measurement(32, 0.03)
    _record(api_db_url, task_id, best)
    with init_db(api_db_url)() as session:
        before = dashboard_progress(session, job_id)
        repo.set_task_best(session, task_id, 0.03, best["config"], worker_id=WORKER,
                           measured="retimed", baseline_ms=0.03, baseline_name="torch")
        session.commit()
        after = dashboard_progress(session, job_id)
    assert before["trials_done"] == after["trials_done"] and before != after


def dashboard_progress(session: Any, job_id: str) -> dict[str, Any]:
    from api.dashboard import job_progress

    session.expire_all()
    return job_progress(repo.get_job(session, job_id))


def test_the_csv_export_has_one_row_per_trial_with_its_one_number(api_client, api_db_url):
    job_id, task_id = _driven_job(api_client, api_db_url)
    best = _measurement(32, 0.030, compile_s=2.0)
    _record(api_db_url, task_id, _measurement(16, 0.050),
            _measurement(64, None, "compile_error", 4.0, 'bad "quote", and comma'), best)
    _finish(api_db_url, task_id, best, 0.024, 0.036)
    r = api_client.get(f"/jobs/{job_id}/trials.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert r.headers["content-disposition"] == (
        f'attachment; filename="job-{job_id[:8]}-trials.csv"')
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(t["number"], t["outcome"], t["BLOCK_M"]) for t in rows] == [
        ("1", "ok", "16"), ("2", "compile_error", "64"), ("3", "ok", "32")]
    assert {(t["job_id"], t["task_id"], t["shape"], t["dtype"]) for t in rows} == {
        (job_id, str(task_id), "64x64x32", "float16")}
    first, failed, finalist = rows
    assert (first["ms"], first["measured"], first["trial_p50_ms"]) == ("0.05", "trial", "0.05")
    assert (finalist["ms"], finalist["measured"]) == ("0.024", "retimed")
    assert (finalist["trial_p50_ms"], finalist["retimed_p50_ms"]) == ("0.03", "0.024")
    flops = get_kernel("matmul").flops(DRIVEN)
    assert float(finalist["tflops"]) == pytest.approx(flops / 0.024e-3 / 1e12)
    assert (failed["ms"], failed["tflops"], failed["compile_s"]) == ("", "", "4.0")
    assert failed["error"] == 'bad "quote", and comma'
    assert (first["sm_mhz"], first["mem_mhz"], first["power_w"], first["temp_c"]) == (
        "1980", "2619", "500.0", "60")
    assert first["throttle"] == "4" and first["throttle_reasons"]
    # the API's best is the CSV's re-timed row and the page's headline: one number per config
    task = api_client.get(f"/api/v1/jobs/{job_id}").json()["tasks"][0]
    assert (task["best_ms"], task["best_measured"]) == (0.024, "retimed")
    assert task["best_config"] == {k: int(finalist[k]) for k in task["best_config"]}
    assert _stats(api_client.get(f"/jobs/{job_id}").text)["ms"] == "0.0240 (re-timed)"
    one = api_client.get(f"/jobs/{job_id}/trials.csv", params={"task": task_id}).text
    assert one == r.text
    assert api_client.get(f"/jobs/{job_id}/trials.csv", params={"task": 999}).status_code == 404
    assert api_client.get("/jobs/nope/trials.csv").status_code == 404
    assert f'href="/jobs/{job_id}/trials.csv"' in api_client.get(f"/jobs/{job_id}").text


def test_the_dashboards_reads_in_the_repository(api_client, api_db_url):
    job_id, task_id = _driven_job(api_client, api_db_url)
    other = _job(api_client)
    _record(api_db_url, task_id, _measurement(32, 0.02), _measurement(16, 0.03))
    store(api_db_url, {"M": 16, "N": 16, "K": 16}, 0.1)
    with init_db(api_db_url)() as session:
        rows = repo.trial_columns(session, [task_id])
        assert [(r["task_id"], r["number"], r["config"]["BLOCK_M"]) for r in rows] == [
            (task_id, 1, 32), (task_id, 2, 16)]
        assert set(rows[0]) == set(repo.TRIAL_COLUMNS) and rows[0]["compile_s"] == 1.0
        assert repo.trial_columns(session, []) == []
        assert repo.count_trials(session) == 2
        assert repo.count_best_by_kernel(session) == {"matmul": 1}
        assert [j.id for j in repo.jobs_for_progress(session, [job_id])] == [job_id]
        assert [j.id for j in repo.jobs_for_progress(session, [], active=True)] == [other,
                                                                                     job_id]
        assert repo.jobs_for_progress(session, ["nope"]) == []


def test_one_triton_config_rendering():
    from tuner.config import KernelConfig

    config = {"BLOCK_M": 64, "num_ctas": 2}
    text = triton_config_text(config)
    assert text == "triton.Config({'BLOCK_M': 64}, num_warps=4, num_stages=3, num_ctas=2)"
    c = eval(text, {"triton": triton})  # noqa: S307
    assert (c.kwargs, c.num_warps, c.num_stages, c.num_ctas) == ({"BLOCK_M": 64}, 4, 3, 2)
    kc = KernelConfig(BLOCK_M=64, num_warps=8, num_stages=2)
    assert kc.triton_repr() == triton_config_text(kc)
    built = kc.to_triton()
    pasted = eval(kc.triton_repr(), {"triton": triton})  # noqa: S307
    assert (pasted.kwargs, pasted.num_warps, pasted.num_stages) == (
        built.kwargs, built.num_warps, built.num_stages)


def test_relative_times_are_time_elements_the_script_keeps_current(api_client):
    job_id = _job(api_client)
    html = api_client.get(f"/jobs/{job_id}").text
    stamp = re.search(r'<time datetime="([^"]+)" title="[^"]+" data-ago>(\d+ s ago)</time>',
                      html)
    assert stamp and datetime.fromisoformat(stamp.group(1)).tzinfo is not None
    assert re.search(r'<body data-server-now="[^"]+\+00:00">', html)
    row = _cells(api_client.get("/jobs").text, "jobs")[0]
    assert row[7].endswith(" s ago")


def test_the_jobs_list_labels_a_best_that_is_a_trial_time(api_client, api_db_url):
    job_id, task_id = _driven_job(api_client, api_db_url)
    best = _measurement(32, 0.030)
    _record(api_db_url, task_id, best)

    def best_cell() -> str:
        rows = {r[0]: r for r in _cells(api_client.get("/jobs").text, "jobs")}
        return rows[job_id[:8]][6]

    assert best_cell() == "0.0300 (trial)"
    _finish(api_db_url, task_id, best, 0.024, 0.036)
    assert best_cell() == "0.0240"  # re-timed: the headline, as the API's best_ms
    assert api_client.get(f"/api/v1/jobs/{job_id}").json()["tasks"][0]["best_ms"] == 0.024


def test_a_shape_that_stopped_before_its_trial_cap_shows_as_all_done(api_client, api_db_url):
    job_id, task_id = _driven_job(api_client, api_db_url)
    best = _measurement(32, 0.030)
    _record(api_db_url, task_id, _measurement(16, 0.050), best)
    with init_db(api_db_url)() as session:
        running = dashboard_progress(session, job_id)
    assert running["trials_done"] == 2 and 0 < running["percent"] < 100
    _finish(api_db_url, task_id, best, 0.024, 0.036)  # the search stopped early: the cap
    with init_db(api_db_url)() as session:
        done = dashboard_progress(session, job_id)
    assert done["trials_done"] == 2 and done["tasks_done"] == 1 and done["percent"] == 100.0
