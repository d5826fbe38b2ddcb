"""The dashboard in a real browser: Debian's Chromium driven by Playwright against ``tuner serve``
running as a user starts it (a subprocess, real HTTP, a worker on the Triton CPU interpreter).

Needs ``/usr/bin/chromium`` and the ``playwright`` package (``scripts/test.sh`` installs both);
where either is missing these tests are skipped and say so."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import triton

from db import repo
from tests.api_support import GPU, store
from tests.support_browser import require_chromium, wait_done

require_chromium(allow_module_level=True)
SHAPE = {"M": 32, "N": 16, "K": 16}


def _submit(live_service: dict[str, Any], trials: int, shape: dict[str, int] = SHAPE) -> str:
    r = httpx.post(f"{live_service['base']}/api/v1/jobs", json={
        "kernel": "matmul", "dtype": "float16", "shapes": [shape], "budget": {"trials": trials},
        "force": True})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_overview_loads(page):
    page.goto("/")
    assert page.locator("h1").inner_text() == "Overview"
    assert page.locator(".status-card").count() == 5
    assert page.locator("table.kernels").inner_text().count("matmul") >= 1
    assert page.console_errors == []


def test_a_submitted_job_shows_its_progress_changing_without_a_reload(page, live_service):
    job_id = _submit(live_service, trials=6)
    page.goto("/jobs")
    row = page.locator(f'tr[data-job="{job_id}"]')
    first = row.locator('[data-field="trials"]').inner_text()
    page.evaluate("window.__sameDocument = true")
    # the counter moves as the worker measures, then the job finishes: one document throughout
    page.wait_for_function(
        "([id, first]) => document.querySelector(`tr[data-job='${id}'] [data-field=trials]`)"
        ".textContent !== first", arg=[job_id, first])
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job='${id}'] [data-field=status]`)"
        ".textContent === 'succeeded'", arg=job_id, timeout=240_000)
    assert row.locator('[data-field="trials"]').inner_text() == "6 / 6"
    assert page.evaluate("window.__sameDocument") is True
    assert row.locator("[data-cancel]").count() == 0  # nothing left to cancel
    assert page.console_errors == []


def test_the_job_page_draws_its_charts(page, live_service):
    job_id = _submit(live_service, trials=4, shape={"M": 16, "N": 32, "K": 16})
    wait_done(live_service["base"], job_id)
    page.goto(f"/jobs/{job_id}")
    for chart in ("best", "trials", "importance", "parcoords"):
        page.locator(f'[data-chart="{chart}"] svg.main-svg').first.wait_for()
    # the best-so-far line and the trial markers are drawn as SVG paths
    assert page.locator('[data-chart="best"] .scatterlayer path.js-line').count() >= 1
    assert page.locator('[data-chart="trials"] .scatterlayer path.point').count() == 4
    assert page.locator('[data-chart="parcoords"] .scatterlayer path.js-line').count() >= 1
    assert page.locator("table.top tbody tr").count() == 4
    assert page.console_errors == []


def test_a_running_jobs_page_redraws_its_charts_as_trials_arrive(page, live_service):
    job_id = _submit(live_service, trials=40, shape={"M": 64, "N": 16, "K": 16})
    page.goto(f"/jobs/{job_id}")
    page.evaluate("window.__sameDocument = true")
    points = "document.querySelectorAll('[data-chart=trials] .scatterlayer path.point').length"
    first = page.evaluate(points)
    page.wait_for_function(f"window.__sameDocument && {points} >= {first} + 2")
    assert page.evaluate("window.__sameDocument") is True
    httpx.post(f"{live_service['base']}/api/v1/jobs/{job_id}/cancel")
    assert page.console_errors == []


def test_cancel_from_the_jobs_page(page, live_service):
    job_id = _submit(live_service, trials=200, shape={"M": 48, "N": 16, "K": 16})
    page.goto("/jobs")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f'button[data-cancel="{job_id}"]').click()
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job='${id}'] [data-field=status]`)"
        ".textContent === 'cancelled'", arg=job_id)
    job = httpx.get(f"{live_service['base']}/api/v1/jobs/{job_id}").json()
    assert job["status"] == "cancelled"
    assert page.console_errors == []


def _seed_configs(live_service: dict[str, Any]) -> None:
    store(live_service["db"], {"M": 4096, "N": 4096, "K": 4096}, 0.217)
    store(live_service["db"], {"M": 16, "N": 4096, "K": 4096}, 0.0164,
          config={"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1, "num_warps": 4,
                  "num_stages": 5})
    store(live_service["db"], {"M": 2048, "N": 2048, "K": 2048}, 0.0279, dtype="bfloat16")


def test_the_configs_filter_narrows_the_table(page, live_service):
    _seed_configs(live_service)
    page.goto(f"/configs?device={GPU}")
    rows = page.locator("#configs-table tbody tr[data-kernel]:visible")
    assert rows.count() == 3
    page.select_option("select[name=dtype]", "bfloat16")
    assert rows.count() == 1 and "2048x2048x2048" in rows.first.inner_text()
    page.select_option("select[name=dtype]", "")
    page.fill("input[name=shape]", "16x4096")
    assert rows.count() == 1 and "16x4096x4096" in rows.first.inner_text()
    assert "shape=16x4096" in page.url  # the filtered view has a shareable address
    assert page.console_errors == []


def test_a_copy_button_yields_a_valid_triton_config(page, live_service):
    _seed_configs(live_service)
    page.goto(f"/configs?device={GPU}&shape=16x4096x4096")
    page.locator("#configs-table tbody tr[data-kernel]").first.locator(
        'button[data-copy="triton"]').click()
    page.locator("#copied[data-text]").wait_for()
    text = page.evaluate("navigator.clipboard.readText()")
    assert text == page.locator("#copied").get_attribute("data-text")
    config = eval(text, {"triton": triton})  # noqa: S307 - what a user pastes into autotune
    assert isinstance(config, triton.Config)
    assert config.kwargs == {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1}
    assert (config.num_warps, config.num_stages) == (4, 5)
    assert page.console_errors == []


# -- a job page driven trial by trial: trials written with the repository functions, as a
# worker writes them, while the page is open ---------------------------------------------------

WORKER = "browser-test"
#: ceilings low enough that the tiny shape's floor is a visible share of its time
CALIBRATION = {"copy_gbps": 2.0, "matmul_tflops": 0.05}
DRIVEN_SHAPE = {"M": 64, "N": 64, "K": 32}


def _trial(block_m: int, outcome: str = "ok", ms: float | None = None, compile_s: float = 1.0,
           error: str | None = None, sm_mhz: int = 1980) -> dict[str, Any]:
    """A measurement as ``Measurement.to_dict()`` gives it, with the GPU's state."""
    config = {"BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4,
              "num_stages": 2}
    times = {"p20_ms": ms * 0.98, "p50_ms": ms, "p80_ms": ms * 1.03} if ms else {}
    return {"config": config, "outcome": outcome, "error": error, "compile_s": compile_s,
            **times, "extra": {"gpu": {"sm_mhz": sm_mhz, "mem_mhz": 2619, "power_w": 512.0,
                                       "temp_c": 61, "throttle": 0}}}


class Driver:
    """Runs one shape of a job as a worker would, through ``db.repo``: start it, record trials,
    store the re-timed best with its baseline, finish it."""

    def __init__(self, live_service: dict[str, Any], device: str, *, kernel: str = "matmul",
                 shape: dict[str, int] = DRIVEN_SHAPE, budget: int = 6,
                 kind: str = "cuda") -> None:
        from db.engine import init_db

        self.factory = init_db(live_service["db"])
        self.device = device
        with self.factory() as session:
            repo.upsert_device(session, {"key": device, "kind": kind, "name": "Test GPU"})
            repo.set_calibration(session, device, **CALIBRATION)
            session.commit()
        r = httpx.post(f"{live_service['base']}/api/v1/jobs", json={
            "kernel": kernel, "dtype": "float16", "shapes": [shape], "force": True,
            "budget": {"trials": budget}, "device": device})
        assert r.status_code == 202, r.text
        self.job_id = str(r.json()["id"])
        with self.factory() as session:
            self.task_id = repo.get_job(session, self.job_id).tasks[0].id
        self.number = 0

    def start(self) -> None:
        with self.factory() as session:
            repo.start_task_locally(session, self.task_id, WORKER)
            repo.set_task_device(session, self.task_id, self.device)
            session.commit()

    def record(self, *measurements: dict[str, Any]) -> None:
        with self.factory() as session:
            for m in measurements:
                self.number += 1
                repo.record_trial(session, self.task_id, self.number, m, worker_id=WORKER)
            session.commit()

    def finish(self, best: dict[str, Any], retimed_ms: float, baseline_ms: float,
               stop_reason: str | None = None) -> None:
        with self.factory() as session:
            repo.record_retimed(session, self.task_id, [
                {"config": best["config"], "outcome": "ok", "p20_ms": retimed_ms * 0.99,
                 "p50_ms": retimed_ms, "p80_ms": retimed_ms * 1.01}])
            repo.set_task_best(session, self.task_id, retimed_ms, best["config"],
                               worker_id=WORKER, measured="retimed", baseline_ms=baseline_ms,
                               baseline_name="torch")
            repo.finish_task(session, self.task_id, "succeeded", worker_id=WORKER,
                             **({"stop_reason": stop_reason} if stop_reason else {}))
            session.commit()


def _text(page: Any, selector: str) -> str:
    return str(page.locator(selector).first.inner_text()).strip()


def _wait_text(page: Any, selector: str, text: str) -> None:
    page.wait_for_function(
        "([sel, text]) => { const el = document.querySelector(sel);"
        " return !!el && el.textContent.trim() === text; }", arg=[selector, text])


def _live_texts(page: Any) -> dict[str, str]:
    """The text of every part of a job page that follows the trials, relative times left out
    (they count on by the second)."""
    return page.evaluate("""() => {
        const out = {};
        document.querySelectorAll('[data-live]').forEach((el, i) => {
            const copy = el.cloneNode(true);
            copy.querySelectorAll('time').forEach(t => t.remove());
            out[i + ':' + el.dataset.live] = copy.textContent.replace(/\\s+/g, ' ').trim();
        });
        return out;
    }""")


def test_every_number_on_a_running_job_page_follows_its_trials(page, live_service):
    from search_spaces import get_kernel
    from tuner.roofline import floor_ms

    drive = Driver(live_service, "cuda:Test GPU live:sm90")
    page.goto(f"/jobs/{drive.job_id}")
    page.evaluate("window.__sameDocument = true")
    head = "section.shape [data-live=head]"
    assert "0 trials (none yet)" in _text(page, head)
    assert "No successful trial yet" in _text(page, head)
    assert _text(page, "table.trials tbody") == "no trial yet"
    # an empty chart's placeholder stays in its box, above the next heading (it overlapped it)
    empty = page.locator('[data-chart="parcoords"] .chart-empty')
    empty.wait_for()
    box = page.locator('[data-chart="parcoords"]').bounding_box()
    text_box = empty.bounding_box()
    below = page.locator("section.shape [data-live=top] h3").first.bounding_box()
    assert box["y"] <= text_box["y"] and text_box["y"] + text_box["height"] <= box["y"] + box[
        "height"] <= below["y"]

    drive.start()
    drive.record(_trial(16, ms=0.050, compile_s=1.0))
    _wait_text(page, "section.shape [data-field=count]", "1")
    assert "1 ok" in _text(page, head) and "0.0500 ms" in _text(page, head)
    _wait_text(page, "#job-status", "running")
    best = _trial(32, ms=0.030, compile_s=2.0, sm_mhz=1755)
    drive.record(_trial(64, "compile_error", compile_s=3.0,
                        error="out of shared memory: 262144 > 232448"), best)
    _wait_text(page, "section.shape [data-field=count]", "3")
    assert page.locator("table.trials tbody tr[data-outcome]").count() == 3
    assert _text(page, "[data-field=failures]") == "1"
    assert page.locator("table.failures").inner_text().count("out of shared memory") == 1
    assert _text(page, "[data-field=stat-ms]") == "0.0300 (trial)"
    assert _text(page, "[data-field=trials]") == "3 / 6"
    page.locator('[data-chart="trials"] .scatterlayer path.point').nth(2).wait_for()

    drive.finish(best, retimed_ms=0.025, baseline_ms=0.040)
    _wait_text(page, "#job-status", "succeeded")
    _wait_text(page, "[data-field=stat-ms]", "0.0250 (re-timed)")
    kernel = get_kernel("matmul")
    tflops = kernel.flops(DRIVEN_SHAPE) / 0.025e-3 / 1e12
    gbps = kernel.bytes(DRIVEN_SHAPE, "float16") / 0.025e-3 / 1e9
    floor = floor_ms(kernel, DRIVEN_SHAPE, "float16", **CALIBRATION)
    assert floor is not None
    assert _text(page, "[data-field=stat-tflops]") == f"{tflops:.2f}"
    assert _text(page, "[data-field=stat-gbps]") == f"{gbps:.1f}"
    assert _text(page, "[data-field=stat-of-roof]").startswith(f"{100 * floor / 0.025:.1f}%")
    assert _text(page, "[data-field=stat-floor]") == f"{floor:.4f}"
    assert _text(page, "[data-field=stat-baseline]") == "0.0400"
    assert _text(page, "[data-field=stat-vs]") == "1.60x"
    assert _text(page, "[data-field=stat-compile]").startswith("2.00 / 3.00")
    assert _text(page, "[data-field=stat-compile-total]") == "6.0"
    assert "1.60x vs torch" in _text(page, head)
    assert "re-timed beside the other finalists" in _text(page, head)
    # the best's row: its one number is the re-timed one, labelled; its trial time stays too
    best_row = page.locator("table.trials tbody tr.best")
    assert best_row.locator("[data-field=ms]").inner_text().strip() == "0.0250 re-timed"
    assert page.locator("table.top [data-field=retimed-ms]").first.inner_text() == "0.0250"
    assert page.locator("[data-live=job] [data-field=finished]").count() == 1
    assert page.locator(".cancel-form").count() == 0
    assert page.evaluate("window.__sameDocument") is True
    # what the live page shows is what a fresh load of it shows
    shown = _live_texts(page)
    fresh = page.context.new_page()
    fresh.goto(f"/jobs/{drive.job_id}")
    assert _live_texts(fresh) == shown
    fresh.close()
    assert page.console_errors == []


def test_the_trials_table_sorts_filters_and_exports_csv(page, live_service):
    drive = Driver(live_service, "cuda:Test GPU table:sm90")
    drive.start()
    best = _trial(64, ms=0.011, compile_s=0.5)
    drive.record(_trial(16, ms=0.040, compile_s=1.25), _trial(32, ms=0.020),
                 _trial(128, "compile_error", error="out of resources: shared memory"), best,
                 _trial(16, ms=0.030, sm_mhz=1410) | {"config": {
                     **best["config"], "BLOCK_M": 16, "num_warps": 8}})
    drive.finish(best, retimed_ms=0.012, baseline_ms=0.015)
    page.goto(f"/jobs/{drive.job_id}")
    rows = page.locator("table.trials tbody tr[data-outcome]:visible")
    assert rows.count() == 5

    def index(name: str) -> int:
        return [t.strip() for t in page.locator("table.trials thead th").all_inner_texts()
                ].index(name)

    def column(name: str) -> list[str]:
        return [r.locator("td").nth(index(name)).inner_text().split()[0] for r in rows.all()]

    page.locator("table.trials thead th").nth(index("ms")).click()
    assert column("ms") == ["0.0120", "0.0200", "0.0300", "0.0400", "-"]  # blanks last
    page.locator("table.trials thead th").nth(index("ms")).click()
    assert column("ms") == ["0.0400", "0.0300", "0.0200", "0.0120", "-"]
    assert page.locator('table.trials th[aria-sort="descending"]').inner_text().startswith("ms")
    page.fill("[data-controls] input[name=q]", "BLOCK_M=16")
    assert column("#") == ["1", "5"]
    assert _text(page, "[data-controls] [data-field=shown]") == "2 of 5 trials shown"
    page.fill("[data-controls] input[name=q]", "BLOCK_M=16 num_warps=8")
    assert column("#") == ["5"]
    page.fill("[data-controls] input[name=q]", "")
    page.select_option("[data-controls] select[name=outcome]", "compile_error")
    assert column("#") == ["3"]
    page.select_option("[data-controls] select[name=outcome]", "")
    assert rows.count() == 5

    best = page.locator("table.trials tbody tr.best")
    assert best.count() == 1 and best.locator("td").first.inner_text() == "4"
    assert "shared memory" in page.locator("table.trials tbody tr[data-outcome=compile_error]"
                                            " td.reason").inner_text()

    with page.expect_download() as download:
        page.locator("a[data-csv]").click()
    path = download.value.path()
    assert download.value.suggested_filename == f"job-{drive.job_id[:8]}-trials.csv"
    with open(path, newline="") as f:
        trials = list(csv.DictReader(f))
    assert [t["number"] for t in trials] == ["1", "2", "3", "4", "5"]
    assert [t["outcome"] for t in trials] == ["ok", "ok", "compile_error", "ok", "ok"]
    assert [t["BLOCK_M"] for t in trials] == ["16", "32", "128", "64", "16"]
    assert trials[4]["num_warps"] == "8" and trials[4]["sm_mhz"] == "1410"
    finalist = trials[3]
    assert (finalist["ms"], finalist["measured"]) == ("0.012", "retimed")
    assert (finalist["trial_p50_ms"], finalist["retimed_p50_ms"]) == ("0.011", "0.012")
    assert (trials[0]["ms"], trials[0]["measured"]) == ("0.04", "trial")
    assert trials[0]["compile_s"] == "1.25" and trials[0]["mem_mhz"] == "2619"
    flops = 2 * DRIVEN_SHAPE["M"] * DRIVEN_SHAPE["N"] * DRIVEN_SHAPE["K"]
    assert float(trials[0]["tflops"]) == pytest.approx(flops / 0.04e-3 / 1e12)
    assert float(trials[0]["gbps"]) > 0
    assert (trials[2]["ms"], trials[2]["measured"], trials[2]["tflops"]) == ("", "", "")
    assert "shared memory" in trials[2]["error"]
    assert {t["shape"] for t in trials} == {"64x64x32"}
    assert page.console_errors == []


def test_cancel_asks_first_and_relative_times_count_on(page, live_service):
    drive = Driver(live_service, "cuda:Test GPU cancel:sm90")  # no worker has it: it stays queued
    page.goto(f"/jobs/{drive.job_id}")
    created = page.locator("[data-live=job] time[data-ago]").first
    before = created.inner_text()
    page.wait_for_function("([el, text]) => el.textContent !== text",
                           arg=[created.element_handle(), before])
    assert created.inner_text().endswith(" s ago")
    dialogs: list[str] = []

    def answer(dialog: Any, accept: bool) -> None:
        dialogs.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda d: answer(d, False))
    page.locator("button[data-cancel]").click()
    _wait_text(page, "#cancel-message", "Not cancelled.")
    assert httpx.get(f"{live_service['base']}/api/v1/jobs/{drive.job_id}").json()[
        "status"] == "queued"
    page.once("dialog", lambda d: answer(d, True))
    page.locator("button[data-cancel]").click()
    _wait_text(page, "#job-status", "cancelled")
    assert httpx.get(f"{live_service['base']}/api/v1/jobs/{drive.job_id}").json()[
        "status"] == "cancelled"
    assert len(dialogs) == 2 and drive.job_id[:8] in dialogs[0]
    assert page.locator(".cancel-form").count() == 0
    assert page.console_errors == []


def test_an_expanded_config_stays_inside_the_configs_table(page, live_service):
    _seed_configs(live_service)
    page.goto(f"/configs?device={GPU}")
    row = page.locator("#configs-table tbody tr[data-kernel]").first
    row.locator("summary").click()
    table = page.locator("#configs-table").bounding_box()
    main = page.locator("main").bounding_box()
    for pre in row.locator("pre").all():
        box = pre.bounding_box()
        assert box["x"] + box["width"] <= table["x"] + table["width"]
    assert table["x"] + table["width"] <= main["x"] + main["width"] + 1
    assert page.console_errors == []


def test_a_shape_of_many_trials_pages_through_all_of_them(page, live_service):
    """The table holds every trial, a page of rows at a time: sorting and filtering work over
    all of them, not over the page shown (nor over the rows the server's HTML lists)."""
    drive = Driver(live_service, "cuda:Test GPU many:sm90")
    drive.start()
    drive.record(*(_trial(16 if n % 2 else 32, ms=0.010 + n * 0.001) for n in range(130)))
    page.goto(f"/jobs/{drive.job_id}")
    rows = page.locator("table.trials tbody tr[data-outcome]")
    shown = "[data-controls] [data-field=shown]"
    assert rows.count() == 100 and _text(page, shown) == "130 trials (rows 1-100)"
    page.locator("[data-pager] [data-page='1']").click()
    assert rows.count() == 30 and _text(page, shown) == "130 trials (rows 101-130)"
    assert rows.first.locator("td").first.inner_text() == "101"
    ms = [h.strip() for h in page.locator("table.trials thead th").all_inner_texts()].index("ms")
    page.locator("table.trials thead th").nth(ms).click()
    page.locator("table.trials thead th").nth(ms).click()  # slowest first, over all 130
    assert rows.first.locator("td").first.inner_text() == "130"
    page.fill("[data-controls] input[name=q]", "BLOCK_M=16")
    assert rows.count() == 65 and _text(page, shown) == "65 of 130 trials shown"
    assert page.locator("[data-pager]").is_hidden()
    assert page.console_errors == []


# -- issue 32 item 9: what a job page and a kernel page show, on one seeded database and one page
# at 1280 px ------------------------------------------------------------------------------------

LONG_REASON = ("out of resources: shared memory, Required: 262144, Hardware limit: 232448. "
               "Reducing block sizes or `num_stages` may help. ") * 3
INTERPRETER = "interpret:test-cpu"


def _softmax_trial(programs: int, ms: float) -> dict[str, Any]:
    config = {"BLOCK_N": 256, "ROWS": 1, "SPLIT": 1, "PROGRAMS_PER_SM": programs, "EVICT": 0,
              "SYNC": 0, "num_warps": 4, "num_stages": 1}
    return {"config": config, "outcome": "ok", "error": None, "compile_s": 0.2,
            "p20_ms": ms * 0.98, "p50_ms": ms, "p80_ms": ms * 1.02, "extra": {}}


@pytest.fixture(scope="module")
def seeded(live_service: dict[str, Any]) -> dict[str, str]:
    """A matmul job on a GPU that stopped early (converged) after 6 of its 48 trials, one of
    them a failure with a long reason and one a run timeout; a softmax job on the CPU
    interpreter (long parameter names, a baseline ratio that means nothing there) and a best
    config stored from the interpreter."""
    gpu = Driver(live_service, "cuda:Test GPU issue32:sm90", budget=48)
    gpu.start()
    best = _trial(64, ms=0.011)
    gpu.record(_trial(16, ms=0.040), _trial(32, ms=0.020),
               _trial(128, "out_of_resources", error=LONG_REASON), best,
               _trial(16, "timeout", error="run timed out: no answer within 2 s"),
               _trial(32, ms=0.025) | {"config": {**best["config"], "num_warps": 8}})
    gpu.finish(best, retimed_ms=0.012, baseline_ms=0.015, stop_reason="converged")
    cpu = Driver(live_service, INTERPRETER, kernel="softmax", shape={"M": 64, "N": 256},
                 kind="interpret")
    cpu.start()
    ok = [_softmax_trial(p, ms) for p, ms in ((0, 3.0), (1, 2.5), (2, 4.0), (4, 2.0))]
    cpu.record(*ok)
    cpu.finish(ok[-1], retimed_ms=2.0, baseline_ms=0.004)
    store(live_service["db"], {"M": 64, "N": 256, "K": 64}, 3.0, device=INTERPRETER,
          kind="interpret")
    return {"gpu": gpu.job_id, "cpu": cpu.job_id}


@pytest.fixture(scope="module")
def narrow(browser: Any, live_service: dict[str, Any]) -> Iterator[Any]:
    """One page at 1280x900 for the tests below (they only read)."""
    from tests.support_browser import new_page

    context = browser.new_context(base_url=live_service["base"],
                                  viewport={"width": 1280, "height": 900})
    page, errors = new_page(context)
    page.set_default_timeout(15_000)
    page.console_errors = errors
    yield page
    context.close()


def _open(page: Any, path: str, chart: str | None = None) -> None:
    """``path`` on the shared page, loaded once for the tests reading it in turn."""
    if not page.url.endswith(path):
        page.goto(path)
    if chart:
        page.locator(f'[data-chart="{chart}"] svg.main-svg').first.wait_for()


def _box_of(page: Any, selector: str) -> dict[str, float]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, selector
    return dict(box)


def test_the_trials_table_fits_the_window(narrow, seeded):
    _open(narrow, f"/jobs/{seeded['gpu']}")
    reason = narrow.locator("table.trials tbody tr[data-outcome=out_of_resources] td.reason")
    box = reason.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1280
    assert narrow.evaluate("document.documentElement.scrollWidth") <= 1280
    assert narrow.console_errors == []


def test_the_importance_chart_shows_whole_parameter_names(narrow, seeded):
    _open(narrow, f"/jobs/{seeded['cpu']}", "importance")
    chart = _box_of(narrow, '[data-chart="importance"]')
    labels = narrow.locator('[data-chart="importance"] .ytick text')
    assert "PROGRAMS_PER_SM" in [label.text_content() for label in labels.all()]
    for label in labels.all():
        assert label.bounding_box()["x"] >= chart["x"], label.text_content()
    assert narrow.console_errors == []


def test_the_trial_axis_title_clears_the_legend(narrow, seeded):
    _open(narrow, f"/jobs/{seeded['gpu']}", "trials")
    title = _box_of(narrow, '[data-chart="trials"] .g-xtitle text')
    legend = _box_of(narrow, '[data-chart="trials"] .legend')
    assert (title["y"] + title["height"] <= legend["y"]
            or legend["y"] + legend["height"] <= title["y"])


def test_a_timeout_is_drawn_at_its_limit_with_its_own_marker(narrow, seeded):
    _open(narrow, f"/jobs/{seeded['gpu']}", "trials")
    traces = narrow.evaluate("""() => document.querySelector('[data-chart="trials"]').data
        .map(t => ({name: t.name, y: t.y, symbol: t.marker.symbol}))""")
    by_name = {t["name"]: t for t in traces}
    assert by_name["timeout"]["y"] == [2000]  # the 2 s limit, in ms
    assert by_name["timeout"]["symbol"] not in {by_name["ok"]["symbol"],
                                                by_name["out_of_resources"]["symbol"]}


def test_a_search_that_stopped_early_says_why(narrow, seeded):
    _open(narrow, f"/jobs/{seeded['gpu']}")
    assert "6 / 48" in _text(narrow, "[data-field=trials]")
    assert "stopped early: converged" in _text(narrow, "[data-live=job]")
    assert "stopped early: converged" in _text(narrow, "section.shape [data-live=head]")


def test_interpreter_timings_are_badged_and_give_no_throughput(narrow, seeded):
    _open(narrow, f"/jobs/{seeded['cpu']}")
    head = _text(narrow, "section.shape [data-live=head]")
    assert "not GPU timings" in head
    assert "0.00x" not in head
    for field in ("stat-tflops", "stat-gbps", "stat-vs"):
        assert _text(narrow, f"[data-field={field}]") == "-", field
    heads = [h.strip() for h in narrow.locator("table.trials thead th").all_inner_texts()]
    for row in narrow.locator("table.trials tbody tr[data-outcome]").all():
        cells = row.locator("td")
        assert cells.nth(heads.index("TFLOP/s")).inner_text() == "-"
        assert cells.nth(heads.index("GB/s")).inner_text() == "-"
    assert narrow.console_errors == []


def test_the_kernel_page_renders_its_docs_and_names_its_variants(narrow, seeded):
    _open(narrow, "/kernels/matmul")
    constraints = narrow.locator("h3:has-text('Constraints') + ul")
    text = constraints.inner_text()
    assert "``" not in text and "None otherwise" not in text
    assert constraints.locator("code").count() >= 1
    variant = narrow.locator("table.space tr", has_text="VARIANT").inner_text()
    assert "tiled" in variant and "split_k" in variant
    row = narrow.locator(f'#configs-table tr[data-device="{INTERPRETER}"]')
    assert "not GPU timings" in row.inner_text()
    heads = [h.strip() for h in narrow.locator("#configs-table thead th").all_inner_texts()]
    assert row.locator("td").nth(heads.index("TFLOP/s")).inner_text() == "-"
    assert narrow.console_errors == []
