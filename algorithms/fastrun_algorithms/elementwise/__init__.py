"""Binary elementwise operators (``add``, ``sub``, ``mul``, ``div``, the comparisons ``equal``,
``less``, ``greater``, ``less_equal``, ``greater_equal``, and ``max``, ``min``, ``add_relu``)
with numpy broadcasting, and their CPU algorithms.

``register(registry)`` adds one operator per operation, each with the algorithms ``numpy``
(the ufunc), ``serial`` and ``parallel`` (numba), and ``cl_elementwise`` (OpenCL) where
pyopencl is installed.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.elementwise._layout import BroadcastLayout, broadcast_layout
from fastrun_algorithms.elementwise.loops import (
    NumbaElementwise,
    ParallelElementwise,
    SerialElementwise,
)
from fastrun_algorithms.elementwise.operator import (
    OPS,
    PARALLEL_MIN_BYTES,
    SUPPORTED_DTYPES,
    BinaryOp,
    ElementwiseOperator,
)
from fastrun_algorithms.elementwise.ufunc import UfuncElementwise

__all__ = [
    "OPS",
    "PARALLEL_MIN_BYTES",
    "SUPPORTED_DTYPES",
    "BinaryOp",
    "BroadcastLayout",
    "ElementwiseOperator",
    "NumbaElementwise",
    "ParallelElementwise",
    "SerialElementwise",
    "UfuncElementwise",
    "broadcast_layout",
    "register",
]


def register(registry: Registry) -> None:
    """Add every elementwise operator and its algorithms to ``registry`` (the OpenCL one
    only where pyopencl is installed)."""
    for op in OPS.values():
        operator = registry.register_operator(ElementwiseOperator(op))
        registry.register_algorithm(UfuncElementwise(op))
        registry.register_algorithm(SerialElementwise(op))
        registry.register_algorithm(ParallelElementwise(op, operator.parallel_pays))
    if opencl_installed():
        from fastrun_algorithms.elementwise import opencl

        opencl.register(registry)
