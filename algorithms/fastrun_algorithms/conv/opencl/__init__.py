"""OpenCL conv algorithms (``cl_direct``, ``cl_depthwise``, ``cl_im2col``, ``cl_conv1x1``,
``cl_igemm``, ``cl_winograd``).

Importing this package does not import pyopencl: the algorithms import it when they run, so
the plugin loads (and lists them) on machines without OpenCL, where the chooser never offers
them because no OpenCL device exists.  See docs/opencl-conv.md.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.conv.opencl.algorithms import (
    DEPTHWISE_CONFIGS,
    DIRECT_CONFIGS,
    Conv1x1CLConv,
    DepthwiseCLConv,
    DirectCLConv,
    Im2colCLConv,
    ImplicitGemmCLConv,
    OpenCLConv,
    opencl_algorithms,
)
from fastrun_algorithms.conv.opencl.heuristic import opencl_rank

__all__ = [
    "DEPTHWISE_CONFIGS",
    "DIRECT_CONFIGS",
    "Conv1x1CLConv",
    "DepthwiseCLConv",
    "DirectCLConv",
    "Im2colCLConv",
    "ImplicitGemmCLConv",
    "OpenCLConv",
    "opencl_algorithms",
    "opencl_rank",
    "register",
]


def register(registry: Registry) -> None:
    """Add every OpenCL conv configuration to ``registry`` (the operator is registered by
    :func:`fastrun_algorithms.conv.register`)."""
    for algorithm in opencl_algorithms():
        registry.register_algorithm(algorithm)
