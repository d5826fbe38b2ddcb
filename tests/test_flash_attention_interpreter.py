"""The attention forward kernels (``search_spaces/flash_attention.py``) under Triton's CPU
interpreter: odd sequence lengths and head dims, causal and full, fp16 and fp32, query and key
blocks of every ratio; what causality and the key padding must hide; the check rejecting wrong
outputs; the space's constraints, the prior, the torch baseline and a tune through the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import search_spaces.flash_attention as module
from search_spaces import get_kernel
from search_spaces.flash_attention import (
    CAUSAL,
    KERNEL,
    KERNELS,
    TMA_VALUES,
    _query_block,
    estimate_s,
    head_group,
    shared_memory,
)
from tuner.config import KernelConfig
from tuner.kernel import load_ref
from tuner.search import known_good_first
from tuner.space import ProblemContext
from tuner.verification import compare

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(KERNELS)
#: query blocks shorter, as long as, and 2 and 4 times as long as key blocks (the causal
#: diagonal is then part of one key block, one, or several, rows of the query block seeing
#: none of the last ones), with pointer loads; then TMA descriptor loads
#: (whose last key block of a head runs into the next head's rows, or past the tensor's end)
CONFIGS = [
    KernelConfig(BLOCK_M=16, BLOCK_N=32, num_warps=1, num_stages=2, TMA=0),
    KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=3, TMA=0),
    KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=2, num_stages=2, TMA=0),
    KernelConfig(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=2, TMA=0),
]
TMA = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=2, TMA=1)
#: the query block as two interleaved halves (SUBTILE): halves of 16 rows against key blocks
#: of 16 and 32 (so that the causal diagonal falls in the first half, the second, or both),
#: by pointers and by descriptors
HALVES = [KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=1, num_stages=2, TMA=0, SUBTILE=1),
          KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=1, num_stages=2, TMA=0, SUBTILE=1),
          KernelConfig(BLOCK_M=32, BLOCK_N=16, num_warps=1, num_stages=2, TMA=1, SUBTILE=1)]
#: S = 1, 17, 33 (a partial last block of queries and keys), 32 (whole blocks); D = 16 and 32
#: (the tile's width) and 24 (a tile padded to 32)
SHAPES = [{"B": 2, "H": 1, "S": 1, "D": 16}, {"B": 1, "H": 2, "S": 17, "D": 32},
          {"B": 1, "H": 1, "S": 33, "D": 16}, {"B": 1, "H": 1, "S": 32, "D": 24}]


def shape_id(shape: dict[str, int]) -> str:
    return "x".join(f"{k}{v}" for k, v in shape.items())


def check(kernel, got: torch.Tensor, inputs: dict, dtype: str) -> str | float:
    """The check every measured config passes (tuner/verification.py): a float when ``got``
    passes, the reason when it does not."""
    return compare(got, kernel.reference(inputs), kernel.tolerance(dtype), dtype,
                   kernel.output_check)


def run(kernel, shape: dict[str, int], dtype: str, config: KernelConfig,
        seed: int = 1) -> dict:
    inputs = kernel.make_inputs(shape, dtype, "cpu", seed)
    inputs["out"].fill_(float("nan"))  # every element must be written
    kernel.launch(config, inputs)
    return inputs


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("name", NAMES)
def test_matches_the_fp32_reference_on_odd_shapes(name, shape, dtype):
    kernel = KERNELS[name]
    ctx = ProblemContext(shape, dtype)
    tma = [TMA] if kernel.space().violation(TMA, ctx) is None else []
    assert bool(tma) == (shape["D"] != 24)  # TMA needs an unpadded power-of-two head dim
    halves = [c for c in HALVES if c["TMA"] == 0 or tma]
    for config in CONFIGS + tma + halves:
        inputs = run(kernel, shape, dtype, config)
        result = check(kernel, inputs["out"], inputs, dtype)
        assert isinstance(result, float), (config, result)


def test_causal_query_zero_sees_only_key_zero():
    """Row 0 attends to key 0 alone: its weight is exactly 1 and its output is v's row 0."""
    for config in CONFIGS + HALVES:
        inputs = run(CAUSAL, {"B": 2, "H": 2, "S": 33, "D": 16}, "float16", config)
        assert torch.equal(inputs["out"][:, :, 0, :], inputs["v"][:, :, 0, :]), config


def test_causal_rows_never_see_later_keys():
    """Changing the keys and values after position 9 leaves rows 0..9 bit for bit unchanged
    (and changes the later rows); full attention sees the change everywhere."""
    shape, config = {"B": 1, "H": 2, "S": 33, "D": 16}, CONFIGS[2]
    for kernel, hidden in ((CAUSAL, True), (KERNEL, False)):
        inputs = run(kernel, shape, "float32", config)
        before = inputs["out"].clone()
        inputs["k"][:, :, 10:] *= -2.0
        inputs["v"][:, :, 10:] += 1.0
        kernel.launch(config, inputs)
        assert torch.equal(inputs["out"][:, :, :10], before[:, :, :10]) == hidden
        assert not torch.equal(inputs["out"][:, :, 10:], before[:, :, 10:])


def test_each_variant_computes_its_own_mask():
    """The causal output fails the full reference and the full output the causal one."""
    shape, dtype = {"B": 1, "H": 2, "S": 17, "D": 16}, "float32"
    for kernel, other in ((CAUSAL, KERNEL), (KERNEL, CAUSAL)):
        inputs = run(kernel, shape, dtype, CONFIGS[0])
        assert isinstance(check(kernel, inputs["out"], inputs, dtype), float)
        assert isinstance(check(other, inputs["out"], inputs, dtype), str)


@pytest.mark.parametrize("tma", [0, 1])
@pytest.mark.parametrize("name", NAMES)
def test_keys_past_the_sequence_get_no_weight(name, tma):
    """Every real score is very negative (q and k point opposite ways): a padding key past S
    left at score 0 (a K row loaded as zeros, unmasked) would take nearly all the weight and
    pull the output towards its zero V row. S=17 in a key block of 64: 47 padding keys (with
    TMA, the next head's first rows, then zeros past the tensor's end)."""
    kernel = KERNELS[name]
    shape, dtype = {"B": 2, "H": 1, "S": 17, "D": 16}, "float32"
    inputs = kernel.make_inputs(shape, dtype, "cpu", seed=2)
    inputs["q"] = -4.0 * inputs["q"].abs()
    inputs["k"] = inputs["k"].abs() + 1.0
    assert float((inputs["q"] @ inputs["k"].transpose(-1, -2)).max()) < -20.0
    inputs["v"] += 3.0  # outputs far from the zeros a padding key would average in
    kernel.launch(KernelConfig(BLOCK_M=16, BLOCK_N=64, num_warps=1, num_stages=2, TMA=tma),
                  inputs)
    result = check(kernel, inputs["out"], inputs, dtype)
    assert isinstance(result, float), result


@pytest.mark.parametrize("name", NAMES)
def test_large_scores_stay_finite_and_right(name):
    """Scores of +-100 and more: exp of the raw scores would overflow fp32; the running max
    (rescaled block after block: BLOCK_N=16 over S=40) keeps them in range."""
    kernel = KERNELS[name]
    shape, dtype = {"B": 1, "H": 2, "S": 40, "D": 16}, "float32"
    inputs = kernel.make_inputs(shape, dtype, "cpu", seed=3)
    inputs["q"] *= 40.0
    for config in (CONFIGS[1], HALVES[0]):
        inputs["out"].fill_(float("nan"))
        kernel.launch(config, inputs)
        assert bool(torch.isfinite(inputs["out"]).all()), config
        result = check(kernel, inputs["out"], inputs, dtype)
        assert isinstance(result, float), (config, result)


def ulps_at_row_scale(ref: torch.Tensor, dtype: str, ulps: float) -> torch.Tensor:
    """``ulps`` ulps of the dtype at each query row's largest |value| (shape (..., 1)); fp32
    in TF32's ulps, the arithmetic of its dots on a GPU."""
    scale = ref.abs().amax(dim=-1, keepdim=True)
    eps = 2.0 ** -10 if dtype == "float32" else torch.finfo(getattr(torch, dtype)).eps
    return ulps * eps * torch.exp2(torch.floor(torch.log2(scale)))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("name", NAMES)
def test_the_check_rejects_wrong_outputs(name, dtype):
    """The kernel's own output passes; its smaller half zeroed, a bias of 3 ulps on one
    query row, one row of another query, or the right weights without the 1/sqrt(D) scale
    are each rejected."""
    kernel = KERNELS[name]
    shape = {"B": 1, "H": 2, "S": 17, "D": 32}
    inputs = run(kernel, shape, dtype, CONFIGS[0])
    out = inputs["out"].float()
    assert isinstance(check(kernel, inputs["out"], inputs, dtype), float)

    zeroed = out.clone()
    zeroed[out.abs() < out.abs().median()] = 0.0
    biased = out.clone()
    biased[0, 1, 11] += ulps_at_row_scale(out, dtype, 3.0)[0, 1, 11]
    swapped = out.clone()
    swapped[0, 0, 5] = out[0, 0, 6]
    q, k, v = (inputs[n].float() for n in ("q", "k", "v"))
    mask = torch.ones(17, 17, dtype=torch.bool).tril() if kernel.causal else None
    unscaled = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                scale=1.0)
    for what, wrong in (("zeroed", zeroed), ("biased", biased), ("swapped", swapped),
                        ("unscaled", unscaled)):
        assert isinstance(check(kernel, wrong, inputs, dtype), str), what


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("name", NAMES)
def test_the_torch_baseline_matches_the_reference(name, dtype):
    kernel = KERNELS[name]
    inputs = kernel.make_inputs({"B": 1, "H": 2, "S": 17, "D": 32}, dtype, "cpu", seed=4)
    got = kernel.baseline(inputs)
    assert got.dtype == getattr(torch, dtype)  # in the inputs' dtype, as a user calls it
    result = check(kernel, got, inputs, dtype)
    assert isinstance(result, float), result


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_computed_in_chunks_is_the_whole(name, monkeypatch):
    """Long sequences' scores are materialised a few query rows and heads at a time: with a
    chunk of 40 scores (4 query rows of S=10, one head at a time) the reference is SDPA's."""
    kernel = KERNELS[name]
    inputs = kernel.make_inputs({"B": 2, "H": 3, "S": 10, "D": 8}, "float32", "cpu", seed=5)
    monkeypatch.setattr(module, "REFERENCE_CHUNK", 40)
    chunked = kernel.reference(inputs)
    expected = torch.nn.functional.scaled_dot_product_attention(
        inputs["q"], inputs["k"], inputs["v"], is_causal=kernel.causal)
    torch.testing.assert_close(chunked, expected, atol=1e-6, rtol=1e-5)


def test_flops_and_bytes():
    shape = {"B": 4, "H": 32, "S": 4096, "D": 128}
    assert KERNEL.flops(shape) == 4.0 * 4 * 32 * 4096 * 4096 * 128
    assert CAUSAL.flops(shape) == KERNEL.flops(shape) / 2
    assert KERNEL.bytes(shape, "bfloat16") == 4 * 2 * 4 * 32 * 4096 * 128
    assert KERNEL.bytes(shape, "float32") == 2 * KERNEL.bytes(shape, "float16")


TARGETS = [(CAUSAL, {"B": 4, "H": 32, "S": 4096, "D": 128}, "bfloat16"),
           (KERNEL, {"B": 16, "H": 16, "S": 1024, "D": 64}, "float16")]


def test_the_space_rejects_configs_that_cannot_run_well():
    space, ctx = KERNEL.space(), ProblemContext({"B": 4, "H": 32, "S": 4096, "D": 128},
                                                "float16")
    config = KernelConfig(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=4, TMA=0)
    assert shared_memory(config, 128, 2) == 2 * 128 * (128 + 2 * 4 * 128)
    assert "shared memory" in space.violation(config, ctx)
    assert space.violation(KernelConfig(config, num_stages=3), ctx) is None  # 224 KiB: fits
    assert "registers" in space.violation(
        KernelConfig(config, num_warps=4, num_stages=2), ctx)
    # 16 warps leave a thread 128 registers: 256 x (128 + 128) / 512 is 128
    assert "has 128" in space.violation(
        KernelConfig(config, BLOCK_M=256, num_warps=16, num_stages=1), ctx)
    assert "fewer than 16 rows" in space.violation(
        KernelConfig(config, BLOCK_M=64, BLOCK_N=64, num_stages=2), ctx)
    # two halves of 64 rows: 4 warps have 16 rows each, 8 warps would split rows (measured
    # 2x slower on the H200)
    halves = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2, TMA=1, SUBTILE=1)
    assert space.violation(halves, ctx) is None
    assert "half of BLOCK_M=128 (SUBTILE=1)" in space.violation(
        KernelConfig(halves, num_warps=8), ctx)
    assert space.violation(KernelConfig(halves, num_warps=8, SUBTILE=0), ctx) is None
    short = ProblemContext({"B": 1, "H": 1, "S": 17, "D": 16}, "float16")
    assert "longer than S=17" in space.violation(
        KernelConfig(config, BLOCK_M=16, BLOCK_N=64, num_warps=1, num_stages=2), short)
    fp32 = ProblemContext({"B": 1, "H": 1, "S": 4096, "D": 256}, "float32")
    assert "shared memory" in space.violation(
        KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, TMA=0), fp32)
    tma = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, TMA=1)
    assert space.violation(tma, ctx) is None
    odd_d = ProblemContext({"B": 4, "H": 32, "S": 4096, "D": 80}, "float16")
    assert "power-of-two head dim" in space.violation(tma, odd_d)
    assert space.violation(KernelConfig(tma, TMA=0), odd_d) is None
    huge = ProblemContext({"B": 4096, "H": 1024, "S": 1024, "D": 64}, "float16")
    assert "32-bit" in space.violation(tma, huge)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_default_and_known_good_configs_pass_the_constraints(dtype):
    space = KERNEL.space()
    for s in (1, 17, 100, 1024, 4096, 131072):
        for d in (1, 16, 24, 64, 80, 128, 256):
            shape = {"B": 2, "H": 3, "S": s, "D": d}
            ctx = ProblemContext(shape, dtype)
            configs = KERNEL.known_good_configs(shape, dtype)
            assert configs[0] == KERNEL.default_config(shape, dtype)
            for config in configs:
                assert space.contains(config), config
                assert space.violation(config, ctx) is None, (shape, config)


def test_the_target_problems_get_the_tutorial_s_configs():
    for kernel, shape, dtype in TARGETS:
        default = kernel.default_config(shape, dtype)
        assert default.meta == {"BLOCK_M": 128, "BLOCK_N": 64, "TMA": 0, "SUBTILE": 0}
        assert default.num_warps == (8 if shape["D"] == 128 else 4)
        assert len(kernel.known_good_configs(shape, dtype)) >= 8


def test_the_prior_prefers_the_sm90_region_to_small_tiles():
    """On the targets, the tutorial's tiles rank above tiny ones and above a spilling one,
    and the estimate is within 3x of the measured torch time (1.04 ms and 0.16 ms)."""
    for (kernel, shape, dtype), torch_ms in zip(TARGETS, (1.04, 0.164), strict=True):
        ctx = ProblemContext(shape, dtype)
        good = estimate_s(kernel.default_config(shape, dtype), ctx, kernel.causal)
        tiny = estimate_s(KernelConfig(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=2),
                          ctx, kernel.causal)
        spills = estimate_s(KernelConfig(BLOCK_M=256, BLOCK_N=256, num_warps=4, num_stages=1),
                            ctx, kernel.causal)
        assert good < tiny / 2 and good < spills
        assert torch_ms / 3 < good * 1e3 < torch_ms * 3
        assert kernel.prior(kernel.default_config(shape, dtype), ctx) == pytest.approx(
            math.log(good))


def test_the_compile_shape_is_tiny_and_specialises_alike():
    assert KERNEL.compile_shape({"B": 5, "H": 33, "S": 4099, "D": 128}, "float16") == {
        "B": 5, "H": 17, "S": 3, "D": 128}
    assert KERNEL.compile_shape({"B": 1, "H": 16, "S": 4096, "D": 64}, "bfloat16") == {
        "B": 1, "H": 16, "S": 16, "D": 64}
    shape = {"B": 2, "H": 3, "S": 4099, "D": 128}
    small = KERNEL.compile_shape(shape, "float16")
    assert small == {"B": 2, "H": 3, "S": 3, "D": 128}
    # the large problem's default config computes the small problem right
    config = KERNEL.default_config(shape, "float16")
    inputs = run(KERNEL, small, "float16", config)
    result = check(KERNEL, inputs["out"], inputs, "float16")
    assert isinstance(result, float), result


def test_both_variants_are_registered_under_their_names_and_refs():
    for name in NAMES:
        kernel = get_kernel(name)
        assert kernel.name == name and load_ref(kernel.ref) is kernel
    assert KERNEL.name == "flash_attention" and CAUSAL.name == "flash_attention_causal"
    assert "bfloat16" in KERNEL.interpreter_unsupported_dtypes
    assert KERNEL.output_check.rowwise


def test_the_launcher_refuses_non_contiguous_tensors():
    inputs = KERNEL.make_inputs({"B": 1, "H": 2, "S": 17, "D": 16}, "float16", "cpu", 6)
    inputs["k"] = inputs["k"].transpose(1, 2).contiguous().transpose(1, 2)
    with pytest.raises(ValueError, match="k must be a contiguous tensor"):
        KERNEL.launch(CONFIGS[0], inputs)


def tuner(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tuner.app.cli", "--db", db, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_a_tune_on_the_interpreter_stores_a_verified_best(tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    name = "flash_attention_causal"
    tuned = tuner("tune", name, "--shape", "B=1,H=2,S=17,D=16", "--dtype", "float16",
                  "--trials", "3", "--backend", "interpret", "--json", db=db)
    assert tuned.returncode == 0, tuned.stderr
    summary = json.loads(tuned.stdout)
    assert summary["device"] == "interpret:cpu" and summary["stored"] is True
    assert summary["best_ms"] > 0 and summary["trials"] == 3
    rows = json.loads(tuner("configs", "--kernel", name, "--json", db=db).stdout)
    assert len(rows) == 1 and rows[0]["config"] == summary["stored_config"]
    assert summary["stored_config"] == summary["best_config"] or (
        "stored the kernel's default" in summary["stored_note"])
    assert CAUSAL.space().contains(KernelConfig(summary["best_config"]))


# -- the order of the programs ---------------------------------------------------------------

@triton.jit
def _probe_order(out_ptr, num_m, group, CAUSAL: tl.constexpr):
    pid = tl.program_id(0)
    bh, start_m = _query_block(pid, num_m, tl.num_programs(0) // num_m, group, CAUSAL)
    tl.store(out_ptr + 2 * pid, bh)
    tl.store(out_ptr + 2 * pid + 1, start_m)


def program_order(heads: int, num_m: int, group: int, causal: bool) -> list[tuple[int, int]]:
    """(batch * head, query block) of each program, in program id order (the kernel's own
    mapping, run on the interpreter)."""
    out = torch.full((heads * num_m, 2), -1, dtype=torch.int32)
    _probe_order[(heads * num_m,)](out, num_m, group, int(causal))
    return [(int(bh), int(m)) for bh, m in out.tolist()]


@pytest.mark.parametrize(("heads", "num_m", "group"),
                         [(5, 3, 2), (7, 4, 3), (4, 5, 1), (3, 2, 3), (6, 1, 4), (1, 6, 1)])
def test_causal_programs_go_longest_first_within_groups_of_heads(heads, num_m, group):
    """Every (head, query block) once; the heads in groups of ``group`` (the last one
    smaller), each group a run of programs; within a group the last query block (the longest
    rows) of each of its heads first, then the one before, down to block 0."""
    order = program_order(heads, num_m, group, causal=True)
    assert sorted(order) == [(h, m) for h in range(heads) for m in range(num_m)]
    at = 0
    for first in range(0, heads, group):
        size = min(group, heads - first)
        run = order[at:at + size * num_m]
        assert run == [(first + i, m) for m in reversed(range(num_m)) for i in range(size)]
        at += size * num_m


def test_full_attention_programs_take_one_head_at_a_time():
    order = program_order(3, 4, 2, causal=False)
    assert order == [(h, m) for h in range(3) for m in range(4)]


def test_the_head_group_is_what_l2_holds():
    # the target: K and V of a head are 2 MiB, 8 heads in 16 MiB
    assert head_group(128, 4096, 128, 2) == 8
    assert head_group(128, 4096, 128, 4) == 4
    assert head_group(128, 65536, 128, 2) == 1  # one head's K and V alone are 32 MiB
    assert head_group(3, 1024, 64, 2) == 3  # no more than there are


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_causal_outputs_are_right_with_several_head_groups(dtype, monkeypatch):
    """Five heads in groups of two (the last of one head): every output row written (NaN
    before) and right, for each block ratio and TMA."""
    shape = {"B": 5, "H": 1, "S": 33, "D": 16}
    monkeypatch.setattr(module, "L2_GROUP_BYTES", 2 * 2 * 33 * 16 * (2 if dtype == "float16"
                                                                       else 4))
    assert head_group(5, 33, 16, 2 if dtype == "float16" else 4) == 2
    for config in CONFIGS + [TMA]:
        inputs = run(CAUSAL, shape, dtype, config)
        result = check(CAUSAL, inputs["out"], inputs, dtype)
        assert isinstance(result, float), (config, result)


# -- what a short search tries first ------------------------------------------------------------

#: median times (ms) the H200 measured (bench/results/targets_14_h200.json,
#: targets_flash_causal_h200.json, targets_14_early_h200.md, docs/dashboard_demo_h200.db) on
#: the two target problems, by (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA)
H200_CAUSAL_MS = {
    (128, 64, 4, 2, 1): 1.246, (128, 128, 8, 3, 1): 1.300, (128, 128, 8, 3, 0): 1.307,
    (256, 64, 8, 3, 1): 1.361, (128, 128, 8, 2, 0): 1.368, (256, 64, 8, 4, 1): 1.374,
    (256, 64, 16, 3, 1): 1.383, (128, 128, 8, 2, 1): 1.388, (256, 64, 8, 5, 1): 1.388,
    (256, 64, 16, 4, 1): 1.391, (128, 32, 8, 5, 1): 1.410, (256, 64, 16, 5, 1): 1.413,
    (128, 32, 8, 4, 1): 1.420, (128, 32, 8, 5, 0): 1.513, (128, 32, 8, 4, 0): 1.524,
    (128, 64, 8, 2, 1): 1.629, (256, 64, 8, 3, 0): 1.713}
H200_FULL_MS = {
    (128, 64, 8, 3, 0): 0.194, (128, 64, 4, 3, 0): 0.195, (128, 64, 8, 4, 0): 0.196,
    (128, 64, 8, 3, 1): 0.198, (128, 64, 8, 5, 0): 0.199, (64, 64, 4, 3, 0): 0.201,
    (128, 64, 4, 4, 0): 0.202, (128, 64, 8, 4, 1): 0.203, (64, 64, 4, 3, 1): 0.204,
    (128, 64, 8, 5, 1): 0.205, (256, 64, 16, 3, 0): 0.214, (256, 64, 16, 4, 0): 0.215,
    (256, 64, 16, 5, 0): 0.217, (128, 32, 4, 3, 1): 0.222, (128, 32, 4, 5, 1): 0.228,
    (128, 32, 4, 4, 1): 0.229, (256, 64, 16, 3, 1): 0.238, (64, 128, 4, 2, 0): 0.240,
    (256, 32, 8, 5, 1): 0.288, (128, 256, 8, 3, 0): 0.310}


def as_config(t: tuple[int, ...]) -> KernelConfig:
    """(BLOCK_M, BLOCK_N, warps, stages, TMA[, SUBTILE]) as a config (SUBTILE 0 if absent)."""
    return KernelConfig(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2], num_stages=t[3], TMA=t[4],
                        SUBTILE=t[5] if len(t) > 5 else 0)


def rank_correlation(xs: list[float], ys: list[float]) -> float:
    """Spearman's rho (ties take their mean rank)."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


@pytest.mark.parametrize(("kernel", "shape", "dtype", "measured"), [
    (CAUSAL, TARGETS[0][1], TARGETS[0][2], H200_CAUSAL_MS),
    (KERNEL, TARGETS[1][1], TARGETS[1][2], H200_FULL_MS)], ids=["causal", "full"])
def test_the_prior_orders_the_h200_s_measurements(kernel, shape, dtype, measured):
    """The prior ranks the configs the H200 measured in about their measured order (the
    model before these tables ranked the causal ones backwards: rho -0.33), and on the causal
    target the fastest measured first."""
    ctx = ProblemContext(shape, dtype)
    prior = [estimate_s(as_config(t), ctx, kernel.causal) for t in measured]
    assert rank_correlation(prior, list(measured.values())) >= 0.7
    if kernel.causal:
        fastest_ranked = min(zip(prior, measured, strict=True), key=lambda p: p[0])[1]
        assert fastest_ranked == min(measured, key=measured.get)


@pytest.mark.skipif(1 not in TMA_VALUES, reason="this Triton has no host-side TMA descriptors")
def test_a_short_search_starts_with_the_h200_s_best_causal_config():
    """The known-good configs a search tries first (after stored bests) on the causal
    target: the H200's fastest (128x64, 4 warps, 2 stages, TMA, as two halves) leads, then
    the same tile whole; 128x128 with 8 warps and 3 stages is among them; below sm90 no TMA
    config is offered."""
    kernel, shape, dtype = TARGETS[0]
    first = known_good_first(kernel, shape, dtype)
    assert first[:2] == [as_config((128, 64, 4, 2, 1, 1)), as_config((128, 64, 4, 2, 1))]
    assert {as_config((128, 128, 8, 3, 1)), as_config((128, 128, 8, 3, 0))} & set(first)
    ampere = ProblemContext(shape, dtype, capability=80)
    older = known_good_first(kernel, shape, dtype, ctx=ampere)
    assert older and not any(c["TMA"] for c in older)
    assert "compute capability" in kernel.space().violation(as_config((128, 64, 4, 2, 1)),
                                                            ampere)


def test_without_tma_descriptors_the_space_and_known_good_configs_fall_back(monkeypatch):
    """A Triton without host-side descriptors (before 3.4): the space offers TMA=0 only, the
    known-good configs keep their pointer-load entries, and a TMA=1 launch says why not."""
    monkeypatch.setattr(module, "TensorDescriptor", None)
    monkeypatch.setattr(module, "TMA_VALUES", (0,))
    kernel, shape, dtype = TARGETS[0]
    assert kernel.space().param("TMA").values == (0,)
    configs = kernel.known_good_configs(shape, dtype)
    assert len(configs) >= 5 and not any(c["TMA"] for c in configs)
    inputs = KERNEL.make_inputs({"B": 1, "H": 1, "S": 17, "D": 16}, "float16", "cpu", 7)
    with pytest.raises(ValueError, match="TMA=1 needs"):
        KERNEL.launch(TMA, inputs)
