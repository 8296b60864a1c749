"""The ``linear`` operator (``act(X @ W + B)``: a fully connected layer, its bias and its
activation in one step), its CPU algorithms, ``blas``, ``blas_split`` and ``packed``, and
``cl_linear`` on an OpenCL device; the ONNX runtime fuses a 2-D MatMul by a constant, its bias
Add and a following Relu or GELU into it."""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.linear.algorithms import BlasLinear, SplitBlasLinear
from fastrun_algorithms.linear.opencl import OpenCLLinear
from fastrun_algorithms.linear.operator import LinearOperator
from fastrun_algorithms.linear.packed import PackedLinear

__all__ = ["BlasLinear", "LinearOperator", "OpenCLLinear", "PackedLinear", "SplitBlasLinear",
           "register"]


def register(registry: Registry) -> None:
    """Add the linear operator and its algorithms to ``registry``."""
    registry.register_operator(LinearOperator())
    registry.register_algorithm(BlasLinear())
    registry.register_algorithm(SplitBlasLinear())
    registry.register_algorithm(PackedLinear())
    if opencl_installed():
        registry.register_algorithm(OpenCLLinear())
