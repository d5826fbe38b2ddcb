"""Cold start of a process whose library kernels are served by ``tuner.install()`` (GPU).

Ten real autotuned kernels of installed libraries (the corpus of ``tests/corpus``: fla-core and
liger-kernel, launched through the library's own autotuner object, unchanged; liger's MoE
kernel, whose tuned ``BLOCK_M`` is outside its autotune list, is left out) are launched once
each, in two fresh processes, each with an empty Triton compile cache:

1. ``cold``: ``tuner.install()`` with an empty store: every kernel's first launch is Triton's
   own benchmarking over its list. With ``--store service`` (the default) the process talks
   to a real service (this script starts one on a fresh SQLite file, no plugin registered:
   the kernels are external to it) and what Triton measured is sent there as client-measured
   results; with ``--store file`` the configs it chose are exported as a configs file;
2. ``served``: ``tuner.install()`` with that store: every first launch takes the stored config
   (one compile, no benchmark).
3. ``pinned-a`` and ``pinned-b`` (``--store service``): two more fresh processes with
   ``TUNER_PINNED=1``: never benchmark; the configs both chose are compared with each other
   and with the served ones (0 differences expected); then ``empty-a`` and ``empty-b``, pinned
   with no store at all (each kernel's first config), compared likewise.

Reported: each kernel's first-launch time in both (and the total), the configs chosen in both
(the same, where the served one came from the file), and the hot path: the host time of one
launch of a key already decided, hooked (``ServedCache``) against plain Triton (a plain dict
as the autotuner's cache), on the same problems (keys decided: nothing compiles), medians of
``--repeats`` alternating loops of ``--calls`` launches, each loop timed before its
synchronize and shorter than the launch queue, so that it is the host's time.

Usage (on the GPU machine; about 3 to 6 minutes on an H100)::

    python3 -m bench.install_cold_start --out $OUT/install_cold_start.md

``--cpu`` runs the same on Triton's CPU interpreter (tiny problems, wall time standing in for
Triton's GPU timer), as the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the corpus kernels launched (liger_moe_up_proj_swiglu needs ``prepare`` per config)
KERNELS = ("fla_l2norm_fwd", "fla_layer_norm_fwd", "fla_swiglu_fwd", "fla_rotary_fwd",
           "fla_qk_rmsnorm_fwd", "fla_grpo_fwd", "fla_chunk_global_cumsum",
           "liger_swiglu_mlp_fwd", "liger_swiglu_mlp_fwd_inference", "liger_swiglu_mlp_bwd_dI")


def cpu_bench(fn: Any, quantiles: Any = None, **_: Any) -> Any:
    """Triton's timer on the CPU interpreter: wall time."""
    started = time.perf_counter()
    fn()
    ms = (time.perf_counter() - started) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def corpus() -> dict[str, Any]:
    from tests.corpus import fla_kernels, liger_kernels

    return {**fla_kernels.KERNELS, **liger_kernels.KERNELS}


def shapes(cpu: bool) -> dict[str, dict[str, int]]:
    from tests.corpus import fla_kernels, liger_kernels

    if cpu:
        return {**fla_kernels.SHAPES, **liger_kernels.SHAPES}
    return {n: s[0] for m in (fla_kernels, liger_kernels) for n, s in m.GPU_SHAPES.items()}


def library_launch(kernel: Any, inputs: dict[str, Any]) -> Callable[[], Any]:
    """A launch through the library's autotuner object (``kernel.fn``), its configs chosen
    there: the kernel's arguments without the tuned parameters, the library's grid."""
    grid = kernel._grid_seeing(None, inputs)
    args = kernel.kernel_args(inputs)
    return lambda: kernel.fn[grid](**args)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def run_phase(names: list[str], configs_file: str | None, cpu: bool, calls: int,
              repeats: int, export: str | None, url: str = "",
              pinned: bool = False) -> dict[str, Any]:
    """One process's first launches (and, served, its hot path); what each chose."""
    import tuner
    from tuner.configs_file import ConfigsEntry, write_tuner
    from tuner.identity import local_device_key, local_triton_version
    from tuner.installing import flush_reports, kernel_name, kernel_version, problem_of, sources
    from tuner.launching import unwrap
    from tuner.user_kernel import config_from_triton

    tuner.configure(url=url, configs_file=configs_file or "", report_misses=bool(url))
    tuner.install(pinned=pinned)
    device, dtype = ("cpu", "float32") if cpu else ("cuda", "float16")
    kernels, problem = corpus(), shapes(cpu)
    rows: list[dict[str, Any]] = []
    entries = []
    for name in names:
        kernel = kernels[name]
        autotuner = unwrap(kernel.fn).autotuner
        if cpu:
            autotuner.__dict__["do_bench"] = cpu_bench
        inputs = kernel.make_inputs(problem[name], dtype, device, 0)
        launch = library_launch(kernel, inputs)
        before = set(autotuner.cache)
        _sync(device)
        started = time.perf_counter()
        launch()
        _sync(device)
        seconds = time.perf_counter() - started
        decided = [k for k in autotuner.cache if k not in before]
        chosen = {repr(k): config_from_triton(autotuner.cache[k]).key() for k in decided}
        source = sorted({sources(kernel.fn).get(k, "triton") for k in decided})
        rows.append({"kernel": name, "shape": problem[name], "first_launch_s": seconds,
                     "configs": chosen, "source": ",".join(source) or "single config",
                     "qualified_name": kernel_name(autotuner)})
        for k in decided:
            found = problem_of(autotuner, k)
            if found is not None:
                entries.append(ConfigsEntry(
                    kernel=kernel_name(autotuner), kernel_version=kernel_version(autotuner),
                    dtype=found[1], device=local_device_key() or "",
                    triton_version=local_triton_version() or "", shape=found[0],
                    config=config_from_triton(autotuner.cache[k])))
    if export:
        write_tuner(entries, export)
    flush_reports(60.0)  # what Triton measured, sent to the service before the process ends
    return {"rows": rows, "hot": hot_path(names, cpu, calls, repeats) if calls else [],
            "exported": len(entries)}


def hot_path(names: list[str], cpu: bool, calls: int, repeats: int) -> list[dict[str, Any]]:
    """Host us per launch of a decided key, hooked against a plain dict cache."""
    from tuner.launching import unwrap

    device, dtype = ("cpu", "float32") if cpu else ("cuda", "float16")
    kernels, problem = corpus(), shapes(cpu)
    out = []
    for name in names:
        kernel = kernels[name]
        autotuner = unwrap(kernel.fn).autotuner
        launch = library_launch(kernel, kernel.make_inputs(problem[name], dtype, device, 0))
        launch()  # decided in the first launches
        served = autotuner.cache
        timings: dict[str, list[float]] = {"hooked": [], "plain": []}
        for _ in range(repeats):
            for label, cache in (("hooked", served), ("plain", dict(served))):
                autotuner.cache = cache
                launch()
                _sync(device)
                started = time.perf_counter()
                for _ in range(calls):
                    launch()
                timings[label].append((time.perf_counter() - started) / calls * 1e6)
                _sync(device)
        autotuner.cache = served
        out.append({"kernel": name, "hooked_us": statistics.median(timings["hooked"]),
                    "plain_us": statistics.median(timings["plain"])})
    return out


def _child(phase: str, args: argparse.Namespace, workdir: Path,
           configs_file: Path | None, url: str = "", pinned: bool = False) -> dict[str, Any]:
    """Run one phase in a fresh process with an empty Triton compile cache."""
    result = workdir / f"{phase}.json"
    cache = workdir / f"triton-cache-{phase}"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "TUNER_URL": "",
           "TUNER_CONFIGS_FILE": "", "TUNER_PINNED": "", "TUNER_KEYS_FILE": ""}
    if args.cpu:
        env["TRITON_INTERPRET"] = "1"
    command = [sys.executable, "-m", "bench.install_cold_start", "--phase", phase,
               "--json", str(result), "--calls", str(args.calls if phase == "served" else 0),
               "--repeats", str(args.repeats), "--kernels", *args.kernels]
    if args.cpu:
        command.append("--cpu")
    if configs_file is not None:
        command += ["--configs-file", str(configs_file)]
    if url:
        command += ["--url", url]
    if pinned:
        command.append("--pinned")
    if phase == "cold" and not url:
        command += ["--export", str(workdir / "configs.json")]
    subprocess.run(command, env=env, check=True)
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def report(cold: dict[str, Any], served: dict[str, Any], cpu: bool, store: str = "file",
           pinned: list[dict[str, Any]] | None = None, gpu: str = "") -> str:
    how = ("the service, filled by the cold run's client-measured results (no plugin "
           "registered: the kernels are external to it)" if store == "service" else
           "a configs file exported from the cold run's choices")
    lines = [f"# tuner.install() cold start ({'CPU interpreter' if cpu else 'GPU'})", "",
             *([f"GPU: {gpu}", ""] if gpu else []),
             "First launch of each kernel in a fresh process (empty Triton compile cache): "
             f"cold (empty store, Triton benchmarks) and served (from {how}).", "",
             "| kernel | shape | cold s | served s | served from | same config | config |",
             "|---|---|---:|---:|---|---|---|"]
    for c, s in zip(cold["rows"], served["rows"], strict=True):
        same = "yes" if c["configs"] == s["configs"] else "NO"
        config = "; ".join(sorted(set(s["configs"].values())))
        shape = ",".join(f"{k}={v}" for k, v in c["shape"].items())
        lines.append(f"| {c['kernel']} | {shape} | {c['first_launch_s']:.3f} | "
                     f"{s['first_launch_s']:.3f} | {s['source']} | {same} | {config} |")
    total_cold = sum(r["first_launch_s"] for r in cold["rows"])
    total_served = sum(r["first_launch_s"] for r in served["rows"])
    exported = f", {cold['exported']} configs exported" if store == "file" else ""
    lines += ["", f"Total first launches: cold {total_cold:.2f} s, served {total_served:.2f} s "
              f"({total_cold / max(total_served, 1e-9):.1f}x; {len(cold['rows'])} kernels"
              f"{exported}).", ""]
    if pinned:
        lines += _pinned_lines(served, pinned)
    if served["hot"]:
        lines += ["Hot path: host us per launch of a decided key, hooked against plain "
                  "Triton, medians.", "",
                  "| kernel | hooked us | plain us | overhead us |", "|---|---:|---:|---:|"]
        for h in served["hot"]:
            lines.append(f"| {h['kernel']} | {h['hooked_us']:.2f} | {h['plain_us']:.2f} | "
                         f"{h['hooked_us'] - h['plain_us']:+.2f} |")
    return "\n".join(lines) + "\n"


def _choices(phase: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(r["kernel"], k): c for r in phase["rows"] for k, c in r["configs"].items()}


def _pinned_lines(served: dict[str, Any], pinned: list[dict[str, Any]]) -> list[str]:
    """Pinned mode: two fresh processes with the store, two without; differences in choice."""
    a, b, empty_a, empty_b = (_choices(p) for p in pinned)
    reference = _choices(served)

    def differences(x: dict[Any, str], y: dict[Any, str]) -> int:
        return sum(x.get(k) != y.get(k) for k in set(x) | set(y))

    sources = sorted({r["source"] for r in pinned[0]["rows"]})
    return ["Pinned mode (`TUNER_PINNED=1`, never benchmarks), each a fresh process:", "",
            "| processes | keys | differences in choice |", "|---|---:|---:|",
            f"| pinned A vs pinned B, store filled | {len(a)} | {differences(a, b)} |",
            f"| pinned A vs served (benchmark-free start above) | {len(a)} | "
            f"{differences(a, reference)} |",
            f"| pinned A vs pinned B, no store (each kernel's first config) | {len(empty_a)} | "
            f"{differences(empty_a, empty_b)} |", "",
            f"Pinned A's sources: {', '.join(sources)}; first launches in total: pinned A "
            f"{sum(r['first_launch_s'] for r in pinned[0]['rows']):.2f} s, no store "
            f"{sum(r['first_launch_s'] for r in pinned[2]['rows']):.2f} s.", ""]


def _gpu_state() -> str:
    """The GPU and its clocks, power and temperature now (nvidia-smi), for the report."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,power.draw,"
                              "power.limit,temperature.gpu", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.replace("\n", "; ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="the markdown report (default: standard output)")
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS))
    parser.add_argument("--cpu", action="store_true", help="Triton's CPU interpreter")
    parser.add_argument("--calls", type=int, default=None, help="launches per hot-path loop")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--store", choices=["service", "file"], default="service",
                        help="where the cold run's results go: a real service it starts "
                             "(client-measured results) or an exported configs file")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--pinned", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--configs-file", help=argparse.SUPPRESS)
    parser.add_argument("--export", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls is None:
        args.calls = 20 if args.cpu else 200
    if args.phase:
        data = run_phase(args.kernels, args.configs_file, args.cpu, args.calls, args.repeats,
                         args.export, args.url, args.pinned)
        Path(args.json).write_text(json.dumps(data))
        return 0
    gpu = "" if args.cpu else _gpu_state()
    with tempfile.TemporaryDirectory(prefix="install-cold-start-") as tmp:
        workdir = Path(tmp)
        if args.store == "file":
            cold = _child("cold", args, workdir, None)
            served = _child("served", args, workdir, workdir / "configs.json")
            pinned = None
        else:
            from tests.api_support import running_app
            from tuner.settings import Settings

            with running_app(Settings(database_url=f"sqlite:///{workdir / 'store.db'}")) as url:
                cold = _child("cold", args, workdir, None, url)
                served = _child("served", args, workdir, None, url)
                pinned = [_child(p, args, workdir, None, url, pinned=True)
                          for p in ("pinned-a", "pinned-b")]
                pinned += [_child(p, args, workdir, None, "", pinned=True)
                           for p in ("empty-a", "empty-b")]
    text = report(cold, served, args.cpu, args.store, pinned, gpu)
    if not args.cpu:
        text += f"\nGPU after the runs: {_gpu_state()}\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
