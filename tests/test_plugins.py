"""Users' kernels: registered without editing this project, tuned over HTTP, launched through
``tuner.autotune``. ``rmsnorm`` is pip-installed with a ``tuner.kernels`` entry point,
``bias_gelu`` comes through ``TUNER_KERNELS`` (tests/plugins.py); both run on the interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import search_spaces
from tests.plugins import registered
from tests.support_processes import free_port, wait_ready
from tuner.client import TunerClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def plugins() -> Iterator[None]:
    with registered():
        yield


@pytest.fixture
def broken_plugin(tmp_path: Path) -> Iterator[None]:
    """The examples plus a plugin module that raises when imported."""
    (tmp_path / "broken_kernel.py").write_text("raise RuntimeError('this plugin is broken')\n")
    with registered(extra_refs="broken_kernel:KERNEL", extra_path=tmp_path):
        yield


def test_an_installed_entry_point_and_tuner_kernels_register_kernels(plugins):
    names = search_spaces.kernel_names()
    assert {"matmul", "softmax", "rmsnorm", "bias_gelu"} <= set(names)
    assert search_spaces.get_kernel("rmsnorm").ref == "tuner_example_rmsnorm:KERNEL"
    assert search_spaces.get_kernel("bias_gelu").ref == "bias_gelu:KERNEL"
    assert search_spaces.plugin_errors() == []


def test_plugin_kernels_are_listed_by_the_api_like_builtins(plugins, api_client):
    body = api_client.get("/api/v1/kernels").json()
    by_name = {k["name"]: k for k in body["data"]}
    assert by_name["rmsnorm"]["source"] == "plugin" and by_name["matmul"]["source"] == "builtin"
    assert [d["name"] for d in by_name["rmsnorm"]["dims"]] == ["M", "N"]
    assert {p["name"] for p in by_name["bias_gelu"]["space"]} == {
        "BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}
    assert body["errors"] == []


def test_a_plugin_that_fails_to_import_is_reported_and_the_rest_still_work(broken_plugin,
                                                                           api_client):
    assert "bias_gelu" in search_spaces.kernel_names()
    [error] = search_spaces.plugin_errors()
    assert error.ref == "broken_kernel:KERNEL" and "this plugin is broken" in error.error
    kernels = api_client.get("/api/v1/kernels").json()
    assert kernels["errors"] == [error.to_dict()]
    assert "rmsnorm" in {k["name"] for k in kernels["data"]}
    health = api_client.get("/healthz").json()
    assert health["plugins"]["errors"] == [error.to_dict()]
    job = {"kernel": "bias_gelu", "dtype": "float32", "shapes": [{"M": 3, "N": 40}],
           "budget": {"trials": 2}}
    assert api_client.post("/api/v1/jobs", json=job).status_code == 202


def test_the_cli_lists_plugins_and_names_the_broken_one(broken_plugin):
    done = subprocess.run([sys.executable, "-m", "tuner.app.cli", "kernels"], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=120)
    assert done.returncode == 0
    assert "rmsnorm: M in [1, 1048576]" in done.stdout and "[plugin bias_gelu:KERNEL]" in (
        done.stdout)
    assert "broken_kernel:KERNEL (TUNER_KERNELS): RuntimeError: this plugin is broken" in (
        done.stderr)


def test_a_plugin_that_hangs_or_exits_while_importing_is_reported_and_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "hangs_on_import_kernel.py").write_text("import time\n\ntime.sleep(3600)\n")
    (tmp_path / "exits_on_import_kernel.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "interrupts_on_import_kernel.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.setenv("TUNER_PLUGIN_IMPORT_TIMEOUT_S", "1")
    refs = "hangs_on_import_kernel:KERNEL,exits_on_import_kernel:KERNEL," \
           "interrupts_on_import_kernel:KERNEL"
    with registered(extra_refs=refs, extra_path=tmp_path):
        started = time.monotonic()
        assert "bias_gelu" in search_spaces.kernel_names()
        assert time.monotonic() - started < 60  # not the hour the first one sleeps
        errors = {e.ref: e.error for e in search_spaces.plugin_errors()}
    assert errors["hangs_on_import_kernel:KERNEL"].startswith(
        "its import did not finish within 1 s (stuck at ")
    assert "hangs_on_import_kernel.py:3) (TUNER_PLUGIN_IMPORT_TIMEOUT_S); skipped" in errors[
        "hangs_on_import_kernel:KERNEL"]
    assert errors["exits_on_import_kernel:KERNEL"] == "it called sys.exit(3) while importing"
    assert errors["interrupts_on_import_kernel:KERNEL"] == (
        "it raised KeyboardInterrupt while importing")


def test_a_kernel_name_clash_is_reported_not_registered(tmp_path: Path):
    (tmp_path / "clash.py").write_text(
        "from bias_gelu import KERNEL as _k\n"
        "import copy\nKERNEL = copy.copy(_k)\nKERNEL.name = 'matmul'\n")
    with registered(extra_refs="clash:KERNEL", extra_path=tmp_path):
        [error] = search_spaces.plugin_errors()
        assert "already registered" in error.error
        assert search_spaces.get_kernel("matmul").ref == "search_spaces.matmul:KERNEL"


def _serve(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "TRITON_INTERPRET": "1", "TUNER_DATA_DIR": str(tmp_path),
           "TUNER_DATABASE_URL": ""}
    with open(tmp_path / "serve.log", "wb") as log:  # the child writes to its own copy
        proc = subprocess.Popen([sys.executable, "-m", "tuner.app.cli", "serve", "--port",
                                 str(port), "--backend", "interpret"], cwd=tmp_path, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _launch(name: str, shape: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The example's own launcher, as the model calls it; (output, expected)."""
    import bias_gelu
    import tuner_example_rmsnorm

    x = torch.randn(shape["M"], shape["N"])
    v = torch.randn(shape["N"])
    if name == "rmsnorm":
        got = tuner_example_rmsnorm.rmsnorm(x, v)
        return got, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * v
    got = bias_gelu.bias_gelu(x, v)
    return got, torch.nn.functional.gelu(x + v, approximate="tanh")


def _decorated(name: str) -> Any:
    import bias_gelu
    import tuner_example_rmsnorm

    return (tuner_example_rmsnorm.rmsnorm_kernel if name == "rmsnorm"
            else bias_gelu.bias_gelu_kernel)


def test_both_examples_tuned_over_http_then_launched_with_the_tuned_config(plugins,
                                                                           tmp_path: Path):
    import tuner

    shapes = {"rmsnorm": {"M": 5, "N": 300}, "bias_gelu": {"M": 3, "N": 70}}
    proc, base = _serve(tmp_path)
    try:
        wait_ready(base, proc)
        client = TunerClient(base, timeout=10)
        jobs = {name: client.submit(name, [shape], "float32", trials=3)
                for name, shape in shapes.items()}
        for job_id in jobs.values():
            job = client.wait(job_id, timeout=300, poll=0.5)
            assert job["status"] == "succeeded", job
        tasks = {name: client.job(job_id)["tasks"][0] for name, job_id in jobs.items()}
        # what is served: the search's best, or the default where that did not beat it
        # beyond the noise (issue 29)
        tuned = {name: t["default_config"] if t["best_basis"] == "default" else t["best_config"]
                 for name, t in tasks.items()}
        tuner.configure(url=base, deadline_s=10, report_misses=False)
        for name, shape in shapes.items():
            got, expected = _launch(name, shape)
            assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
            kernel = _decorated(name)
            problem = ("float32", tuple(sorted(shape.items())))
            assert kernel.sources[problem] == "service"
            assert kernel.config_for(problem).to_dict() == tuned[name]
    finally:
        tuner.configure(url="", client=None)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
