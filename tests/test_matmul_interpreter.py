"""The matmul kernel is right for odd shapes under Triton's CPU interpreter, in every variant
(tiled, persistent, tma_persistent, split_k, stream_k); the variant constraints prune what
cannot run or would repeat another config; split-K is deterministic."""

import pytest
import torch

from search_spaces import get_kernel
from search_spaces import matmul as mm
from tuner.backends.replay import ReplayBackend, parse_table, with_added_params
from tuner.config import KernelConfig
from tuner.kernel import output_check_of
from tuner.measurement import Outcome
from tuner.space import ProblemContext
from tuner.verification import compare

CONFIGS = [
    KernelConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2),
    KernelConfig(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3),
    KernelConfig(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=4),
]
SHAPES = [{"M": 1, "N": 1, "K": 1}, {"M": 17, "N": 33, "K": 65}, {"M": 100, "N": 3, "K": 257}]


def variant(name: str, split_k: int = 1, **tile: int) -> KernelConfig:
    base = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4,
            "num_stages": 2, **tile}
    return KernelConfig({**base, "VARIANT": mm.VARIANTS.index(name), "SPLIT_K": split_k})


#: one config per variant (split_k twice): 16x32 tiles, so that the shapes below have more
#: tiles than the interpreter's 3 persistent programs and a K loop of several steps
VARIANT_CONFIGS = [variant("tiled"), variant("persistent"), variant("split_k", 2),
                   variant("split_k", 4, GROUP_M=1), variant("tma_persistent"),
                   variant("stream_k")]
#: M=1, K=1, K not a multiple of BLOCK_K (65), K a multiple of it (EVEN_K: 64), N < BLOCK_N
VARIANT_SHAPES = [{"M": 1, "N": 40, "K": 1}, {"M": 17, "N": 33, "K": 65},
                  {"M": 50, "N": 72, "K": 64}, {"M": 33, "N": 8, "K": 40}]


def shape_id(shape: dict[str, int]) -> str:
    return "x".join(map(str, shape.values()))


def run(config: KernelConfig, shape: dict[str, int], dtype: str, seed: int = 1) -> tuple:
    k = get_kernel("matmul")
    inputs = k.make_inputs(shape, dtype, "cpu", seed=seed)
    inputs["out"].fill_(float("nan"))  # every element must be written
    k.launch(config, inputs)
    return k, inputs


def tma_runs_on(shape: dict[str, int], dtype: str) -> bool:
    """TMA's 16-byte row rule (the interpreter would run it anyway; a GPU would not)."""
    e = 4 if dtype == "float32" else 2
    return shape["K"] * e % 16 == 0 and shape["N"] * e % 16 == 0


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.key())
def test_matmul_matches_torch_on_odd_shapes(shape, dtype, config):
    """Configs without VARIANT (stored before variants existed) run the tiled kernel."""
    k, inputs = run(config, shape, dtype)
    ref = k.reference(inputs)
    tol = k.tolerance(dtype)
    torch.testing.assert_close(inputs["out"].float(), ref, atol=tol.atol, rtol=tol.rtol)


#: every variant on every shape and dtype, but TMA only where its 16-byte row rule holds (its
#: constraint prunes the others; the interpreter would run them, a GPU would not)
VARIANT_CASES = [
    pytest.param(config, shape, dtype,
                 id=f"{mm.VARIANTS[config['VARIANT']]}{config['SPLIT_K']}-{shape_id(shape)}-{dtype}")
    for config in VARIANT_CONFIGS for shape in VARIANT_SHAPES for dtype in ("float32", "float16")
    if config["VARIANT"] != mm.TMA_PERSISTENT or tma_runs_on(shape, dtype)
]


@pytest.mark.parametrize(("config", "shape", "dtype"), VARIANT_CASES)
def test_every_variant_matches_the_reference_on_odd_shapes(config, shape, dtype):
    k, inputs = run(config, shape, dtype)
    result = compare(inputs["out"], k.reference(inputs), k.tolerance(dtype), dtype,
                     output_check_of(k))
    assert isinstance(result, float), result


def test_tma_persistent_zero_fills_past_every_edge():
    """Tiles past M, N and K (K < BLOCK_K, N < BLOCK_N, M = 1) read zeros and store nothing."""
    for shape in ({"M": 1, "N": 8, "K": 8}, {"M": 19, "N": 24, "K": 40}):
        k, inputs = run(variant("tma_persistent", BLOCK_K=64), shape, "float16")
        result = compare(inputs["out"], k.reference(inputs), k.tolerance("float16"), "float16",
                         output_check_of(k))
        assert isinstance(result, float), (shape, result)


@pytest.mark.parametrize("warp_spec", [1, 2])
def test_tma_persistent_asked_to_warp_specialise_computes_the_same(warp_spec):
    """The benchmarks' WS switch (the tile loop warp-specialised, flattened or not) changes
    how Triton schedules the loop, not what it computes: bit-equal to WS=0."""
    k = get_kernel("matmul")
    config = variant("tma_persistent", BLOCK_K=16)
    inputs = k.make_inputs({"M": 40, "N": 48, "K": 72}, "float16", "cpu", seed=2)
    a, b, out = inputs["a"], inputs["b"], inputs["out"]
    mm.matmul(a, b, out, config, sms=3)
    plain = out.clone()
    out.fill_(float("nan"))
    mm.matmul(a, b, out, config, sms=3, warp_spec=warp_spec)
    assert torch.equal(out, plain)


def test_split_k_with_empty_splits_is_right():
    """K = 40 with BLOCK_K = 32 is two K steps; SPLIT_K = 4 leaves two splits empty (their
    partials are zeros), and SPLIT_K = 16 fourteen."""
    for split in (4, 16):
        k, inputs = run(variant("split_k", split), {"M": 20, "N": 36, "K": 40}, "float32")
        torch.testing.assert_close(inputs["out"], k.reference(inputs), atol=1e-5, rtol=1e-5)


def test_split_k_is_deterministic_and_differs_from_one_pass_only_by_rounding():
    shape = {"M": 18, "N": 40, "K": 200}
    first = run(variant("split_k", 4), shape, "float32")[1]["out"].clone()
    again = run(variant("split_k", 4), shape, "float32")[1]["out"]
    assert torch.equal(first, again)
    tiled = run(variant("tiled"), shape, "float32")[1]["out"]
    assert not torch.equal(first, tiled)  # four fp32 partial sums, added in another order
    torch.testing.assert_close(first, tiled, atol=1e-5, rtol=1e-5)


def test_verification_rejects_a_split_k_that_dropped_a_split():
    """Summing 3 of 4 splits (what a reduction that skipped one would give) fails the check."""
    k, inputs = run(variant("split_k", 4), {"M": 18, "N": 40, "K": 128}, "float16")
    a, b = inputs["a"].float(), inputs["b"].float()
    dropped = (a[:, 32:] @ b[32:, :]).to(torch.float16)
    assert isinstance(compare(inputs["out"], k.reference(inputs), k.tolerance("float16"),
                              "float16", output_check_of(k)), float)
    assert isinstance(compare(dropped, k.reference(inputs), k.tolerance("float16"), "float16",
                              output_check_of(k)), str)


def test_persistent_programs_cover_every_tile():
    """Three programs (the interpreter's NUM_SMS) walk 4 x 3 = 12 tiles, four each; GROUP_M=3
    leaves a short last group."""
    config = variant("persistent", GROUP_M=3)
    k, inputs = run(config, {"M": 57, "N": 70, "K": 33}, "float32")
    assert mm.output_tiles(config, {"M": 57, "N": 70}) == 12 > mm.INTERPRETER_SMS
    torch.testing.assert_close(inputs["out"], k.reference(inputs), atol=1e-5, rtol=1e-5)


def test_the_variant_constraints_prune_duplicates_and_what_cannot_run():
    space = get_kernel("matmul").space()
    big = ProblemContext({"M": 4096, "N": 4096, "K": 4096}, "float16")
    tile = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
            "num_stages": 3}

    def why(name: str, split: int = 1, ctx: ProblemContext = big, **over: int) -> str | None:
        return space.violation(variant(name, split, **{**tile, **over}), ctx)

    for name in ("tiled", "persistent", "tma_persistent"):
        assert why(name) is None
        assert "only used by VARIANT=split_k" in (why(name, 4) or "")
    assert "needs SPLIT_K > 1" in (why("split_k", 1) or "")
    assert why("split_k", 16) is None  # 64 K steps, 4 per split
    # K = 100 is 2 steps of 64: a third split would be empty (the same work as SPLIT_K = 2)
    deep_k = ProblemContext({"M": 64, "N": 64, "K": 100}, "float16")
    assert why("split_k", 2, deep_k, BLOCK_M=64, BLOCK_N=64) is None
    assert "without a K step" in (why("split_k", 4, deep_k, BLOCK_M=64, BLOCK_N=64) or "")
    # persistent with no more tiles than SMs is the tiled kernel
    few = ProblemContext({"M": 512, "N": 512, "K": 4096}, "float16")
    assert "persistent is the tiled kernel" in (why("persistent", ctx=few) or "")
    assert why("tma_persistent", ctx=few) is None
    # TMA: sm_90 and up, 16-bit inputs, 16-byte aligned rows, the output tile's staging
    old = ProblemContext(big.shape, "float16", capability=80)
    assert "compute capability" in (why("tma_persistent", ctx=old) or "")
    assert why("tiled", ctx=old) is None
    fp32 = ProblemContext(big.shape, "float32")
    assert "16-bit inputs" in (why("tma_persistent", ctx=fp32) or "")
    odd = ProblemContext({"M": 777, "N": 1234, "K": 4321}, "float16")
    assert "16-byte aligned rows" in (why("tma_persistent", ctx=odd) or "")
    assert why("tma_persistent", BLOCK_N=256, num_stages=3) is None
    assert why("tiled", BLOCK_N=256, num_stages=4) is None  # 196,608 B
    assert "shared memory" in (why("tma_persistent", BLOCK_N=256, num_stages=4) or "")
    # the split-K workspace's cap
    wide = ProblemContext({"M": 8192, "N": 8192, "K": 65536}, "float16")
    assert "workspace" in (why("split_k", 8, wide) or "")


def test_the_space_holds_every_variant_once_per_tile():
    space = get_kernel("matmul").space()
    assert space.param("VARIANT").kind == "categorical"
    ctx = ProblemContext({"M": 2048, "N": 2048, "K": 4096}, "float16")
    feasible = space.feasible(ctx)
    by_variant = {name: [c for c in feasible if c["VARIANT"] == i]
                  for i, name in enumerate(mm.VARIANTS)}
    tiled = {c.key() for c in by_variant["tiled"]}
    assert tiled and all(c["SPLIT_K"] == 1 for c in by_variant["tiled"])
    assert {c["SPLIT_K"] for c in by_variant["split_k"]} == set(mm.SPLIT_KS[1:])
    whole = [c for c in by_variant["tma_persistent"] if c["BLOCK_N"] != 192]
    assert 0 < len(whole) < len(tiled)  # less smem per pipeline (split tiles are its own)
    assert 0 < len(by_variant["persistent"]) < len(tiled)  # the small-tile grids fit in a wave
    assert len(feasible) == len({c.key() for c in feasible})


def test_known_good_and_default_configs_are_in_the_space_and_run():
    k = get_kernel("matmul")
    space = k.space()
    shape = {"M": 4096, "N": 4096, "K": 4096}
    good = k.known_good_configs(shape, "float16")
    assert all(space.contains(c) for c in good)
    # 4096^2 in 128x128 or 128x256 tiles leaves a partial last wave on 132 SMs: stream-K's too
    assert {c["VARIANT"] for c in good} == {mm.TILED, mm.PERSISTENT, mm.TMA_PERSISTENT,
                                            mm.STREAM_K}
    assert good[0]["VARIANT"] == mm.TILED  # the ones that run everywhere come first
    # a skinny deep-K problem gets split-K's instead of the persistent ones
    skinny = k.known_good_configs({"M": 16, "N": 4096, "K": 4096}, "float16")
    assert {c["VARIANT"] for c in skinny} == {mm.TILED, mm.SPLIT_K_VARIANT}
    assert all(space.contains(c) for c in skinny)
    ctx = ProblemContext(shape, "bfloat16")
    assert space.violation(good[0], ctx) is None
    tma = KernelConfig({**variant("tma_persistent", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
                                  GROUP_M=8, num_warps=8, num_stages=3), "ALIGN": 0})
    assert tma in good and space.violation(tma, ctx) is None
    assert all(c["ALIGN"] == 0 for c in good)  # aligned rows: nothing to stage
    default = k.default_config({"M": 5, "N": 7, "K": 9}, "float32")
    assert space.contains(default) and default["VARIANT"] == mm.TILED
    kk, inputs = run(default, {"M": 5, "N": 7, "K": 9}, "float32")
    torch.testing.assert_close(inputs["out"], kk.reference(inputs), atol=1e-5, rtol=1e-5)


def test_a_recorded_table_replays_as_the_tiled_variant():
    """Tables recorded before variants hold configs without VARIANT or SPLIT_K: the replayed
    space maps them to VARIANT=tiled, SPLIT_K=1, and offers no other value."""
    old = {"BLOCK_K": 32, "BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_stages": 2,
           "num_warps": 4}
    table = parse_table({
        "format": "replay-v1", "kernel": "matmul", "device": "synthetic",
        "shape": {"M": 16, "N": 64, "K": 64}, "dtype": "float16", "params": sorted(old),
        "results": [{"config": old, "ms": 0.5},
                    {"config": {**old, "BLOCK_N": 64}, "ms": 0.25}]})
    backend = ReplayBackend(table)
    space = backend.restrict(get_kernel("matmul").space())
    assert space.param("VARIANT").values == (mm.TILED,) and space.param("SPLIT_K").values == (1,)
    assert space.param("ALIGN").values == (0,)
    mapped = KernelConfig({**old, "VARIANT": mm.TILED, "SPLIT_K": 1, "ALIGN": 0})
    assert space.contains(mapped) and len(list(space)) == 2
    assert backend.measure([mapped])[0].p50_ms == 0.5
    other = backend.measure([KernelConfig({**mapped, "VARIANT": mm.PERSISTENT})])[0]
    assert other.outcome is Outcome.COMPILE_ERROR and "not in the replay table" in other.error
    assert backend.measure([KernelConfig(old)])[0].p50_ms == 0.5  # the recorded name too
    # the table itself, renamed as the search names its configs
    renamed = with_added_params(table, get_kernel("matmul").space())
    assert renamed.results[mapped] == 0.5 and set(renamed.params) == set(space.names)
    assert with_added_params(renamed, get_kernel("matmul").space()) is renamed


def test_capability_of_a_fingerprint_reaches_the_constraints():
    assert ProblemContext.capability_of("9.0") == 90
    assert ProblemContext.capability_of("8.6") == 86
    assert ProblemContext.capability_of(None) == ProblemContext.capability == 90
    from dataclasses import replace

    from tuner.search import SearchLoop, SearchOptions

    table = parse_table({
        "format": "replay-v1", "kernel": "matmul", "device": "synthetic",
        "shape": {"M": 4096, "N": 4096, "K": 4096}, "dtype": "float16",
        "params": ["BLOCK_K", "BLOCK_M", "BLOCK_N", "GROUP_M", "num_stages", "num_warps"],
        "results": [{"config": {"BLOCK_K": 64, "BLOCK_M": 128, "BLOCK_N": 128, "GROUP_M": 8,
                                "num_stages": 3, "num_warps": 8}, "ms": 0.2}]})
    tma = variant("tma_persistent", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                  num_warps=8, num_stages=3)
    for cc, pruned in (("8.0", True), ("9.0", False)):
        backend = ReplayBackend(table)
        backend.fingerprint = replace(backend.fingerprint, compute_capability=cc)
        loop = SearchLoop(get_kernel("matmul"), table.shape, table.dtype, backend,
                          SearchOptions(trials=1))
        assert loop.ctx.capability == ProblemContext.capability_of(cc)
        assert bool(loop.space.violation(tma, loop.ctx)) is pruned


def test_matmul_inputs_are_random_not_zero():
    k = get_kernel("matmul")
    inputs = k.make_inputs({"M": 8, "N": 8, "K": 8}, "float16", "cpu", seed=0)
    assert inputs["a"].abs().min() >= 0 and inputs["a"].abs().sum() > 0
    assert not torch.equal(inputs["a"], k.make_inputs({"M": 8, "N": 8, "K": 8}, "float16",
                                                      "cpu", seed=1)["a"])


@pytest.mark.parametrize("name", ["tiled", "persistent", "tma_persistent"])
def test_the_epilogue_kernels_run_matmuls_variants(name):
    """matmul_epilogue offers tiled, persistent and tma_persistent (not split-K): each applies
    the bias, the activation and the residual on an odd shape with more tiles than the
    interpreter's persistent programs."""
    from search_spaces.matmul_epilogue import KERNELS

    k = KERNELS["matmul_epilogue_gelu_residual"]
    config = KernelConfig({k2: v for k2, v in variant(name, GROUP_M=8).items()
                           if k2 != "SPLIT_K"})
    assert k.space().contains(config)
    for shape in ({"M": 37, "N": 72, "K": 40}, {"M": 1, "N": 8, "K": 16}):
        inputs = k.make_inputs(shape, "float16", "cpu", seed=3)
        inputs["out"].fill_(float("nan"))
        k.launch(config, inputs)
        result = compare(inputs["out"], k.reference(inputs), k.tolerance("float16"), "float16",
                         output_check_of(k))
        assert isinstance(result, float), (shape, result)


def test_the_epilogue_space_has_no_split_k():
    from search_spaces.matmul_epilogue import KERNELS

    k = KERNELS["matmul_epilogue_relu"]
    space = k.space()
    assert "SPLIT_K" not in space.names
    assert set(space.param("VARIANT").values) == {mm.TILED, mm.PERSISTENT, mm.TMA_PERSISTENT}
    shape = {"M": 4096, "N": 4096, "K": 4096}
    good = k.known_good_configs(shape, "bfloat16")
    assert good and all(space.contains(c) for c in good)
    assert {c["VARIANT"] for c in good} == {mm.TILED, mm.PERSISTENT, mm.TMA_PERSISTENT}
    ctx = ProblemContext({"M": 512, "N": 512, "K": 4096}, "float16")
    persistent = KernelConfig({**k.default_config(shape, "float16"), "VARIANT": mm.PERSISTENT})
    assert "tiled kernel" in (space.violation(persistent, ctx) or "")
