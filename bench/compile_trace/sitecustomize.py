"""Trace every Triton compile of every Python process started with this folder on PYTHONPATH
and ``TUNER_COMPILE_TRACE=<folder>`` set (the worker, its GPU child, its compile pool): one JSON
line per compile, per process, with the parts of Triton's cache key and whether the binary was
in the disk cache already. ``python3 -m bench.compile_trace.report <folder>`` then says, for each
kernel the GPU child compiled although a pool process had compiled one of the same name and
constants, which part of the key differed (issue 33: the child compiling matmul configs
again). A diagnostic for the GPU machine; nothing in the product imports it."""

from __future__ import annotations

import os

if os.environ.get("TUNER_COMPILE_TRACE"):
    from bench.compile_trace.hook import install

    install(os.environ["TUNER_COMPILE_TRACE"])
