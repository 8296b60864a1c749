"""Tensor (data movement) operators with ONNX semantics: ``transpose``, ``concat``,
``slice``, ``pad`` and ``gather``, and their CPU algorithms.

``register(registry)`` adds every operator with its ``numpy`` algorithm.  Outputs are new
C-contiguous arrays in the input's dtype (bool, integers and floats of every width).
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.tensor.numpy_impl import (
    NumpyConcat,
    NumpyGather,
    NumpyPad,
    NumpySlice,
    NumpyTranspose,
)
from fastrun_algorithms.tensor.operator import (
    INDEX_DTYPES,
    PAD_MODES,
    SUPPORTED_DTYPES,
    ConcatOperator,
    GatherOperator,
    PadOperator,
    SliceOperator,
    TensorOperator,
    TransposeOperator,
    clamp_slice,
)

__all__ = [
    "INDEX_DTYPES",
    "PAD_MODES",
    "SUPPORTED_DTYPES",
    "ConcatOperator",
    "GatherOperator",
    "NumpyConcat",
    "NumpyGather",
    "NumpyPad",
    "NumpySlice",
    "NumpyTranspose",
    "PadOperator",
    "SliceOperator",
    "TensorOperator",
    "TransposeOperator",
    "clamp_slice",
    "register",
]


def register(registry: Registry) -> None:
    """Add the tensor operators and their algorithms to ``registry``."""
    for operator, algorithm in ((TransposeOperator(), NumpyTranspose()),
                                (ConcatOperator(), NumpyConcat()),
                                (SliceOperator(), NumpySlice()),
                                (PadOperator(), NumpyPad()),
                                (GatherOperator(), NumpyGather())):
        registry.register_operator(operator)
        registry.register_algorithm(algorithm)
