"""A squeeze-and-excitation block in one call: three parallel loops in one numba kernel.

Why it exists.  As separate steps, a block is a global average pool, two 1x1 convs on the
pooled (N, C, 1, 1) vector (``conv``'s ``matvec``) and a broadcast multiply: four calls, four
parallel regions and four outputs for a few microseconds of arithmetic each, and on a small
model those fixed costs were most of the block's time (MobileNetV3-Small on the 2-core VM:
16-41 us per 1x1 conv on a pooled vector, where onnxruntime took 13-16).  Here one call makes
the whole block.

How.  Four parallel loops in one call: over (image, channel), each plane's mean
(``global_avgpool``'s vector sum in float64, ``pooling.global_pool.row_sum``); over (image,
block of squeezed channels), the first layer and its activation; over (image, block of
channels), the second layer and the gate; over (image, channel, pixel range), the scaling.  The
layers run as ``out[j] += v[i] * W[i, j]``, vector loops over j (:data:`COLUMNS`), which is why
the operator takes W1 as (C, S) and W2 as (S, C).  The vectors between the loops are a few
kilobytes, allocated per call.
The activations are the conv epilogue's (``conv.epilogue.activate``).

REPRODUCIBLE: every value is summed by one task in a fixed order, whatever the thread count
(a plane's sum in the vector order ``row_sum`` compiles to for this instruction set, as
``global_avgpool``'s).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import prange, types

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import (
    CACHE,
    FASTMATH,
    RunsThroughBind,
    U,
    thread_count,
)
from fastrun_algorithms.conv.epilogue import activate, activation_args
from fastrun_algorithms.pooling.global_pool import row_sum

#: Outputs of a layer per task: a layer runs as ``out[j] += v[i] * W[i, j]`` over i, each
#: step a vector loop over the task's j, so every output keeps its own sum in order and the
#: adds of one step do not wait for each other.  (The library's kernels add in the order
#: written, ``_common.FASTMATH``: one running dot product per output is a chain of dependent
#: adds, 4 cycles each, and MobileNetV3-Large's 960 -> 240 layer took 130 us that way.)
COLUMNS = 64


@numba.njit(inline="always")
def _dense_block(v, w, b, code, low, high, task, out):
    """Block ``task`` (image, block of COLUMNS outputs) of ``out = act(v @ w + b)``: ``out[n,
    j] = act(sum over i of v[n, i] * w[i, j] + b[j])``, each sum in order of i."""
    width = w.shape[1]
    blocks = (width + COLUMNS - 1) // COLUMNS
    n = task // blocks
    j0 = (task - n * blocks) * COLUMNS
    j1 = min(j0 + COLUMNS, width)
    for j in range(j0, j1):
        out[n, U(j)] = 0
    for i in range(w.shape[0]):
        value = v[n, U(i)]
        for j in range(j0, j1):
            out[n, U(j)] += value * w[U(i), U(j)]
    for j in range(j0, j1):
        out[n, U(j)] = activate(out[n, U(j)] + b[U(j)], code, low, high)


def _squeeze_excite_kernel(x, w1, b1, w2, b2, act, act_low, act_high, gate, gate_low,
                           gate_high, parts, pooled, hidden, gated, out):
    """out = x * gate(act(mean(x) @ w1 + b1) @ w2 + b2) per image and channel; x and out
    (N, C, pixels), w1 (C, S), w2 (S, C); pooled (N, C), hidden (N, S) and gated (N, C) the
    kernel's scratch; ``parts`` pixel ranges per channel in the last loop."""
    images, channels, pixels = x.shape
    squeezed = w1.shape[1]
    kind = out.dtype.type
    act_lo, act_hi = kind(act_low), kind(act_high)
    gate_lo, gate_hi = kind(gate_low), kind(gate_high)
    flat = x.reshape(x.size)
    for plane in prange(images * channels):
        n = plane // channels
        c = plane - n * channels
        pooled[n, c] = kind(row_sum(flat, plane * pixels, pixels) / pixels)
    for task in prange(images * ((squeezed + COLUMNS - 1) // COLUMNS)):
        _dense_block(pooled, w1, b1, act, act_lo, act_hi, task, hidden)
    for task in prange(images * ((channels + COLUMNS - 1) // COLUMNS)):
        _dense_block(hidden, w2, b2, gate, gate_lo, gate_hi, task, gated)
    for task in prange(images * channels * parts):
        plane = task // parts
        part = task - plane * parts
        n = plane // channels
        c = plane - n * channels
        scale = gated[n, c]
        for p in range(part * pixels // parts, (part + 1) * pixels // parts):
            out[n, c, U(p)] = x[n, c, U(p)] * scale


@functools.cache
def _compiled(dtype: str) -> Callable[..., None]:
    """The kernel for one dtype, every operand C-contiguous so that LLVM knows its strides."""
    item = numba.from_dtype(np.dtype(dtype))

    def array(ndim: int, readonly: bool = True) -> types.Array:
        return types.Array(item, ndim, "C", readonly=readonly)

    code, bound = types.intp, types.float64
    signature = types.void(array(3), array(2), array(1), array(2), array(1), code, bound, bound,
                           code, bound, bound, types.intp, array(2, False), array(2, False),
                           array(2, False), array(3, False))
    return numba.njit(signature, parallel=True, cache=CACHE,
                      fastmath=FASTMATH)(_squeeze_excite_kernel)


class FusedSqueezeExcite(RunsThroughBind, Algorithm):
    """The whole block in one kernel call (see the module docstring)."""

    operator = "squeeze_excite"
    name = "fused"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """The pooled, hidden and gate vectors."""
        n, c = problem.shapes[0][:2]
        return n * (2 * c + problem.shapes[1][1]) * np.dtype(problem.dtypes[0]).itemsize

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        dtype = np.dtype(problem.dtypes[0])
        kernel = _compiled(dtype.name)
        shape = tuple(problem.shapes[0])
        images, channels = shape[:2]
        squeezed = problem.shapes[1][1]
        pixels = math.prod(shape[2:])
        # Pixel ranges per plane in the scaling loop: at least four tasks per thread where
        # the planes alone are fewer (an early block: 16 channels of 56x56), ranges of at
        # least 256 values.
        parts = max(1, min(-(-4 * thread_count() // (images * channels)), pixels // 256))
        first = activation_args(problem.param("activation", "none"))
        second = activation_args(problem.param("gate", "sigmoid"),
                                 alpha=problem.param("alpha", 0.2),
                                 beta=problem.param("beta", 0.5))

        def call(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> np.ndarray:
            planes = np.ascontiguousarray(x).reshape(images, channels, -1)
            out = np.empty(planes.shape, dtype)
            kernel(planes, *(np.ascontiguousarray(v) for v in (w1, b1, w2, b2)), *first,
                   *second, parts, np.empty((images, channels), dtype),
                   np.empty((images, squeezed), dtype), np.empty((images, channels), dtype), out)
            return out.reshape(shape)
        return call


def algorithms() -> list[Algorithm]:
    return [FusedSqueezeExcite()]
