"""Activation operators (``relu``, ``leaky_relu``, ``clip``, ``sigmoid``, ``tanh``,
``hard_sigmoid``, ``hard_swish``, the math functions ``sqrt``, ``exp``, ``log``, ``neg``,
``abs``, ``reciprocal``, ``erf``, ``gelu``, and ``softmax``, ``batch_norm``, ``layer_norm``)
with ONNX semantics, and their CPU algorithms.

``register(registry)`` adds every operator with its ``numpy`` algorithm (erf and gelu have
none), and ``parallel`` (numba) for all the unary ones but tanh and for batch_norm, where it
can win on large tensors; ``serial`` and ``parallel`` numba passes for gelu and for softmax
over the last axis; and where pyopencl is installed the OpenCL ones (``cl_unary``, ``cl_softmax``,
``cl_batch_norm``).
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.activation.batch_norm import ParallelBatchNorm
from fastrun_algorithms.activation.gelu import ParallelGelu, SerialGelu
from fastrun_algorithms.activation.layer_norm import NumpyLayerNorm, ParallelLayerNorm
from fastrun_algorithms.activation.numpy_impl import (
    UNARY_FUNCTIONS,
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
    GeluOperator,
    HardSigmoidOperator,
    HardSwishOperator,
    LayerNormOperator,
    LeakyReluOperator,
    ReluOperator,
    SigmoidOperator,
    SoftmaxOperator,
    TanhOperator,
)
from fastrun_algorithms.activation.parallel import KERNELS, ParallelUnary
from fastrun_algorithms.activation.softmax import ParallelSoftmax, SerialSoftmax

__all__ = [
    "CLIP_DTYPES",
    "COMPUTE_BOUND_MIN_THREADS",
    "FLOAT_DTYPES",
    "PARALLEL_MIN_BYTES",
    "ActivationOperator",
    "BatchNormOperator",
    "ClipOperator",
    "GeluOperator",
    "HardSigmoidOperator",
    "HardSwishOperator",
    "LayerNormOperator",
    "LeakyReluOperator",
    "NumpyBatchNorm",
    "NumpyLayerNorm",
    "NumpySoftmax",
    "NumpyUnary",
    "ParallelBatchNorm",
    "ParallelLayerNorm",
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
        if operator.name in UNARY_FUNCTIONS:  # not erf: numpy has none
            registry.register_algorithm(NumpyUnary(operator.name))
        if operator.name in KERNELS:
            registry.register_algorithm(ParallelUnary(operator.name, operator.parallel_pays))
    gelu = registry.register_operator(GeluOperator())
    registry.register_algorithm(SerialGelu())
    registry.register_algorithm(ParallelGelu(gelu.parallel_pays))
    softmax = registry.register_operator(SoftmaxOperator())
    registry.register_algorithm(NumpySoftmax())
    registry.register_algorithm(SerialSoftmax())
    registry.register_algorithm(ParallelSoftmax(softmax.parallel_pays))
    registry.register_operator(BatchNormOperator())
    registry.register_algorithm(NumpyBatchNorm())
    registry.register_algorithm(ParallelBatchNorm())
    layer_norm = registry.register_operator(LayerNormOperator())
    registry.register_algorithm(NumpyLayerNorm())
    registry.register_algorithm(ParallelLayerNorm(layer_norm.parallel_pays))
    if opencl_installed():
        from fastrun_algorithms.activation import opencl

        opencl.register(registry)
