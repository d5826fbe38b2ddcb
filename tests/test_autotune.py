"""``tuner.autotune``: the lookup order (exported file, then the service, then Triton's own
autotuning), one deadline against a server that trickles bytes, misses reported and tuned,
configs of another GPU never used. The kernel is the bias_gelu example (a real Triton kernel on
the interpreter); the service is the real app on a real socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import tuner
from db import repo
from db.engine import init_db
from tests.api_support import INTERPRETER, register_devices, run_worker_once, running_app
from tests.plugins import registered
from tests.test_client import CountingTransport
from tuner.autotuning import Autotuned
from tuner.client import TunerClient
from tuner.config import KernelConfig
from tuner.configs_file import ConfigsEntry, write_tuner
from tuner.identity import local_triton_version
from tuner.settings import Settings

H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
IN_FILE = {"M": 3, "N": 40}
IN_SERVICE = {"M": 5, "N": 40}
NOWHERE = {"M": 6, "N": 40}
FILE_CONFIG = KernelConfig(BLOCK_M=2, BLOCK_N=64, num_warps=4, num_stages=1)
SERVICE_CONFIG = KernelConfig(BLOCK_M=4, BLOCK_N=128, num_warps=2, num_stages=2)


def cpu_bench(fn: Any, quantiles: Any = None, **_: Any) -> Any:
    """Triton's autotuner times configs with a GPU timer; on the CPU, wall time stands in."""
    started = time.perf_counter()
    fn()
    ms = (time.perf_counter() - started) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


@pytest.fixture
def example() -> Iterator[Any]:
    with registered():
        import bias_gelu

        yield bias_gelu
    tuner.configure(url="", configs_file="", client=None)


@pytest.fixture
def service(tmp_path: Path, example: Any) -> Iterator[tuple[str, str]]:
    db_url = f"sqlite:///{tmp_path / 'autotune.db'}"
    with running_app(Settings(database_url=db_url, miss_trials=2)) as url:
        register_devices(db_url, INTERPRETER)  # as the interpreter worker does on start
        yield url, db_url


def fresh_kernel(example: Any) -> Autotuned:
    """The example's kernel as a new process would decorate it: nothing looked up yet, and
    Triton's autotuner timing with the CPU stand-in."""
    decorated = example.bias_gelu_kernel
    return Autotuned(decorated.fn, decorated.configs, decorated.key, "bias_gelu",
                     {"do_bench": cpu_bench})


def launch(example: Any, kernel: Autotuned, shape: dict[str, int]) -> str:
    """Run the example's launcher through ``kernel``; check its output; where its config came
    from."""
    example.bias_gelu_kernel, saved = kernel, example.bias_gelu_kernel
    try:
        x, b = torch.randn(shape["M"], shape["N"]), torch.randn(shape["N"])
        out = example.bias_gelu(x, b)
    finally:
        example.bias_gelu_kernel = saved
    expected = torch.nn.functional.gelu(x + b, approximate="tanh")
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)
    return kernel.sources[("float32", tuple(sorted(shape.items())))]


def store(db_url: str, example: Any, shape: dict[str, int], config: KernelConfig,
          device: str = INTERPRETER) -> None:
    with init_db(db_url)() as session:
        kind, name = device.split(":")[0], device.split(":")[1]
        repo.upsert_device(session, {"key": device, "kind": kind, "name": name})
        repo.store_best(session, device_key=device, kernel="bias_gelu",
                        kernel_version=example.KERNEL.version, dtype="float32", shape=shape,
                        triton_version=local_triton_version() or "", config=config.to_dict(),
                        p20_ms=0.01, p50_ms=0.01, p80_ms=0.01, tflops=None, gbps=None,
                        torch_version=None, cuda_version=None, task_id=None)
        session.commit()


def configs_file(tmp_path: Path, example: Any) -> Path:
    path = tmp_path / "exported.json"
    entry = ConfigsEntry(kernel="bias_gelu", kernel_version=example.KERNEL.version,
                         dtype="float32", device=INTERPRETER,
                         triton_version=local_triton_version() or "", shape=IN_FILE,
                         config=FILE_CONFIG, ms=0.01)
    write_tuner([entry], path)
    return path


def test_lookup_order_is_file_then_service_then_tritons_autotuning(service, example, tmp_path):
    url, db_url = service
    store(db_url, example, IN_FILE, SERVICE_CONFIG)
    store(db_url, example, IN_SERVICE, SERVICE_CONFIG)
    transport = CountingTransport()
    tuner.configure(client=TunerClient(url, transport=transport,
                                       configs_file=configs_file(tmp_path, example)))
    kernel = fresh_kernel(example)
    assert launch(example, kernel, IN_FILE) == "file"
    assert transport.paths == []  # the file answered: no request at all
    assert kernel.config_for(("float32", tuple(sorted(IN_FILE.items())))) == FILE_CONFIG
    assert launch(example, kernel, IN_SERVICE) == "service"
    assert kernel.config_for(("float32", tuple(sorted(IN_SERVICE.items())))) == SERVICE_CONFIG
    assert launch(example, kernel, NOWHERE) == "triton"
    assert transport.paths == ["/api/v1/configs/query"] * 2
    launch(example, kernel, IN_SERVICE)  # looked up once per shape
    assert len(transport.paths) == 2


def test_prefetch_answers_every_shape_in_one_request(service, example):
    url, db_url = service
    store(db_url, example, IN_SERVICE, SERVICE_CONFIG)
    transport = CountingTransport()
    tuner.configure(client=TunerClient(url, transport=transport))
    kernel = fresh_kernel(example)
    assert kernel.prefetch([IN_SERVICE, NOWHERE], "float32") == 2
    assert launch(example, kernel, IN_SERVICE) == "service"
    assert launch(example, kernel, NOWHERE) == "triton"
    assert transport.paths == ["/api/v1/configs/query"]


def test_a_config_tuned_on_another_gpu_is_only_a_labelled_fallback(service, example):
    url, db_url = service
    store(db_url, example, IN_SERVICE, SERVICE_CONFIG, device=H100)
    client = TunerClient(url)
    tuner.configure(client=client)
    kernel = fresh_kernel(example)
    assert launch(example, kernel, IN_SERVICE) == "triton"  # never launched with it
    answer = client.lookup("bias_gelu", IN_SERVICE, "float32",
                           kernel_version=example.KERNEL.version)
    assert answer is not None and answer["match"] == "other-device" and answer["device"] == H100


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """Accepts, reads the request, then sends its answer one byte every 0.2 s (for minutes)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b" " * 1000:
                if stop.wait(0.2):
                    break
                try:
                    conn.send(bytes([byte]))
                except OSError:
                    break
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    listener.close()


def test_one_deadline_bounds_a_lookup_against_a_server_that_trickles(trickling_server,
                                                                       example):
    client = TunerClient(trickling_server, timeout=1.0)
    started = time.monotonic()
    assert client.prefetch("bias_gelu", [IN_SERVICE], "float32") == 0
    assert time.monotonic() - started < 2.5
    tuner.configure(client=client)
    started = time.monotonic()
    assert launch(example, fresh_kernel(example), NOWHERE) == "triton"
    assert time.monotonic() - started < 5  # the service is not asked again for retry_after_s


def test_a_miss_reported_many_times_is_queued_once_tuned_then_served_exact(service, example):
    url, db_url = service
    for _ in range(3):  # three model start-ups
        tuner.configure(client=TunerClient(url, report_misses=True, client_name="model-a"))
        assert launch(example, fresh_kernel(example), NOWHERE) == "triton"
    [miss] = httpx.get(f"{url}/api/v1/misses").json()["data"]
    assert miss["count"] == 3 and miss["status"] == "queued" and miss["shape"] == NOWHERE
    assert miss["device"] == INTERPRETER and miss["job_id"]
    assert len(httpx.get(f"{url}/api/v1/jobs").json()["data"]) == 1
    outcome = run_worker_once(db_url)  # the interpreter worker tunes it
    assert outcome.status == "succeeded"
    tuner.configure(client=TunerClient(url, report_misses=True, client_name="model-a"))
    assert launch(example, fresh_kernel(example), NOWHERE) == "service"
    [miss] = httpx.get(f"{url}/api/v1/misses").json()["data"]
    assert miss["status"] == "tuned" and miss["count"] == 3


def test_the_hot_path_launches_what_the_full_path_chose_and_only_then(example, tmp_path,
                                                                        monkeypatch):
    """After a key's first launch, a launch with positional arguments goes straight from its
    key's values and dtype to the config's keywords: the same config, the problem never
    named again; an unanswered key goes straight to Triton's autotuner; a keyword argument,
    or a dtype not seen, takes the full path."""
    from tuner.launching import launch_kwargs

    tuner.configure(client=TunerClient("", configs_file=configs_file(tmp_path, example)))
    kernel = fresh_kernel(example)
    assert launch(example, kernel, IN_FILE) == "file"
    assert launch(example, kernel, NOWHERE) == "triton"
    assert sorted(kernel._fast.values(), key=lambda v: v is None) == [
        launch_kwargs(FILE_CONFIG), None]
    seen: list[dict[str, Any]] = []
    run = kernel.fn.run
    monkeypatch.setattr(kernel.fn, "run", lambda *a, **kw: seen.append(kw) or run(*a, **kw))

    def named_again(_named: Any) -> Any:
        raise AssertionError("the hot path named the launch's problem again")

    monkeypatch.setattr(kernel, "problem", named_again)
    assert launch(example, kernel, IN_FILE) == "file"  # the output is checked there
    assert {k: v for k, v in seen[-1].items() if k in launch_kwargs(FILE_CONFIG)} == \
        launch_kwargs(FILE_CONFIG)
    launch(example, kernel, NOWHERE)  # Triton's autotuner, its cached choice
    x = torch.randn(*IN_FILE.values(), dtype=torch.float64)
    with pytest.raises(AssertionError, match="named the launch's problem again"):
        kernel[(1,)](x, x[0], x, *IN_FILE.values(), 1, 1)  # a dtype not seen: the full path


def test_where_triton_cannot_benchmark_an_unanswered_shape_launches_the_first_config(
        example, caplog):
    """On the interpreter (no GPU driver: Triton's autotuner fails with "0 active drivers"),
    a shape neither the file nor the service answers (here: the service is down) launches the
    list's first config, saying so; the warning about the service says what happens."""
    from tests.support_processes import free_port
    from tuner.launching import launch_kwargs
    from tuner.user_kernel import config_from_triton

    tuner.configure(client=TunerClient(f"http://127.0.0.1:{free_port()}", timeout=1.0))
    decorated = example.bias_gelu_kernel
    kernel = Autotuned(decorated.fn, decorated.configs, decorated.key, "bias_gelu", {})
    with caplog.at_level("WARNING"):
        assert launch(example, kernel, NOWHERE) == "first"
        assert launch(example, kernel, NOWHERE) == "first"  # the hot path, the same config
    first = config_from_triton(decorated.configs[0])
    assert list(kernel._fast.values()) == [launch_kwargs(first)]
    said = [r.getMessage() for r in caplog.records]
    assert sum("launching the first listed config" in m for m in said) == 1, said
    assert any("unreachable" in m and "Triton's own autotuning" in m for m in said), said
