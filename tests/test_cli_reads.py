"""``tuner configs`` and ``tuner export`` read a running service over HTTP (``--url``, or
``TUNER_URL``) from any folder, and a reading command never creates a database: a missing
SQLite file is one line naming it and a non-zero exit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from db import repo
from db.engine import init_db
from tests.api_support import INTERPRETER, running_app
from tuner.app.cli import main
from tuner.configs_file import ConfigsFile
from tuner.settings import Settings

SHAPE = {"M": 16, "N": 32, "K": 64}
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 2,
          "num_stages": 1}


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch) -> Path:
    """An empty working folder, no service or database named by the environment."""
    for name in ("TUNER_URL", "TUNER_API_KEY", "TUNER_DATABASE_URL", "TUNER_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    db_url = f"sqlite:///{tmp_path / 'service.db'}"
    with running_app(Settings(database_url=db_url)) as url:
        with init_db(db_url)() as session:
            repo.store_best(session, device_key=INTERPRETER, kernel="matmul",
                            kernel_version="v1", dtype="float16", shape=SHAPE,
                            triton_version="3.9.0", config=CONFIG, p20_ms=0.5, p50_ms=0.5,
                            p80_ms=0.5, tflops=None, gbps=None, torch_version=None,
                            cuda_version=None, task_id=None)
            session.commit()
        yield url


def test_configs_and_export_read_a_running_service_from_another_folder(
        service, elsewhere, capsys, monkeypatch):
    assert main(["configs", "--url", service, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["kernel"], row["shape"], row["config"], row["device_key"]) == (
        "matmul", SHAPE, CONFIG, INTERPRETER)
    out = elsewhere / "exported.json"
    assert main(["export", "--url", service, "--out", str(out)]) == 0
    [entry] = ConfigsFile.load(str(out)).entries
    assert (entry.shape, entry.config.to_dict(), entry.ms) == (SHAPE, CONFIG, 0.5)
    monkeypatch.setenv("TUNER_URL", service)  # as a model's host has it set
    assert main(["configs", "--kernel", "matmul"]) == 0
    assert "16x32x64" in capsys.readouterr().out
    assert not (elsewhere / "data").exists()  # no database was created


def test_reading_a_database_that_does_not_exist_is_an_error_not_a_new_file(elsewhere, capsys):
    for command in (["configs"], ["export"]):
        assert main(command) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert str(elsewhere / "data" / "tuner.db") in line and "no database" in line, line
    assert not (elsewhere / "data").exists()
