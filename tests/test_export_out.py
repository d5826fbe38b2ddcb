"""Where ``tuner export --out`` writes (issue 32, item 8): a folder named with its slash is
never written as a file (the tuner format refuses it, naming a file to give; vLLM's format
creates it and writes the file vLLM looks for), and exported files get a new file's mode
(0644 under the usual umask), not mkstemp's 0600."""

from __future__ import annotations

import os
import stat

from tests.test_export import SQUARE, one_error_line, source, store, store_moe
from tuner.app.cli import main

__all__ = ["source"]  # the fixture


def test_a_folder_for_the_tuner_format_is_refused_not_written_as_a_file(source, tmp_path,
                                                                        capsys, monkeypatch):
    store(source, SQUARE, 0.2)
    monkeypatch.chdir(tmp_path)
    assert main(["--db", source, "export", "--out", "exports/"]) == 2
    line = one_error_line(capsys)
    assert "--out 'exports/' is a folder" in line and "exports/configs.json" in line, line
    assert not (tmp_path / "exports").exists()
    (tmp_path / "there").mkdir()
    assert main(["--db", source, "export", "--out", "there"]) == 2
    assert "is a folder" in one_error_line(capsys)
    assert list((tmp_path / "there").iterdir()) == []


def test_a_missing_folder_for_the_vllm_format_is_created(source, tmp_path):
    store_moe(source)
    folder = tmp_path / "vllm-configs"
    assert main(["--db", source, "export", "--format", "vllm", "--out", f"{folder}/"]) == 0
    assert [p.name for p in folder.iterdir()] == ["E=8,N=14336,device_name=NVIDIA_H200.json"]


def test_exported_files_get_a_new_files_mode(source, tmp_path):
    store(source, SQUARE, 0.2)
    old = os.umask(0o022)
    try:
        out = tmp_path / "configs.json"
        assert main(["--db", source, "export", "--out", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        os.umask(0o027)
        assert main(["--db", source, "export", "--out", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o640
    finally:
        os.umask(old)
