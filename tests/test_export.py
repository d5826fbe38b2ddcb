"""Offline configs files: ``tuner export`` / ``tuner import`` on real SQLite files, the exact-only
``ConfigsFile.lookup``, and vLLM's format read back the way vLLM reads it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from db import repo
from db.engine import init_db
from search_spaces import get_kernel
from tuner.app.cli import main
from tuner.config import KernelConfig
from tuner.configs_file import ConfigsEntry, ConfigsFile, nearest_m, read_vllm, write_tuner
from tuner.device import INTERPRETER_NAME

ROOT = Path(__file__).resolve().parents[1]
H200 = "cuda:NVIDIA H200:sm90"
H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
CPU = "interpret:cpu"
SQUARE = {"M": 4096, "N": 4096, "K": 4096}


def config(block_m: int = 128, warps: int = 8) -> dict[str, int]:
    return {"BLOCK_M": block_m, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
            "num_warps": warps, "num_stages": 3}


def store(url: str, shape: dict[str, int], ms: float, *, device: str = H200,
          kernel_version: str = "v1", triton: str = "3.6.0", dtype: str = "float16",
          cfg: dict[str, int] | None = None, device_name: str = "NVIDIA H200",
          kernel: str = "matmul") -> None:
    """A best config as a worker would have stored it (device row first)."""
    with init_db(url)() as session:
        kind = device.split(":")[0]
        repo.upsert_device(session, {"key": device, "kind": kind, "name": device_name})
        repo.store_best(session, device_key=device, kernel=kernel,
                        kernel_version=kernel_version, dtype=dtype, shape=shape,
                        triton_version=triton, config=cfg or config(), p20_ms=ms, p50_ms=ms,
                        p80_ms=ms, tflops=2 * math.prod(shape.values()) / ms / 1e9, gbps=None,
                        torch_version="2.13.0", cuda_version="12.8", task_id=None)
        session.commit()


def bests(url: str) -> set[tuple[Any, ...]]:
    """What identifies and ranks each stored best (ids and timestamps differ between stores)."""
    with init_db(url)() as session:
        return {(r.device_key, r.kernel, r.kernel_version, r.dtype, json.dumps(r.shape),
                 r.triton_version, json.dumps(r.config, sort_keys=True), r.p50_ms, r.tflops,
                 r.gbps, r.torch_version, r.cuda_version) for r in repo.list_best(session)}


def devices(url: str) -> dict[str, tuple[str, str, str | None]]:
    with init_db(url)() as session:
        return {d.key: (d.kind, d.name, d.compute_capability)
                for d in repo.list_devices(session)}


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tuner.app.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def source(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'source.db'}"


@pytest.fixture
def target(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'target.db'}"


# -- round trip ---------------------------------------------------------------------------------

def test_export_then_import_into_a_fresh_store_gives_the_same_bests(source, target, tmp_path):
    store(source, SQUARE, 0.217)
    store(source, {"M": 16, "N": 4096, "K": 4096}, 0.0397, triton="3.5.1", cfg=config(16, 4))
    store(source, {"M": 17, "N": 33, "K": 65}, 12.5, device=CPU, kernel_version="v2",
          device_name=INTERPRETER_NAME)
    out = tmp_path / "h200.json"
    exported = tuner("--db", source, "export", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert exported.stderr.strip() == f"tuner: wrote 3 configs (tuner-configs-v1) to {out}"

    imported = tuner("import", str(out), "--db", target)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "imported 3, kept 0 faster stored configs"
    assert bests(target) == bests(source) and len(bests(target)) == 3
    assert devices(target) == {H200: ("cuda", "NVIDIA H200", "9.0"),
                               CPU: ("interpret", INTERPRETER_NAME, None)}


def test_import_keeps_the_faster_of_the_stored_and_the_imported_config(source, target,
                                                                       tmp_path, capsys):
    small = {"M": 16, "N": 4096, "K": 4096}
    store(source, SQUARE, 0.30, cfg=config(64))
    store(source, small, 0.04, cfg=config(16))
    mine = "my H200"
    store(target, SQUARE, 0.20, cfg=config(256), device_name=mine)  # faster than the file
    store(target, small, 0.05, cfg=config(32), device_name=mine)    # slower than the file
    out = str(tmp_path / "configs.json")
    assert main(["--db", source, "export", "--out", out]) == 0
    assert main(["--db", target, "import", out]) == 0
    assert capsys.readouterr().out.strip() == "imported 1, kept 1 faster stored configs"
    with init_db(target)() as session:
        kept = {json.dumps(r.shape): (r.p50_ms, r.config["BLOCK_M"])
                for r in repo.list_best(session)}
    assert kept == {json.dumps(SQUARE): (0.20, 256), json.dumps(small): (0.04, 16)}
    assert devices(target)[H200][1] == mine  # an existing device row is left as it was


def test_export_writes_to_standard_output_by_default(source, capsys):
    store(source, SQUARE, 0.217)
    assert main(["--db", source, "export", "--kernel", "matmul"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["format"] == "tuner-configs-v1"
    exported_at = datetime.fromisoformat(data["exported_at"])
    assert exported_at.utcoffset() is not None and exported_at.utcoffset().total_seconds() == 0
    assert abs((datetime.now(UTC) - exported_at).total_seconds()) < 60
    [entry] = data["configs"]
    assert entry["device"] == H200 and entry["shape"] == SQUARE and entry["ms"] == 0.217
    assert entry["config"] == config() and entry["gbps"] is None
    assert "wrote 1 configs (tuner-configs-v1) to standard output" in captured.err


def test_export_filters_by_device_and_dimensions(source, tmp_path):
    store(source, SQUARE, 0.2)
    store(source, {"M": 16, "N": 1024, "K": 4096}, 0.03)
    store(source, SQUARE, 0.25, device=H100, device_name="NVIDIA H100 80GB HBM3")
    out = tmp_path / "out.json"
    assert main(["--db", source, "export", "--device", H200, "--where", "N=4096",
                 "--out", str(out)]) == 0
    entries = ConfigsFile.load(out).entries
    assert [(e.device, e.shape) for e in entries] == [(H200, SQUARE)]


# -- lookup: exact identity only ----------------------------------------------------------------

def entry(ms: float, **changes: Any) -> ConfigsEntry:
    fields: dict[str, Any] = dict(kernel="matmul", kernel_version="v1", dtype="float16",
                                  device=H200, triton_version="3.6.0", shape=dict(SQUARE),
                                  config=KernelConfig(config()), ms=ms)
    return ConfigsEntry(**{**fields, **changes})


@pytest.fixture
def loaded(tmp_path: Path) -> ConfigsFile:
    path = tmp_path / "configs.json"
    write_tuner([entry(0.30, config=KernelConfig(config(64))),
                 entry(0.20, triton_version="3.6.1", config=KernelConfig(config(128))),
                 entry(0.10, triton_version="3.5.0", config=KernelConfig(config(256)))], path)
    return ConfigsFile.load(path)


def test_lookup_answers_the_fastest_exact_match(loaded):
    found = loaded.lookup("matmul", "float16", {"K": 4096, "N": 4096, "M": 4096}, device=H200,
                          kernel_version="v1", triton_version="3.6.0")
    assert found is not None and found.ms == 0.20  # 3.6.1 compiles like 3.6.0
    assert found.config.to_triton().kwargs["BLOCK_M"] == 128
    any_triton = loaded.lookup("matmul", "float16", SQUARE, device=H200)
    assert any_triton is not None and any_triton.ms == 0.10


def test_lookup_matches_triton_patch_releases_of_one_minor(tmp_path):
    path = tmp_path / "one.json"
    write_tuner([entry(0.3)], path)
    found = ConfigsFile.load(path).lookup("matmul", "float16", SQUARE, device=H200,
                                          triton_version="3.6.1")
    assert found is not None and found.triton_version == "3.6.0"


@pytest.mark.parametrize(("kernel", "dtype", "shape", "device", "version", "triton"), [
    ("matmul", "float16", SQUARE, H100, "v1", "3.6.0"),
    ("matmul", "float16", SQUARE, CPU, "v1", "3.6.0"),
    ("matmul", "float16", SQUARE, H200, "v2", "3.6.0"),
    ("matmul", "float16", SQUARE, H200, "v1", "3.4.0"),
    ("matmul", "float16", SQUARE, H200, "v1", "4.6.0"),
    ("matmul", "float16", {"M": 4096, "N": 4096, "K": 2048}, H200, "v1", "3.6.0"),
    ("matmul", "float16", {"M": 4096, "N": 4096}, H200, "v1", "3.6.0"),
    ("matmul", "bfloat16", SQUARE, H200, "v1", "3.6.0"),
    ("softmax", "float16", SQUARE, H200, "v1", "3.6.0"),
])
def test_lookup_of_another_identity_finds_nothing(loaded, kernel, dtype, shape, device, version,
                                                  triton):
    assert loaded.lookup(kernel, dtype, shape, device=device, kernel_version=version,
                         triton_version=triton) is None


# -- vLLM's format ------------------------------------------------------------------------------

MOE_M = (1, 8, 16, 128)  # numerically ordered; as strings "128" < "16" < "8"


def test_vllm_export_is_keyed_by_m_with_vllms_names_and_reads_back(source, tmp_path):
    for i, m in enumerate(MOE_M):
        store(source, {"M": m, "N": 4096, "K": 4096}, 0.01 * (i + 1), cfg=config(16 << i, 4))
    store(source, {"M": 8, "N": 1024, "K": 4096}, 0.5, cfg=config(32, 2))
    out = tmp_path / "E=8,N=4096,device_name=NVIDIA_H200.json"
    assert main(["--db", source, "export", "--format", "vllm", "--where", "N=4096,K=4096",
                 "--out", str(out)]) == 0
    raw = json.loads(out.read_text())
    assert list(raw) == ["1", "8", "16", "128"]
    assert raw["16"] == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64,
                         "GROUP_SIZE_M": 8, "num_warps": 4, "num_stages": 3}
    back = read_vllm(out)
    assert back == {m: config(16 << i, 4) for i, m in enumerate(MOE_M)}
    # vLLM takes the entry whose M is nearest to the batch's token count
    nearest = back[min(back, key=lambda m: abs(m - 100))]
    assert nearest["BLOCK_M"] == 128


MIXTRAL = {"N": 14336, "K": 4096, "E": 8, "TOPK": 2}
#: moe_gemm configs tuned per token count, with vLLM's parameter names
MOE_TUNED = {
    1: (16, 32, 64, 1, 4, 3), 16: (16, 64, 128, 1, 4, 4), 64: (32, 128, 64, 16, 4, 4),
    256: (64, 128, 64, 16, 4, 3), 4096: (128, 128, 64, 16, 8, 4),
}


def moe_config(values: tuple[int, ...]) -> dict[str, int]:
    names = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
             "num_stages")
    return dict(zip(names, values, strict=True))


def store_moe(url: str, *, dtype: str = "bfloat16", **dims: int) -> None:
    for i, (m, values) in enumerate(MOE_TUNED.items()):
        store(url, {"M": m, **MIXTRAL, **dims}, 0.05 * (i + 1), kernel="moe_gemm", dtype=dtype,
              cfg=moe_config(values))


def vllm_load(path: Path) -> dict[int, Any]:
    """What vLLM's ``get_moe_configs`` does with the file it found."""
    with open(path) as f:
        return {int(key): val for key, val in json.load(f).items()}


def test_moe_gemm_exports_to_the_file_vllm_looks_for_and_loads_back_by_nearest_m(source,
                                                                                  tmp_path):
    store_moe(source)
    store(source, SQUARE, 0.2)  # a matmul config: --kernel leaves it out
    assert main(["--db", source, "export", "--format", "vllm", "--kernel", "moe_gemm",
                 "--out", str(tmp_path)]) == 0
    path = tmp_path / "E=8,N=14336,device_name=NVIDIA_H200.json"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".json"] == [path.name]
    raw = json.loads(path.read_text())
    assert list(raw) == ["1", "16", "64", "256", "4096"]  # M ascending, as strings
    assert raw["64"] == moe_config(MOE_TUNED[64])  # vLLM's key names, nothing renamed

    loaded = vllm_load(path)
    assert loaded == {m: moe_config(v) for m, v in MOE_TUNED.items()}
    assert read_vllm(path, vllm_names=True) == loaded
    space = get_kernel("moe_gemm").space()
    assert all(space.contains(c) for c in loaded.values())  # what the kernel tunes
    # vLLM's try_get_optimal_moe_config: the nearest M; on a tie the first in the file
    assert nearest_m(loaded, 100)["BLOCK_SIZE_M"] == 32      # 64 is nearest
    assert nearest_m(loaded, 3000)["BLOCK_SIZE_M"] == 128    # 4096
    assert nearest_m(loaded, 40) == moe_config(MOE_TUNED[16])  # 16 and 64 tie: 16
    assert nearest_m(loaded, 1) == moe_config(MOE_TUNED[1])


def test_fp32_moe_configs_get_vllms_dtype_suffix(source, tmp_path, capsys):
    store_moe(source, dtype="float32")
    assert main(["--db", source, "export", "--format", "vllm", "--out", str(tmp_path)]) == 0
    path = tmp_path / "E=8,N=14336,device_name=NVIDIA_H200,dtype=float32.json"
    assert capsys.readouterr().err.strip() == f"tuner: wrote 5 configs (vllm) to {path}"
    assert vllm_load(path)[4096] == moe_config(MOE_TUNED[4096])


@pytest.mark.parametrize(("moe_n", "names"), [
    (None, ["vLLM names its file after E and N", "--out"]),  # matmul shapes: no E
    (4096, ["N takes 4096, 14336", "--where N=14336"]),      # two files' worth of moe_gemm
])
def test_a_directory_for_a_selection_vllm_cannot_name_is_refused(source, tmp_path, capsys,
                                                                 moe_n, names):
    if moe_n is None:
        store(source, SQUARE, 0.2)
    else:
        store_moe(source)
        store_moe(source, N=moe_n)
    assert main(["--db", source, "export", "--format", "vllm", "--out", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert line.startswith("tuner: error: ") and all(n in line for n in names), line
    assert list(tmp_path.glob("*.json")) == []


@pytest.mark.parametrize(("extra", "names"), [
    (dict(shape={"M": 8, "N": 1024, "K": 4096}), ["N takes 1024, 4096", "--where N=4096"]),
    (dict(shape={"M": 8, "N": 4096, "K": 4096}, device=H100, device_name="NVIDIA H100"),
     [H100, H200, "--device"]),
    (dict(shape={"M": 8, "N": 4096, "K": 4096}, triton="3.5.0"), ["'3.5', '3.6'", "--triton"]),
])
def test_vllm_export_of_mixed_selection_is_refused_naming_the_values(source, tmp_path, capsys,
                                                                     extra, names):
    store(source, {"M": 16, "N": 4096, "K": 4096}, 0.02)
    others = dict(extra)
    store(source, others.pop("shape"), 0.03, **others)
    out = tmp_path / "vllm.json"
    assert main(["--db", source, "export", "--format", "vllm", "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert line.startswith("tuner: error: the vllm format")
    assert all(name in line for name in names), line
    assert not out.exists()


# -- bad input ----------------------------------------------------------------------------------

GOOD = entry(0.2).to_dict()


@pytest.mark.parametrize(("content", "message"), [
    (None, "does not exist"),
    ("{not json", "is not valid JSON"),
    (json.dumps({"format": "replay-v1", "results": []}), "is not a tuner-configs-v1 file"),
    (json.dumps({"format": "tuner-configs-v1", "configs": {}}), "must be a list of entries"),
    (json.dumps({"format": "tuner-configs-v1",
                 "configs": [GOOD, {**GOOD, "kernel": None}]}),
     "malformed entry 1: 'kernel' must be a non-empty string"),
    (json.dumps({"format": "tuner-configs-v1",
                 "configs": [{**GOOD, "config": {**GOOD["config"], "BLOCK_M": "64"}}]}),
     "malformed entry 0: config.BLOCK_M must be an integer"),
    (json.dumps({"format": "tuner-configs-v1", "configs": [{**GOOD, "device": "gpu0"}]}),
     "malformed entry 0: device 'gpu0' is not a device key"),
    (json.dumps({"format": "tuner-configs-v1", "configs": [GOOD, {**GOOD, "ms": None}]}),
     "entry 1 has no \"ms\""),
])
def test_a_malformed_file_is_one_line_exit_2_and_imports_nothing(target, tmp_path, capsys,
                                                                  content, message):
    path = tmp_path / "configs.json"
    if content is not None:
        path.write_text(content)
    assert main(["--db", target, "import", str(path)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"tuner: error: configs file '{path}'") and message in line, line
    assert bests(target) == set()


def test_export_with_no_match_exits_1_and_leaves_the_out_file_alone(source, tmp_path, capsys):
    store(source, SQUARE, 0.2)
    out = tmp_path / "kept.json"
    out.write_text("earlier export")
    assert main(["--db", source, "export", "--kernel", "softmax", "--out", str(out)]) == 1
    assert one_error_line(capsys) == ("tuner: no stored configs match kernel=softmax "
                                      "(tuner configs lists what is stored)")
    assert out.read_text() == "earlier export"


def test_export_of_an_empty_store_says_so(target, capsys):
    init_db(target)  # an empty store (a database that does not exist is another error)
    assert main(["--db", target, "export"]) == 1
    assert one_error_line(capsys) == "tuner: no stored configs to export: the store is empty"


@pytest.mark.parametrize(("args", "message"), [
    (["--where", "N:4096"], "--where 'N:4096': shape part 'N:4096' is not NAME=VALUE"),
    (["--out", "/nonexistent/folder/out.json"], "cannot write '/nonexistent/folder/out.json'"),
])
def test_bad_export_arguments_are_one_line_exit_2(source, capsys, args, message):
    store(source, SQUARE, 0.2)
    assert main(["--db", source, "export", *args]) == 2
    line = one_error_line(capsys)
    assert message in line, line


def test_a_write_that_fails_part_way_leaves_the_previous_file_whole(tmp_path):
    path = tmp_path / "configs.json"
    write_tuner([entry(0.2)], path)
    before = path.read_text()
    with pytest.raises(ValueError):  # NaN is not JSON: serialising fails after the first entry
        write_tuner([entry(0.2), entry(0.3, tflops=float("nan"))], path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["configs.json"]  # no temporary file left
