"""OpenCL conv algorithms (``cl_direct``, ``cl_depthwise``, ``cl_im2col``, ``cl_conv1x1``,
``cl_igemm``, ``cl_winograd``, ``cl_winograd_fused``).

Importing this package does not import pyopencl: the algorithms import it when they run, so
the plugin loads (and lists them) on machines without OpenCL, where the chooser never offers
them because no OpenCL device exists.  See docs/opencl-conv.md.
"""

from __future__ import annotations

from fastrun.algorithm import Algorithm
from fastrun.registry import Registry
from fastrun_algorithms.conv.opencl import space
from fastrun_algorithms.conv.opencl.algorithms import (
    DEPTHWISE_CONFIGS,
    DIRECT_CONFIGS,
    Conv1x1CLConv,
    DepthwiseCLConv,
    DirectCLConv,
    Im2colCLConv,
    ImplicitGemmCLConv,
    OpenCLConv,
)
from fastrun_algorithms.conv.opencl.winograd import winograd_algorithms
from fastrun_algorithms.conv.opencl.winograd_fused import fused_winograd_algorithms

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
    "register",
]


def opencl_algorithms() -> list[Algorithm]:
    """Every OpenCL conv algorithm, one per configuration (built here, where the families'
    modules meet: Winograd's builds on the base class in ``algorithms``)."""
    algorithms = [DirectCLConv({"ko": ko, "l": local}) for ko, local in DIRECT_CONFIGS]
    algorithms += [DepthwiseCLConv({"px": px, "l": local}) for px, local in DEPTHWISE_CONFIGS]
    algorithms += [Im2colCLConv(), Conv1x1CLConv()]
    algorithms += [ImplicitGemmCLConv(c) for c in space.igemm_configurations()]
    return algorithms + winograd_algorithms() + fused_winograd_algorithms()


def register(registry: Registry) -> None:
    """Add every OpenCL conv configuration to ``registry`` (the operator is registered by
    :func:`fastrun_algorithms.conv.register`)."""
    for algorithm in opencl_algorithms():
        registry.register_algorithm(algorithm)
