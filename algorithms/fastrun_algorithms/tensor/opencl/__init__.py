"""OpenCL algorithms of the tensor operators (``cl_copy`` for transpose, slice and concat;
``cl_pad``; ``cl_gather``).

Importing this package does not import pyopencl: the algorithms import it when they run, so
the plugin loads (and lists them) on machines without OpenCL, where the chooser never offers
them because no OpenCL device exists.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.tensor.opencl.algorithms import (
    CLConcat,
    CLGather,
    CLPad,
    CLSlice,
    CLTranspose,
    OpenCLTensor,
    merge_axes,
    opencl_algorithms,
)

__all__ = [
    "CLConcat",
    "CLGather",
    "CLPad",
    "CLSlice",
    "CLTranspose",
    "OpenCLTensor",
    "merge_axes",
    "opencl_algorithms",
    "register",
]


def register(registry: Registry) -> None:
    """Add the OpenCL tensor algorithms to ``registry`` (the operators are registered by
    :func:`fastrun_algorithms.tensor.register`)."""
    for algorithm in opencl_algorithms():
        registry.register_algorithm(algorithm)
