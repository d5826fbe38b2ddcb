"""``tuner.install()``: a real library kernel (fla-core's ``l2norm_fwd_kernel``, under fla's own
``CachedAutotuner``, launched by fla's ``l2norm_fwd``), unchanged, gets its config from an
exported configs file or the service (the real app on a real socket) on the first launch of
each key; pinned mode never benchmarks; a miss is reported once; a dead service costs the
deadline once; answers for another Triton, GPU or kernel version are never used;
``uninstall`` gives Triton its autotuner back; ``python -m tuner.run`` and ``TUNER_INSTALL=1``
hook kernels imported after them."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import triton
from fla.modules.norm.l2norm import l2norm_fwd, l2norm_fwd_kernel

import tuner
from db import repo
from db.engine import init_db
from tests.api_support import INTERPRETER, register_devices, running_app
from tests.corpus import generator, randn
from tests.plugins import ROOT, registered
from tests.test_client import CountingTransport
from tuner.client import TunerClient
from tuner.config import KernelConfig
from tuner.configs_file import ConfigsEntry, write_tuner
from tuner.identity import local_triton_version
from tuner.installing import ServedCache, kernel_name, kernel_version, sources
from tuner.settings import Settings
from tuner.user_kernel import config_from_triton

NAME = kernel_name(l2norm_fwd_kernel)
VERSION = kernel_version(l2norm_fwd_kernel)
LISTED = [config_from_triton(c) for c in l2norm_fwd_kernel.configs]
#: a listed config that is not the first (the first is what pinned mode falls back to)
SERVED = LISTED[7]
#: rows of width D: fla buckets the rows into NB (1 for fewer than 65,536)
D_SERVED, D_OTHER = 24, 40


def key(d: int) -> tuple[Any, ...]:
    """Triton's key of ``l2norm_fwd`` on fp32 rows of width ``d``: (D, NB, x, y, rstd dtypes)."""
    return (d, 1, "torch.float32", "torch.float32", "torch.float32")


def launch(d: int, rows: int = 37) -> None:
    x = torch.randn(rows, d)
    y, _ = l2norm_fwd(x)
    assert torch.allclose(y, x / x.norm(dim=-1, keepdim=True), atol=1e-5)


def entry(d: int = D_SERVED, config: KernelConfig = SERVED, **identity: str) -> ConfigsEntry:
    fields = {"kernel": NAME, "kernel_version": VERSION, "device": INTERPRETER,
              "triton_version": local_triton_version() or "", **identity}
    return ConfigsEntry(dtype="float32", shape={"D": d, "NB": 1}, config=config, ms=0.01,
                        **fields)


def configs_file(tmp_path: Path, *entries: ConfigsEntry) -> Path:
    path = tmp_path / "exported.json"
    write_tuner(entries, path)
    return path


class Bench:
    """Triton's timer on the CPU (wall time), counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn: Any, quantiles: Any = None, **_: Any) -> Any:
        self.calls += 1
        started = time.perf_counter()
        fn()
        ms = (time.perf_counter() - started) * 1e3
        return [ms] * len(quantiles) if quantiles else ms


@pytest.fixture
def bench() -> Iterator[Bench]:
    """fla's kernel as a fresh process has it (nothing decided), timed by a counting CPU
    stand-in; afterwards uninstalled and the client forgotten."""
    counter = Bench()
    l2norm_fwd_kernel.cache = {}
    l2norm_fwd_kernel.__dict__["do_bench"] = counter  # Triton's cached_property
    yield counter
    tuner.uninstall()
    tuner.configure(url="", configs_file="", client=None)
    l2norm_fwd_kernel.cache = {}
    del l2norm_fwd_kernel.__dict__["do_bench"]


def chosen(d: int) -> KernelConfig:
    return config_from_triton(l2norm_fwd_kernel.cache[key(d)])


def test_a_config_from_the_configs_file_is_used_on_the_first_launch(bench, tmp_path):
    tuner.configure(client=TunerClient("", configs_file=configs_file(tmp_path, entry())))
    tuner.install(pinned=False)
    assert isinstance(l2norm_fwd_kernel.cache, ServedCache)  # built before install: hooked
    launch(D_SERVED)
    launch(D_SERVED, rows=50)  # the same key: decided
    assert sources(l2norm_fwd_kernel) == {key(D_SERVED): "file"}
    assert chosen(D_SERVED) == SERVED and bench.calls == 0
    launch(D_OTHER)  # in no store: Triton benchmarks its list
    assert sources(l2norm_fwd_kernel)[key(D_OTHER)] == "triton"
    assert bench.calls == len(LISTED)


def test_pinned_mode_never_benchmarks(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_PINNED", "1")
    tuner.configure(client=TunerClient("", configs_file=configs_file(tmp_path, entry())))
    tuner.install()
    launch(D_SERVED)
    launch(D_OTHER)
    assert sources(l2norm_fwd_kernel) == {key(D_SERVED): "file", key(D_OTHER): "pinned"}
    assert chosen(D_SERVED) == SERVED and chosen(D_OTHER) == LISTED[0]
    assert bench.calls == 0


def test_an_answer_for_another_triton_gpu_or_kernel_version_is_never_used(bench, tmp_path):
    wrong = [entry(triton_version="2.9.0"), entry(device="cuda:NVIDIA H100 80GB HBM3:sm90"),
             entry(kernel_version="0123456789ab")]
    tuner.configure(client=TunerClient("", configs_file=configs_file(tmp_path, *wrong)))
    tuner.install(pinned=True)
    launch(D_SERVED)
    assert sources(l2norm_fwd_kernel) == {key(D_SERVED): "pinned"}
    assert chosen(D_SERVED) == LISTED[0] and bench.calls == 0


def test_a_config_outside_the_list_is_used_if_it_sets_the_lists_parameters(bench, tmp_path,
                                                                           caplog):
    unlisted = KernelConfig(BT=4, num_warps=2, num_stages=1)
    foreign = KernelConfig(BLOCK=64, num_warps=2, num_stages=1)
    assert unlisted not in LISTED
    tuner.configure(client=TunerClient("", configs_file=configs_file(
        tmp_path, entry(config=unlisted), entry(D_OTHER, config=foreign))))
    tuner.install(pinned=True)
    with caplog.at_level(logging.WARNING, logger="tuner.installing"):
        launch(D_SERVED)
        launch(D_OTHER)
        launch(D_OTHER + 8)
    assert sources(l2norm_fwd_kernel) == {key(D_SERVED): "file", key(D_OTHER): "pinned",
                                          key(D_OTHER + 8): "pinned"}
    assert chosen(D_SERVED) == unlisted and chosen(D_OTHER) == LISTED[0]
    assert [r.getMessage() for r in caplog.records] == [
        f"{NAME}: the served config {foreign.key()} sets other parameters than the kernel's "
        "configs; Triton's autotuning decides (shown once per kernel)"]


def test_a_served_config_that_fails_to_launch_is_left_to_triton(bench, tmp_path, caplog):
    jit = l2norm_fwd_kernel.fn
    broken = KernelConfig(BT=3, num_warps=2, num_stages=3)  # tl.arange: not a power of 2
    tuner.configure(client=TunerClient("", configs_file=configs_file(
        tmp_path, entry(config=broken), entry(D_OTHER))))
    tuner.install(pinned=False)
    with caplog.at_level(logging.WARNING, logger="tuner.installing"):
        launch(D_SERVED)  # the output is checked there
        launch(D_OTHER)
    assert sources(l2norm_fwd_kernel) == {key(D_SERVED): "triton", key(D_OTHER): "file"}
    assert bench.calls == len(LISTED) and chosen(D_SERVED) in LISTED
    assert chosen(D_OTHER) == SERVED and l2norm_fwd_kernel.fn is jit
    [warning] = [r.getMessage() for r in caplog.records]
    assert "the launch with the served config failed" in warning


def test_a_tuner_autotune_kernel_is_looked_up_once_under_its_own_name(bench, tmp_path):
    """``tuner.autotune`` asked under its name already; its fallback, Triton's autotuner, is not
    served again under the jit function's qualified name (whose entry the file has)."""
    from tuner.autotuning import Autotuned

    tuner.configure(client=TunerClient("", configs_file=configs_file(tmp_path, entry())))
    tuner.install(pinned=False)
    kernel = Autotuned(l2norm_fwd_kernel.fn, l2norm_fwd_kernel.configs, ["D", "NB"],
                       "l2norm_own_name", {"do_bench": bench})
    x = torch.randn(37, D_SERVED)
    y, rstd = torch.empty_like(x), torch.empty(37)
    kernel[lambda meta: (triton.cdiv(37, meta["BT"]),)](x, y, rstd, 1e-6, 37, D=D_SERVED,
                                                         BD=32, NB=1)
    assert torch.allclose(y, x / x.norm(dim=-1, keepdim=True), atol=1e-5)
    assert kernel.sources == {("float32", (("D", D_SERVED), ("NB", 1))): "triton"}
    assert sources(kernel._triton) == {key(D_SERVED): "triton"}
    assert bench.calls == len(LISTED)


def test_uninstall_gives_triton_its_autotuner_back(bench, tmp_path):
    from triton.runtime.autotuner import Autotuner

    plain_init = Autotuner.__init__
    tuner.configure(client=TunerClient("", configs_file=configs_file(
        tmp_path, entry(), entry(D_OTHER))))
    tuner.install(pinned=True)
    assert Autotuner.__init__ is not plain_init
    launch(D_SERVED)
    tuner.uninstall()
    assert Autotuner.__init__ is plain_init and type(l2norm_fwd_kernel.cache) is dict
    assert chosen(D_SERVED) == SERVED  # decided stays decided
    launch(D_OTHER)  # in the file, but Triton's own autotuning decides again
    assert bench.calls == len(LISTED)


# -- the service: the real app, the kernel registered under its qualified name ----------------

def _l2norm_inputs(shape: dict[str, int], dtype: str, device: str, seed: int) -> dict[str, Any]:
    return {"x": randn(generator(device, seed), 37, shape["D"], dtype=dtype, device=device)}


#: fla's kernel as the service knows it: its qualified name, its key as dimensions
L2NORM = tuner.Kernel(l2norm_fwd_kernel, name=NAME, call=lambda a: l2norm_fwd(a["x"]),
                      call_inputs=_l2norm_inputs, outputs=["y", "rstd"],
                      dims={"D": (1, 512), "NB": (1, 64)})


@pytest.fixture
def service(tmp_path: Path, bench: Bench) -> Iterator[tuple[str, str]]:
    db_url = f"sqlite:///{tmp_path / 'install.db'}"
    with registered(extra_refs="tests.test_install:L2NORM"), running_app(
            Settings(database_url=db_url)) as url:
        register_devices(db_url, INTERPRETER)
        yield url, db_url


def store(db_url: str, d: int, config: KernelConfig) -> None:
    with init_db(db_url)() as session:
        repo.store_best(session, device_key=INTERPRETER, kernel=NAME, kernel_version=VERSION,
                        dtype="float32", shape={"D": d, "NB": 1},
                        triton_version=local_triton_version() or "", config=config.to_dict(),
                        p20_ms=0.01, p50_ms=0.01, p80_ms=0.01, tflops=None, gbps=None,
                        torch_version=None, cuda_version=None, task_id=None)
        session.commit()


def test_a_config_from_the_service_is_used_and_a_miss_reported_once(service, bench):
    url, db_url = service
    store(db_url, D_SERVED, SERVED)
    transport = CountingTransport()
    tuner.configure(client=TunerClient(url, transport=transport, report_misses=True,
                                       client_name="model-a"))
    tuner.install(pinned=True)
    launch(D_SERVED)
    launch(D_OTHER)
    launch(D_OTHER, rows=50)  # the same key: not asked again
    assert sources(l2norm_fwd_kernel) == {key(D_SERVED): "service", key(D_OTHER): "pinned"}
    assert chosen(D_SERVED) == SERVED and bench.calls == 0
    assert transport.paths == ["/api/v1/configs/query"] * 2
    [miss] = httpx.get(f"{url}/api/v1/misses").json()["data"]
    assert miss["kernel"] == NAME and miss["shape"] == {"D": D_OTHER, "NB": 1}
    assert miss["count"] == 1


def test_a_restart_asks_every_key_of_the_last_process_in_one_request(service, bench,
                                                                     tmp_path):
    """The keys file: a process's lookups are remembered; the next process's first lookup
    asks them all at once, and its later first launches ask nothing."""
    url, db_url = service
    store(db_url, D_SERVED, SERVED)
    keys = tmp_path / "keys.json"
    first = CountingTransport()
    tuner.configure(client=TunerClient(url, transport=first, keys_file=keys))
    tuner.install(pinned=True)
    launch(D_SERVED)
    launch(D_OTHER)
    assert first.paths == ["/api/v1/configs/query"] * 2
    assert len(json.loads(keys.read_text())) == 2
    tuner.uninstall()  # a fresh process: nothing decided
    l2norm_fwd_kernel.cache = {}
    again = CountingTransport()
    tuner.configure(client=TunerClient(url, transport=again, keys_file=keys))
    tuner.install(pinned=True)
    launch(D_OTHER)
    launch(D_SERVED)
    assert again.paths == ["/api/v1/configs/query"]
    assert sources(l2norm_fwd_kernel) == {key(D_OTHER): "pinned", key(D_SERVED): "service"}
    assert chosen(D_SERVED) == SERVED and bench.calls == 0


def test_a_keys_file_naming_a_lookup_the_service_refuses_is_started_anew(service, bench,
                                                                         tmp_path):
    url, db_url = service
    store(db_url, D_SERVED, SERVED)
    keys = tmp_path / "keys.json"
    stale = {"kernel": "gone", "dtype": "float32", "shape": {"D": 8}, "device": INTERPRETER,
             "kernel_version": "0", "triton_version": local_triton_version()}
    keys.write_text(json.dumps({"gone|float32": stale}))
    transport = CountingTransport()
    tuner.configure(client=TunerClient(url, transport=transport, keys_file=keys))
    tuner.install(pinned=True)
    launch(D_SERVED)
    assert sources(l2norm_fwd_kernel) == {key(D_SERVED): "service"}
    assert transport.paths == ["/api/v1/configs/query"] * 2  # refused, then asked alone
    assert "gone" not in keys.read_text()


def served_in_a_fresh_process(url: str, d: int, config: KernelConfig) -> None:
    """As a fresh process (nothing decided, hooked anew): the first launch of ``D=d`` takes
    ``config`` from the service."""
    tuner.uninstall()
    l2norm_fwd_kernel.cache = {}
    tuner.configure(client=TunerClient(url))
    tuner.install(pinned=False)
    launch(d)
    assert sources(l2norm_fwd_kernel) == {key(d): "service"}
    assert chosen(d) == config


def stored_best(db_url: str, d: int) -> tuple[KernelConfig, str | None]:
    """The stored best of ``D=d`` (the only device and version here): config and label."""
    from db.models import BestConfig

    with init_db(db_url)() as session:
        [row] = [r for r in session.query(BestConfig).all() if r.shape == {"D": d, "NB": 1}]
        return KernelConfig(row.config), row.measured


def test_what_triton_measured_is_stored_client_measured_below_a_workers_best(service, bench):
    """A key no store answers is benchmarked by Triton; every config's timings go to the
    service, stored as the key's best labelled ``client-measured``; a fresh process is served
    it. A worker's best is never replaced by a client's timings."""
    from tuner.installing import flush_reports

    url, db_url = service
    store(db_url, D_SERVED, SERVED)  # a worker's
    tuner.configure(client=TunerClient(url))
    tuner.install(pinned=False)
    launch(D_OTHER)
    flush_reports()
    assert bench.calls == len(LISTED)
    measured = chosen(D_OTHER)
    identity = {"kernel": NAME, "dtype": "float32", "device": INTERPRETER,
                "kernel_version": VERSION, "triton_version": local_triton_version()}
    assert stored_best(db_url, D_OTHER) == (measured, "client-measured")
    answer = httpx.get(f"{url}/api/v1/configs", params={**identity, "D": D_OTHER, "NB": 1})
    assert answer.json()["match"] == "exact"
    assert KernelConfig(answer.json()["config"]) == measured
    served_in_a_fresh_process(url, D_OTHER, measured)
    assert bench.calls == len(LISTED)  # the first process's benchmarking only
    faster = {"config": LISTED[0].to_dict(), "p20_ms": 1e-6, "p50_ms": 1e-6, "p80_ms": 1e-6}
    item = {**identity, "shape": {"D": D_SERVED, "NB": 1}, "timings": [faster]}
    answer = httpx.post(f"{url}/api/v1/configs/measured", json={"items": [item]})
    assert answer.status_code == 200 and answer.json()["data"][0]["status"] == "kept"
    assert stored_best(db_url, D_SERVED) == (SERVED, None)


# -- a kernel the service has no code for: served from client measurements only ---------------

@pytest.fixture
def bare_service(tmp_path: Path, bench: Bench) -> Iterator[tuple[str, str]]:
    """The real app with no plugin registered: fla's kernel is unknown to it."""
    db_url = f"sqlite:///{tmp_path / 'bare.db'}"
    with running_app(Settings(database_url=db_url)) as url:
        register_devices(db_url, INTERPRETER)
        yield url, db_url


def test_an_unregistered_kernel_is_served_from_client_measurements_only(bare_service, bench):
    """No plugin registers fla's kernel: what one process's Triton measured is stored under
    its qualified name and version, a fresh process is served it without benchmarking, the
    answer says it is client-measured and served from client measurements only, and the
    miss is recorded as ``unregistered`` (no worker can tune it), never queued."""
    from tuner.installing import flush_reports

    url, db_url = bare_service
    tuner.configure(client=TunerClient(url, report_misses=True))
    tuner.install(pinned=False)
    launch(D_OTHER)
    flush_reports()
    assert bench.calls == len(LISTED)
    measured = chosen(D_OTHER)
    assert stored_best(db_url, D_OTHER) == (measured, "client-measured")
    from db.models import BestConfig
    from tuner.installing import TIMED_BY

    with init_db(db_url)() as session:
        [row] = session.query(BestConfig).all()
        assert row.client_state == {"timed_by": TIMED_BY, "gpu": None,  # no GPU here
                                    "triton_key": list(key(D_OTHER))}
    [miss] = httpx.get(f"{url}/api/v1/misses").json()["data"]
    assert miss["kernel"] == NAME and miss["status"] == "unregistered"
    assert httpx.get(f"{url}/api/v1/jobs").json()["count"] == 0
    identity = {"kernel": NAME, "dtype": "float32", "device": INTERPRETER,
                "kernel_version": VERSION, "triton_version": local_triton_version()}
    answer = httpx.get(f"{url}/api/v1/configs", params={**identity, "D": D_OTHER, "NB": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["match"] == "exact" and answer.json()["measured"] == "client-measured"
    assert answer.json()["verification"] == "served from client measurements only"
    page = httpx.get(f"{url}/kernels/{NAME}")  # the dashboard's kernel page
    assert page.status_code == 200
    assert 'data-field="client-measurements-only"' in page.text
    assert 'data-field="client-measured"' in page.text and "BT" in page.text
    assert httpx.get(f"{url}/kernels/{NAME}.nothing").status_code == 404
    nearest = httpx.get(f"{url}/api/v1/configs", params={**identity, "D": D_SERVED, "NB": 1})
    assert nearest.json()["match"] == "nearest"  # the ladder as for any kernel
    unknown = httpx.get(f"{url}/api/v1/configs",
                        params={**identity, "dtype": "float16", "D": D_OTHER, "NB": 1})
    assert unknown.status_code == 404 and unknown.json()["match"] == "none"
    assert unknown.json()["config"] == {}
    served_in_a_fresh_process(url, D_OTHER, measured)
    assert bench.calls == len(LISTED)  # the first process's benchmarking only


def test_tuner_export_writes_flas_own_config_files_that_fla_reads(bare_service, bench,
                                                                  tmp_path, monkeypatch):
    """What a process measured, exported from the service as fla's own files
    (``--format fla``), is what fla's ``CachedAutotuner`` loads for that key (its own reader,
    in its strict mode)."""
    import fla.ops.utils.cache as fla_cache

    from tuner.installing import flush_reports

    url, _ = bare_service
    tuner.configure(client=TunerClient(url))
    tuner.install(pinned=False)
    launch(D_OTHER)
    flush_reports()
    measured = chosen(D_OTHER)
    out = tmp_path / "fla-configs"
    exported = subprocess.run([sys.executable, "-m", "tuner.app.cli", "export", "--url", url,
                               "--format", "fla", "--out", str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert exported.returncode == 0, exported.stderr
    assert "wrote 1 configs (fla)" in exported.stderr
    assert [p.name for p in out.iterdir()] == ["l2norm_fwd_kernel.json"]
    monkeypatch.setenv("FLA_CONFIG_DIR", str(out))
    monkeypatch.setattr(fla_cache, "FLA_CACHE_MODE", fla_cache.FlaCacheMode.STRICT)
    loaded = fla_cache.load_cached_config("l2norm_fwd_kernel",
                                          fla_cache.AutotuneKey(autotune_key=key(D_OTHER)))
    assert loaded is not None
    assert KernelConfig({**loaded["kwargs"], "num_warps": loaded["num_warps"],
                         "num_stages": loaded["num_stages"]}) == measured
    other = fla_cache.AutotuneKey(autotune_key=key(D_SERVED))
    assert fla_cache.load_cached_config("l2norm_fwd_kernel", other) is None


def test_an_unregistered_kernel_needs_a_qualified_name_and_its_version(bare_service):
    """A name that is neither registered nor a qualified name with a kernel_version is the
    unknown kernel's 4xx naming the field; an external kernel's shape and dtype are checked."""
    url, _ = bare_service
    item = {"kernel": NAME, "dtype": "float32", "shape": {"D": 24, "NB": 1},
            "device": INTERPRETER, "kernel_version": VERSION}
    ok = httpx.post(f"{url}/api/v1/configs/query", json={"items": [item]})
    assert ok.status_code == 200 and ok.json()["data"][0]["match"] == "none"
    for bad, field in [({"kernel_version": None}, "kernel"), ({"kernel": "l2norm"}, "kernel"),
                       ({"dtype": "Float 32"}, "dtype"), ({"shape": {"D": 2**70}}, "D"),
                       ({"shape": {"D-1": 3}}, "D-1")]:
        answer = httpx.post(f"{url}/api/v1/configs/query",
                            json={"items": [{**item, **bad}]})
        assert answer.status_code == 422, (bad, answer.text)
        assert field in json.dumps(answer.json()["detail"]), (bad, answer.json())


def test_a_clients_timings_never_replace_a_workers_best_written_meanwhile(tmp_path):
    """The measured route's one conditional write: a worker's best stored after the client
    looked (the race a check-then-write had) is not replaced by faster client timings."""
    db_url = f"sqlite:///{tmp_path / 'race.db'}"
    store(db_url, D_SERVED, SERVED)  # a worker's, 0.01 ms
    with init_db(db_url)() as session:
        row, written = repo.store_best(
            session, device_key=INTERPRETER, kernel=NAME, kernel_version=VERSION,
            dtype="float32", shape={"D": D_SERVED, "NB": 1},
            triton_version=local_triton_version() or "", config=LISTED[0].to_dict(),
            p20_ms=1e-6, p50_ms=1e-6, p80_ms=1e-6, tflops=None, gbps=None,
            torch_version=None, cuda_version=None, task_id=None,
            measured="client-measured", replaces_only="client-measured",
            client_state={"timed_by": "test"})
        session.commit()
        assert not written and KernelConfig(row.config) == SERVED and row.client_state is None


def launch_times_against(url: str) -> tuple[float, float]:
    """Seconds of the first launches of two keys, pinned, served by ``url`` under a 1 s
    deadline; the sources are checked: pinned both (the service never answered)."""
    tuner.configure(client=TunerClient(url, timeout=1.0))
    tuner.install(pinned=True)
    started = time.monotonic()
    launch(D_SERVED)
    first = time.monotonic() - started
    started = time.monotonic()
    launch(D_OTHER)
    second = time.monotonic() - started
    assert set(sources(l2norm_fwd_kernel).values()) == {"pinned"}
    return first, second


def test_a_dead_service_costs_the_deadline_once(bench):
    listener = socket.socket()  # accepts connections (the backlog), never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        first, second = launch_times_against(f"http://127.0.0.1:{listener.getsockname()[1]}")
    finally:
        listener.close()
    assert 1.0 <= first < 1.0 + max(3.0, 2 * second)
    assert second < 1.0  # not asked again for retry_after_s


def test_a_trickling_service_costs_the_deadline_once(bench):
    """A service that answers one byte every 0.2 s (each read well inside httpx's timeout,
    the whole answer far past it) costs one deadline: then Triton's own choice (pinned: the
    first config), and the next key is not asked."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            try:
                listener.settimeout(0.2)
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 50:
                    if stop.is_set():
                        return
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        break
                    time.sleep(0.2)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        first, second = launch_times_against(f"http://127.0.0.1:{listener.getsockname()[1]}")
    finally:
        stop.set()
        listener.close()
        thread.join(5)
    assert 1.0 <= first < 1.0 + max(3.0, 2 * second)
    assert second < 1.0
    assert set(sources(l2norm_fwd_kernel).values()) == {"pinned"}
    assert chosen(D_SERVED) == LISTED[0] and bench.calls == 0


# -- a fresh process: kernels imported after the hook --------------------------------------

SCRIPT = """
import json, sys
import torch
import triton
from fla.modules.norm.l2norm import l2norm_fwd, l2norm_fwd_kernel
from tuner.installing import sources
l2norm_fwd(torch.randn(37, int(sys.argv[1])))
print(json.dumps({str(k[0]): s for k, s in sources(l2norm_fwd_kernel).items()}))
"""


@pytest.mark.timeout(300)
def test_tuner_run_and_tuner_install_hook_kernels_imported_later(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNER_PINNED": "1", "TUNER_URL": "",
           "TUNER_CONFIGS_FILE": str(configs_file(tmp_path, entry())),
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "tuner.run", str(script), str(D_SERVED)],
                         env=env, capture_output=True, text=True, timeout=240, check=True)
    assert json.loads(run.stdout.splitlines()[-1]) == {str(D_SERVED): "file"}
    code = f"import tuner, runpy, sys; sys.argv = ['m', '{D_OTHER}']; " \
           f"runpy.run_path({str(script)!r}, run_name='__main__')"
    run = subprocess.run([sys.executable, "-c", code], env={**env, "TUNER_INSTALL": "1"},
                         capture_output=True, text=True, timeout=240, check=True)
    assert json.loads(run.stdout.splitlines()[-1]) == {str(D_OTHER): "pinned"}


def test_an_fla_export_spans_one_gpu_and_one_triton_and_needs_the_triton_key():
    from types import SimpleNamespace

    from tuner.errors import InvalidRequest
    from tuner.export_fla import autotune_key_hash, fla_files

    def row(device: str, triton: str = "3.6.0", state: Any = None) -> Any:
        return SimpleNamespace(kernel=NAME, device_key=device, triton_version=triton,
                               config=SERVED.to_dict(), client_state=state)

    keyed = {"triton_key": list(key(D_SERVED))}
    files, skipped = fla_files([row("cuda:A", state=keyed), row("cuda:A")])
    assert skipped == 1 and list(files) == ["l2norm_fwd_kernel.json"]
    [entry] = files["l2norm_fwd_kernel.json"]["autotune_entries"].items()
    assert entry[0] == autotune_key_hash(list(key(D_SERVED)))
    assert entry[1]["config"]["num_ctas"] == 1  # fla reads it on Triton >= 3.5.1
    for rows, field in (([row("cuda:A", state=keyed), row("cuda:B", state=keyed)], "device"),
                        ([row("cuda:A", state=keyed), row("cuda:A", "3.5.1", keyed)],
                         "triton")):
        with pytest.raises(InvalidRequest) as refused:
            fla_files(rows)
        assert refused.value.field == field
