"""A kernel's version is a hash of what it runs and how it is searched (``tuner/code_hash.py``):
the jit functions it launches and every jit function they reach, the constants they read, the
host code that launches them (built-ins), its space and constraints. Comments, docstrings and
edits elsewhere in a module change nothing.

Edits are simulated on copies: the built-in modules are copied into a package of their own
under ``tmp_path`` (an edited copy beside a pristine one), a user's kernel module is written
there and imported under a new name after each edit."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import search_spaces.conv2d as conv2d_module
import search_spaces.matmul as matmul_module
import tuner
from tuner.kernel import code_version
from tuner.space import Param, SearchSpace

ROOT = Path(__file__).resolve().parents[1]
_counter = iter(range(1_000_000))


@pytest.fixture
def importable(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))


def replaced(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} is not in the source once"
    return text.replace(old, new)


# -- built-ins: copies of matmul.py, conv2d.py and the GEMM family's package --------------------

def builtin_copy(root: Path, matmul_edit: Any = None, conv2d_edit: Any = None,
                 tiles_edit: Any = None, host_edit: Any = None) -> Any:
    """A fresh package holding matmul.py, conv2d.py and gemm/ (the family's device code,
    ``tiles.py``, and host helpers, ``host.py``, that both import), each importing the copies,
    each edited by its function of the source; returns matmul's and conv2d's modules."""
    package = f"identity_copy_{next(_counter)}"
    (root / package / "gemm").mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    edits = {"matmul.py": matmul_edit, "conv2d.py": conv2d_edit, "gemm/tiles.py": tiles_edit,
             "gemm/host.py": host_edit}
    sources = ["matmul.py", "conv2d.py", *(
        f"gemm/{p.name}" for p in sorted((ROOT / "search_spaces" / "gemm").glob("*.py")))]
    for name in sources:
        src = (ROOT / "search_spaces" / name).read_text().replace(
            "from search_spaces.matmul import", f"from {package}.matmul import").replace(
            "from search_spaces.gemm", f"from {package}.gemm")
        edit = edits.get(name)
        (root / package / name).write_text(edit(src) if edit else src)
    importlib.invalidate_caches()
    return (importlib.import_module(f"{package}.matmul"),
            importlib.import_module(f"{package}.conv2d"))


def versions(modules: Any) -> dict[str, str]:
    matmul, conv2d = modules
    return {"matmul": matmul.KERNEL.version, "conv2d": conv2d.NCHW.version,
            "conv2d_nhwc": conv2d.NHWC.version}


def test_a_pristine_copy_has_the_built_ins_versions(importable: Path) -> None:
    """The version names no module: the same code anywhere is the same version."""
    assert versions(builtin_copy(importable)) == {
        "matmul": matmul_module.KERNEL.version, "conv2d": conv2d_module.NCHW.version,
        "conv2d_nhwc": conv2d_module.NHWC.version}


def test_comments_and_docstrings_in_matmul_change_no_version(importable: Path) -> None:
    """Comments anywhere, in the hashed jit functions too (the family's, in gemm/tiles.py),
    and their docstrings."""
    def commented(src: str) -> str:
        src = "# a comment at the top\n" + src
        return replaced(src, "class MatmulKernel:\n", "# before the class\nclass MatmulKernel:\n")

    def commented_tiles(src: str) -> str:
        src = replaced(src, "    num_pid_m = tl.cdiv(M, BLOCK_M)\n", "    # inside tile_coords\n"
                       "    num_pid_m = tl.cdiv(M, BLOCK_M)  # x\n")
        return replaced(src, "walked column by column so that the B tiles they share stay in L2.",
                        "walked column by column (reworded).")

    base = builtin_copy(importable)
    edited = builtin_copy(importable, commented, tiles_edit=commented_tiles)
    assert versions(edited) == versions(base)


def test_an_edit_to_a_function_conv2d_does_not_run_leaves_its_version(importable: Path) -> None:
    """matmul's split-K reduction tile is matmul's launcher's, not conv2d's: matmul's version
    changes, conv2d's stays (its stored configs stay served)."""
    def reduce_tile(src: str) -> str:
        return replaced(src, "_REDUCE_BLOCK_M, _REDUCE_BLOCK_N = 16, 128",
                        "_REDUCE_BLOCK_M, _REDUCE_BLOCK_N = 32, 128")

    base, edited = versions(builtin_copy(importable)), versions(builtin_copy(importable,
                                                                             reduce_tile))
    assert edited["matmul"] != base["matmul"]
    assert (edited["conv2d"], edited["conv2d_nhwc"]) == (base["conv2d"], base["conv2d_nhwc"])


def test_an_edit_to_a_jit_helper_conv2d_calls_changes_its_version(importable: Path) -> None:
    """conv2d's kernels call the family's ``grouped_tile``, which calls ``tile_coords``: an
    edit two calls deep, in another module, is an edit of conv2d (and of matmul)."""
    def tile_order(src: str) -> str:
        return replaced(src, "    pid_n = (tile_id % num_pid_in_group) // group_size_m\n",
                        "    pid_n = (tile_id % num_pid_in_group) // group_size_m + 0\n")

    base = versions(builtin_copy(importable))
    edited = versions(builtin_copy(importable, tiles_edit=tile_order))
    assert all(edited[k] != base[k] for k in base)


def test_a_constraint_s_helper_and_the_space_are_part_of_the_version(importable: Path) -> None:
    def smem(line: str) -> Any:  # conv2d's shared-memory constraint calls tile_shared_memory
        def edit(src: str) -> str:
            body = src.index("    need = ", src.index("def tile_shared_memory("))
            return src[:body] + line + src[body:]
        return edit

    def group_m(src: str) -> str:
        return replaced(src, 'Param.ints("GROUP_M", (1, 8)),', 'Param.ints("GROUP_M", (1, 4, 8)),')

    base = versions(builtin_copy(importable))
    assert versions(builtin_copy(importable, host_edit=smem("    # a comment\n")))["conv2d"] == (
        base["conv2d"])
    assert versions(builtin_copy(importable, host_edit=smem("    stages = stages + 0\n")))[
        "conv2d"] != base["conv2d"]
    spaced = versions(builtin_copy(importable, conv2d_edit=group_m))
    assert spaced["conv2d"] != base["conv2d"] and spaced["matmul"] == base["matmul"]


def test_a_constexpr_global_of_matmul_is_part_of_its_version(importable: Path) -> None:
    """``ROUND_TF32`` (a ``tl.constexpr`` that ``tile_dot`` reads) with the other value: part
    of the version once it is not listed as a machine setting (``__unversioned__``), and
    not while it is."""
    flipped = "True" if not matmul_module.ROUND_TF32 else "False"

    def constant(src: str) -> str:
        return replaced(src, 'ROUND_TF32 = tl.constexpr(runs_ptx() and os.environ.get('
                        '"TUNER_TF32_ROUNDING", "1") != "0")',
                        f"ROUND_TF32 = tl.constexpr({flipped})")

    def versioned(src: str) -> str:
        return replaced(src, '__unversioned__ = ("ROUND_TF32",)', "__unversioned__ = ()")

    base = versions(builtin_copy(importable, tiles_edit=versioned))
    edited = versions(builtin_copy(importable, tiles_edit=lambda src: versioned(constant(src))))
    assert edited["matmul"] != base["matmul"]
    assert edited["conv2d"] == base["conv2d"]  # conv2d's K loop is its own
    assert versions(builtin_copy(importable, tiles_edit=constant))["matmul"] == versions(
        builtin_copy(importable))["matmul"]  # a machine setting: not the code's


def test_the_layouts_differ_by_their_space() -> None:
    """NCHW searches PADDED and NSPLIT, NHWC does not: one module, two versions."""
    assert conv2d_module.NCHW.space() != conv2d_module.NHWC.space()
    assert conv2d_module.NCHW.version != conv2d_module.NHWC.version


# -- users' kernels: tuner.Kernel and tuner.autotune ---------------------------------------------

HELPERS = '''
import triton
import triton.language as tl


@triton.jit
def deep(x):
    return x * {deep}
'''

USER = '''
import triton
import triton.language as tl

import tuner
import {helpers} as helpers

SCALE = tl.constexpr({scale})
CONFIGS = [triton.Config({{"BLOCK": 16}}, num_warps=1), triton.Config({{"BLOCK": {block}}},
                                                                      num_warps=2)]


def unrelated(x):
    return x + {unrelated}


@triton.jit
def inner(x):
    """Scaled."""
    return x * {inner}


@triton.jit
def helper(x):
    return inner(x) + helpers.deep(x)  # through a global and a module attribute


@tuner.autotune(configs=CONFIGS, key=["N"], name="user_scale")
@triton.jit
def scale_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    """Out = helper(x) * SCALE."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N)  {comment}
    tl.store(out_ptr + offs, helper(x) * SCALE, mask=offs < N)


def small(config, ctx):
    return "too big" if config["BLOCK"] > {limit} else None


def make_inputs(shape, dtype, device, seed):
    import torch
    x = torch.randn(shape["N"], device=device).to(getattr(torch, dtype))
    return {{"x_ptr": x, "out_ptr": torch.empty_like(x), "N": shape["N"]}}


def grid(meta):
    return (triton.cdiv(meta["N"], meta["BLOCK"]),)


KERNEL = tuner.Kernel(scale_kernel, grid=grid, make_inputs=make_inputs)
PLAIN = tuner.Kernel(scale_kernel.fn, name="user_scale_plain", grid=grid, key=["N"],
                     make_inputs=make_inputs, space={{"BLOCK": [16, 32, {block}]}},
                     constraints=[small])
'''

DEFAULTS = {"deep": "2", "scale": "3", "block": "64", "unrelated": "1", "inner": "2.0",
            "comment": "", "limit": "64"}


def user_module(root: Path, **edits: str) -> Any:
    """The user's module (and the helpers module it imports), edited, under fresh names."""
    n = next(_counter)
    values = {**DEFAULTS, **edits}
    (root / f"user_helpers_{n}.py").write_text(HELPERS.format(deep=values.pop("deep")))
    (root / f"user_kernel_{n}.py").write_text(USER.format(helpers=f"user_helpers_{n}",
                                                          **values))
    importlib.invalidate_caches()
    return importlib.import_module(f"user_kernel_{n}")


def user_versions(module: Any) -> dict[str, str]:
    got = {"autotune": module.scale_kernel.version, "kernel": module.KERNEL.version,
           "plain": module.PLAIN.version}
    assert got["kernel"] == got["autotune"]  # what the model's process sends, the worker has
    return got


def test_a_user_kernel_s_version_follows_every_jit_helper_it_reaches(importable: Path) -> None:
    base = user_versions(user_module(importable))
    assert user_versions(user_module(importable)) == base  # the same code, another module
    for edit in ({"inner": "4.0"},  # a helper's helper, called by name
                 {"deep": "5"},  # a helper in another module, called as helpers.deep
                 {"scale": "7"}):  # a tl.constexpr global the kernel reads
        edited = user_versions(user_module(importable, **edit))
        assert all(edited[k] != base[k] for k in base), edit


def test_a_user_kernel_s_comments_and_other_functions_change_nothing(importable: Path) -> None:
    base = user_versions(user_module(importable))
    assert user_versions(user_module(importable, comment="# loaded", unrelated="2")) == base


def test_a_user_kernel_s_space_constraints_and_configs_are_part_of_it(importable: Path) -> None:
    base = user_versions(user_module(importable))
    configs = user_versions(user_module(importable, block="128"))  # the list and the space
    assert all(configs[k] != base[k] for k in base)
    limit = user_versions(user_module(importable, limit="32"))  # a constraint's source
    assert limit["plain"] != base["plain"] and limit["autotune"] == base["autotune"]


def test_plain_global_scalars_read_by_device_code_are_hashed_by_value(importable: Path) -> None:
    """A plain global int/float/bool a jit function reads counts as its constexprs do; a
    global list (maybe a cache) does not."""
    source = textwrap.dedent('''
        import triton

        LIMIT = {limit}
        CACHE = [{cache}]


        @triton.jit
        def kernel(x_ptr):
            if LIMIT > 2:
                x_ptr += len(CACHE)
    ''')

    def version(limit: int, cache: int) -> str:
        name = f"plain_globals_{next(_counter)}"
        (importable / f"{name}.py").write_text(source.format(limit=limit, cache=cache))
        importlib.invalidate_caches()
        return code_version(importlib.import_module(name).kernel)

    assert version(3, 1) == version(3, 2)
    assert version(3, 1) != version(4, 1)


def test_a_space_is_hashed_by_its_parameters_and_values() -> None:
    one = SearchSpace((Param.pow2("BLOCK", 16, 64),))
    assert code_version(space=one) == code_version(space=SearchSpace((Param.pow2("BLOCK", 16,
                                                                                 64),)))
    assert code_version(space=one) != code_version(space=SearchSpace((Param.pow2("BLOCK", 16,
                                                                                 128),)))


def test_a_decorated_kernel_whose_configs_set_different_parameters_still_loads() -> None:
    """Triton takes such a list; the decorator must too (its version has no space then)."""
    import triton
    import triton.language as tl

    @tuner.autotune(configs=[triton.Config({"A": 1}), triton.Config({"B": 2})], key=["N"],
                    name="odd_configs")
    @triton.jit
    def odd(x_ptr, N, A: tl.constexpr = 1, B: tl.constexpr = 2):
        tl.store(x_ptr, N)

    assert len(odd.version) == 12


def test_the_interpreter_and_a_process_without_it_compute_one_matmul_version():
    """matmul's ROUND_TF32 is off under TRITON_INTERPRET=1 and on without it (a machine
    setting, listed in ``__unversioned__``): a CPU-only service's API process and its
    interpreter workers must still agree on the kernels' versions."""
    import os
    import subprocess
    import sys

    from tests.support_processes import ROOT

    code = ("from search_spaces import get_kernel; import search_spaces.matmul as m; "
            "print(bool(m.ROUND_TF32), get_kernel('matmul').version, "
            "get_kernel('matmul_epilogue_gelu').version)")
    outputs = []
    for interpret in ("1", "0"):
        env = {**os.environ, "TRITON_INTERPRET": interpret, "PYTHONPATH": str(ROOT)}
        outputs.append(subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                                      capture_output=True, text=True, check=True).stdout.split())
    (rounding_a, *versions_a), (rounding_b, *versions_b) = outputs
    assert (rounding_a, rounding_b) == ("False", "True")  # the setting does differ
    assert versions_a == versions_b
