"""Issue 10 on the GPU: users' kernels launched through ``tuner.autotune`` with configs the
service tuned, against ``triton.autotune`` over the user's own configs list.

    python3 -m bench.plugin_demo first-launch --arm tuner|triton --url URL --out FILE.json
    python3 -m bench.plugin_demo kernel-times --url URL --out FILE.json
    python3 -m bench.plugin_demo report --dir DIR > table.md

``first-launch`` (run each arm in a fresh process with a fresh TRITON_CACHE_DIR for a cold
compile cache, then again with the same directory for a warm one) times the first call of each
example's launcher per shape: with ``tuner``, one lookup of the service plus compiling the one
tuned config; with ``triton``, ``triton.autotune`` compiling and timing its whole list.
``kernel-times`` times, in one process and interleaved, the tuned config and the config
``triton.autotune`` picks from the user's list (``do_bench``: median, L2 flushed between runs,
fresh random inputs), plus torch's own implementation for context. The examples come from
``examples/`` (rmsnorm installed as a package, bias_gelu through TUNER_KERNELS).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

SHAPES = {
    "rmsnorm": [{"M": 4096, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 2048, "N": 14336},
                {"M": 64, "N": 8192}],
    "bias_gelu": [{"M": 4096, "N": 4096}, {"M": 16384, "N": 11008}, {"M": 256, "N": 14336}],
}
DTYPE = "float16"


def _examples() -> dict[str, Any]:
    import bias_gelu
    import tuner_example_rmsnorm

    return {"rmsnorm": tuner_example_rmsnorm, "bias_gelu": bias_gelu}


def _inputs(name: str, shape: dict[str, int], seed: int = 0) -> tuple[Any, ...]:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape["M"], shape["N"], generator=gen, device="cuda").half()
    v = torch.randn(shape["N"], generator=gen, device="cuda").half()
    return (x, v)


def _call(module: Any, name: str, args: tuple[Any, ...]) -> Any:
    return module.rmsnorm(*args) if name == "rmsnorm" else module.bias_gelu(*args)


def _triton_version_of(module: Any, name: str) -> Any:
    """The same @triton.jit function under triton.autotune over the user's configs list."""
    import triton

    decorated = module.rmsnorm_kernel if name == "rmsnorm" else module.bias_gelu_kernel
    return triton.autotune(configs=decorated.configs, key=decorated.key)(decorated.fn)


def first_launch(arm: str, url: str) -> dict[str, Any]:
    import torch

    import tuner

    torch.ones(1, device="cuda").sum().item()  # CUDA context: not part of either arm
    tuner.configure(url=url, deadline_s=2.0, report_misses=False)
    modules = _examples()
    rows = []
    for name, shapes in SHAPES.items():
        module = modules[name]
        attr = "rmsnorm_kernel" if name == "rmsnorm" else "bias_gelu_kernel"
        if arm == "triton":
            setattr(module, attr, _triton_version_of(module, name))
        for shape in shapes:
            args = _inputs(name, shape)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _call(module, name, args)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            problem = (DTYPE, tuple(sorted(shape.items())))
            source = (getattr(module, attr).sources.get(problem) if arm == "tuner"
                      else "triton.autotune")
            rows.append({"kernel": name, "shape": shape, "first_launch_s": seconds,
                         "source": source})
            print(f"{arm} {name} {shape}: first launch {seconds * 1e3:.1f} ms ({source})",
                  flush=True)
    return {"arm": arm, "rows": rows}


def _torch_ms(name: str, args: tuple[Any, ...]) -> float:
    import torch
    import triton.testing

    x, v = args
    if name == "rmsnorm":
        fn = lambda: torch.nn.functional.rms_norm(x, (x.shape[1],), v, 1e-6)  # noqa: E731
    else:
        fn = lambda: torch.nn.functional.gelu(x + v, approximate="tanh")  # noqa: E731
    return float(triton.testing.do_bench(fn, warmup=25, rep=200))


def kernel_times(url: str) -> dict[str, Any]:
    import torch
    import triton.testing

    import tuner
    from tuner.user_kernel import config_from_triton

    tuner.configure(url=url, deadline_s=5.0, report_misses=False)
    modules = _examples()
    rows = []
    for name, shapes in SHAPES.items():
        module = modules[name]
        decorated = module.rmsnorm_kernel if name == "rmsnorm" else module.bias_gelu_kernel
        reference = _triton_version_of(module, name)
        for shape in shapes:
            args = _inputs(name, shape, seed=1)
            problem = (DTYPE, tuple(sorted(shape.items())))
            tuned = decorated.config_for(problem)
            # triton.autotune's choice from the user's list, found the way it finds it
            setattr(module, "rmsnorm_kernel" if name == "rmsnorm" else "bias_gelu_kernel",
                    reference)
            _call(module, name, args)
            picked = config_from_triton(reference.best_config)
            setattr(module, "rmsnorm_kernel" if name == "rmsnorm" else "bias_gelu_kernel",
                    decorated)
            times: dict[str, list[float]] = {"tuned": [], "list": []}
            for _ in range(5):  # interleaved rounds: clock drift hits both alike
                for label, config in (("tuned", tuned), ("list", picked)):
                    if config is None:
                        continue
                    with tuner.forced_config(config):
                        times[label].append(float(triton.testing.do_bench(
                            lambda m=module, n=name, a=args: _call(m, n, a), warmup=25,
                            rep=100)))
            torch.cuda.synchronize()
            tuned_ms = sorted(times["tuned"])[2] if times["tuned"] else None
            list_ms = sorted(times["list"])[2]
            row = {"kernel": name, "shape": shape, "tuned_config": tuned and tuned.to_dict(),
                   "list_config": picked.to_dict(), "tuned_ms": tuned_ms, "list_ms": list_ms,
                   "torch_ms": _torch_ms(name, args)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"rows": rows, "gpu": gpu_state()}


def gpu_state() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _shape(s: dict[str, int]) -> str:
    return "x".join(str(v) for v in s.values())


def report(folder: Path) -> str:
    def load(name: str) -> dict[str, Any]:
        return json.loads((folder / name).read_text())

    times = load("kernel_times.json")
    first = {arm: load(f"first_{arm}.json") for arm in
             ("tuner_cold", "triton_cold", "tuner_warm", "triton_warm")}
    lines = ["| kernel | shape (fp16) | first launch: tuner.autotune cold / warm cache | "
             "triton.autotune cold / warm | tuned config | best of user's list | "
             "tuned vs list | torch |", "|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(times["rows"]):
        f = {arm: first[arm]["rows"][i]["first_launch_s"] * 1e3 for arm in first}
        ratio = row["list_ms"] / row["tuned_ms"] if row["tuned_ms"] else float("nan")
        lines.append(
            f"| {row['kernel']} | {_shape(row['shape'])} | {f['tuner_cold']:.0f} / "
            f"{f['tuner_warm']:.0f} ms ({first['tuner_cold']['rows'][i]['source']}) | "
            f"{f['triton_cold']:.0f} / {f['triton_warm']:.0f} ms | "
            f"{row['tuned_ms'] * 1e3:.1f} us | {row['list_ms'] * 1e3:.1f} us | {ratio:.2f}x | "
            f"{row['torch_ms'] * 1e3:.1f} us |")
    lines.append("")
    lines.append(f"GPU state after the kernel timings: {times['gpu']}")
    lines.append("")
    lines.append("Configs: " + "; ".join(
        f"{r['kernel']} {_shape(r['shape'])}: tuned {r['tuned_config']}, list "
        f"{r['list_config']}" for r in times["rows"]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    fl = sub.add_parser("first-launch")
    fl.add_argument("--arm", choices=["tuner", "triton"], required=True)
    fl.add_argument("--url", required=True)
    fl.add_argument("--out", required=True)
    kt = sub.add_parser("kernel-times")
    kt.add_argument("--url", required=True)
    kt.add_argument("--out", required=True)
    rp = sub.add_parser("report")
    rp.add_argument("--dir", required=True)
    args = parser.parse_args()
    if args.cmd == "first-launch":
        Path(args.out).write_text(json.dumps(first_launch(args.arm, args.url)))
    elif args.cmd == "kernel-times":
        Path(args.out).write_text(json.dumps(kernel_times(args.url)))
    else:
        print(report(Path(args.dir)))


if __name__ == "__main__":
    main()
