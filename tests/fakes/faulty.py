"""A small fake kernel whose configs fail in chosen ways (MODE), for the pipeline tests.

out = a + b, computed with torch on the CPU (no GPU exists here); MODE picks the fault. It goes
through the real pipeline: the real child process, the real compile pool, real timeouts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from triton.compiler.errors import CompilationError as TritonCompilationError

from tuner.config import KernelConfig
from tuner.kernel import Dim, Tolerance
from tuner.space import Param, SearchSpace

GOOD, EXIT, HANG, STICKY, WRONG, NAN, COMPILE_HANG, COMPILE_ERROR = range(8)


class CompilationError(TritonCompilationError):
    """Triton's own compile error (what the child classifies as one, by its type), with a
    plain message in place of the source excerpt Triton builds from the kernel's AST."""

    def __init__(self, message: str) -> None:  # Triton's takes (src, node, error_message)
        Exception.__init__(self, message)
        self.src, self.node, self.error_message = None, None, message
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.message,)


class FaultyKernel:
    name = "faulty"
    ref = "tests.fakes.faulty:KERNEL"
    version = "fake-1"
    dims = (Dim("N", 1, 1 << 20),)
    dtypes = ("float32",)
    interpreter_unsupported_dtypes: tuple[str, ...] = ()

    def space(self) -> SearchSpace:
        return SearchSpace((Param.ints("MODE", range(8)), Param.ints("SLOW", (1, 2, 3))))

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        return KernelConfig(MODE=GOOD, SLOW=1)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        return []

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(shape["N"], generator=gen)
        return {"a": a, "b": torch.randn(shape["N"], generator=gen), "out": torch.empty_like(a)}

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        if config["MODE"] == COMPILE_HANG:
            time.sleep(3600)
        if config["MODE"] == COMPILE_ERROR:
            raise CompilationError("at 3:4: BLOCK must be a power of two")

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        mode = config["MODE"]
        if mode == EXIT:
            os._exit(3)
        if mode == HANG:
            while True:
                pass
        if mode == STICKY:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        time.sleep(config["SLOW"] * 0.002)
        torch.add(inputs["a"], inputs["b"], out=inputs["out"])
        if mode == WRONG:
            inputs["out"][0] += 1.0
        if mode == NAN:
            inputs["out"][-1] = float("nan")

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["a"] + inputs["b"]

    def tolerance(self, dtype: str) -> Tolerance:
        return Tolerance(1e-6, 1e-6)

    def flops(self, shape: Mapping[str, int]) -> float:
        return float(shape["N"])

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        return 12.0 * shape["N"]


KERNEL = FaultyKernel()


class SubtractKernel(FaultyKernel):
    """Another kernel over the same space (out = a - b): a worker keeps its child and compile
    pool from a task of ``KERNEL`` to one of this, and both must load it. Two configs tell which
    kernel answered: MODE=GOOD SLOW=3 fails to compile, SLOW=2 fails at launch (both fine in
    ``KERNEL``)."""

    name = "faulty_sub"
    ref = "tests.fakes.faulty:SUBTRACT"

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        if config["MODE"] == GOOD and config["SLOW"] == 3:
            raise CompilationError("faulty_sub does not compile SLOW=3")
        super().compile(config, inputs)

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        if config["MODE"] == GOOD and config["SLOW"] == 2:
            raise ValueError("faulty_sub does not launch SLOW=2")
        torch.sub(inputs["a"], inputs["b"], out=inputs["out"])

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["a"] - inputs["b"]


SUBTRACT = SubtractKernel()


class PoolOnlyKernel(FaultyKernel):
    """Compiles from inputs of its own in the compile pool (``compile_inputs``, as
    ``tuner.Kernel`` does with stand-ins), where its compile crashes; with the problem's own
    inputs (the GPU child's) it compiles and runs fine."""

    name = "pool_only"
    ref = "tests.fakes.faulty:POOL_ONLY"

    def compile_inputs(self, shape: Mapping[str, int], dtype: str,
                       device: str) -> dict[str, Any]:
        return {"stand_in": True}

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        super().compile(config, inputs)  # MODE=COMPILE_ERROR fails anywhere
        if inputs.get("stand_in"):
            raise RuntimeError("Pointer argument (at 0) cannot be accessed from Triton")


POOL_ONLY = PoolOnlyKernel()


class SleepyKernel(FaultyKernel):
    """Every launch sleeps ``$FAKE_LAUNCH_S`` seconds (0 without it) after touching the file
    ``$FAKE_LAUNCH_MARK`` (where set): a trial, or a re-timing, as long as a test needs, and a
    sign that one is in flight."""

    name = "sleepy"
    ref = "tests.fakes.faulty:SLEEPY"

    def space(self) -> SearchSpace:
        return SearchSpace((Param.ints("MODE", (GOOD,)), Param.ints("SLOW", (1, 2, 3))))

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        if mark := os.environ.get("FAKE_LAUNCH_MARK"):
            with open(mark, "a"):
                pass
        time.sleep(float(os.environ.get("FAKE_LAUNCH_S", "0")))
        torch.add(inputs["a"], inputs["b"], out=inputs["out"])


SLEEPY = SleepyKernel()


class HangsKernel(FaultyKernel):
    """Three good configs, then three that hang at launch (``exhaustive`` order): a task whose
    time budget is spent while a config hangs."""

    name = "hangs"
    ref = "tests.fakes.faulty:HANGS"

    def space(self) -> SearchSpace:
        return SearchSpace((Param.ints("MODE", (GOOD, HANG)), Param.ints("SLOW", (1, 2, 3))))


HANGS = HangsKernel()


class SlowCompileKernel(FaultyKernel):
    """Good configs whose compile takes ``SLOW - 1`` seconds (SLOW=1 at once, SLOW=3 2 s): a
    batch that waits for one config's compile while others are compiled already."""

    name = "slow_compile"
    ref = "tests.fakes.faulty:SLOW_COMPILE"

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        time.sleep(config["SLOW"] - 1)
        super().compile(config, inputs)


SLOW_COMPILE = SlowCompileKernel()


#: lines of the PTX Triton prints when ptxas rejects a config
PTX_LINES = 1200


class NoisyKernel(FaultyKernel):
    """Prints as Triton does when ptxas rejects a config (the error, then the whole PTX) and
    fails, for MODE=COMPILE_ERROR: in its compile (a compile pool's) and, where nothing is
    compiled ahead (the interpreter's child), at launch. A good config prints three lines."""

    name = "noisy"
    ref = "tests.fakes.faulty:NOISY"

    def _noise(self, config: KernelConfig) -> None:
        if config["MODE"] == COMPILE_ERROR:
            print("\n" + "=" * 64 + "\n`ptxas` failed with error code 255\n`ptxas` stderr:\n"
                  "ptxas fatal   : Unresolved extern function 'nope'\n")
            print("\n".join(f"\tld.global.v4.b32 {{%r{i}}}, [%rd{i}];  // PTX line {i}"
                            for i in range(PTX_LINES)))
            raise CompilationError("PTXASError: `ptxas` failed with error code 255")
        print("compiled\nfine\nhere")

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        self._noise(config)

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        if config["MODE"] == COMPILE_ERROR:
            self._noise(config)
        super().launch(config, inputs)


NOISY = NoisyKernel()
