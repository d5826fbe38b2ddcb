"""The tuning engine: configs, search spaces, the kernel protocol, measurement and search.

The engine core never imports ``api`` or ``db``; the worker, the CLI and
the client sit on top of it.
"""

from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome

__all__ = ["KernelConfig", "Measurement", "Outcome"]
