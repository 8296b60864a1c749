"""The pooling operators (maxpool, avgpool, global_maxpool, global_avgpool, lrn, and pool_linear,
a global average pool feeding a linear layer) and their CPU algorithms.

They follow ONNX's MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool and LRN, because the
ONNX runtime lowers those nodes onto these operators by name: the operator names and parameter
names are a contract with it.  Parameters are canonicalised when a problem is built
(:mod:`.geometry`), so that equal poolings spelled differently share one cache entry.

maxpool and avgpool have ``direct`` (a parallel numba kernel, 1-D and 2-D) and ``numpy``
(strided views of a padded copy, every rank); maxpool also has ``rows`` (a window's rows
reduced, then its columns: the usual winner).  The global pools and LRN are one pass over
memory and have a numpy algorithm each.  pool_linear has an OpenCL
algorithm only: the runtime fuses a model's head into it only where the device has one.
Where pyopencl is installed the OpenCL algorithms (``cl_pool``, ``cl_global_pool``,
``cl_lrn``, ``cl_pool_linear``) are added too.
"""

from __future__ import annotations

from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.pooling.operator import (
    AvgPoolOperator,
    GlobalAvgPoolOperator,
    GlobalMaxPoolOperator,
    LRNOperator,
    MaxPoolOperator,
    PoolLinearOperator,
)


def register(registry) -> None:
    """Add the pooling operators and every pooling algorithm (rows, then direct, then numpy:
    the order the heuristic keeps among equals; the OpenCL ones where pyopencl is
    installed)."""
    from fastrun_algorithms.pooling import direct, global_pool, lrn, max_rows, vectorised

    for operator in (MaxPoolOperator(), AvgPoolOperator(), GlobalMaxPoolOperator(),
                     GlobalAvgPoolOperator(), LRNOperator(), PoolLinearOperator()):
        registry.register_operator(operator)
    for module in (max_rows, direct, vectorised, global_pool, lrn):
        for algorithm in module.algorithms():
            registry.register_algorithm(algorithm)
    if opencl_installed():
        from fastrun_algorithms.pooling import opencl

        opencl.register(registry)


__all__ = [
    "AvgPoolOperator",
    "GlobalAvgPoolOperator",
    "GlobalMaxPoolOperator",
    "LRNOperator",
    "MaxPoolOperator",
    "PoolLinearOperator",
    "register",
]
