"""softmax's prior: a streaming model of the variant a config runs (one pass, two passes, split
rows), for ranking only (``SoftmaxKernel.prior`` is the log of :func:`estimated_seconds`).

Moved out of ``search_spaces/softmax.py``, as the GEMM prior lives in ``search_spaces/gemm/``:
a prior steers a search and is no part of a kernel's version (``tuner.kernel.builtin_version``),
so it need not sit beside the code it ranks. It reads the kernel's own config helpers.
"""

from __future__ import annotations

import math

from search_spaces.softmax import (
    _cdiv,
    _evict_of,
    _per_sm_of,
    _pipeline_smem,
    _split_of,
    _sync_of,
    _two_pass,
    split_chunk,
)
from search_spaces.vector_add import (
    BYTES_IN_FLIGHT_PER_SM,
    COPY_BANDWIDTH,
    LAUNCH_S,
    NEXT_LAUNCH_S,
    PROGRAM_S,
)
from tuner.config import KernelConfig
from tuner.space import ProblemContext

#: the part of a re-read that still costs HBM bandwidth when the data is in L2
L2_REREAD = 0.3
#: L2 an H200 keeps for one kernel's re-reads (of its 50 MB, two partitions); EVICT's hints
#: (x kept for its second read, out streamed past L2) are guessed to keep this much more
L2_BYTES = 30e6
EVICT_L2_GAIN = 1.3
#: thread instructions a second that this kernel's loops sustain on an H200 (132 SMs): the
#: two-pass kernel before the exp2/one-max rewrite ran ~33 SASS instructions an element and
#: took 0.84-0.88 ms on 8192 x 50257 (4.1e8 elements) at every block size, warp count and
#: occupancy of its 405-config table (tests/data/replay/nongemm): bound by issue, not HBM
ISSUE_RATE = 1.6e13
#: what one launch's wait at the row counters adds (SYNC): an atomic's round trip to L2 and
#: back for the last program in, and the spinning programs' polls; a guess
SYNC_S = 1e-6
#: the part of the smaller of memory and arithmetic time that one program an SM adds to the
#: larger: it loads, then computes (other SMs' loads fill HBM meanwhile); a guess
LONE_PROGRAM = 0.3


def _reread(working_set: float, evict: int) -> float:
    """The part of a second read of x that costs HBM bandwidth: ``L2_REREAD`` while the
    rows in flight fit in L2, growing to a whole re-read as they outgrow it."""
    l2 = L2_BYTES * (EVICT_L2_GAIN if evict else 1.0)
    if working_set <= l2:
        return L2_REREAD
    return L2_REREAD + (1.0 - L2_REREAD) * (1.0 - l2 / working_set)


def _instructions(config: KernelConfig, ctx: ProblemContext, per_thread: int) -> float:
    """SASS instructions an element (counted from sm_90 builds of 8192 x 50257 bf16): two
    passes ~12 plus the loops' fixed cost spread over a thread's elements, ~1.5 more when
    pipelined (shared-memory reads); one pass ~9 plus its reductions' fixed cost."""
    if _two_pass(config, ctx):
        return 12.0 + 40.0 / per_thread + (1.5 if config["num_stages"] > 1 else 0.0)
    return 9.0 + 40.0 / per_thread


def estimated_seconds(config: KernelConfig, ctx: ProblemContext) -> float:
    """A streaming model of the variant the config runs, for ranking only: HBM bytes (x and
    out once; a second read of x, from L2 while the rows in flight fit there) over the copy
    bandwidth, slowed where the programs resident on an SM (by warps, registers and the
    pipeline's shared memory; a persistent grid's few) keep too little in flight (a block,
    half a block in an unpipelined column loop, num_stages - 1 blocks in a pipelined one);
    and the instructions an element at ``ISSUE_RATE``. The larger of the two counts, plus
    part of the smaller where one program an SM leaves nothing to overlap its loads with its
    arithmetic; then launches and wave tails."""
    m, n, elem = ctx.shape["M"], ctx.shape["N"], ctx.elem_bytes
    split, block, warps = _split_of(config), config["BLOCK_N"], config["num_warps"]
    sms, per_sm, evict = max(1, ctx.sm_count), _per_sm_of(config), _evict_of(config)
    span = split_chunk(n, split)
    two_pass = _two_pass(config, ctx)
    pipelined = block < span and config["num_stages"] > 1
    per_thread = max(1, block // (32 * warps))
    registers = 24 + per_thread * (2.25 if two_pass else 2.0)
    resident = max(1, min(32, 64 // warps, int(65536 // (32 * warps * registers))))
    resident = max(1, min(resident, ctx.smem_limit // _pipeline_smem(config, ctx)))
    matrix = m * n * elem
    if split == 1:
        groups = _cdiv(m, config["ROWS"])
        programs = min(groups, per_sm * sms) if per_sm else groups
        live = min(resident, _cdiv(programs, sms))
        reread = _reread(live * sms * n * elem, evict) if two_pass else 0.0
        launches = 1
    else:
        programs = m * split
        live = min(resident, _cdiv(programs, sms))
        reread = _reread(matrix, evict) if two_pass else 0.0
        launches = 1 if _sync_of(config) else 2
    in_flight: float
    if pipelined:
        in_flight = (config["num_stages"] - 1) * block * elem
    elif block < span:  # a column loop that loads a block only once the last one is used
        in_flight = 0.5 * block * elem
    else:
        in_flight = min(block, span) * elem * (config["ROWS"] ** 0.5 if not two_pass else 1.0)
    efficiency = min(1.0, live * in_flight / BYTES_IN_FLIGHT_PER_SM)
    waves = programs / (sms * resident)
    quantised = 1.0 if per_sm or waves > 4 else math.ceil(waves) / waves
    memory = (2 + reread) * matrix / (COPY_BANDWIDTH * efficiency) * quantised
    compute = m * n * _instructions(config, ctx, per_thread) / ISSUE_RATE * quantised
    overlap = max(memory, compute) + (LONE_PROGRAM * min(memory, compute) if live == 1 else 0.0)
    barrier = SYNC_S if _sync_of(config) else 0.0
    return (LAUNCH_S + NEXT_LAUNCH_S * (launches - 1) + barrier + overlap
            + PROGRAM_S * programs / sms)
