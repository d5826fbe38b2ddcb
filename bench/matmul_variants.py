"""Issue 13's GEMM targets: the configs expected to win, per variant, timed beside torch.

For each target problem, each listed config is checked against the space's constraints (on this
device: its SM count, shared memory and compute capability), run once and verified against the
fp32 reference (stream_k's also launched 20 more times, each bit the same), then timed with
``triton.testing.do_bench`` interleaved with ``torch.matmul`` in this one process (ratio = torch
ms / config ms: above 1 the config is faster). A quick look, not the tuner's protocol:
``bench/targets.py`` tunes the same problems with the product.

Usage (on the GPU machine)::

    python3 -m bench.matmul_variants [--only 4096] [--rounds 3]
    python3 -m bench.matmul_variants --table T.json [--table ...] [--pipeline]

``--table`` re-times a recorded replay table's picks on its own problem instead: the table's
best, each VARIANT's best, and beside each one of another variant its tiled twin (the same tile
with VARIANT=0, whether or not the table holds it), pruned configs included (their reason is
logged): a check, in one process, of what a sampled table says about the variants and of the
constraints that prune its best. ``--pipeline`` times them as the product does (``run_pipeline``).

``--smoke`` runs and verifies every config once on the CPU interpreter, on small shapes with the
same alignments, in float16 (the interpreter's bf16 dot is wrong), untimed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
_BIG = [("tma_persistent", 1, (128, 256, 64, 8, 8, 3)),
        ("tma_persistent", 1, (128, 128, 64, 8, 8, 4)),
        ("tma_persistent", 1, (128, 192, 64, 8, 8, 3)),
        ("tma_persistent", 1, (128, 192, 64, 8, 8, 4)),
        ("tma_persistent", 1, (128, 192, 128, 8, 8, 2)),
        ("tma_persistent", 1, (128, 192, 64, 4, 8, 4)),
        ("tma_persistent", 1, (128, 192, 64, 8, 4, 4)),
        ("tma_persistent", 1, (128, 128, 64, 8, 4, 5)),
        ("persistent", 1, (128, 256, 64, 8, 8, 3)), ("tiled", 1, (128, 256, 64, 8, 8, 3)),
        ("tiled", 1, (128, 256, 32, 8, 8, 5)), ("stream_k", 1, (128, 256, 64, 8, 8, 3)),
        ("stream_k", 1, (128, 128, 64, 8, 4, 4)), ("stream_k", 1, (128, 128, 64, 8, 8, 4))]
TARGETS: list[tuple[str, str, float, list[tuple[str, int, tuple[int, ...]]]]] = [
    ("M=4096,N=4096,K=4096", "float16", 0.95, _BIG),
    ("M=8192,N=8192,K=8192", "bfloat16", 0.95, _BIG),
    ("M=4096,N=14336,K=4096", "bfloat16", 0.95, _BIG),
    ("M=3072,N=3072,K=3072", "bfloat16", 0.95, _BIG),
    ("M=16,N=14336,K=4096", "bfloat16", 1.0, [
        ("tiled", 1, (16, 64, 256, 1, 4, 5)), ("tiled", 1, (16, 128, 128, 1, 4, 4)),
        ("split_k", 2, (16, 64, 256, 1, 4, 4)), ("split_k", 4, (16, 64, 128, 1, 4, 4)),
        ("tma_persistent", 1, (16, 64, 256, 1, 4, 4))]),
    ("M=64,N=8192,K=8192", "float16", 1.0, [
        ("tiled", 1, (64, 64, 128, 1, 4, 4)), ("tiled", 1, (32, 64, 256, 1, 4, 4)),
        ("split_k", 2, (64, 64, 128, 1, 4, 4)), ("split_k", 4, (64, 128, 128, 1, 8, 4)),
        ("tma_persistent", 1, (64, 64, 128, 1, 4, 4))]),
    ("M=777,N=1234,K=4321", "float16", 1.0, [
        ("tiled", 1, (32, 128, 64, 1, 4, 3)), ("split_k", 2, (32, 128, 64, 1, 4, 3)),
        ("split_k", 4, (64, 128, 64, 8, 4, 3)), ("split_k", 2, (64, 256, 64, 1, 8, 3))]),
]
_PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


def _shape(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in text.split(","))}


def _config(variant: str, split: int, tile: tuple[int, ...]) -> Any:
    from search_spaces.matmul import VARIANTS
    from tuner.config import KernelConfig

    return KernelConfig({**dict(zip(_PARAMS, tile, strict=True)),
                         "VARIANT": VARIANTS.index(variant), "SPLIT_K": split})


def timed_interleaved(fns: list[Callable[[], Any]], rounds: int) -> list[float]:
    """Median do_bench ms of each function, the functions interleaved round by round."""
    import triton

    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            times[i].append(float(triton.testing.do_bench(fn, warmup=25, rep=100)))
    return [statistics.median(t) for t in times]


def verified_once(launch: Callable[[], Any], out: Any, ref: Any, kernel: Any, dtype: str,
                  label: str, log: Callable[[str], None]) -> bool | None:
    """Run ``launch`` once into ``out`` (NaN-filled first) and compare it with ``ref``: True
    when right, False when wrong, None when it raised (this Triton may not build it); the
    last two logged under ``label``."""
    from tuner.kernel import output_check_of
    from tuner.verification import compare

    try:
        out.fill_(float("nan"))
        launch()
        check = compare(out, ref, kernel.tolerance(dtype), dtype, output_check_of(kernel))
    except Exception as exc:  # noqa: BLE001 - one config must not end the benchmark
        log(f"  {label}: FAILED {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}")
        return None
    if not isinstance(check, float):
        log(f"  {label}: WRONG ({check})")
        return False
    return True


def table_picks(path: str) -> tuple[str, str, list[Any]]:
    """(shape text, dtype, configs) of a replay table: its best, each VARIANT's best, and the
    tiled twin of each pick of another variant, best first, each once."""
    from search_spaces.matmul import TILED, variant_of
    from tuner.backends.replay import load_table
    from tuner.config import KernelConfig

    table = load_table(path)
    timed = sorted(((ms, c) for c, ms in table.results.items() if isinstance(ms, float)),
                   key=lambda r: r[0])
    best_of: dict[int, Any] = {}
    for _, config in timed:
        best_of.setdefault(variant_of(config), config)
    picks: list[Any] = []
    for config in dict.fromkeys([timed[0][1], *best_of.values()]):
        picks.append(config)
        n = config["BLOCK_N"]
        if variant_of(config) != TILED and n & (n - 1) == 0:  # a split tile has no twin
            picks.append(KernelConfig({**config, "VARIANT": TILED, "SPLIT_K": 1}))
    shape_text = ",".join(f"{k}={v}" for k, v in table.shape.items())
    return shape_text, table.dtype, list(dict.fromkeys(picks))


def run_pipeline(targets: list[tuple[str, str, float, list[Any]]], rounds: int,
                 log: Callable[[str], None] = print, kind: str = "cuda") -> int:
    """Each target's configs through the product's pipeline, as a search measures them (the
    compile pool, the measuring child, verification, the host-ahead timer), then re-timed
    interleaved with torch in that child for ``rounds`` rounds, as the finalists of a search
    are: GPU time, where ``run``'s do_bench of a Python launch also counts the host's launch
    cost on problems of a few tens of microseconds."""
    from search_spaces.matmul import KERNEL
    from tuner.backends import TimingOptions
    from tuner.backends.process import ProcessBackend

    for shape_text, dtype, _, configs in targets:
        backend = ProcessBackend(kind, KERNEL.ref, _shape(shape_text), dtype,
                                 timing=TimingOptions(quick_rep_ms=0.0))
        try:
            first = backend.measure(list(configs))
            for m in first:
                if not m.ok:
                    log(f"  {m.config.key()}: {m.outcome.value} {(m.error or '')[:120]}")
            ok = [m.config for m in first if m.ok]
            timed = backend.retime(ok, rounds, baseline=True)
        finally:
            backend.close()
        base = [m for m in timed if m.extra.get("baseline")]
        if not base or not base[0].p50_ms:
            log(f"{shape_text} {dtype}: the re-timing failed")
            return 1
        torch_ms = base[0].p50_ms
        log(f"{shape_text} {dtype} (pipeline, {rounds} rounds): torch {torch_ms:.4f} ms")
        rows = [(m.p50_ms, m.config.key()) for m in timed
                if m.ok and m.p50_ms and not m.extra.get("baseline")]
        for t, key in sorted(rows):
            log(f"  {torch_ms / t:5.3f}x  {t:.4f} ms  {key}")
    return 0


def run(only: str, rounds: int, smoke: bool, log: Callable[[str], None] = print,
        targets: list[tuple[str, str, float, list[Any]]] | None = None,
        keep_pruned: bool = False) -> int:
    """Each target's configs verified, then timed interleaved with torch (``targets``: TARGETS
    by default; a target of 0 is not printed). ``keep_pruned`` times configs the constraints
    prune as well; a config that fails to build is logged and left out."""
    import torch

    from search_spaces import matmul as mm
    from search_spaces.matmul import KERNEL
    from tuner.space import DEFAULT_SMEM_LIMIT, ProblemContext

    device = "cpu" if smoke else "cuda"
    sms, smem, cc = 132, DEFAULT_SMEM_LIMIT, 90
    if not smoke:
        props = torch.cuda.get_device_properties(0)
        sms, cc = props.multi_processor_count, props.major * 10 + props.minor
        smem = int(getattr(props, "shared_memory_per_block_optin", smem) or smem)
        log(f"{props.name}, {sms} SMs, sm_{cc}")
    space = KERNEL.space()
    wrong = 0
    for shape_text, dtype, target, configs in TARGETS if targets is None else targets:
        if only and only not in shape_text:
            continue
        shape = _shape(shape_text)
        if smoke:  # the same variants on a small problem with the same alignments
            shape = {k: min(v, 48 + v % 16) for k, v in shape.items()}
        ctx = ProblemContext(shape, dtype, smem, sms, cc)
        inputs = KERNEL.make_inputs(shape, "float16" if smoke else dtype, device, seed=0)
        ref = KERNEL.reference(inputs)
        rows, fns = [], []
        for entry in configs:
            config = entry if isinstance(entry, Mapping) else _config(*entry)
            variant = mm.VARIANTS[mm.variant_of(config)]
            reason = space.violation(config, ctx)
            if reason and not smoke:
                log(f"  {config.key()}: pruned ({reason}){', timed' if keep_pruned else ''}")
                if not keep_pruned:
                    continue
            checked = "float16" if smoke else dtype
            ok = verified_once(lambda c=config, x=inputs: KERNEL.launch(c, x), inputs["out"],
                               ref, KERNEL, checked, config.key(), log)
            if not ok:
                wrong += ok is False
                continue
            if variant == "stream_k":  # shared tiles: the same bits on every launch
                first = inputs["out"].clone()
                for _ in range(20):
                    KERNEL.launch(config, inputs)
                if not torch.equal(first, inputs["out"]):
                    wrong += 1
                    log(f"  {config.key()}: NOT DETERMINISTIC")
                    continue
            rows.append(config.key())
            fns.append(lambda c=config, x=inputs: KERNEL.launch(c, x))
            if variant == "tma_persistent" and not smoke:  # Triton's warp specialisation
                for ws, name in ((1, "warp-specialised, flattened"), (2, "warp-specialised")):
                    ok = verified_once(
                        lambda c=config, x=inputs, w=ws: mm.matmul(x["a"], x["b"], x["out"], c,
                                                                   warp_spec=w),
                        inputs["out"], ref, KERNEL, dtype, f"{config.key()} ({name})", log)
                    if not ok:
                        wrong += ok is False
                        continue
                    rows.append(config.key() + f" ({name})")
                    fns.append(lambda c=config, x=inputs, w=ws: mm.matmul(
                        x["a"], x["b"], x["out"], c, warp_spec=w))
            if variant == "stream_k" and not smoke:  # the same schedule, loads by pointers
                rows.append(config.key() + " (pointer loads)")
                fns.append(lambda c=config, x=inputs: mm.matmul(x["a"], x["b"], x["out"], c,
                                                                 tma=False))
        if smoke:
            log(f"{shape_text} {dtype}: {len(rows)} configs right on the interpreter "
                f"({'x'.join(map(str, shape.values()))} float16)")
            continue
        ms = timed_interleaved([lambda x=inputs: KERNEL.baseline(x), *fns], rounds)
        goal = f" (target {target}x torch)" if target else ""
        log(f"{shape_text} {dtype}{goal}: torch {ms[0]:.4f} ms")
        for config, t in sorted(zip(rows, ms[1:], strict=True), key=lambda r: r[1]):
            log(f"  {ms[0] / t:5.3f}x  {t:.4f} ms  {config}")
    return 1 if wrong else 0


#: the epilogue target's configs: (VARIANT, tile as in TARGETS)
EPILOGUE_CONFIGS = [("tma_persistent", (128, 256, 64, 8, 8, 3)),
                    ("persistent", (128, 256, 64, 8, 8, 4)), ("tiled", (128, 256, 64, 8, 8, 3))]


def run_epilogue(rounds: int, smoke: bool, log: Callable[[str], None] = print) -> int:
    """bf16 4096^3 C = gelu(A @ B + bias): each epilogue config with the activation computed
    exactly (exp and division) or by the GPU's tanh approximation (FAST_ACT), and, for
    tma_persistent, C stored by pointers or by its descriptor (TMA_STORE), beside the plain
    GEMM of the same tile (matmul's tma_persistent), torch.matmul and the kernel's torch
    baseline (addmm + gelu), interleaved in this one process."""
    from search_spaces import matmul_epilogue as me
    from search_spaces.matmul import KERNEL as MATMUL
    from tuner.kernel import output_check_of
    from tuner.verification import compare

    kernel = me.GELU
    device, dtype = ("cpu", "float16") if smoke else ("cuda", "bfloat16")
    shape = {"M": 64, "N": 96, "K": 80} if smoke else {"M": 4096, "N": 4096, "K": 4096}
    x = kernel.make_inputs(shape, dtype, device, seed=0)
    ref = kernel.reference(x)
    rows: list[str] = ["torch addmm + gelu (the baseline)", "torch.matmul"]
    fns: list[Callable[[], Any]] = [lambda: kernel.baseline(x),
                                    lambda: MATMUL.baseline(x)]
    plain = _config("tma_persistent", 1, EPILOGUE_CONFIGS[0][1])
    rows.append(f"matmul (no epilogue) {plain.key()}")
    fns.append(lambda: MATMUL.launch(plain, x))
    wrong = 0
    for variant, tile in EPILOGUE_CONFIGS:
        config = _config(variant, 1, tile)
        config = type(config)({k: v for k, v in config.items() if k != "SPLIT_K"})
        for fast in ((False,) if smoke else (False, True)):
            for tma in ((False, True) if variant == "tma_persistent" else (False,)):
                label = f"{config.key()} FAST_ACT={int(fast)} TMA_STORE={int(tma)}"

                def launch(c=config, f=fast, t=tma) -> None:
                    me.matmul_epilogue(x["a"], x["b"], x["bias"], None, x["out"], "gelu", c,
                                       fast_act=f, tma_store=t)
                ok = verified_once(launch, x["out"], ref, kernel, dtype, label, log)
                if not ok:
                    wrong += ok is False
                    continue
                rows.append(label)
                fns.append(launch)
    if smoke:
        log(f"epilogue: {len(fns) - 2} configs right on the interpreter")
        return 1 if wrong else 0
    check = compare(x["out"], ref, kernel.tolerance(dtype), dtype, output_check_of(kernel))
    assert isinstance(check, float), check
    ms = timed_interleaved(fns, rounds)
    log(f"gelu(A @ B + bias) bf16 4096^3 (target 1.15x the baseline): baseline {ms[0]:.4f} ms")
    for label, t in sorted(zip(rows, ms, strict=True), key=lambda r: r[1]):
        log(f"  {ms[0] / t:5.3f}x  {t:.4f} ms  {label}")
    return 1 if wrong else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="targets whose shape contains this text")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, small shapes")
    parser.add_argument("--table", action="append", default=[],
                        help="a replay table whose picks to re-time (repeatable)")
    parser.add_argument("--pipeline", action="store_true",
                        help="with --table: time through the product's pipeline (GPU time) "
                             "instead of do_bench of Python launches")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    if args.only == "epilogue":
        return run_epilogue(args.rounds, args.smoke)
    if args.table:
        targets = [(shape, dtype, 0.0, picks)
                   for shape, dtype, picks in map(table_picks, args.table)]
        if args.pipeline and not args.smoke:
            return run_pipeline(targets, args.rounds)
        return run("", args.rounds, args.smoke, targets=targets, keep_pruned=True)
    return run(args.only, args.rounds, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
