import pytest

from search_spaces import get_kernel
from tuner.config import KernelConfig
from tuner.errors import InvalidConfig
from tuner.space import Param, ProblemContext, SearchSpace


def test_pow2_param_is_ordinal_with_all_powers():
    p = Param.pow2("BLOCK_M", 16, 256)
    assert p.values == (16, 32, 64, 128, 256) and p.kind == "pow2"


def test_space_enumerates_the_product_and_encodes_indices():
    space = SearchSpace((Param.pow2("A", 1, 4), Param.ints("B", (2, 3))))
    configs = list(space)
    assert len(configs) == space.size() == 6
    assert space.decode(space.encode(configs[3])) == configs[3]


def test_validate_names_the_bad_field():
    space = SearchSpace((Param.pow2("A", 1, 4),))
    with pytest.raises(InvalidConfig) as err:
        space.validate({"A": 3})
    assert err.value.field == "config.A"


def test_matmul_shared_memory_constraint_prunes_before_compiling():
    k = get_kernel("matmul")
    ctx = ProblemContext({"M": 4096, "N": 4096, "K": 4096}, "float16", smem_limit=232_448)
    too_big = KernelConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4,
                           num_stages=4)  # 262,144 B (an OutOfResources in the H200 table)
    fits = KernelConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4,
                        num_stages=3)
    assert "262144 B" in (k.space().violation(too_big, ctx) or "")
    assert k.space().violation(fits, ctx) is None


def test_matmul_prunes_accumulators_that_cannot_fit_in_registers():
    k = get_kernel("matmul")
    ctx = ProblemContext({"M": 4096, "N": 4096, "K": 4096}, "float16")
    spills = KernelConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=4,
                          num_stages=3)  # 256 fp32 registers per thread for the accumulator
    fits = KernelConfig({**spills.to_dict(), "num_warps": 8})  # 128
    assert "256 registers" in (k.space().violation(spills, ctx) or "")
    assert k.space().violation(fits, ctx) is None
    assert all(k.space().violation(c, ctx) is None
               for c in k.known_good_configs(ctx.shape, ctx.dtype))


def test_matmul_prunes_tiles_larger_than_a_skinny_problem():
    k = get_kernel("matmul")
    ctx = ProblemContext({"M": 8, "N": 4096, "K": 4096}, "float16")
    cfg = KernelConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3)
    assert "BLOCK_M=64" in (k.space().violation(cfg, ctx) or "")


def test_matmul_default_and_known_good_configs_are_in_the_space():
    k = get_kernel("matmul")
    shape = {"M": 4096, "N": 4096, "K": 4096}
    for c in [k.default_config(shape, "float16"), *k.known_good_configs(shape, "float16")]:
        assert k.space().contains(c), c


def test_enumerating_a_space_makes_the_same_configs_in_the_product_s_order():
    """``SearchSpace.__iter__`` builds configs without KernelConfig's checks and sort (a
    matmul space has 120,000 configs, enumerated for each problem): the same configs, equal
    and hashing alike, in ``itertools.product``'s order."""
    import itertools

    space = get_kernel("matmul").space()
    combos = itertools.islice(itertools.product(*(p.values for p in space.params)), 2000)
    made = list(itertools.islice(iter(space), 2000))
    expected = [KernelConfig(dict(zip(space.names, combo, strict=True))) for combo in combos]
    assert made == expected
    assert [hash(c) for c in made] == [hash(c) for c in expected]
    assert all(list(c) == sorted(c) and c["BLOCK_M"] == e["BLOCK_M"]
               for c, e in zip(made, expected, strict=True))
    one = SearchSpace((Param.ints("X", (1, 2)),))
    assert list(one) == [KernelConfig(X=1), KernelConfig(X=2)]
