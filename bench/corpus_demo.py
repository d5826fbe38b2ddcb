"""Issue 27 on the GPU: real library kernels (the corpus, ``tests/corpus/``) tuned through
``tuner serve`` and served, against each library's own ``triton.autotune`` pick.

    python3 -m bench.corpus_demo refs                      # TUNER_KERNELS for the corpus
    python3 -m bench.corpus_demo tune --url URL --out tune.json
    python3 -m bench.corpus_demo first-launch --arm tuner|library --url URL --out FILE.json
    python3 -m bench.corpus_demo kernel-times --url URL --out times.json
    python3 -m bench.corpus_demo tune-rows --db DB_URL --out tune_x.json  # from a tune's DB
    python3 -m bench.corpus_demo report --dir DIR > corpus_demo.md  # every tune*.json in DIR

``tune`` submits one job per corpus kernel (its GPU shapes, 48 trials a shape) to a running
``tuner serve`` and waits; it records each task's trials, wall time and best.
``first-launch`` (each arm in a fresh process) times the first call of each kernel on each
shape: ``tuner`` launches through ``tuner.autotune`` wrapped around the library's own jit
function (one lookup, one compile), ``library`` through the library's autotuner as imported
(it compiles and times its whole list). ``kernel-times`` times, in one process and
interleaved (5 rounds, median of each), the served config and the config the library's
autotuner picked in the first-launch run, both launched the same way
(``tuner.Kernel.launch``) and timed with the project's host-ahead ``do_bench`` (L2 flushed;
random inputs); the ratio is library / served.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import time
from pathlib import Path
from typing import Any

import httpx

from bench.plugin_demo import gpu_state

TRIALS = 48
ROUNDS = 5
#: GPU shapes a kernel is tuned and timed on (the first ones of its GPU_SHAPES): one keeps a
#: run of the whole corpus inside a device call
SHAPES_PER_KERNEL = 1


#: a job that runs longer than this is cancelled (its trials are kept), so a phase ends
JOB_DEADLINE_S = 180.0


def _selected(name: str) -> bool:
    """``CORPUS_ONLY``/``CORPUS_SKIP``: comma-separated kernel names a run is limited to or
    leaves out (to split the corpus across device calls)."""
    only = [n for n in os.environ.get("CORPUS_ONLY", "").split(",") if n]
    skip = [n for n in os.environ.get("CORPUS_SKIP", "").split(",") if n]
    return (not only or name in only) and name not in skip


def corpus() -> dict[str, tuple[Any, list[dict[str, int]], str]]:
    """Every corpus kernel: name -> (tuner.Kernel, its GPU shapes, its GPU dtype)."""
    import tests.corpus as package

    found: dict[str, tuple[Any, list[dict[str, int]], str]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"tests.corpus.{info.name}")
        shapes = getattr(module, "GPU_SHAPES", {})
        dtypes = getattr(module, "GPU_DTYPES", {})
        for name, kernel in getattr(module, "KERNELS", {}).items():
            if name in shapes and _selected(kernel.name):
                found[kernel.name] = (kernel, shapes[name][:SHAPES_PER_KERNEL],
                                      dtypes.get(name, _dtype(kernel)))
    return found


def _dtype(kernel: Any) -> str:
    return next(d for d in ("bfloat16", "float16", "float32") if d in kernel.dtypes)


def refs() -> str:
    return ",".join(kernel.ref for kernel, _, _ in corpus().values())


def _cancel_unselected(url: str, selected: set[str]) -> None:
    """Cancel the unfinished jobs of kernels this run leaves out (an earlier phase's, in the
    database it continues), so the worker runs only the selected ones."""
    for state in ("queued", "running"):
        listed = httpx.get(f"{url}/api/v1/jobs", params={"status": state, "limit": 500},
                           timeout=30).json()["data"]
        for job in listed:
            if job["kernel"] not in selected:
                httpx.post(f"{url}/api/v1/jobs/{job['id']}/cancel", timeout=30)
                print(f"cancelled {state} job {job['id']} ({job['kernel']}): not in this run",
                      flush=True)


def tune(url: str) -> dict[str, Any]:
    jobs = {}
    _cancel_unselected(url, set(corpus()))
    for name, (_, shapes, dtype) in corpus().items():
        body = {"kernel": name, "dtype": dtype, "shapes": shapes,
                "budget": {"trials": TRIALS}, "force": True}
        answer = httpx.post(f"{url}/api/v1/jobs", json=body, timeout=30)
        answer.raise_for_status()
        jobs[name] = answer.json()["id"]
        print(f"submitted {name} {dtype} {shapes}: job {jobs[name]}", flush=True)
    rows = []
    for name, job_id in jobs.items():
        job = _wait(url, job_id)
        for task in job["tasks"]:
            rows.append({"kernel": name, "dtype": job["dtype"], "shape": task["shape"],
                         "status": task["status"], "trials": task["trials_done"],
                         "best_ms": task["best_ms"], "best_config": task["best_config"],
                         "outcomes": task["outcome_counts"], "error": task["error"],
                         "verification": job.get("verification")})
        started, finished = job["started_at"], job["finished_at"]
        rows_of_job = [r for r in rows if r["kernel"] == name]
        for r in rows_of_job:
            r["job_wall_s"] = _seconds(started, finished)
        print(json.dumps(rows_of_job), flush=True)
    return {"rows": rows}


def _seconds(started: str | None, finished: str | None) -> float | None:
    from datetime import datetime

    if not started or not finished:
        return None
    return (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()


def _wait(url: str, job_id: str) -> dict[str, Any]:
    """The job once it ended; cancelled (its trials kept) once it has run JOB_DEADLINE_S."""
    started: float | None = None
    while True:
        job = httpx.get(f"{url}/api/v1/jobs/{job_id}", timeout=30).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return dict(job)
        if job["status"] == "running":
            started = started or time.monotonic()
            if time.monotonic() - started > JOB_DEADLINE_S:
                print(f"job {job_id} over {JOB_DEADLINE_S:.0f} s: cancelled", flush=True)
                httpx.post(f"{url}/api/v1/jobs/{job_id}/cancel", timeout=30)
        time.sleep(2)


def tune_rows(db_url: str) -> dict[str, Any]:
    """``tune``'s rows read back from a database a tune phase wrote (for a phase whose device
    call ended before ``tune`` wrote its file): each task's status, trials, wall time, best."""
    from sqlalchemy import create_engine, text

    query = text("SELECT j.kernel, j.dtype, t.shape, t.status, t.trials_done, t.best_ms, "
                 "t.best_config, t.outcome_counts, t.error, t.started_at, t.finished_at "
                 "FROM tasks t JOIN jobs j ON j.id = t.job_id ORDER BY t.id")
    with create_engine(db_url).connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
    out = []
    for r in rows:
        decode = (lambda v: json.loads(v) if isinstance(v, str) else v)
        out.append({"kernel": r["kernel"], "dtype": r["dtype"], "shape": decode(r["shape"]),
                    "status": r["status"], "trials": r["trials_done"], "best_ms": r["best_ms"],
                    "best_config": decode(r["best_config"]),
                    "outcomes": decode(r["outcome_counts"]), "error": r["error"],
                    "job_wall_s": _seconds(r["started_at"] and str(r["started_at"]),
                                           r["finished_at"] and str(r["finished_at"]))})
    return {"rows": out}


def served(kernel: Any) -> Any:
    """The library's jit function under ``tuner.autotune``, as a user adopting the service
    would decorate it: the kernel's name, list, key, problem and dtype argument."""
    from triton.runtime.autotuner import Heuristics

    from tuner.autotuning import Autotuned
    from tuner.launching import Chain, unwrap

    parts = unwrap(kernel.fn)
    spec = kernel.problem_spec
    decorated: Any = Autotuned(parts.jit, parts.autotuner.configs, list(spec.key),
                               kernel.name, {}, spec.problem, spec.dtype_arg)
    layers = parts.runner.heuristics if isinstance(parts.runner, Chain) else ()
    for layer in reversed(layers):  # heuristics stacked over it, as the library stacks them
        decorated = Heuristics(decorated, layer.arg_names, layer.values)
    return decorated


def _launch_args(kernel: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return kernel.kernel_args(inputs)


def first_launch(arm: str, url: str) -> dict[str, Any]:
    import torch

    import tuner
    from tuner.launching import unwrap
    from tuner.user_kernel import config_from_triton

    torch.ones(1, device="cuda").sum().item()  # the CUDA context: in neither arm
    tuner.configure(url=url, deadline_s=2.0, report_misses=False)
    rows = []
    for name, (kernel, shapes, dtype) in corpus().items():
        launcher = served(kernel) if arm == "tuner" else kernel.fn
        for shape in shapes:
            inputs = kernel.make_inputs(shape, dtype, "cuda", 0)
            if getattr(kernel, "_prepare", None) is not None and arm == "library":
                rows.append({"kernel": name, "shape": shape, "first_launch_s": None,
                             "source": "n/a: inputs depend on the config"})
                continue
            prepared = getattr(kernel, "_prepare", None) is not None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            args = _launch_args(kernel, inputs)
            if prepared:  # the launcher pads the inputs to the config it is served
                problem = unwrap(launcher).autotuner.problem(inputs)
                config = (unwrap(launcher).autotuner.config_for(problem) if problem else None
                          ) or kernel.configs[0]
                args = kernel._launch_args(config, inputs)
            launcher[inputs.get("_grid", kernel._grid)](**args)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            source, pick = "library autotune", None
            if arm == "library":
                pick = config_from_triton(unwrap(launcher).autotuner.best_config).to_dict()
            if arm == "tuner":
                decorated = unwrap(launcher).autotuner  # the Autotuned under any heuristics
                problem = decorated.problem({**inputs, **args})
                source = decorated.sources.get(problem, "?") if problem else "?"
            rows.append({"kernel": name, "shape": shape, "first_launch_s": seconds,
                         "source": source, "library_config": pick})
            print(f"{arm} {name} {shape}: {seconds * 1e3:.1f} ms ({source})", flush=True)
    return {"arm": arm, "rows": rows}


def _library_pick(kernel: Any, inputs: dict[str, Any], picked: dict[str, Any] | None) -> Any:
    """The config the library's autotuner picked in the first-launch run (``picked``), else
    the one it picks on these inputs, found as it finds it."""
    from tuner.config import KernelConfig
    from tuner.launching import unwrap
    from tuner.user_kernel import config_from_triton

    if picked:
        return KernelConfig(picked)
    lib = kernel.fn
    lib[inputs.get("_grid", kernel._grid)](**_launch_args(kernel, inputs))
    return config_from_triton(unwrap(lib).autotuner.best_config)


def kernel_times(url: str, picks_file: str | None = None) -> dict[str, Any]:
    import torch

    import tuner
    from tuner.autotuning import shared_client
    from tuner.gpu_timer import do_bench

    tuner.configure(url=url, deadline_s=5.0, report_misses=False)
    picks = {(r["kernel"], _shape(r["shape"])): r.get("library_config") for r in json.loads(
        Path(picks_file).read_text())["rows"]} if picks_file else {}
    rows = []
    for name, (kernel, shapes, dtype) in corpus().items():
        for shape in shapes:
            inputs = kernel.make_inputs(shape, dtype, "cuda", 1)
            found = shared_client().exact_config(name, shape, dtype,
                                                 kernel_version=kernel.version)
            tuned = found[0] if found else None
            pick = (None if getattr(kernel, "_prepare", None) is not None
                    else _library_pick(kernel, inputs, picks.get((name, _shape(shape)))))
            arms = {"served": tuned, "library": pick}
            times: dict[str, list[float]] = {k: [] for k, c in arms.items() if c is not None}
            for _ in range(ROUNDS):  # interleaved: drift hits both alike
                for label in times:
                    config = arms[label]
                    times[label].append(float(do_bench(
                        lambda c=config, k=kernel, i=inputs: k.launch(c, i), warmup=25,
                        rep=100)[1]))
            torch.cuda.synchronize()
            med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            row = {"kernel": name, "shape": shape, "dtype": dtype,
                   "served_config": tuned and tuned.to_dict(),
                   "library_config": pick and pick.to_dict(),
                   "served_ms": med.get("served"), "library_ms": med.get("library"),
                   "served_rounds": times.get("served"), "library_rounds": times.get("library"),
                   "verification": getattr(kernel, "verification", "reference"),
                   "list_size": len(kernel.configs)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"rows": rows, "gpu": gpu_state()}


def _shape(s: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in s.items())


def _ms(v: float | None, scale: float = 1e3, unit: str = "us") -> str:
    return "n/a" if v is None else f"{v * scale:.1f} {unit}"


def report(folder: Path) -> str:
    def load(name: str) -> dict[str, Any]:
        return dict(json.loads((folder / name).read_text()))

    tuned: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(folder.glob("tune*.json")):  # phases: a task's furthest run counts
        for r in json.loads(path.read_text())["rows"]:
            key = (r["kernel"], _shape(r["shape"]))
            if key not in tuned or (r["trials"] or 0) > (tuned[key]["trials"] or 0):
                tuned[key] = r
    times = load("kernel_times.json")
    first = {arm: {(r["kernel"], _shape(r["shape"])): r for r in load(f"first_{arm}.json")[
        "rows"]} for arm in ("tuner", "library")}
    lines = ["| kernel | dtype | shape | list | trials | job wall | served | library pick | "
             "library / served | first launch: served / library | checked against |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in times["rows"]:
        key = (row["kernel"], _shape(row["shape"]))
        t, fs, fl = tuned.get(key, {}), first["tuner"].get(key, {}), first["library"].get(key, {})
        ratio = (row["library_ms"] / row["served_ms"]
                 if row["library_ms"] and row["served_ms"] else None)
        wall = t.get("job_wall_s")
        lines.append(
            f"| {row['kernel']} | {row['dtype']} | {key[1]} | {row['list_size']} | "
            f"{t.get('trials', 'n/a')} | {'n/a' if wall is None else f'{wall:.1f} s'} | "
            f"{_ms(row['served_ms'])} | {_ms(row['library_ms'])} | "
            f"{'n/a' if ratio is None else f'{ratio:.3f}x'} | "
            f"{_ms(fs.get('first_launch_s'), 1e3, 'ms')} ({fs.get('source', '?')}) / "
            f"{_ms(fl.get('first_launch_s'), 1e3, 'ms')} | {row['verification']} |")
    lines += ["", f"GPU state after the kernel timings: {times['gpu']}", "",
              "Per-round medians (served / library, ms) and configs:", ""]
    for row in times["rows"]:
        lines.append(f"- {row['kernel']} {_shape(row['shape'])}: served {row['served_config']}"
                     f" {row['served_rounds']}; library {row['library_config']} "
                     f"{row['library_rounds']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("refs")
    for cmd in ("tune", "kernel-times"):
        p = sub.add_parser(cmd)
        p.add_argument("--url", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--picks", help="kernel-times: the library arm's first-launch json "
                       "(its picks are timed instead of autotuning again)")
    fl = sub.add_parser("first-launch")
    fl.add_argument("--arm", choices=["tuner", "library"], required=True)
    fl.add_argument("--url", required=True)
    fl.add_argument("--out", required=True)
    tr = sub.add_parser("tune-rows")
    tr.add_argument("--db", required=True)
    tr.add_argument("--out", required=True)
    rp = sub.add_parser("report")
    rp.add_argument("--dir", required=True)
    args = parser.parse_args()
    if args.cmd == "refs":
        print(refs())
        return
    if args.cmd == "tune-rows":
        Path(args.out).write_text(json.dumps(tune_rows(args.db), indent=1))
        return
    if args.cmd == "report":
        print(report(Path(args.dir)))
        return
    result = (tune(args.url) if args.cmd == "tune" else
              kernel_times(args.url, args.picks) if args.cmd == "kernel-times" else
              first_launch(args.arm, args.url))
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
