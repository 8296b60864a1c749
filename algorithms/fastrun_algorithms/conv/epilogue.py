"""The fused epilogue: bias add, residual add and activation, applied where the output is written.

numba algorithms apply :func:`epilogue_value` to each value in their output loop; algorithms
whose inner product is a BLAS call apply ``_gemm_common.epilogue_in_place`` (a numba loop over
:func:`epilogue_value` too) to each output block right after it is produced, while it is still
in cache.  Either way the runtime gets Conv+Bias+Relu in
one call instead of three passes over memory.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from fastrun_algorithms.conv.geometry import ConvGeometry

#: Activation codes the numba kernels take (strings cannot be compile-time constants cheaply).
NONE, RELU, CLIP = 0, 1, 2
_CODES = {"none": NONE, "relu": RELU, "clip": CLIP}


def activation_code(geo: ConvGeometry) -> int:
    return _CODES[geo.activation]


@numba.njit(inline="always")
def activate(value, code, low, high):
    """The activation of one value.  ``value - value`` is the zero of value's own type (and NaN
    for NaN): ``value * 0`` multiplied by an integer, which numba types as float64, so every
    float32 epilogue ran in float64 with a conversion each way."""
    if code == RELU:
        return value if value > 0 else value - value
    if code == CLIP:
        return min(max(value, low), high)
    return value


@numba.njit(inline="always")
def epilogue_value(value, bias, code, low, high):
    """One output value after bias and activation (inlined into the kernels' output loops)."""
    return activate(value + bias, code, low, high)


@numba.njit(inline="always")
def epilogue_residual(value, bias, z, code, low, high):
    """One output value of a conv with a residual: ``act((value + bias) + z)``."""
    return activate((value + bias) + z, code, low, high)


@functools.cache
def _residual_placeholder(dtype: np.dtype) -> np.ndarray:
    """The shared read-only zero (1, 1, 1, 1) that kernels get when there is no residual."""
    zero = np.zeros((1, 1, 1, 1), dtype=dtype)
    zero.flags.writeable = False
    return zero


def residual_operand(geo: ConvGeometry, inputs: Sequence[Any]) -> np.ndarray:
    """The residual Z as a C-contiguous (N, K, OH, OW) array, or a shared one-element zero
    placeholder when the problem has none (the kernels' signatures always take one).  A runtime
    passes contiguous residuals, which are used where they lie; a strided one is copied."""
    if not geo.has_residual:
        return _residual_placeholder(np.dtype(geo.dtype))
    return np.ascontiguousarray(geo.as_4d_output(np.asarray(inputs[-1])))
