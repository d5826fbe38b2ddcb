"""The Backend contract on the backends a CPU has: a replay table (``ReplayBackend``) and the
CPU interpreter's measuring child (``ProcessBackend`` ``interpret``); ``tests/gpu/`` runs the
same suite (``tests/backend_conformance.py``) on the GPU's child. A fake backend in a test
passes only what that test needs; these are the real ones, whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from search_spaces import get_kernel
from tests.backend_conformance import OPTIONAL_PROTOCOLS, check_backend
from tuner.backends import TimingOptions, open_backend
from tuner.backends.base import TimesWithMethods
from tuner.backends.replay import ReplayBackend, load_table
from tuner.config import KernelConfig

TABLE = Path(__file__).parent / "data" / "replay" / "matmul_777x1234x4321_float16_h200.json"
#: a short timing: the contract, not the numbers, is what is checked
FAST = TimingOptions(warmup_ms=1.0, rep_ms=2.0, quick_rep_ms=0.0, protocol="none")


def test_a_replay_table_keeps_the_backend_contract():
    table = load_table(TABLE)
    kernel = get_kernel("matmul")
    ok = [c for c, v in table.results.items() if not isinstance(v, str)]
    space = kernel.space()
    backend = ReplayBackend(table)
    restricted = backend.restrict(space)
    good = [c for c in restricted if any(c.items() >= o.items() for o in ok[:2])][:2]
    assert len(good) == 2
    bad = KernelConfig({**good[0], "BLOCK_K": 8})  # not recorded
    check_backend(lambda: ReplayBackend(table), space, good, bad, declares=[TimesWithMethods])


@pytest.mark.timeout(300)
def test_the_interpreters_child_keeps_the_backend_contract():
    kernel = get_kernel("vector_add")
    shape, dtype = {"N": 300}, "float32"
    good = [KernelConfig(BLOCK=256, PROGRAMS_PER_SM=0, num_warps=4, num_stages=1),
            KernelConfig(BLOCK=512, PROGRAMS_PER_SM=1, num_warps=4, num_stages=1)]
    bad = KernelConfig(BLOCK=300, PROGRAMS_PER_SM=0, num_warps=4, num_stages=1)  # no pow2
    check_backend(lambda: open_backend("interpret", kernel, shape, dtype, timing=FAST,
                                       compile_workers=0),
                  kernel.space(), good, bad, refuses=["cuda-graph"],
                  declares=OPTIONAL_PROTOCOLS)
