"""Serving configs under load: a fleet of models starting at once against ``tuner serve``.

    python3 -m bench.serving_load --out bench/results/serving_load.md

Seeds a SQLite file with a realistic store (~350 tuned shapes: matmul fp16 and bf16, softmax
fp16 and the ``bias_gelu`` example kernel as a plugin, each on an H200 and an H100), then for
each arm starts ``tuner serve --workers 0`` on it and runs a load generator in a separate
process (asyncio, raw HTTP/1.1 over keep-alive connections, so that the generator costs little
CPU) that measures:

- a bulk query of 1,000 items (``POST /api/v1/configs/query``): median of 7 after 2 warm-ups,
  client-side and server time (the ``Server-Timing`` header: routing, validation, the handler,
  serialising the body);
- one client's lookups (``GET /api/v1/configs``, one after another): p50 client-side and server
  time over 500 after 50 warm-ups;
- ``--clients`` (64) concurrent clients looping on lookups for ``--seconds`` (10): lookups/s,
  p50/p99 client-side latency, and the CPU seconds the server's processes used in that window
  (``/proc``), so that lookups per server-CPU-second do not depend on the generator sharing the
  server's cores.

Lookups are a model start-up's mix: 60% tuned shapes on the caller's GPU (``exact``), 30%
untuned batch sizes (``nearest``), 10% a GPU with nothing tuned (``other-device``).

Arms: ``before`` (``TUNER_SERVING_REFRESH_S=0``: every lookup reads the database, one API
process: the code path before the serving index), ``index-1`` (the index, one API process) and
``after`` (the index, ``--api-workers`` processes). ``--server-cpus 0,1 --client-cpus 2-7`` pins
the server and the generator to disjoint cores where the machine has them (Linux).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
H200 = "cuda:NVIDIA H200:sm90"
H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
UNTUNED_GPU = "cuda:NVIDIA A100-SXM4-80GB:sm80"
TRITON = "3.6.0"
PLUGIN_ENV = {"TUNER_KERNELS": "bias_gelu:KERNEL",
              "PYTHONPATH": os.pathsep.join(filter(None, (
                  str(ROOT), str(ROOT / "examples/bias_gelu"), os.environ.get("PYTHONPATH"))))}
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
#: (kernel, dtypes, the non-batch dimensions of each tuned shape)
STORE: list[tuple[str, list[str], list[dict[str, int]]]] = [
    ("matmul", ["float16", "bfloat16"], [{"N": 4096, "K": 4096}, {"N": 14336, "K": 4096},
                                         {"N": 4096, "K": 14336}, {"N": 6144, "K": 4096}]),
    ("softmax", ["float16"], [{"N": 1024}, {"N": 4096}, {"N": 32000}, {"N": 128256}]),
    ("bias_gelu", ["float16"], [{"N": 4096}, {"N": 14336}]),
]


# -- the store ----------------------------------------------------------------------------------

def tuned_shapes() -> list[tuple[str, str, dict[str, int]]]:
    """(kernel, dtype, shape) of every tuned shape, the batch dimension ``M``."""
    return [(kernel, dtype, {"M": m, **rest}) for kernel, dtypes, others in STORE
            for dtype in dtypes for rest in others for m in BATCHES]


def seed_store(db_url: str) -> int:
    """Every tuned shape on both GPUs (a config from the kernel's own space); returns rows."""
    from db import repo
    from db.engine import init_db
    from search_spaces import get_kernel

    rng = random.Random(0)
    factory = init_db(db_url)
    rows = 0
    with factory() as session:
        for device in (H200, H100):
            repo.upsert_device(session, {"key": device, "kind": "cuda",
                                         "name": device.split(":")[1]})
        for kernel_name, dtype, shape in tuned_shapes():
            kernel = get_kernel(kernel_name)
            configs = list(kernel.space())
            for device in (H200, H100):
                config = rng.choice(configs).to_dict()
                ms = rng.uniform(0.01, 1.0)
                repo.store_best(session, device_key=device, kernel=kernel_name,
                                kernel_version=kernel.version, dtype=dtype, shape=shape,
                                triton_version=TRITON, config=config, p20_ms=ms, p50_ms=ms,
                                p80_ms=ms, tflops=None, gbps=None, torch_version=None,
                                cuda_version=None, task_id=None)
                rows += 1
        session.commit()
    return rows


def lookups(count: int, seed: int) -> list[dict[str, Any]]:
    """A model start-up's lookups: 60% exact, 30% nearest (an untuned batch), 10% another
    GPU with nothing tuned."""
    rng = random.Random(seed)
    tuned = tuned_shapes()
    out = []
    for _ in range(count):
        kernel, dtype, shape = rng.choice(tuned)
        roll = rng.random()
        device = rng.choice((H200, H100))
        if 0.6 <= roll < 0.9:
            shape = {**shape, "M": max(1, int(shape["M"] * rng.uniform(0.55, 0.95)))}
        elif roll >= 0.9:
            device = UNTUNED_GPU
        out.append({"kernel": kernel, "dtype": dtype, "shape": shape, "device": device,
                    "triton_version": TRITON})
    return out


# -- the server ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(db_url: str, port: int, api_workers: int, refresh_s: float,
                 cpus: set[int] | None, log_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **PLUGIN_ENV, "TUNER_DATABASE_URL": db_url,
           "TUNER_SERVING_REFRESH_S": str(refresh_s), "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "tuner.app.cli", "serve", "--port", str(port), "--workers", "0",
           "--api-workers", str(api_workers)]
    log = open(log_path, "wb")  # noqa: SIM115 - the server's whole life

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=pin)


def wait_ready(port: int, proc: subprocess.Popen[bytes], api_workers: int) -> None:
    """Until every API process answers (each connection may reach another process: ask
    until as many distinct pids as processes were seen, or enough successes)."""
    import http.client

    deadline = time.monotonic() + 180
    ok = 0
    while ok < 4 * api_workers:
        if proc.poll() is not None:
            raise SystemExit(f"tuner serve exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit("tuner serve did not become ready in 180 s")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/readyz")
            ok += conn.getresponse().status == 200
            conn.close()
        except OSError:
            time.sleep(0.5)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants (``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(times.get(pid, 0.0) for pid in tree)


# -- the load generator (its own process) ---------------------------------------------------------

class Connection:
    """One keep-alive HTTP/1.1 connection; a request returns (seconds, server ms, status)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[float, float, int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        start = time.perf_counter()
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, server_ms = 0, float("nan")
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"server-timing":
                server_ms = float(value.split(b"dur=")[1])
        body = await self.reader.readexactly(length)
        return time.perf_counter() - start, server_ms, status, body


def get_request(item: dict[str, Any]) -> bytes:
    from urllib.parse import urlencode

    params = {"kernel": item["kernel"], "dtype": item["dtype"], **item["shape"],
              "device": item["device"], "triton_version": item["triton_version"]}
    return (f"GET /api/v1/configs?{urlencode(params)} HTTP/1.1\r\nHost: bench\r\n\r\n"
            .encode())


def post_request(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bulk(port: int, items: int, reps: int) -> dict[str, Any]:
    conn = Connection(port)
    raw = post_request("/api/v1/configs/query", {"items": lookups(items, seed=1)})
    client, server = [], []
    for i in range(reps + 2):
        seconds, server_ms, status, body = await conn.request(raw)
        assert status == 200 and json.loads(body)["count"] == items, (status, body[:300])
        if i >= 2:
            client.append(seconds * 1e3)
            server.append(server_ms)
    return {"bulk_ms": statistics.median(client), "bulk_server_ms": statistics.median(server)}


async def single(port: int, count: int) -> dict[str, Any]:
    conn = Connection(port)
    raws = [get_request(item) for item in lookups(count + 50, seed=2)]
    client, server = [], []
    matches: dict[str, int] = {}
    for i, raw in enumerate(raws):
        seconds, server_ms, status, body = await conn.request(raw)
        assert status in (200, 404), (status, body[:300])
        if i >= 50:
            client.append(seconds * 1e3)
            server.append(server_ms)
            match = json.loads(body)["match"]
            matches[match] = matches.get(match, 0) + 1
    return {"single_p50_ms": pct(client, 0.5), "single_server_p50_ms": pct(server, 0.5),
            "single_server_p90_ms": pct(server, 0.9), "matches": matches}


async def concurrent(port: int, clients: int, seconds: float, server_pid: int
                     ) -> dict[str, Any]:
    raws = [get_request(item) for item in lookups(2000, seed=3)]
    latencies: list[float] = []
    errors = 0
    conns = [Connection(port) for _ in range(clients)]
    for conn in conns:  # connect (and warm every process) before the clock starts
        await conn.request(raws[0])
    stop = time.perf_counter() + seconds

    async def loop(n: int, conn: Connection) -> None:
        nonlocal errors
        i = n * 31
        while time.perf_counter() < stop:
            elapsed, _, status, _ = await conn.request(raws[i % len(raws)])
            i += 1
            if status in (200, 404):
                latencies.append(elapsed * 1e3)
            else:
                errors += 1

    cpu0, own0, t0 = tree_cpu_seconds(server_pid), _own_cpu(), time.perf_counter()
    await asyncio.gather(*(loop(n, c) for n, c in enumerate(conns)))
    wall = time.perf_counter() - t0
    server_cpu = tree_cpu_seconds(server_pid) - cpu0
    return {"clients": clients, "wall_s": wall, "lookups": len(latencies), "errors": errors,
            "lookups_per_s": len(latencies) / wall, "p50_ms": pct(latencies, 0.5),
            "p99_ms": pct(latencies, 0.99), "server_cpu_s": server_cpu,
            "lookups_per_server_cpu_s": len(latencies) / server_cpu if server_cpu else 0.0,
            "generator_cpu_s": _own_cpu() - own0}


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def generate(args: argparse.Namespace) -> dict[str, Any]:
    result = await bulk(args.port, args.bulk_items, args.bulk_reps)
    result.update(await single(args.port, args.single))
    result.update(await concurrent(args.port, args.clients, args.seconds, args.server_pid))
    return result


# -- the arms and the table -----------------------------------------------------------------------

ARMS = {  # name: (API processes, TUNER_SERVING_REFRESH_S; 0 = no index), description
    "before": (1, 0.0, "no index (every lookup reads the database), 1 API process"),
    "index-1": (1, 0.5, "serving index, 1 API process"),
    "after": (None, 0.5, "serving index, {n} API processes"),
}


def cpus(spec: str | None) -> set[int] | None:
    if not spec:
        return None
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def run_arm(name: str, args: argparse.Namespace, db_url: str, work: Path) -> dict[str, Any]:
    processes, refresh_s, _ = ARMS[name]
    processes = processes or args.api_workers
    port = free_port()
    proc = start_server(db_url, port, processes, refresh_s, cpus(args.server_cpus),
                        work / f"serve_{name}.log")
    try:
        wait_ready(port, proc, processes)
        cmd = [sys.executable, "-m", "bench.serving_load", "--generate", "--port", str(port),
               "--server-pid", str(proc.pid), "--clients", str(args.clients),
               "--seconds", str(args.seconds), "--single", str(args.single),
               "--bulk-items", str(args.bulk_items), "--bulk-reps", str(args.bulk_reps)]
        client_cpus = cpus(args.client_cpus)
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False,
                             preexec_fn=(lambda: os.sched_setaffinity(0, client_cpus))
                             if client_cpus else None)
        if out.returncode != 0:
            raise SystemExit(f"load generator failed:\n{out.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        stop_server(proc)
    result.update(arm=name, processes=processes, refresh_s=refresh_s)
    print(json.dumps(result), flush=True)
    return result


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} cores ({model or platform.processor()}), "
            f"load average {load:.1f} at the start")


def table(results: list[dict[str, Any]], args: argparse.Namespace, rows: int) -> str:
    command = "python3 -m bench.serving_load " + " ".join(args.argv)
    server_cores = args.server_cpus or "all (shared with the generator)"
    lines = [
        "# Serving configs under load (`bench/serving_load.py`)", "",
        f"Command: `{command.strip()}`", "",
        f"Machine: {machine()}; server cores: {server_cores}; "
        f"generator cores: {args.client_cpus or 'all'}. SQLite store of {rows} tuned "
        "shapes (matmul fp16/bf16, softmax fp16, bias_gelu fp16 as a plugin; H200 and H100). "
        "Lookups: 60% exact, 30% nearest, 10% another GPU.", "",
        "| arm | bulk 1,000 items: ms (server) | one client: p50 ms (server p50 / p90) | "
        f"{args.clients} clients: lookups/s | p50 / p99 ms | server CPU-s | lookups per "
        "server CPU-s | generator CPU-s | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        _, _, description = ARMS[r["arm"]]
        lines.append(
            f"| {r['arm']}: {description.format(n=r['processes'])} | {r['bulk_ms']:.1f} "
            f"({r['bulk_server_ms']:.1f}) | {r['single_p50_ms']:.2f} "
            f"({r['single_server_p50_ms']:.2f} / {r['single_server_p90_ms']:.2f}) | "
            f"{r['lookups_per_s']:.0f} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} | "
            f"{r['server_cpu_s']:.1f} | {r['lookups_per_server_cpu_s']:.0f} | "
            f"{r['generator_cpu_s']:.1f} | {r['errors']} |")
    matches = results[-1]["matches"] if results else {}
    lines += ["", f"Matches of the one-client lookups (last arm): {json.dumps(matches)}.",
              "Server time: the `Server-Timing` header (the app's routing, validation, handler "
              "and body, without the HTTP server's parsing). Server CPU-s: user + system "
              "seconds of the `tuner serve` process tree during the concurrent window "
              "(/proc). Lookups per server CPU-s times the server's cores bounds what it "
              "serves when the generator runs elsewhere.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the markdown table here")
    ap.add_argument("--arms", default="before,index-1,after")
    ap.add_argument("--api-workers", type=int, default=2, help="processes of the 'after' arm")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--single", type=int, default=500)
    ap.add_argument("--bulk-items", type=int, default=1000)
    ap.add_argument("--bulk-reps", type=int, default=7)
    ap.add_argument("--server-cpus", help="pin the server to these cores, e.g. 0,1")
    ap.add_argument("--client-cpus", help="pin the load generator to these cores, e.g. 2-7")
    ap.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        print(json.dumps(asyncio.run(generate(args))))
        return
    args.argv = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        db_url = f"sqlite:///{work / 'store.db'}"
        os.environ.update(PLUGIN_ENV)
        sys.path.insert(0, str(ROOT / "examples/bias_gelu"))
        rows = seed_store(db_url)
        results = [run_arm(name, args, db_url, work) for name in args.arms.split(",")]
    text = table(results, args, rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
