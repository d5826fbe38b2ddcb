"""Which step of a compile from host tensors starts a CUDA context?

A compile pool process that makes its inputs in host memory (``tuner.host_compile``) should
hold no CUDA context; on an H100 the processes that had compiled a config still did
(nvidia-smi listed them). This probe runs, in fresh processes, each step a pool process takes
(torch's device queries, Triton's target, current device and stream, a kernel's compile from
host tensors) and reads after each whether the device's primary context is active
(``cuDevicePrimaryCtxGetState``); then the same compile after ``tuner.host_compile.quiet_driver``.

Usage (on the GPU machine)::

    python3 -m bench.host_compile_probe --out $OUT/host_compile_probe.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

STEP_CODE = r'''
import ctypes, json, os, sys, time
os.environ["TUNER_COMPILE_ON_HOST"] = "1"
cuda = ctypes.CDLL("libcuda.so.1")
def active():
    cuda.cuInit(0)
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    flags, on = ctypes.c_uint(), ctypes.c_int()
    cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on))
    return bool(on.value)
out = []
def step(name, fn):
    t0 = time.perf_counter()
    fn()
    out.append((name, round(time.perf_counter() - t0, 3), active()))
quiet = sys.argv[1] == "quiet"
kernel_name = sys.argv[2]
step("import torch, triton, the kernel",
     lambda: __import__("search_spaces").get_kernel(kernel_name))
import torch, triton
from search_spaces import get_kernel
from tuner.kernel import compile_inputs_for
kernel = get_kernel(kernel_name)
shape = json.loads(sys.argv[3]); dtype = sys.argv[4]
if quiet:
    from tuner.host_compile import quiet_driver
    step("quiet_driver()", quiet_driver)
else:
    step("torch.cuda.current_device()", torch.cuda.current_device)
    step("torch.cuda.get_device_capability(0)", lambda: torch.cuda.get_device_capability(0))
    step("torch.cuda.get_device_properties(0)", lambda: torch.cuda.get_device_properties(0))
    from triton.runtime import driver
    step("driver.active.get_current_target()", driver.active.get_current_target)
    step("driver.active.get_current_stream(0)", lambda: driver.active.get_current_stream(0))
inputs = {}
step("compile inputs in host memory",
     lambda: inputs.update(compile_inputs_for(kernel, shape, dtype, "cpu")))
step("kernel.compile(default config)",
     lambda: kernel.compile(kernel.default_config(shape, dtype), inputs))
print(json.dumps(out))
'''

PROBLEMS = (("vector_add", {"N": 1 << 20}, "float32"),
            ("matmul", {"M": 4096, "N": 4096, "K": 4096}, "bfloat16"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lines = ["# Which step of a compile from host tensors starts a CUDA context", "",
             f"Command: `python3 -m bench.host_compile_probe {' '.join(sys.argv[1:])}`", "",
             "Each column: a fresh process (`TUNER_COMPILE_ON_HOST=1`); each row: a step, its "
             "seconds, and whether the GPU's primary context was active after it.", ""]
    for name, shape, dtype in PROBLEMS:
        for mode in ("as is", "quiet"):
            run = subprocess.run([sys.executable, "-c", STEP_CODE,
                                  "quiet" if mode == "quiet" else "plain", name,
                                  json.dumps(shape), dtype],
                                 capture_output=True, text=True, timeout=300)
            lines += [f"## {name} {shape} {dtype}, driver {mode}", ""]
            if run.returncode != 0:
                lines += ["```", run.stderr[-3000:], "```", ""]
                continue
            steps = json.loads(run.stdout.strip().splitlines()[-1])
            lines += ["| step | s | context active after |", "|---|---|---|"]
            lines += [f"| {s} | {t:.3f} | {'yes' if on else 'no'} |" for s, t, on in steps]
            lines.append("")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
