"""Tensor (data movement) operators with ONNX semantics: ``transpose``, ``concat``,
``slice``, ``pad``, ``gather``, ``gather_elements``, ``scatter_nd``, ``where`` and ``expand``,
and their CPU algorithms.

``register(registry)`` adds every operator with its ``numpy`` algorithm, and the OpenCL ones
(``tensor/opencl``) where pyopencl is installed.  Outputs are new
C-contiguous arrays in the input's dtype (bool, integers and floats of every width).
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.tensor.numpy_impl import (
    NumpyConcat,
    NumpyExpand,
    NumpyGather,
    NumpyGatherElements,
    NumpyPad,
    NumpyScatterND,
    NumpySlice,
    NumpyTranspose,
    NumpyWhere,
)
from fastrun_algorithms.tensor.operator import (
    INDEX_DTYPES,
    PAD_MODES,
    SUPPORTED_DTYPES,
    ConcatOperator,
    ExpandOperator,
    GatherElementsOperator,
    GatherOperator,
    PadOperator,
    ScatterNDOperator,
    SliceOperator,
    TensorOperator,
    TransposeOperator,
    WhereOperator,
    clamp_slice,
)

__all__ = [
    "INDEX_DTYPES",
    "PAD_MODES",
    "SUPPORTED_DTYPES",
    "ConcatOperator",
    "ExpandOperator",
    "GatherElementsOperator",
    "GatherOperator",
    "NumpyConcat",
    "NumpyExpand",
    "NumpyGather",
    "NumpyGatherElements",
    "NumpyPad",
    "NumpyScatterND",
    "NumpySlice",
    "NumpyTranspose",
    "NumpyWhere",
    "PadOperator",
    "ScatterNDOperator",
    "SliceOperator",
    "TensorOperator",
    "TransposeOperator",
    "WhereOperator",
    "clamp_slice",
    "register",
]


def register(registry: Registry) -> None:
    """Add the tensor operators and their algorithms to ``registry``."""
    concat, transpose = ConcatOperator(), TransposeOperator()
    for operator, algorithm in ((transpose, NumpyTranspose()),
                                (concat, NumpyConcat()),
                                (SliceOperator(), NumpySlice()),
                                (PadOperator(), NumpyPad()),
                                (GatherOperator(), NumpyGather()),
                                (GatherElementsOperator(), NumpyGatherElements()),
                                (ScatterNDOperator(), NumpyScatterND()),
                                (WhereOperator(), NumpyWhere()),
                                (ExpandOperator(), NumpyExpand())):
        registry.register_operator(operator)
        registry.register_algorithm(algorithm)
    from fastrun_algorithms.tensor import parallel

    for algorithm in parallel.algorithms(concat.parallel_pays, transpose.parallel_pays):
        registry.register_algorithm(algorithm)
    if opencl_installed():
        from fastrun_algorithms.tensor import opencl

        opencl.register(registry)
