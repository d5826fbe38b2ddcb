"""Real kernels as users write them (tests/user_kernels.py), each pattern ``triton.autotune``
users rely on: verified, tuned and served right on the interpreter.

Config-dependent inputs, pre_hooks (a TMA kernel's descriptor block shapes), heuristics under
the autotuner with empty-kwargs configs, reset_to_zero, restore_value, prune_configs_by, key
values of any type, a named dtype, problem dimensions beyond the kernel's arguments, the user's
whole list measured before the search extends it, NaN and disagreeing configs refused without
a reference, compile-ahead whatever a kernel declares, and a plugin with only the required
protocol members."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import search_spaces
import tuner
from tests import user_kernels as uk
from tests.api_support import INTERPRETER
from tests.plugins import registered
from tests.support_kernels import tuner_cli
from tuner.backends.child import ChildState, _verify
from tuner.backends.factory import open_backend
from tuner.config import KernelConfig
from tuner.configs_file import ConfigsEntry, write_tuner
from tuner.identity import local_triton_version
from tuner.kernel import compile_inputs_for, missing_members
from tuner.search import SearchOptions, run_search
from tuner.shapes import key_value


def verify(kernel: Any, config: KernelConfig, shape: dict[str, int],
           dtype: str = "float32", seed: int = 1) -> str | None:
    """The measuring child's check of one config (poisoned outputs, then the reference)."""
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = kernel, shape, dtype
    return _verify(state, config, kernel.make_inputs(shape, dtype, "cpu", seed))


def search(kernel: Any, shape: dict[str, int], trials: int, **options: Any) -> Any:
    """A search on the interpreter through the real measuring child, the user's whole list
    passed as the worker passes it."""
    backend = open_backend("interpret", kernel, shape, "float32")
    try:
        return run_search(kernel, shape, "float32", backend, SearchOptions(
            trials=trials, listed=kernel.listed_configs(shape, "float32"), **options))
    finally:
        backend.close()


@pytest.fixture
def served_from(tmp_path: Path) -> Iterator[Any]:
    """Serve configs from an exported file (the first source a launch asks)."""

    def serve(kernel: Any, shape: dict[str, int], dtype: str, config: KernelConfig) -> None:
        entry = ConfigsEntry(kernel=kernel.name, kernel_version=kernel.version, dtype=dtype,
                             device=INTERPRETER, triton_version=local_triton_version() or "",
                             shape=shape, config=config, ms=0.01)
        path = tmp_path / f"{kernel.name}.json"
        write_tuner([entry], path)
        tuner.configure(url="", configs_file=str(path), client=None)

    yield serve
    tuner.configure(url="", configs_file="", client=None)


# -- config-dependent inputs -------------------------------------------------------------------

def test_inputs_prepared_per_config_verify_for_every_block_size():
    shape = {"T": 7, "D": 5}
    for block in (2, 4, 8, 16):  # 16 is beyond the list: the space extends it
        assert verify(uk.PADDED, KernelConfig(BLOCK_T=block, num_warps=4, num_stages=3),
                      shape) is None


def test_the_reference_sees_values_make_inputs_returned_beyond_the_kernels_arguments():
    inputs = uk.PADDED.make_inputs({"T": 7, "D": 5}, "float32", "cpu", 2)
    expected = inputs["x_ptr"] * inputs["weights"][:, None]
    assert torch.allclose(uk.PADDED.reference(inputs), expected)


def test_a_kernel_with_config_dependent_inputs_is_tuned_end_to_end():
    shape = {"T": 7, "D": 5}
    result = search(uk.PADDED, shape, 4, strategy="random", retime_rounds=1)
    assert result.best is not None and result.best.ok
    assert all(m.ok for m in result.trials), [m.error for m in result.trials]


# -- pre_hook ----------------------------------------------------------------------------------

def test_a_config_outside_the_list_gets_the_lists_pre_hook_for_its_descriptors():
    beyond = KernelConfig(BLOCK_M=4, BLOCK_N=32, num_warps=4, num_stages=3)
    assert beyond not in uk.TMA.configs
    assert verify(uk.TMA, beyond, {"M": 6, "N": 40}) is None


def test_a_served_tma_config_runs_its_pre_hook(served_from):
    shape, config = {"M": 6, "N": 40}, KernelConfig(BLOCK_M=4, BLOCK_N=32, num_warps=4,
                                                    num_stages=3)
    served_from(uk.tma_double_served, shape, "float32", config)
    inputs = uk.tma_inputs(shape, "float32", "cpu", 3)
    uk.tma_double_served[uk.tma_grid](**inputs)
    assert uk.tma_double_served.sources[("float32", (("M", 6), ("N", 40)))] == "file"
    assert torch.equal(inputs["out_desc"].base, inputs["x_desc"].base * 2)
    assert inputs["out_desc"].block_shape == [4, 32]  # the served config's, set by the hook


def test_a_forced_config_runs_its_pre_hook():
    inputs = uk.tma_inputs({"M": 6, "N": 40}, "float32", "cpu", 4)
    with tuner.forced_config(KernelConfig(BLOCK_M=2, BLOCK_N=16, num_warps=4, num_stages=3)):
        uk.tma_double_served[uk.tma_grid](**inputs)
    assert torch.equal(inputs["out_desc"].base, inputs["x_desc"].base * 2)


# -- heuristics, empty kwargs, do_not_specialize, reset_to_zero, two outputs -------------------

def test_heuristics_under_the_autotuner_fill_in_their_meta_parameters():
    assert uk.SQUARE.space().size() > 0
    assert {p.name for p in uk.SQUARE.space().params} == {"num_warps", "num_stages"}
    for config in uk.SQUARE.configs:
        assert verify(uk.SQUARE, config, {"N": 13}) is None


def test_reset_to_zero_zeroes_an_accumulated_output_before_every_launch():
    inputs = uk.SQUARE.make_inputs({"N": 13}, "float32", "cpu", 5)
    for _ in range(3):  # as timing launches it: the total must not accumulate across launches
        uk.SQUARE.launch(uk.SQUARE.configs[0], inputs)
    assert torch.allclose(inputs["total_ptr"], (inputs["x_ptr"] ** 2).sum().reshape(1))


def test_restore_value_starts_every_launch_from_the_inputs_as_made():
    inputs = uk.IN_PLACE.make_inputs({"N": 11}, "float32", "cpu", 6)
    original = inputs["x_ptr"].clone()
    for _ in range(3):
        uk.IN_PLACE.launch(uk.IN_PLACE.configs[1], inputs)
    assert torch.allclose(inputs["x_ptr"], original + 1)
    assert verify(uk.IN_PLACE, uk.IN_PLACE.configs[0], {"N": 11}) is None


def test_configs_the_kernels_prune_rules_out_are_pruned_not_crashed():
    shape = {"N": 20}
    result = search(uk.NEGATE, shape, 1, retime_rounds=0)
    outcomes = {m.config["BLOCK"]: m.outcome.value for m in result.trials}
    assert outcomes == {8: "ok", 16: "ok", 32: "pruned", 64: "pruned"}


# -- keys of any type, a named dtype, dimensions beyond the arguments --------------------------

def test_bool_and_string_key_values_are_served_not_left_to_triton(served_from):
    shape = {"N": 13, "DOUBLE": key_value(True), "MODE": key_value("plus")}
    served_from(uk.keyed, shape, "float16", KernelConfig(BLOCK=16, num_warps=4, num_stages=3))
    x = torch.randn(13).half()
    out = uk.keyed_launch(x, True, "plus")
    assert torch.allclose(out.float(), x.float() * 2 + 1, atol=1e-2)
    assert uk.keyed.sources[("float16", tuple(sorted(shape.items())))] == "file"


def test_key_values_map_to_stable_dimensions():
    assert key_value(True) == 1 and key_value(False) == 0 and key_value(4096) == 4096
    assert key_value("plus") == key_value("plus") != key_value("minus")
    assert 0 <= key_value(torch.float16) < 1 << 30


def test_dtype_arg_names_the_problems_dtype_past_a_float32_side_buffer():
    named = {"scale_ptr": torch.ones(1), "x_ptr": torch.ones(3).half(), "N": 3,
             "DOUBLE": False, "MODE": "plus"}
    assert uk.keyed.problem(named)[0] == "float16"


def test_dimensions_beyond_the_key_round_trip_from_make_inputs_to_the_launch():
    shape = {"B": 2, "H": 3, "S": 9}
    inputs = uk.ROWS.make_inputs(shape, "float32", "cpu", 7)
    assert uk.ROWS.problem_of(inputs) == (shape, "float32")
    assert verify(uk.ROWS, uk.ROWS.configs[1], shape) is None


def test_a_problem_with_batch_and_heads_is_served_by_its_whole_shape(served_from):
    shape = {"B": 2, "H": 3, "S": 9}
    served_from(uk.rows_scaled, shape, "float32",
                KernelConfig(BLOCK_S=16, num_warps=4, num_stages=3))
    inputs = uk.rows_inputs(shape, "float32", "cpu", 8)
    uk.rows_scaled[uk.rows_grid](**inputs)
    assert torch.allclose(inputs["out_ptr"], inputs["x_ptr"] * 3)
    assert uk.rows_scaled.sources[("float32", tuple(sorted(shape.items())))] == "file"


# -- never worse than the user's list ------------------------------------------------------------

def test_every_config_of_the_users_list_is_measured_beyond_a_smaller_budget():
    shape = {"N": 24}
    listed = uk.LISTED.listed_configs(shape, "float32")
    assert len(listed) == 6
    result = search(uk.LISTED, shape, 3, retime_rounds=1)
    measured = {m.config for m in result.trials}
    assert set(listed) <= measured
    fastest_listed = min((m for m in result.trials if m.config in set(listed)),
                         key=lambda m: m.p50_ms or 0.0)
    # re-timed beside the finalists: the best found is compared with it side by side
    assert fastest_listed.config in {m.config for m in result.finalists}


def test_the_worker_measures_the_whole_list_of_a_plugin(tmp_path: Path):
    with registered("tests.user_kernels:LISTED"):
        tuned = tuner_cli("tune", "listed_copy", "--shape", "N=24", "--dtype", "float32",
                          "--trials", "2", "--backend", "interpret", "--json",
                          db=f"sqlite:///{tmp_path / 't.db'}")
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["trials"] >= 6


# -- without a reference -----------------------------------------------------------------------

def test_without_a_reference_nan_from_finite_inputs_is_refused():
    wrong = verify(uk.NAN_ROWS, uk.NAN_ROWS.configs[1], {"R": 3, "N": 5})
    assert wrong is not None and "NaN" in wrong
    assert uk.NAN_ROWS.verification == "unverified: no reference"


def test_without_a_reference_configs_that_disagree_are_refused():
    wrong = verify(uk.DISAGREEING, uk.DISAGREEING.configs[0], {"R": 2, "N": 5})
    assert wrong is not None and "disagree" in wrong


def test_a_kernel_with_a_reference_says_so():
    assert uk.PADDED.verification == "reference"


# -- compile ahead whatever a kernel declares --------------------------------------------------

def test_compile_ahead_uses_tiny_stand_ins_for_a_kernel_declaring_huge_traffic():
    inputs = compile_inputs_for(uk.HUGE, {"N": 4000}, "float32", "cpu")
    assert inputs is not None
    assert inputs["x_ptr"].dtype == torch.float32 and inputs["x_ptr"].numel() <= 16
    assert inputs["N"] == 4000  # integers specialise: they stay as they are
    uk.HUGE.compile(uk.HUGE.configs[0], inputs)


def test_stand_ins_keep_a_tensors_alignment():
    from tuner.user_kernel import _standin

    view = torch.empty(40)[1:]  # 4 bytes past a 16-byte boundary
    assert _standin(view, "cpu").data_ptr() % 16 == view.data_ptr() % 16
    assert _standin(torch.empty(40), "cpu").data_ptr() % 16 == 0


# -- a plugin with only the required members -----------------------------------------------------

def test_a_plugin_written_against_the_required_members_loads_and_tunes(tmp_path: Path):
    assert missing_members(uk.RAW) == []
    with registered("tests.user_kernels:RAW"):
        assert search_spaces.plugin_errors() == []
        kernel = search_spaces.get_kernel("raw_negate")
        assert kernel.known_good_configs({"N": 8}, "float32") == []
        assert kernel.prior(kernel.default_config({"N": 8}, "float32"), None) is None
        tuned = tuner_cli("tune", "raw_negate", "--shape", "N=20", "--dtype", "float32",
                          "--trials", "2", "--backend", "interpret", "--json",
                          db=f"sqlite:///{tmp_path / 't.db'}")
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["stored"] is True


@pytest.fixture(autouse=True)
def _interpreter() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"


# -- every adapted kernel passes the conformance suite shipped to plugin authors ---------------

CONFORMING = {"PADDED": {"T": 7, "D": 5}, "TMA": {"M": 8, "N": 16}, "SQUARE": {"N": 13},
              "IN_PLACE": {"N": 11}, "NEGATE": {"N": 20}, "ROWS": {"B": 2, "H": 3, "S": 9},
              "LISTED": {"N": 24}, "RAW": {"N": 20}, "BY_CALL": {"N": 21}}


@pytest.mark.parametrize("name", sorted(CONFORMING))
def test_each_adapted_kernel_passes_tuner_testing(name: str):
    from tuner.kernel import with_defaults
    from tuner.testing import check_kernel

    check_kernel(with_defaults(getattr(uk, name)), shape=CONFORMING[name], dtype="float32")


# -- adapted by its launcher ---------------------------------------------------------------------

def test_a_kernel_adapted_by_its_launcher_gets_the_arguments_and_grid_the_launcher_gives():
    inputs = uk.BY_CALL.make_inputs({"N": 21}, "float32", "cpu", 9)
    assert inputs["N"] == 21 and inputs["x_ptr"] is inputs["x"]
    assert callable(inputs["_grid"])
    for config in (uk.BY_CALL.configs[0], KernelConfig(BLOCK=64, num_warps=1, num_stages=3)):
        assert verify(uk.BY_CALL, config, {"N": 21}) is None


def test_capturing_a_launch_runs_nothing_and_leaves_the_kernel_as_it_was():
    from tuner.launching import capture_launch

    x = torch.randn(9)
    seen = capture_launch(uk.copy_kernel, lambda: uk.copy(x))
    assert seen.args["x_ptr"] is x and seen.args["N"] == 9
    assert "run" not in vars(uk.copy_kernel)
    with pytest.raises(ValueError, match="never launched"):
        capture_launch(uk.copy_kernel, lambda: None)


def test_a_kernel_adapted_by_its_launcher_is_tuned_end_to_end():
    shape = {"N": 30}
    result = search(uk.BY_CALL, shape, 2, retime_rounds=1)
    assert result.best is not None and result.best.ok
    assert all(m.ok for m in result.trials)
