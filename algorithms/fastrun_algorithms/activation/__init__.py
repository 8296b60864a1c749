"""Activation operators (``relu``, ``leaky_relu``, ``clip``, ``sigmoid``, ``tanh``,
``softmax``, ``batch_norm``) with ONNX semantics, and their CPU algorithms.

``register(registry)`` adds every operator with its ``numpy`` algorithm, and ``parallel``
(numba) for relu, leaky_relu, clip and sigmoid, the ones where it wins on large tensors.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.activation.numpy_impl import (
    NumpyBatchNorm,
    NumpySoftmax,
    NumpyUnary,
)
from fastrun_algorithms.activation.operator import (
    CLIP_DTYPES,
    COMPUTE_BOUND_MIN_THREADS,
    FLOAT_DTYPES,
    PARALLEL_MIN_BYTES,
    UNARY_OPERATORS,
    ActivationOperator,
    BatchNormOperator,
    ClipOperator,
    LeakyReluOperator,
    ReluOperator,
    SigmoidOperator,
    SoftmaxOperator,
    TanhOperator,
)
from fastrun_algorithms.activation.parallel import KERNELS, ParallelUnary

__all__ = [
    "CLIP_DTYPES",
    "COMPUTE_BOUND_MIN_THREADS",
    "FLOAT_DTYPES",
    "PARALLEL_MIN_BYTES",
    "ActivationOperator",
    "BatchNormOperator",
    "ClipOperator",
    "LeakyReluOperator",
    "NumpyBatchNorm",
    "NumpySoftmax",
    "NumpyUnary",
    "ParallelUnary",
    "ReluOperator",
    "SigmoidOperator",
    "SoftmaxOperator",
    "TanhOperator",
    "register",
]


def register(registry: Registry) -> None:
    """Add the activation operators and their algorithms to ``registry``."""
    for operator_class in UNARY_OPERATORS:
        operator = registry.register_operator(operator_class())
        registry.register_algorithm(NumpyUnary(operator.name))
        if operator.name in KERNELS:
            registry.register_algorithm(ParallelUnary(operator.name))
    registry.register_operator(SoftmaxOperator())
    registry.register_algorithm(NumpySoftmax())
    registry.register_operator(BatchNormOperator())
    registry.register_algorithm(NumpyBatchNorm())
