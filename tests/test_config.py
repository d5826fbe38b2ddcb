import json
import pickle

import pytest

from tuner.config import KernelConfig


def test_config_is_hashable_and_order_independent():
    a = KernelConfig({"BLOCK_M": 64, "num_warps": 4})
    b = KernelConfig({"num_warps": 4, "BLOCK_M": 64})
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


def test_config_json_round_trip_is_a_flat_dict():
    c = KernelConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    assert json.loads(c.to_json()) == {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3,
                                       "num_warps": 8}
    assert KernelConfig.from_json(c.to_json()) == c


def test_config_pickles_for_child_processes():
    c = KernelConfig(BLOCK_M=16, num_stages=2)
    assert pickle.loads(pickle.dumps(c)) == c


def test_config_splits_meta_from_launch_options():
    c = KernelConfig(BLOCK_M=16, GROUP_M=8, num_warps=2, num_stages=5)
    assert c.meta == {"BLOCK_M": 16, "GROUP_M": 8}
    assert (c.num_warps, c.num_stages) == (2, 5)


def test_config_to_triton_builds_a_triton_config():
    t = KernelConfig(BLOCK_M=32, num_warps=4, num_stages=3).to_triton()
    assert t.kwargs == {"BLOCK_M": 32} and t.num_warps == 4 and t.num_stages == 3


@pytest.mark.parametrize("bad", [{"BLOCK_M": 1.5}, {"BLOCK_M": "64"}, {"BLOCK_M": True}])
def test_config_rejects_non_int_values(bad):
    with pytest.raises(TypeError):
        KernelConfig(bad)
