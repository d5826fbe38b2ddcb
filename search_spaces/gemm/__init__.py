"""The GEMM family's shared code: what matmul, matmul_epilogue, conv2d and moe_gemm have in common.

- ``tiles``: device code, the grouped tile order, one output tile's pipelined K loop
  (``tile_dot``, fp32 operands rounded to TF32 on NVIDIA GPUs) and its masked store;
- ``host``: host helpers, matmul's variant numbering and parameters, the SM count, TMA
  availability, whether a tile fits, matmul's constraints and the tiled kernel's space;
- ``prior``: the analytic cost model of a tiled GEMM config (matmul's ``prior``; conv2d and
  moe_gemm rank theirs with it on the GEMM they compute; flash attention borrows its hardware
  constants). Kernels reach it only through their own ``prior`` hook (``tuner.kernel.HasPrior``):
  the engine's strategies know no kernel parameter.

matmul's own kernels, launcher and ``MatmulKernel`` stay in ``search_spaces/matmul.py``. Moving
code here changed no kernel's version: a version hashes each function's syntax tree and the
constants it reads, by name, wherever they live (``tuner/code_hash.py``). This file imports
nothing, so that a measuring child that never ranks configs never loads the prior.
"""
