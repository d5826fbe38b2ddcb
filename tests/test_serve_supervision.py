"""``tuner serve`` under an operator's faults: ``kill -9`` of it, its port taken. Real
processes, real signals, real sockets (``tuner.app.supervision``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support_processes import (
    ROOT,
    alive,
    free_port,
    interpreter_env,
    wait_for,
    wait_ready,
)


@contextmanager
def _serve(data: Path, port: int, log_name: str = "serve.log", **env: str
           ) -> Iterator[subprocess.Popen[bytes]]:
    """``tuner serve --backend interpret`` on ``port`` with its SQLite file in ``data``, in a
    session of its own; stopped with SIGTERM on leaving (its whole group SIGKILLed if that
    takes over a minute)."""
    with open(data / log_name, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.app.cli", "serve", "--port", str(port), "--backend",
             "interpret"], cwd=data, stdout=log, stderr=subprocess.STDOUT,
            env=interpreter_env(TUNER_DATA_DIR=str(data), TUNER_DATABASE_URL="", **env),
            start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _descendants(pid: int) -> list[int]:
    parents = _parents()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return sorted(found)


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after ``seconds`` (polled: nothing signals another's death)."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _idle_worker(base: str) -> bool:
    """Whether a worker has registered and is waiting for work (past its start-up)."""
    try:
        workers = httpx.get(f"{base}/healthz", timeout=5).json()["workers"]
    except (httpx.HTTPError, ValueError):
        return False
    return bool(workers) and any(w["status"] == "idle" and w["alive"]
                                 for w in workers["workers"])


@pytest.mark.timeout(400)
def test_a_serve_killed_with_sigkill_takes_every_child_along_and_frees_its_port(
        tmp_path: Path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with _serve(tmp_path, port) as first:
        wait_ready(base, first, timeout=180)
        wait_for(lambda: _idle_worker(base), first, timeout=180)
        children = _descendants(first.pid)
        try:
            # two API processes (the default) and the worker, at least
            assert len(children) >= 3, children
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            assert _gone_within(children, 15.0) == []
        finally:
            for pid in children:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
    with _serve(tmp_path, port, "serve2.log") as second:
        wait_ready(base, second, timeout=180)
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    assert "already in use" not in (tmp_path / "serve2.log").read_text()


@pytest.mark.timeout(120)
def test_a_port_in_use_is_one_line_naming_the_port_and_its_holder(tmp_path: Path):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tuner.app.cli", "serve", "--port", str(port), "--backend",
             "interpret"], cwd=tmp_path, capture_output=True, text=True, timeout=100,
            env=interpreter_env(TUNER_DATA_DIR=str(tmp_path), TUNER_DATABASE_URL=""))
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"tuner: error: port {port} is already in use by pid {os.getpid()} (")
    assert "another --port" in line
    assert not (tmp_path / "tuner.db").exists()  # refused before anything started


def _health(base: str) -> dict[str, Any]:
    try:
        response = httpx.get(f"{base}/healthz", timeout=5)
    except httpx.HTTPError:
        return {}
    assert response.status_code == 200  # liveness: the API answers whatever the workers do
    return dict(response.json())


@pytest.mark.timeout(400)
def test_a_worker_that_keeps_dying_is_restarted_and_healthz_says_so(tmp_path: Path):
    site = tmp_path / "site"  # the worker processes (only they) exit as they start
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\nif 'worker' in sys.orig_argv:\n    os._exit(3)\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with _serve(tmp_path, port, PYTHONPATH=f"{site}{os.pathsep}{ROOT}") as proc:
        wait_ready(base, proc, timeout=180)
        health = wait_for(lambda: (h := _health(base)) and (h["supervisor"] or {}).get(
            "workers", [{}])[0].get("restarts", 0) >= 3 and h, proc, timeout=180)
        assert health["status"] == "degraded"
        [worker] = health["supervisor"]["workers"]
        assert worker["state"] in ("restarting", "running") and worker["exits_in_a_row"] >= 3
        assert worker["last_exit"].startswith("exited with status 3 after ")
        assert health["supervisor"]["serve_pid"] == proc.pid
        down = wait_for(lambda: (h := _health(base)) and h["supervisor"]["workers"][0][
            "state"] == "restarting" and h, proc, timeout=120)
        assert down["status"] == "degraded" and down["supervisor"]["workers"][0][
            "restart_in_s"] >= 0
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200  # lookups go on


@pytest.mark.timeout(400)
def test_a_plugin_that_hangs_or_exits_while_importing_neither_holds_nor_stops_serve(
        tmp_path: Path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hangs_kernel.py").write_text("import time\n\ntime.sleep(3600)\n")
    (plugins / "exits_kernel.py").write_text("import sys\n\nsys.exit(3)\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with _serve(tmp_path, port, PYTHONPATH=f"{plugins}{os.pathsep}{ROOT}",
                TUNER_KERNELS="hangs_kernel:KERNEL,exits_kernel:KERNEL",
                TUNER_PLUGIN_IMPORT_TIMEOUT_S="2") as proc:
        wait_ready(base, proc, timeout=180)
        errors = {e["ref"]: e["error"] for e in _health(base)["plugins"]["errors"]}
        assert "did not finish within 2 s" in errors["hangs_kernel:KERNEL"]
        assert errors["exits_kernel:KERNEL"] == "it called sys.exit(3) while importing"
        kernels = httpx.get(f"{base}/api/v1/kernels", timeout=10).json()
        assert {e["ref"] for e in kernels["errors"]} == set(errors)
        assert "matmul" in {k["name"] for k in kernels["data"]}
        wait_for(lambda: _idle_worker(base), proc, timeout=180)  # the worker got past them too
        assert proc.poll() is None


#: the bounds of ``served`` on idle and slow connections (seconds)
KEEP_ALIVE_S = 2
READ_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``tuner serve`` on 127.0.0.1 with its defaults but short bounds on idle and slow
    connections, for the tests of what its HTTP server refuses; its base URL."""
    data = tmp_path_factory.mktemp("served")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with _serve(data, port, TUNER_KEEP_ALIVE_S=str(KEEP_ALIVE_S),
                TUNER_REQUEST_READ_TIMEOUT_S=str(READ_TIMEOUT_S)) as proc:
        wait_ready(base, proc, timeout=180)
        yield base


def _raw(base: str, request: bytes) -> bytes:
    """The whole answer to ``request`` sent on a fresh connection (closed by the server)."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname or "", url.port or 0), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_serve_on_loopback_refuses_a_host_it_does_not_serve(served: str):
    port = urlsplit(served).port
    refused = _raw(served, b"GET /healthz HTTP/1.1\r\nHost: rebound.attacker.example\r\n"
                          b"Connection: close\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 400 ")
    [error] = json.loads(refused.partition(b"\r\n\r\n")[2])["detail"]
    assert error["msg"] == ("this service refuses requests for a host it does not serve; it "
                            "answers for localhost, 127.0.0.1, ::1 (TUNER_ALLOWED_HOSTS)")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        answer = _raw(served, f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n"
                              "Connection: close\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 200 ")


def _connect(base: str) -> socket.socket:
    url = urlsplit(base)
    return socket.create_connection((url.hostname or "", url.port or 0), timeout=30)


def _closed_after(sock: socket.socket, trickle: bytes = b"", every_s: float = 0.5,
                  limit_s: float = 60.0) -> tuple[float, bytes]:
    """Send ``trickle`` a byte every ``every_s`` seconds (nothing when empty) until the server
    closes the connection; (seconds it took, what the server sent)."""
    started = time.monotonic()
    received = b""
    sock.settimeout(every_s)
    for i in range(int(limit_s / every_s)):
        if trickle:
            try:
                sock.send(trickle[i % len(trickle):i % len(trickle) + 1])
            except OSError:  # closed under us
                break
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    return time.monotonic() - started, received


def _timeout_message(received: bytes) -> str:
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    [error] = json.loads(received.partition(b"\r\n\r\n")[2])["detail"]
    return str(error["msg"])


def test_an_idle_connection_is_closed_before_its_first_request(served: str):
    with _connect(served) as sock:
        took, received = _closed_after(sock)
    assert received == b"" and KEEP_ALIVE_S - 0.5 <= took < KEEP_ALIVE_S + 10


def test_a_request_head_sent_a_byte_at_a_time_is_answered_408_and_closed(served: str):
    with _connect(served) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        # a byte every half second: each came before the keep-alive timeout would have
        took, received = _closed_after(sock, trickle=b"X-Padding: aaaaaaaaaa\r\n")
    assert READ_TIMEOUT_S - 0.5 <= took < READ_TIMEOUT_S + 10
    assert _timeout_message(received) == (
        "the request did not arrive within 4 s of its first byte "
        "(TUNER_REQUEST_READ_TIMEOUT_S); the connection is closed")


def test_a_request_body_sent_a_byte_at_a_time_is_answered_408_and_closed(served: str):
    with _connect(served) as sock:
        sock.sendall(b"POST /api/v1/configs/query HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        took, received = _closed_after(sock, trickle=b" ")
    assert READ_TIMEOUT_S - 0.5 <= took < READ_TIMEOUT_S + 10
    assert "did not arrive within 4 s" in _timeout_message(received)


def test_requests_sent_at_a_normal_pace_are_answered_on_one_kept_connection(served: str):
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with _connect(served) as sock:
        for pause in (0.0, KEEP_ALIVE_S / 2):  # the second within the keep-alive timeout
            time.sleep(pause)
            for part in (request[:10], request[10:30], request[30:]):  # in pieces, promptly
                sock.sendall(part)
                time.sleep(0.05)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                assert chunk, "the connection was closed"
                head += chunk
            status, _, rest = head.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in status.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(rest) < length:
                rest += sock.recv(65536)
            assert status.startswith(b"HTTP/1.1 200 ") and json.loads(rest)["status"]
        # then idle after the response: closed by the keep-alive timeout
        took, received = _closed_after(sock)
        assert received == b"" and took < KEEP_ALIVE_S + 10


def test_the_state_file_of_a_killed_serve_is_removed_by_the_next(tmp_path: Path):
    from tuner.app.supervision import remove_stale_states

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = tmp_path / f"tuner-serve-{gone}-abc.json"
    live = tmp_path / f"tuner-serve-{os.getpid()}-def.json"
    other = tmp_path / "tuner-serve-notes.json"
    for path in (left, live, other):
        path.write_text("{}")
    remove_stale_states(tmp_path)
    assert not left.exists() and live.exists() and other.exists()
