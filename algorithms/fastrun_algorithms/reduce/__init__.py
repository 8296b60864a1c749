"""The ``reduce`` operator (ONNX's Reduce{Sum,Mean,Max,Min,Prod,L1,L2,SumSquare}) and its CPU
algorithms: ``numpy`` for any axes and dtype, ``parallel`` (numba) for adjacent reduced axes
of float inputs, first in the rule of thumb from
:data:`~fastrun_algorithms.reduce.operator.PARALLEL_MIN_BYTES` of input; Fast Run measures
which wins; ``cl_reduce`` on an OpenCL device (:mod:`.opencl`).  And ``arg_reduce`` (ArgMax,
ArgMin; :mod:`.arg`) and ``topk`` (TopK's indices; :mod:`.topk`), each with its numpy
algorithm."""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.reduce.algorithms import NumpyReduce, ParallelReduce
from fastrun_algorithms.reduce.arg import ArgReduceOperator, NumpyArgReduce
from fastrun_algorithms.reduce.operator import MODES, ReduceOperator, blocks
from fastrun_algorithms.reduce.topk import NumpyTopK, TopKOperator

__all__ = ["MODES", "ArgReduceOperator", "NumpyArgReduce", "NumpyReduce", "NumpyTopK",
           "ParallelReduce", "ReduceOperator", "TopKOperator", "blocks", "register"]


def register(registry: Registry) -> None:
    """Add the reduce operator and its algorithms to ``registry``."""
    operator = registry.register_operator(ReduceOperator())
    registry.register_algorithm(NumpyReduce())
    registry.register_algorithm(ParallelReduce(operator.parallel_pays))
    registry.register_operator(ArgReduceOperator())
    registry.register_algorithm(NumpyArgReduce())
    registry.register_operator(TopKOperator())
    registry.register_algorithm(NumpyTopK())
    if opencl_installed():
        from fastrun_algorithms.reduce import opencl

        for algorithm in opencl.algorithms():
            registry.register_algorithm(algorithm)
