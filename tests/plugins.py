"""The example plugin kernels of ``examples/``, registered as a user registers them.

``rmsnorm`` is installed with pip as a real package (into a folder of its own, once per source
version) and found through its ``tuner.kernels`` entry point; ``bias_gelu`` is a module found
through ``TUNER_KERNELS``. ``registered()`` puts both on the path and in the environment (so
measuring child processes and ``tuner serve`` subprocesses see them too) and rebuilds the
registry; leaving it restores everything.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import search_spaces

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PLUGIN_NAMES = ("bias_gelu", "rmsnorm")


def _source_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "egg-info" not in str(path) and "__pycache__" not in str(path):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def installed_rmsnorm() -> Path:
    """``pip install examples/rmsnorm`` into a folder of its own; that folder."""
    source = EXAMPLES / "rmsnorm"
    site = Path(tempfile.gettempdir()) / f"tuner-test-rmsnorm-{_source_digest(source)}"
    if not (site / "tuner_example_rmsnorm").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-cache-dir", "--target", str(site),
                        str(source)], check=True, capture_output=True)
    return site


def plugin_env(extra_refs: str = "") -> dict[str, str]:
    """Environment variables under which both examples are registered."""
    paths = [str(installed_rmsnorm()), str(EXAMPLES / "bias_gelu"), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    refs = ",".join(r for r in ("bias_gelu:KERNEL", extra_refs) if r)
    return {"PYTHONPATH": os.pathsep.join(paths), "TUNER_KERNELS": refs}


@contextmanager
def registered(extra_refs: str = "", extra_path: Path | None = None) -> Iterator[None]:
    """Both examples (and ``extra_refs``, found on ``extra_path``) registered in this process
    and in the environment of the processes it starts."""
    env = plugin_env(extra_refs)
    if extra_path is not None:
        env["PYTHONPATH"] = f"{extra_path}{os.pathsep}{env['PYTHONPATH']}"
    saved_env = {k: os.environ.get(k) for k in env}
    saved_path = list(sys.path)
    os.environ.update(env)
    sys.path[:0] = env["PYTHONPATH"].split(os.pathsep)
    search_spaces.reload()
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.path[:] = saved_path
        search_spaces.reload()


def all_kernel_names() -> list[str]:
    """Every kernel registered with the examples installed: built-ins and plugins."""
    with registered():
        return search_spaces.kernel_names()
