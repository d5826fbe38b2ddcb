"""Test-wide setup: kernels run on Triton's CPU interpreter unless TUNER_TEST_GPU=1.

TRITON_INTERPRET must be set before any kernel module is imported, hence here, at the root.
"""

import os

if os.environ.get("TUNER_TEST_GPU") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
