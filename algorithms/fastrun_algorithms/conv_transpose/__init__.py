"""The ``conv_transpose`` operator (ONNX's ConvTranspose, 1-D and 2-D, groups, dilations,
output padding and shape) and its CPU algorithms: ``per_tap`` (one BLAS product per kernel
tap, first in the rule of thumb for kernels of up to four taps) and ``col2im`` (one product for
every tap, then a parallel gather); Fast Run measures which wins; ``cl_direct`` on an OpenCL
device (:mod:`.opencl`)."""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.conv_transpose.algorithms import Col2imConvTranspose, PerTapConvTranspose
from fastrun_algorithms.conv_transpose.operator import ConvTransposeOperator

__all__ = ["Col2imConvTranspose", "ConvTransposeOperator", "PerTapConvTranspose", "register"]


def register(registry: Registry) -> None:
    """Add the conv_transpose operator and its algorithms to ``registry``."""
    registry.register_operator(ConvTransposeOperator())
    registry.register_algorithm(PerTapConvTranspose())
    registry.register_algorithm(Col2imConvTranspose())
    if opencl_installed():
        from fastrun_algorithms.conv_transpose import opencl

        for algorithm in opencl.algorithms():
            registry.register_algorithm(algorithm)
