"""The ``resize`` operator (ONNX's Resize and Upsample, nearest and linear) and its CPU
algorithms: ``numpy`` for any rank and dtype, ``parallel`` (numba) for NCHW inputs resized in H
and W, first in the rule of thumb from
:data:`~fastrun_algorithms.resize.operator.PARALLEL_MIN_BYTES` of output; Fast Run measures
which wins; ``cl_resize`` on an OpenCL device (:mod:`.opencl`)."""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.resize.algorithms import NumpyResize, ParallelResize
from fastrun_algorithms.resize.operator import ResizeOperator

__all__ = ["NumpyResize", "ParallelResize", "ResizeOperator", "register"]


def register(registry: Registry) -> None:
    """Add the resize operator and its algorithms to ``registry``."""
    operator = registry.register_operator(ResizeOperator())
    registry.register_algorithm(NumpyResize())
    registry.register_algorithm(ParallelResize(operator.parallel_pays))
    if opencl_installed():
        from fastrun_algorithms.resize import opencl

        for algorithm in opencl.algorithms():
            registry.register_algorithm(algorithm)
