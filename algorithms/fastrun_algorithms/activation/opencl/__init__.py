"""OpenCL algorithms of the activation operators (``cl_unary``, ``cl_softmax``,
``cl_layer_norm``, ``cl_batch_norm``).

Importing this package does not import pyopencl: the algorithms import it when they run, so
the plugin loads (and lists them) on machines without OpenCL, where the chooser never offers
them because no OpenCL device exists.  See docs/opencl-ops.md.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.activation.opencl.algorithms import (
    LAYER_NORM_PER_ROW,
    SOFTMAX_PER_ROW,
    OpenCLBatchNorm,
    OpenCLLayerNorm,
    OpenCLSoftmax,
    OpenCLUnary,
    opencl_algorithms,
    softmax_rank,
)

__all__ = [
    "LAYER_NORM_PER_ROW",
    "SOFTMAX_PER_ROW",
    "OpenCLBatchNorm",
    "OpenCLLayerNorm",
    "OpenCLSoftmax",
    "OpenCLUnary",
    "opencl_algorithms",
    "register",
    "softmax_rank",
]


def register(registry: Registry) -> None:
    """Add every OpenCL activation algorithm (the operators are registered by
    :func:`fastrun_algorithms.activation.register`)."""
    for algorithm in opencl_algorithms():
        registry.register_algorithm(algorithm)
