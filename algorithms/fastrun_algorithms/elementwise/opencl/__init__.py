"""OpenCL algorithm of the binary elementwise operators (``cl_elementwise``).

Importing this package does not import pyopencl: the algorithm imports it when it runs, so
the plugin loads (and lists it) on machines without OpenCL, where the chooser never offers it
because no OpenCL device exists.  See docs/opencl-ops.md.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.elementwise.opencl.algorithms import OpenCLElementwise, opencl_algorithms

__all__ = ["OpenCLElementwise", "opencl_algorithms", "register"]


def register(registry: Registry) -> None:
    """Add ``cl_elementwise`` for every operation (the operators are registered by
    :func:`fastrun_algorithms.elementwise.register`)."""
    for algorithm in opencl_algorithms():
        registry.register_algorithm(algorithm)
