"""Why does the GPU child compile a config again that the compile pool compiled?

A worker's log (issue 33) shows the child's compile step as long as the pool's compile for
most matmul configs (0.3-1.3 s each), so the two build different binaries: Triton keys a
binary by the launch's specialisation (argument types, divisibility, constexprs) and options,
and the pool compiles on the problem's ``compile_shape`` inputs while the child launches on
the full problem. This probe compiles each config both ways in one process, as the pool
(``compile_inputs_for``) and then as the child (``make_inputs``), and prints, for every
Triton kernel that got a second binary, the two cache keys where they differ.

In one process the keys matched; the difference was between processes (the twelfth session's
``bench/compile_trace/``: Triton 3.6 keys a kernel by what its process compiled first, settled
now by ``tuner/triton_keys.py``).

Usage (on the GPU machine)::

    python3 -m bench.compile_key_probe --problem matmul:M=8192,N=8192,K=8192:bfloat16 \\
        --out $OUT/compile_keys.md
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any


def _jit_functions(module: Any) -> dict[str, Any]:
    from triton.runtime.jit import JITFunction

    return {name: obj for name, obj in vars(module).items() if isinstance(obj, JITFunction)}


def _keys(fn: Any) -> set[str]:
    """Every cache key of ``fn``'s compiled binaries, on every device."""
    keys: set[str] = set()
    for entry in getattr(fn, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(cache, dict):
            keys.update(str(k) for k in cache)
    return keys


def _diff(a: str, b: str) -> str:
    """Where two keys differ: the differing runs of each, side by side."""
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op != "equal":
            out.append(f"`{a[max(0, i1 - 40):i2 + 10]}` -> `{b[max(0, j1 - 40):j2 + 10]}`")
    return "; ".join(out[:4]) or "identical"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", action="append", required=True)
    parser.add_argument("--configs", type=int, default=4, help="known-good configs a problem")
    parser.add_argument("--config", action="append", default=[],
                        help="a config's key (A=1,B=2,...) to probe as well, on every problem")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import importlib

    from bench.tuning_time import parse_problem
    from search_spaces import get_kernel
    from tuner.config import KernelConfig
    from tuner.kernel import compile_hook, compile_inputs_for

    lines = ["# The pool's and the child's cache keys of one config (issue 33)", "",
             f"Command: `python3 -m bench.compile_key_probe {' '.join(sys.argv[1:])}`", ""]
    for text in args.problem:
        problem = parse_problem(text)
        kernel = get_kernel(problem.kernel)
        module = importlib.import_module(kernel.ref.split(":")[0])
        fns = _jit_functions(module)
        compile_fn = compile_hook(kernel)
        assert compile_fn is not None
        small = compile_inputs_for(kernel, problem.shape, problem.dtype, "cuda")
        full = kernel.make_inputs(problem.shape, problem.dtype, "cuda", 1)
        lines += [f"## {text}", ""]
        listed = [KernelConfig({k: int(v) for k, v in (item.split("=") for item in
                                                        text.split(","))})
                  for text in args.config]
        for config in [*kernel.known_good_configs(problem.shape, problem.dtype)[:args.configs],
                       *listed]:
            before = {n: _keys(f) for n, f in fns.items()}
            compile_fn(config, small)
            pooled = {n: _keys(f) - before[n] for n, f in fns.items()}
            compile_fn(config, full)
            childs = {n: _keys(f) - before[n] - pooled[n] for n, f in fns.items()}
            again = {n: k for n, k in childs.items() if k}
            lines.append(f"- `{config.key()}`: " + ("the child's launch found the pool's "
                                                     "binary" if not again else
                                                     "compiled again: " + ", ".join(again)))
            for name, keys in again.items():
                for key in keys:
                    for old in pooled.get(name) or ["(none)"]:
                        lines.append(f"  - {name}: {_diff(old, key)}")
        lines.append("")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
