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

In ``nchw16c`` (:mod:`fastrun_algorithms.layout.blocking`) the first loop runs over (image,
channel block, range of :data:`POOL_PIXELS` pixels), summing the range's 16-lane pixel vectors
in float64; each channel's partial sums are then added in range order, and the scaling
multiplies each pixel vector by its block's 16 gates.  The padding lanes of the last block are
stored as zeros.

REPRODUCIBLE: every value is summed by one task in a fixed order, whatever the thread count
(a plane's sum in the vector order ``row_sum`` compiles to for this instruction set, as
``global_avgpool``'s; in ``nchw16c``, pixel by pixel within fixed ranges, the ranges in order).
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
from fastrun_algorithms.layout.blocking import BLOCKED, LANES, NCHW, blocks
from fastrun_algorithms.pooling.global_pool import row_sum

#: Outputs of a layer per task: a layer runs as ``out[j] += v[i] * W[i, j]`` over i, each
#: step a vector loop over the task's j, so every output keeps its own sum in order and the
#: adds of one step do not wait for each other.  (The library's kernels add in the order
#: written, ``_common.FASTMATH``: one running dot product per output is a chain of dependent
#: adds, 4 cycles each, and MobileNetV3-Large's 960 -> 240 layer took 130 us that way.)
COLUMNS = 64
#: Pixels of one pooling task in ``nchw16c``: a fixed range, so that the partial sums (and
#: their order) do not depend on the thread count, short enough that an early block's few
#: channel blocks of a large plane still split over the threads.
POOL_PIXELS = 256


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


@numba.njit(inline="always")
def _excite(pooled, w1, b1, w2, b2, act, act_lo, act_hi, gate, gate_lo, gate_hi, hidden,
            gated):
    """The two layers on the channel means, each a parallel loop over (image, block of
    outputs): ``gated = gate(act(pooled @ w1 + b1) @ w2 + b2)``."""
    images = pooled.shape[0]
    squeezed, channels = w2.shape
    for task in prange(images * ((squeezed + COLUMNS - 1) // COLUMNS)):
        _dense_block(pooled, w1, b1, act, act_lo, act_hi, task, hidden)
    for task in prange(images * ((channels + COLUMNS - 1) // COLUMNS)):
        _dense_block(hidden, w2, b2, gate, gate_lo, gate_hi, task, gated)


def _squeeze_excite_kernel(x, w1, b1, w2, b2, act, act_low, act_high, gate, gate_low,
                           gate_high, parts, pooled, hidden, gated, out):
    """out = x * gate(act(mean(x) @ w1 + b1) @ w2 + b2) per image and channel; x and out
    (N, C, pixels), w1 (C, S), w2 (S, C); pooled (N, C), hidden (N, S) and gated (N, C) the
    kernel's scratch; ``parts`` pixel ranges per channel in the last loop."""
    images, channels, pixels = x.shape
    kind = out.dtype.type
    act_lo, act_hi = kind(act_low), kind(act_high)
    gate_lo, gate_hi = kind(gate_low), kind(gate_high)
    flat = x.reshape(x.size)
    for plane in prange(images * channels):
        n = plane // channels
        c = plane - n * channels
        pooled[n, c] = kind(row_sum(flat, plane * pixels, pixels) / pixels)
    _excite(pooled, w1, b1, w2, b2, act, act_lo, act_hi, gate, gate_lo, gate_hi, hidden, gated)
    for task in prange(images * channels * parts):
        plane = task // parts
        part = task - plane * parts
        n = plane // channels
        c = plane - n * channels
        scale = gated[n, c]
        for p in range(part * pixels // parts, (part + 1) * pixels // parts):
            out[n, c, U(p)] = x[n, c, U(p)] * scale


def _blocked_kernel(x, w1, b1, w2, b2, act, act_low, act_high, gate, gate_low, gate_high,
                    parts, partial, pooled, hidden, gated, out):
    """:func:`_squeeze_excite_kernel` in ``nchw16c``: x and out (N, C/16, pixels * 16), the
    16 lanes of a block's pixel together; ``partial`` (N, C/16, ranges, 16) float64 the pooling
    ranges' sums; ``parts`` pixel ranges per block in the scaling loop."""
    images, nb, size = x.shape
    pixels = size // LANES
    channels = w1.shape[0]
    ranges = partial.shape[2]
    kind = out.dtype.type
    act_lo, act_hi = kind(act_low), kind(act_high)
    gate_lo, gate_hi = kind(gate_low), kind(gate_high)
    for task in prange(images * nb * ranges):
        plane = task // ranges
        r = task - plane * ranges
        n = plane // nb
        b = plane - n * nb
        for t in range(LANES):
            partial[n, b, r, t] = 0
        for p in range(r * POOL_PIXELS, min(pixels, (r + 1) * POOL_PIXELS)):
            for t in range(LANES):
                partial[n, b, r, t] += x[n, b, U(p * LANES + t)]
    for plane in prange(images * nb):
        n = plane // nb
        b = plane - n * nb
        for t in range(min(LANES, channels - b * LANES)):
            total = partial[n, b, 0, t]
            for r in range(1, ranges):
                total += partial[n, b, r, t]
            pooled[n, b * LANES + t] = kind(total / pixels)
    _excite(pooled, w1, b1, w2, b2, act, act_lo, act_hi, gate, gate_lo, gate_hi, hidden, gated)
    for task in prange(images * nb * parts):
        plane = task // parts
        part = task - plane * parts
        n = plane // nb
        b = plane - n * nb
        first, last = part * pixels // parts * LANES, (part + 1) * pixels // parts * LANES
        if (b + 1) * LANES <= channels:
            for e in range(first, last, LANES):
                for t in range(LANES):
                    out[n, b, U(e + t)] = x[n, b, U(e + t)] * gated[n, U(b * LANES + t)]
        else:  # the last block: lanes past C are padding, stored as zeros
            lanes = channels - b * LANES
            for e in range(first, last, LANES):
                for t in range(LANES):
                    out[n, b, U(e + t)] = 0
                for t in range(lanes):
                    out[n, b, U(e + t)] = x[n, b, U(e + t)] * gated[n, U(b * LANES + t)]


@functools.cache
def _compiled_blocked(dtype: str) -> Callable[..., None]:
    """The ``nchw16c`` kernel for one dtype (see :func:`_compiled`)."""
    item = numba.from_dtype(np.dtype(dtype))

    def array(ndim: int, readonly: bool = True, kind: types.Type = item) -> types.Array:
        return types.Array(kind, ndim, "C", readonly=readonly)

    code, bound = types.intp, types.float64
    signature = types.void(array(3), array(2), array(1), array(2), array(1), code, bound, bound,
                           code, bound, bound, types.intp, array(4, False, types.float64),
                           array(2, False), array(2, False), array(2, False), array(3, False))
    return numba.njit(signature, parallel=True, cache=CACHE,
                      fastmath=FASTMATH)(_blocked_kernel)


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
        """The pooled, hidden and gate vectors, and in ``nchw16c`` the pooling ranges' float64
        sums."""
        n = problem.shapes[0][0]
        c, squeezed = problem.shapes[1]
        size = n * (2 * c + squeezed) * np.dtype(problem.dtypes[0]).itemsize
        if problem.param("layout", NCHW) == BLOCKED:
            pixels = math.prod(problem.shapes[0][2:-1])
            size += 8 * n * blocks(c) * _ranges(pixels) * LANES
        return size

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        dtype = np.dtype(problem.dtypes[0])
        shape = tuple(problem.shapes[0])
        images = shape[0]
        channels, squeezed = problem.shapes[1]
        blocked = problem.param("layout", NCHW) == BLOCKED
        planes = images * (blocks(channels) if blocked else channels)
        pixels = math.prod(shape[2:-1] if blocked else shape[2:])
        # Pixel ranges per plane in the scaling loop: at least four tasks per thread where
        # the planes alone are fewer (an early block: 16 channels of 56x56), ranges of at
        # least 256 values.
        parts = max(1, min(-(-4 * thread_count() // planes), pixels // 256))
        first = activation_args(problem.param("activation", "none"))
        second = activation_args(problem.param("gate", "sigmoid"),
                                 alpha=problem.param("alpha", 0.2),
                                 beta=problem.param("beta", 0.5))

        if blocked:
            kernel = _compiled_blocked(dtype.name)
            ranges = _ranges(pixels)

            def call_blocked(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> np.ndarray:
                flat = np.ascontiguousarray(x).reshape(images, blocks(channels), -1)
                out = np.empty(flat.shape, dtype)
                kernel(flat, *(np.ascontiguousarray(v) for v in (w1, b1, w2, b2)), *first,
                       *second, parts, np.empty((images, blocks(channels), ranges, LANES)),
                       np.empty((images, channels), dtype), np.empty((images, squeezed), dtype),
                       np.empty((images, channels), dtype), out)
                return out.reshape(shape)
            return call_blocked

        kernel = _compiled(dtype.name)

        def call(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> np.ndarray:
            flat = np.ascontiguousarray(x).reshape(images, channels, -1)
            out = np.empty(flat.shape, dtype)
            kernel(flat, *(np.ascontiguousarray(v) for v in (w1, b1, w2, b2)), *first,
                   *second, parts, np.empty((images, channels), dtype),
                   np.empty((images, squeezed), dtype), np.empty((images, channels), dtype), out)
            return out.reshape(shape)
        return call


def _ranges(pixels: int) -> int:
    """Pooling ranges of a plane in ``nchw16c`` (:data:`POOL_PIXELS` pixels each)."""
    return max(1, -(-pixels // POOL_PIXELS))


def algorithms() -> list[Algorithm]:
    return [FusedSqueezeExcite()]
