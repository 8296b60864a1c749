"""OpenCL algorithms of the pooling operators (``cl_pool``, ``cl_global_pool``, ``cl_lrn``,
``cl_pool_linear``).

Importing this package does not import pyopencl: the algorithms import it when they run, so
the plugin loads (and lists them) on machines without OpenCL, where the chooser never offers
them because no OpenCL device exists.  See docs/opencl-ops.md.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.pooling.opencl.algorithms import (
    GLOBAL_PER_PLANE,
    OpenCLGlobalPool,
    OpenCLLRN,
    OpenCLPool,
    OpenCLPoolLinear,
    global_pool_rank,
    opencl_algorithms,
)

__all__ = [
    "GLOBAL_PER_PLANE",
    "OpenCLGlobalPool",
    "OpenCLLRN",
    "OpenCLPool",
    "OpenCLPoolLinear",
    "global_pool_rank",
    "opencl_algorithms",
    "register",
]


def register(registry: Registry) -> None:
    """Add every OpenCL pooling algorithm (the operators are registered by
    :func:`fastrun_algorithms.pooling.register`)."""
    for algorithm in opencl_algorithms():
        registry.register_algorithm(algorithm)
