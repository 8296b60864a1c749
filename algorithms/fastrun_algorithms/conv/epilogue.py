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

from fastrun_algorithms._common import U
from fastrun_algorithms._fastmath import sigmoid
from fastrun_algorithms.conv.geometry import ConvGeometry

#: Activation codes the numba kernels take (strings cannot be compile-time constants cheaply);
#: the OpenCL kernels' ``conv_epilogue`` takes the same (``conv/opencl/_kernels.py``).
NONE, RELU, CLIP, HARD_SWISH, SIGMOID, SILU, HARD_SIGMOID = 0, 1, 2, 3, 4, 5, 6
_CODES = {"none": NONE, "relu": RELU, "clip": CLIP, "hard_swish": HARD_SWISH,
          "sigmoid": SIGMOID, "silu": SILU, "hard_sigmoid": HARD_SIGMOID}


def epilogue_args(geo: ConvGeometry) -> tuple[int, float, float]:
    """(code, low, high): what every kernel passes to :func:`activate` (see
    :func:`activation_args`)."""
    return activation_args(geo.activation, geo.clip_min, geo.clip_max, geo.alpha, geo.beta)


def activation_args(name: str, clip_min: float = -np.inf, clip_max: float = np.inf,
                    alpha: float = 0.2, beta: float = 0.5) -> tuple[int, float, float]:
    """(code, low, high) of activation ``name`` for :func:`activate`.  ``low`` and ``high``
    are clip's bounds, hard_swish's shift 3 and scale 1/6, hard_sigmoid's alpha and beta, or
    sigmoid's and silu's 1: the kernels convert them to the output's type once, so that the
    activation computes in that type (a literal would make numba promote a float32 value to
    float64)."""
    code = _CODES[name]
    if code == CLIP:
        return code, float(clip_min), float(clip_max)
    if code == HARD_SWISH:
        return code, 3.0, 1.0 / 6.0
    if code == HARD_SIGMOID:
        return code, float(alpha), float(beta)
    return code, 1.0, 1.0


@numba.njit(inline="always")
def _relu(value):
    return value if value > 0 else value - value


@numba.njit(inline="always")
def _hard_swish(value, low, high):
    gate = (value + low) * high
    zero, one = value - value, high / high
    gate = zero if gate < zero else (one if gate > one else gate)
    return value * gate


@numba.njit(inline="always")
def _hard_sigmoid(value, alpha, beta):
    """max(0, min(1, alpha * value + beta)), NaN kept; 1 as the zero of value's type plus a
    float32 one, so that float32 stays float32."""
    gate = value * alpha + beta
    zero = value - value
    one = zero + np.float32(1.0)
    gate = zero if gate < zero else gate
    return one if gate > one else gate


@numba.njit(inline="always")
def activate(value, code, low, high):
    """The activation of one value (``low`` and ``high`` as :func:`epilogue_args` gives
    them).  ``value - value`` is the zero of value's own type (and NaN for NaN): ``value * 0``
    multiplied by an integer, which numba types as float64, so every float32 epilogue ran in
    float64 with a conversion each way; ``high / high`` is its one likewise.  hard_swish gates
    with (x + 3) / 6 as the hard_swish operator does, exact near the knee at -3.  The
    sigmoid (and SiLU's) is :func:`~fastrun_algorithms._fastmath.sigmoid`: libm's scalar exp
    made the epilogue 5-9x the cost of the convolution it ends (EfficientNet's SiLU layers).
    In a loop over values, the test of the code keeps the loop scalar: loops use
    :func:`activate_in_place`, or :func:`bounds` and :func:`clamp`, instead.
    """
    if code == RELU:
        return _relu(value)
    if code == CLIP:
        return min(max(value, low), high)
    if code == HARD_SWISH:
        return _hard_swish(value, low, high)
    if code == SIGMOID:
        return sigmoid(value)
    if code == SILU:
        return value * sigmoid(value)
    if code == HARD_SIGMOID:
        return _hard_sigmoid(value, low, high)
    return value


@numba.njit(inline="always")
def activate_in_place(values, first, count, code, low, high):
    """``values[first:first + count]`` (1-D) through the activation, the code tested once,
    outside a loop of its own per activation: with :func:`activate` in the loop, LLVM kept
    it scalar, and a depthwise layer with a HardSwish or a sigmoid took 2.5-3x the time of the
    same layer without one."""
    if code == RELU:
        for i in range(count):
            e = U(first + i)
            values[e] = _relu(values[e])
    elif code == CLIP:
        for i in range(count):
            e = U(first + i)
            values[e] = min(max(values[e], low), high)
    elif code == HARD_SWISH:
        for i in range(count):
            e = U(first + i)
            values[e] = _hard_swish(values[e], low, high)
    elif code == SIGMOID:
        for i in range(count):
            e = U(first + i)
            values[e] = sigmoid(values[e])
    elif code == SILU:
        for i in range(count):
            e = U(first + i)
            values[e] = values[e] * sigmoid(values[e])
    elif code == HARD_SIGMOID:
        for i in range(count):
            e = U(first + i)
            values[e] = _hard_sigmoid(values[e], low, high)


@numba.njit(inline="always")
def bounds(code, low, high, out):
    """(bounded, floor, ceiling): whether ``code`` is an activation that only clamps (none,
    relu, clip) and the interval it clamps to, in the type of the array ``out``.  A vector
    loop over outputs applies such an activation with :func:`clamp` and stays a vector loop;
    a test of the code inside it (as :func:`activate` makes) kept the loops of
    ``depthwise_lanes`` and ``tiled_1x1`` scalar.  ``low`` and ``high`` as
    :func:`epilogue_args` gives them."""
    kind = out.dtype.type
    floor = kind(low) if code == CLIP else (kind(0) if code == RELU else kind(-np.inf))
    ceiling = kind(high) if code == CLIP else kind(np.inf)
    return code in (NONE, RELU, CLIP), floor, ceiling


@numba.njit(inline="always")
def clamp(value, floor, ceiling):
    """``value`` clamped to [floor, ceiling], NaN kept, as selects (see :func:`bounds`)."""
    value = value if value > floor else (value - value) + floor
    return value if value < ceiling else (value - value) + ceiling


@numba.njit(inline="always")
def finish_span(row, first, count, bias, z, has_residual, code, low, high):
    """``row[first:first + count]`` (1-D, holding raw sums) through the epilogue in place:
    the bias, ``z[first:first + count]`` when ``has_residual``, and the activation.  Relu and
    clip are clamps in the same pass, the other activations a loop of their own
    (:func:`activate_in_place`): with :func:`epilogue_value`'s test of the code per value the
    loop stayed scalar, and a 1x1 HardSwish layer took 1.1-2.7x the time it takes now."""
    bounded, floor, ceiling = bounds(code, low, high, row)
    if bounded and has_residual:
        for i in range(count):
            e = U(first + i)
            row[e] = clamp((row[e] + bias) + z[e], floor, ceiling)
    elif bounded:
        for i in range(count):
            e = U(first + i)
            row[e] = clamp(row[e] + bias, floor, ceiling)
    else:
        if has_residual:
            for i in range(count):
                e = U(first + i)
                row[e] = (row[e] + bias) + z[e]
        else:
            for i in range(count):
                e = U(first + i)
                row[e] = row[e] + bias
        activate_in_place(row, first, count, code, low, high)


@numba.njit(inline="always")
def finish_tile(tile, count, bounded, floor, ceiling, code, low, high):
    """A copy of a register tile, ``tile[:count]`` (flat, private to its task, the bias and any
    residual already added), through the activation: bounds as one clamp loop, the others as
    one loop of their own (:func:`activate_in_place`).  Finishing the tile whole, before it
    is stored, is one loop where finishing it row by row was three short ones per row with
    two array views: a 3x3/2 stem conv with a HardSwish took twice the time of the same conv
    with a Relu when its 16-value rows were finished apart."""
    if bounded:
        for i in range(count):
            tile[i] = clamp(tile[i], floor, ceiling)
    else:
        activate_in_place(tile, 0, count, code, low, high)


@numba.njit(inline="always")
def store_tile(out, z, has_residual, n, k0, rows, p0, width, tile, scratch, bias, has_bias,
               bounded, floor, ceiling, code, low, high):
    """A register tile's sums to ``out[n, k0 + a, p0 + t]`` for ``a < rows``, ``t < width``
    (out and the residual z as (N, K, pixels)), through the epilogue.  ``tile`` is the
    (rows, columns) accumulator, ``scratch`` a stack vector of its size, private to the task.
    A clamping activation without a residual is applied as each value is stored; otherwise the
    values plus bias and residual are copied into ``scratch``, :func:`finish_tile` finishes it
    in one loop, and it is stored.  The tile itself is never indexed by a loop of run-time
    length: that kept LLVM from holding it in registers, and the multiply-adds went through
    memory (a 3x3/2 stem conv took 1.5-2x as long).  The output is never finished in place:
    the last tile of a row overlaps its neighbour's."""
    if bounded and not has_residual:
        for a in range(rows):
            b = bias[k0 + a] if has_bias else bias[0] - bias[0]
            for t in range(width):
                out[n, k0 + a, p0 + U(t)] = clamp(tile[a, t] + b, floor, ceiling)
        return
    columns = tile.shape[1]
    for a in range(rows):
        b = bias[k0 + a] if has_bias else bias[0] - bias[0]
        if has_residual:
            for t in range(width):
                scratch[a * columns + t] = (tile[a, t] + b) + z[n, k0 + a, p0 + U(t)]
        else:
            for t in range(columns):
                scratch[a * columns + t] = tile[a, t] + b
    finish_tile(scratch, rows * columns, bounded, floor, ceiling, code, low, high)
    for a in range(rows):
        for t in range(width):
            out[n, k0 + a, p0 + U(t)] = scratch[a * columns + t]


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
