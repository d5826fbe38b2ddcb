"""matmul's stream_k variant under Triton's CPU interpreter: tiles shared by two programs are
summed right and bit for bit the same on every launch (the counters are left at zero), on
odd shapes, by pointer and by tensor-descriptor loads; its constraint keeps it where it differs
from the persistent kernel; the cost model sees its balanced last wave."""

import pytest
import torch

from search_spaces import get_kernel
from search_spaces import matmul as mm
from search_spaces.gemm import prior as cost_model
from tuner.config import KernelConfig
from tuner.space import ProblemContext


def stream_k(**tile: int) -> KernelConfig:
    base = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4,
            "num_stages": 2, **tile}
    return KernelConfig({**base, "VARIANT": mm.STREAM_K, "SPLIT_K": 1})


def shared_tiles(config: KernelConfig, shape: dict[str, int], sms: int) -> int:
    """How many of the stream-K tiles two programs share (their K steps cut by a run's end)."""
    tiles = mm.output_tiles(config, shape)
    k_tiles = -(-shape["K"] // config["BLOCK_K"])
    full, per = mm.stream_k_plan(tiles, k_tiles, sms)
    ends = {p * per for p in range(1, sms)}
    return sum(any(t * k_tiles < e < (t + 1) * k_tiles for e in ends)
               for t in range(tiles - full))


#: (shape, programs): a data-parallel part and a shared tail (64^3 on 5), no data-parallel
#: part (17x100 on 9), a deep K (128x16x256 on 3), K not a multiple of BLOCK_K, M = 1
CASES = [({"M": 64, "N": 64, "K": 64}, 5), ({"M": 17, "N": 100, "K": 33}, 9),
         ({"M": 128, "N": 16, "K": 256}, 3), ({"M": 37, "N": 45, "K": 70}, 4),
         ({"M": 1, "N": 80, "K": 50}, 2)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("shape", "sms"), CASES, ids=lambda v: str(v))
def test_stream_k_matches_the_reference_and_repeats_bit_for_bit(shape, sms, dtype):
    k = get_kernel("matmul")
    config = stream_k()
    inputs = k.make_inputs(shape, dtype, "cpu", seed=3)
    a, b, out = inputs["a"], inputs["b"], inputs["out"]
    outs = []
    for _ in range(2):  # the second launch finds the counters the first left
        out.fill_(float("nan"))
        mm.matmul(a, b, out, config, sms=sms, tma=False)
        tol = k.tolerance(dtype)
        torch.testing.assert_close(out.float(), k.reference(inputs), atol=tol.atol,
                                   rtol=tol.rtol)
        outs.append(out.clone())
    assert torch.equal(outs[0], outs[1])
    ws, cnt = mm.stream_k_buffers(a.device, sms, 16, 16)
    assert int(cnt.count_nonzero()) == 0


def test_the_cases_share_tiles_between_programs():
    """The shapes above exercise the fix-up path, not only whole tiles."""
    assert [shared_tiles(stream_k(), s, p) > 0 for s, p in CASES[:3]] == [True] * 3


def test_stream_k_by_tensor_descriptors_matches_the_reference():
    """USE_TMA: descriptor loads zero-fill past M, N and K (16-byte rows: K, N multiples of 8)."""
    k = get_kernel("matmul")
    for shape, sms in (({"M": 40, "N": 48, "K": 72}, 5), ({"M": 33, "N": 64, "K": 40}, 3)):
        inputs = k.make_inputs(shape, "float16", "cpu", seed=5)
        inputs["out"].fill_(float("nan"))
        mm.matmul(inputs["a"], inputs["b"], inputs["out"], stream_k(), sms=sms, tma=True)
        tol = k.tolerance("float16")
        torch.testing.assert_close(inputs["out"].float(), k.reference(inputs), atol=tol.atol,
                                   rtol=tol.rtol)


def test_stream_k_plan_covers_every_step_once():
    for tiles, k_tiles, sms in ((288, 48, 132), (16, 4, 5), (8, 3, 7), (140, 1, 132)):
        full, per = mm.stream_k_plan(tiles, k_tiles, sms)
        assert full % sms == 0 and full <= tiles
        assert k_tiles <= per <= 2 * k_tiles  # a tile meets at most two runs
        assert per * sms >= (tiles - full) * k_tiles  # the runs cover the stream-K steps
    # 3072^3 in 128x256 tiles: 288 tiles = 2 waves + 24 on 132 SMs; one wave data-parallel
    assert mm.stream_k_plan(288, 48, 132) == (132, 57)


def test_stream_k_constraint_keeps_it_where_it_differs_from_persistent():
    space = get_kernel("matmul").space()
    tile = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
            "num_stages": 3}
    cube = ProblemContext({"M": 3072, "N": 3072, "K": 3072}, "bfloat16")
    assert space.violation(stream_k(**tile), cube) is None  # 288 tiles on 132 SMs
    few = ProblemContext({"M": 512, "N": 512, "K": 4096}, "bfloat16")
    assert "full wave" in (space.violation(stream_k(**tile), few) or "")
    whole = ProblemContext({"M": 128 * 12, "N": 256 * 11, "K": 4096}, "bfloat16")
    assert "whole waves" in (space.violation(stream_k(**tile), whole) or "")
    shallow = ProblemContext({"M": 3072, "N": 3072, "K": 64}, "bfloat16")
    assert "one K step" in (space.violation(stream_k(**tile), shallow) or "")


def test_cost_model_ranks_stream_k_as_the_h200_measured_it():
    """bench/results/matmul_variants_stream_k_tma_store_h200.txt, 128x256 tiles: on 3072^3
    (2.18 waves) stream_k 0.1020 ms beat persistent 0.1047 and TMA persistent 0.1060; on
    4096^3 (3.88 waves) it lost to both (0.2477 against 0.2146 and 0.2099). Whole tiles
    only would predict a 27% gain on 3072^3: the model's stream-K steps are slower, as
    measured."""
    tile = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
            "num_stages": 3}

    def est(variant: int, shape: tuple[int, int, int], dtype: str) -> float:
        config = KernelConfig({**tile, "VARIANT": variant, "SPLIT_K": 1})
        ctx = ProblemContext(dict(zip("MNK", shape, strict=True)), dtype)
        return cost_model.estimate_s(config, ctx)

    cube = (3072, 3072, 3072)
    sk = est(mm.STREAM_K, cube, "bfloat16")
    assert sk < est(mm.PERSISTENT, cube, "bfloat16")
    assert 0.9 * est(mm.TMA_PERSISTENT, cube, "bfloat16") < sk < est(mm.TMA_PERSISTENT, cube,
                                                                        "bfloat16")
    big = (4096, 4096, 4096)
    assert est(mm.STREAM_K, big, "float16") > 1.1 * est(mm.TMA_PERSISTENT, big, "float16")
    assert est(mm.STREAM_K, big, "float16") > est(mm.PERSISTENT, big, "float16")


def test_known_good_stream_k_configs_only_where_a_wave_is_partial():
    k = get_kernel("matmul")
    cube = k.known_good_configs({"M": 3072, "N": 3072, "K": 3072}, "bfloat16")
    assert any(c["VARIANT"] == mm.STREAM_K for c in cube)
    skinny = k.known_good_configs({"M": 16, "N": 4096, "K": 4096}, "bfloat16")
    assert not any(c["VARIANT"] == mm.STREAM_K for c in skinny)
