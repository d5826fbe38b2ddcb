"""matmul tma_persistent's split tiles (BLOCK_N not a power of two, e.g. 192 = 128 + 64): right
on odd shapes under the interpreter, offered by the space for tma_persistent alone, known-good
where N is whole 192-wide tiles, and ranked by the cost model in the order the H200 measured."""

import pytest
import torch

from search_spaces import get_kernel
from search_spaces import matmul as mm
from search_spaces.gemm.prior import estimate_s
from tuner.config import KernelConfig
from tuner.kernel import output_check_of
from tuner.space import ProblemContext
from tuner.verification import compare


def tma(block_n: int, **over: int) -> KernelConfig:
    return KernelConfig({"VARIANT": mm.TMA_PERSISTENT, "SPLIT_K": 1, "BLOCK_M": 16,
                         "BLOCK_N": block_n, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4,
                         "num_stages": 2, **over})


def test_second_block_names_the_split():
    assert mm.second_block(192) == 64 and mm.second_block(96) == 32
    assert mm.second_block(160) == 32
    assert mm.second_block(256) == 0 and mm.second_block(32) == 0
    with pytest.raises(ValueError, match="side of 224"):
        mm.second_block(224)  # 128 + 96: the second block is not a power of two either


#: N spanning several split tiles with a partial last one (its second block wholly past N on
#: the first shape), K not a multiple of BLOCK_K, one row
SHAPES = [{"M": 40, "N": 200, "K": 72}, {"M": 17, "N": 104, "K": 40}, {"M": 1, "N": 8, "K": 8}]


@pytest.mark.parametrize("block_n", [48, 96, 192])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
def test_split_tiles_match_the_reference_on_odd_shapes(shape, block_n):
    k = get_kernel("matmul")
    inputs = k.make_inputs(shape, "float16", "cpu", seed=3)
    inputs["out"].fill_(float("nan"))  # both blocks of every tile must be stored
    mm.matmul(inputs["a"], inputs["b"], inputs["out"], tma(block_n), sms=3)
    result = compare(inputs["out"], k.reference(inputs), k.tolerance("float16"), "float16",
                     output_check_of(k))
    assert isinstance(result, float), result


def test_split_tiles_store_nothing_past_the_output():
    """C's columns past N (inside the last tile's second block) keep what was there."""
    k = get_kernel("matmul")
    inputs = k.make_inputs({"M": 20, "N": 136, "K": 24}, "float16", "cpu", seed=4)
    wide = torch.full((20, 256), 7.0, dtype=torch.float16)
    out = wide[:, :136]  # row stride 256: columns 136.. belong to no output
    mm.matmul(inputs["a"], inputs["b"], out, tma(192), sms=3)
    torch.testing.assert_close(out.float(), k.reference(inputs), atol=2e-2, rtol=2e-2)
    assert torch.all(wide[:, 136:] == 7.0)


def test_only_tma_persistent_takes_a_split_tile():
    space = get_kernel("matmul").space()
    assert 192 in space.param("BLOCK_N").values
    ctx = ProblemContext({"M": 3072, "N": 3072, "K": 3072}, "bfloat16")
    tile = {"BLOCK_M": 128, "BLOCK_N": 192, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
            "num_stages": 4}
    for i, name in enumerate(mm.VARIANTS):
        config = KernelConfig({**tile, "VARIANT": i, "SPLIT_K": 2 if name == "split_k" else 1})
        why = space.violation(config, ctx)
        if name == "tma_persistent":
            assert why is None
        else:
            assert why and "BLOCK_N=192 is not a power of two" in why, (name, why)
    # 4 stages of 128x64 + 64x192 and the 128x192 output tile fit (213 KB); 5 do not
    assert "shared memory" in (space.violation(KernelConfig(
        {**tile, "num_stages": 5, "VARIANT": mm.TMA_PERSISTENT, "SPLIT_K": 1}), ctx) or "")
    # the tiled space (matmul_epilogue's) stays powers of two
    assert 192 not in mm.tiled_space().param("BLOCK_N").values
    feasible = space.feasible(ctx)
    split = [c for c in feasible if c["BLOCK_N"] == 192]
    assert split and all(c["VARIANT"] == mm.TMA_PERSISTENT for c in split)


def test_known_good_split_tile_only_where_n_is_whole_tiles():
    k = get_kernel("matmul")

    def split(shape: dict[str, int]) -> list[KernelConfig]:
        return [c for c in k.known_good_configs(shape, "bfloat16") if c["BLOCK_N"] == 192]

    assert len(split({"M": 3072, "N": 3072, "K": 3072})) == 1
    assert split({"M": 4096, "N": 4096, "K": 4096}) == []
    assert split({"M": 8192, "N": 8192, "K": 8192}) == []


def test_cost_model_ranks_split_tiles_as_the_h200_measured_them():
    """bench/results/matmul_split_tile_h200/run2_*: TMA persistent 128x192/4 stages took 0.915x
    the time of 128x256/3 stages on 3072^3 (2.9 waves against 2.2) and 1.148x on 8192^3."""
    def ratio(shape: dict[str, int]) -> float:
        ctx = ProblemContext(shape, "bfloat16", 232_448, 132, 90)
        base = {"VARIANT": mm.TMA_PERSISTENT, "SPLIT_K": 1, "BLOCK_M": 128, "BLOCK_K": 64,
                "GROUP_M": 8, "num_warps": 8}
        return (estimate_s({**base, "BLOCK_N": 192, "num_stages": 4}, ctx)
                / estimate_s({**base, "BLOCK_N": 256, "num_stages": 3}, ctx))

    assert 0.85 < ratio({"M": 3072, "N": 3072, "K": 3072}) < 0.97
    assert 1.08 < ratio({"M": 8192, "N": 8192, "K": 8192}) < 1.22
