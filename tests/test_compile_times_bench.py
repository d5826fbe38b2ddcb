"""bench/compile_times.py reads each problem's compile times from the pool's debug lines."""

from __future__ import annotations

from bench.compile_times import compile_times

LOG = """\
2026-11-27 14:10:36,075 INFO tuner.app.keeper: reusing the measuring child (pid 744) for matmul {'M': 8192, 'N': 8192, 'K': 8192} bfloat16
2026-11-27 14:10:38,219 DEBUG tuner.backends.compile_pool: pool: ok BLOCK_K=32,num_warps=4 in 1.76 s of the process, 2.03 s after its dispatch
2026-11-27 14:10:38,300 DEBUG tuner.backends.compile_pool: pool: compiling BLOCK_K=64 (0 queued behind it)
2026-11-27 14:10:44,214 INFO tuner.app.keeper: reusing the measuring child (pid 744) for softmax {'M': 4096, 'N': 4096} float16
2026-11-27 14:10:45,000 DEBUG tuner.backends.compile_pool: pool: ok BLOCK=1024,num_warps=8 in 0.42 s of the process, 0.46 s after its dispatch
2026-11-27 14:10:45,100 DEBUG tuner.backends.compile_pool: pool: ok BLOCK=2048,num_warps=8 in 0.50 s of the process, 0.61 s after its dispatch
"""  # noqa: E501


def test_each_compile_counts_for_the_problem_being_tuned_when_it_finished():
    times = compile_times(LOG)
    assert times == {"matmul M=8192,N=8192,K=8192 bfloat16": [(1.76, 2.03)],
                     "softmax M=4096,N=4096 float16": [(0.42, 0.46), (0.50, 0.61)]}
