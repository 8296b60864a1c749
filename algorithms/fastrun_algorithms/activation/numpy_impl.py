"""The ``numpy`` algorithm of every activation operator: numpy's vectorised loops, in the
input dtype, writing into the output in place wherever it can so that no full-size temporary
is made."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import NumpyRanked
from fastrun_algorithms.activation.operator import ClipOperator, HardSigmoidOperator


def ufunc_buffer_bytes(dtype: str) -> int:
    """What numpy's ufunc iterator may allocate for a broadcast operation: a buffer of
    ``np.getbufsize()`` elements (8192) per buffered operand; two are allowed for (measured:
    one, 33 KB for float32, in ``x - max(x, axis=1, keepdims=True)``)."""
    return 2 * np.getbufsize() * np.dtype(dtype).itemsize


def _empty_like(x: np.ndarray) -> np.ndarray:
    """The output, allocated C-contiguous: a ufunc left to allocate follows a strided input's
    layout (later kernels expect C order) and returns a scalar for a 0-d input (which the
    in-place steps cannot write into)."""
    return np.empty(x.shape, x.dtype)


def _relu(problem: Problem, x: np.ndarray) -> np.ndarray:
    # np.clip with both bounds takes numpy's SIMD loop: 3x faster on float32 than
    # np.maximum(x, 0) or np.clip(x, 0, None), which take the generic one.
    return np.clip(x, x.dtype.type(0), x.dtype.type(np.inf), out=_empty_like(x))


def _leaky_relu(problem: Problem, x: np.ndarray) -> np.ndarray:
    alpha = x.dtype.type(problem.param("alpha"))
    with np.errstate(invalid="ignore"):  # inf * 0 is NaN, as the definition says
        out = np.multiply(x, alpha, out=_empty_like(x))
    if 0 < alpha <= 1:  # then max(x, alpha * x) is the function, NaN and infinities included
        # (not for alpha 0: 0 * inf is NaN, where the function gives inf)
        np.maximum(x, out, out=out)
    else:
        np.copyto(out, x, where=x >= 0)
    return out


def _clip(problem: Problem, x: np.ndarray) -> np.ndarray:
    out = _empty_like(x)
    if problem.param("min") is None and problem.param("max") is None:
        np.copyto(out, x)
        return out
    # An absent bound as the dtype's extreme rather than None: see _relu.
    low, high = ClipOperator.bounds(problem)
    return np.clip(x, low, high, out=out)


def _sigmoid(problem: Problem, x: np.ndarray) -> np.ndarray:
    # Four in-place passes, no temporary.  exp(-x) overflows to inf for x below about -88
    # (float32), and 1 / (1 + inf) is the right limit, 0.
    out = np.negative(x, out=_empty_like(x))
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1
    return np.reciprocal(out, out=out)


def _tanh(problem: Problem, x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=_empty_like(x))


def _hard_sigmoid(problem: Problem, x: np.ndarray) -> np.ndarray:
    # alpha * x + beta in float64 (one temporary): near the lower knee the two terms cancel,
    # and a float32 product would leave only its rounding error in a small result
    alpha, beta = (float(c) for c in HardSigmoidOperator.coefficients(problem))
    # an array even for a 0-d x (so that it works in place), in C order whatever x's strides
    gate = np.array(x, dtype=np.float64, order="C")
    with np.errstate(invalid="ignore"):  # alpha 0 times an infinity: NaN, as the reference
        gate *= alpha
    gate += beta
    np.clip(gate, 0.0, 1.0, out=gate)  # both bounds, as in _relu: numpy's SIMD loop
    return gate.astype(x.dtype, order="C")


def _hard_swish(problem: Problem, x: np.ndarray) -> np.ndarray:
    # the gate as (x + 3) / 6: x + 3 is exact near the knee at -3, where x / 6 + 1/2 would
    # cancel to its rounding error; then x times the clipped gate
    zero, three, sixth, one = (x.dtype.type(v) for v in (0, 3, 1 / 6, 1))
    gate = np.add(x, three, out=_empty_like(x))
    gate *= sixth
    np.clip(gate, zero, one, out=gate)
    with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as ONNX's reference gives
        return np.multiply(x, gate, out=gate)


def _math(ufunc):
    """A numpy ufunc into a fresh C-contiguous output, with numpy's values at the edges."""
    def apply(problem: Problem, x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return ufunc(x, out=_empty_like(x))
    return apply


UNARY_FUNCTIONS = {
    "relu": _relu,
    "leaky_relu": _leaky_relu,
    "clip": _clip,
    "sigmoid": _sigmoid,
    "tanh": _tanh,
    "hard_sigmoid": _hard_sigmoid,
    "hard_swish": _hard_swish,
    "sqrt": _math(np.sqrt),
    "exp": _math(np.exp),
    "log": _math(np.log),
    "neg": _math(np.negative),
    "abs": _math(np.abs),
    "reciprocal": _math(np.reciprocal),
    # erf: numpy has none; its algorithms are numba loops (activation.parallel)
}


class NumpyUnary(NumpyRanked, Algorithm):
    """numpy's ufuncs: SIMD loops on one thread.  Cheapest for small and medium tensors, and
    the only algorithm of tanh, whose numpy loop is vectorised (numba's calls the scalar libm
    tanh and lost even on 16 threads).  REPRODUCIBLE: elementwise, computed the same way every
    run."""

    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, operator: str):
        self.operator = operator  # before super().__init__, which builds the identity from it
        super().__init__()
        self.function = UNARY_FUNCTIONS[operator]

    def workspace_bytes(self, problem: Problem) -> int:
        """leaky_relu with alpha outside (0, 1] selects through a boolean mask; hard_sigmoid
        computes its gate in float64."""
        if self.operator == "leaky_relu" and not 0 < problem.param("alpha") <= 1:
            return math.prod(problem.shapes[0])
        if self.operator == "hard_sigmoid":  # its float64 gate
            return math.prod(problem.shapes[0]) * 8
        return 0

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        out = self.function(problem, np.asarray(inputs[0]))
        return out if type(out) is np.ndarray else np.asarray(out)


class NumpySoftmax(Algorithm):
    """Max-subtracted softmax: the maximum along the axis is subtracted before exp, so large
    inputs do not overflow; exp and the division happen in place in the output.
    REPRODUCIBLE: numpy's reductions have a fixed order for a given shape."""

    operator = "softmax"
    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """The maximum and the sum along the axis, one value per row each, and numpy's
        buffers for the broadcast subtraction and division."""
        shape = problem.shapes[0]
        rows = math.prod(shape) // shape[problem.param("axis")] if math.prod(shape) else 0
        return (2 * rows * np.dtype(problem.dtypes[0]).itemsize
                + ufunc_buffer_bytes(problem.dtypes[0]))

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.asarray(inputs[0])
        if x.size == 0:
            return np.empty(x.shape, x.dtype)
        axis = problem.param("axis")
        out = np.subtract(x, np.max(x, axis=axis, keepdims=True))
        scale = problem.param("scale", 1.0)
        if scale != 1.0:  # positive: the maximum of s*x is s times x's
            out *= out.dtype.type(scale)
        with np.errstate(invalid="ignore"):  # a row of -inf or +inf gives NaN, as ONNX's does
            np.exp(out, out=out)
            out /= np.sum(out, axis=axis, keepdims=True)
        return out


def batch_norm_channels(problem: Problem, inputs: Sequence[Any], dtype: np.dtype
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, factor, B) per channel in X's ``dtype``: ``factor = scale / sqrt(var +
    epsilon)``, computed once for C values.  Both CPU algorithms take them from here, so that
    their per-value arithmetic starts from the same numbers and gives the same values."""
    scale, bias, mean, var = (np.asarray(a, dtype=dtype) for a in inputs[1:])
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.add(var, dtype.type(problem.param("epsilon")))
        np.sqrt(factor, out=factor)
        np.divide(scale, factor, out=factor)
    return mean, factor, bias


def batch_norm_channel_bytes(problem: Problem) -> int:
    """What :func:`batch_norm_channels` allocates: the factor, and each per-channel vector
    given in another dtype than X's, converted."""
    channels = problem.shapes[0][1]
    converted = sum(d != problem.dtypes[0] for d in problem.dtypes[1:])
    return (converted + 1) * channels * np.dtype(problem.dtypes[0]).itemsize


class NumpyBatchNorm(Algorithm):
    """Per-channel factor ``scale / sqrt(var + epsilon)`` computed once (C values), then
    ``(x - mean) * factor + B`` in three in-place broadcast passes over the output (a fourth
    for a fused Relu).
    Subtracting the mean first (rather than folding it into the bias) keeps the result
    accurate when the mean is large.  REPRODUCIBLE."""

    operator = "batch_norm"
    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """The per-channel vectors (:func:`batch_norm_channel_bytes`), and numpy's buffers
        for the broadcast passes."""
        return batch_norm_channel_bytes(problem) + ufunc_buffer_bytes(problem.dtypes[0])

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.asarray(inputs[0])
        mean, factor, bias = batch_norm_channels(problem, inputs, x.dtype)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.subtract(x, mean.reshape(shape))
            out *= factor.reshape(shape)
            out += bias.reshape(shape)
        if problem.param("activation") == "relu":
            np.maximum(out, out.dtype.type(0), out=out)
        return out
