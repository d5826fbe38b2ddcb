"""The Backend contract (``tests/backend_conformance.py``) on the GPU's measuring child: the
same clauses the CPU interpreter's child and a replay table keep (``tests/
test_backend_conformance.py``); here ``cuda-graph`` is a method it can time with."""

from __future__ import annotations

import pytest

from search_spaces import get_kernel
from tests.backend_conformance import OPTIONAL_PROTOCOLS, check_backend
from tuner.backends import TimingOptions, open_backend
from tuner.config import KernelConfig

FAST = TimingOptions(warmup_ms=2.0, rep_ms=5.0, quick_rep_ms=0.0, protocol="none")


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_the_gpus_child_keeps_the_backend_contract():
    kernel = get_kernel("vector_add")
    shape, dtype = {"N": 1 << 20}, "float16"
    good = [KernelConfig(BLOCK=1024, PROGRAMS_PER_SM=0, num_warps=4, num_stages=1),
            KernelConfig(BLOCK=2048, PROGRAMS_PER_SM=1, num_warps=8, num_stages=1)]
    bad = KernelConfig(BLOCK=300, PROGRAMS_PER_SM=0, num_warps=4, num_stages=1)  # no pow2
    check_backend(lambda: open_backend("cuda", kernel, shape, dtype, timing=FAST,
                                       compile_workers=0),
                  kernel.space(), good, bad, declares=OPTIONAL_PROTOCOLS)
