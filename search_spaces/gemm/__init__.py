"""The GEMM family's shared code: what matmul, matmul_epilogue, conv2d and moe_gemm have in common.

- ``prior``: the analytic cost model of a tiled GEMM config (matmul's ``prior``; conv2d and
  moe_gemm rank theirs with it on the GEMM they compute; flash attention borrows its hardware
  constants). Kernels reach it only through their own ``prior`` hook (``TunableKernel.prior``):
  the engine's strategies know no kernel parameter.

Modules here are imported by the kernels that use them; this file imports nothing, so that a
measuring child that never ranks configs never loads the prior.
"""
