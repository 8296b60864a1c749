"""1x1 convolution in the channel-blocked layout: register tiles of 2 output blocks x 8 pixels.

Why it exists.  A mobile network's blocks are a 1x1 expansion, a depthwise layer and a 1x1
projection.  The depthwise layers run 2-4x faster in ``nchw16c`` (``conv/blocked_depthwise.py``),
but a model gains that only if the 1x1 layers around them compute in the same layout: a
conversion on each side costs as much as the layer.  ``blocked_direct`` covers 1x1 layers in
``nchw16c`` too, but its tile of four output blocks wastes three quarters of its work on a
16-channel layer and half on most others, and its per-value epilogue stays scalar for a
HardSwish.  This kernel is made for them.

How.  A 1x1 convolution is, per image, out[p, k] = sum over c of x[p, c] w[c, k].  In
``nchw16c`` a pixel's 16 channels of a block are one vector, so a job holds a tile of 2 output
blocks x 8 pixels in 16 vector accumulators: for every input channel it broadcasts the 8
pixels' values of that channel, loads the two blocks' 16 weights (packed once as (K/16, C, 16),
zero past K) and does 16 vector multiply-adds; consecutive channels read the next lane of the
same 8 pixel vectors, already in L1.  (A tile of 2 x 12 spilled: LLVM holds the broadcasts in
registers too, 38 of AVX-512's 32.)  A last block of its own takes a loop with half the
multiply-adds.  The tile is then copied with the bias (and residual) to a stack buffer,
finished in one loop per activation (``conv.epilogue.finish_tile``) and stored as whole
vectors.  Where there are 16 vector registers (AVX2), the tile is one block x 4 pixels, as
``blocked_direct`` found.

Edges.  The last pixel tile is shifted back to end at the last pixel (its overlap computed
twice, identically); a plane of fewer pixels than a tile repeats its last pixel.  An odd block
count leaves the last block to a job of its own.  Input lanes past C are never
read; output lanes past K are stored as zeros.

Stride 1, no padding, one group, float32.  REPRODUCIBLE: every output value is summed in
channel order by one job, with FMA contraction only, whatever the thread count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange, types

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, FASTMATH, U, stack_buffer, vector_registers
from fastrun_algorithms.conv._gemm_common import buffer, item_type, readonly
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import bounds, epilogue_args, finish_tile, residual_operand
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.layout.blocking import BLOCKED, LANES, blocks


def _tile(registers: int, lanes: int) -> tuple[int, int]:
    """(output blocks, pixels) of a job's tile: 16 accumulators, 8 broadcasts and two weight
    vectors where a block is one of 32 registers; one block x 4 pixels elsewhere."""
    if registers >= 32 and lanes >= LANES:
        return 2, 8
    return 1, 4


BLOCKS, PIXELS = _tile(*vector_registers())
#: Elements of one job's tile: a global, so that numba sees the literal the stack buffer needs.
TILE = BLOCKS * PIXELS * LANES


@numba.njit(inline="always")
def _fma_pixels(acc, a, t, x0, x1, x2, x3, x4, x5, x6, x7, w):
    """Lane ``t`` of block ``a`` of the tile: ``acc[a, p, t] += x_p * w`` for its
    :data:`PIXELS` pixels (a constant: the test compiles away).  Called in a loop over t,
    each line becomes one vector multiply-add of a broadcast pixel value."""
    acc[a, 0, t] += x0 * w
    acc[a, 1, t] += x1 * w
    acc[a, 2, t] += x2 * w
    acc[a, 3, t] += x3 * w
    if PIXELS == 8:
        acc[a, 4, t] += x4 * w
        acc[a, 5, t] += x5 * w
        acc[a, 6, t] += x6 * w
        acc[a, 7, t] += x7 * w


@numba.njit(inline="always")
def _add_bias(scratch, base, acc, a, t, b):
    """Lane ``t`` of block ``a``'s pixels plus ``b``, into ``scratch`` from ``base``."""
    scratch[base + t] = acc[a, 0, t] + b
    scratch[base + LANES + t] = acc[a, 1, t] + b
    scratch[base + 2 * LANES + t] = acc[a, 2, t] + b
    scratch[base + 3 * LANES + t] = acc[a, 3, t] + b
    if PIXELS == 8:
        scratch[base + 4 * LANES + t] = acc[a, 4, t] + b
        scratch[base + 5 * LANES + t] = acc[a, 5, t] + b
        scratch[base + 6 * LANES + t] = acc[a, 6, t] + b
        scratch[base + 7 * LANES + t] = acc[a, 7, t] + b


@numba.njit(inline="always")
def _channel(acc, x, n, o, c, packed, b0, b1, both):
    """Input channel ``c`` into the tile: one broadcast per pixel (``o[p] + lane``: pixel p's
    offset of the channel's block plus the channel's lane), two weight vectors, a multiply-add
    per pixel and block."""
    x0, x1, x2, x3 = x[n, U(o[0])], x[n, U(o[1])], x[n, U(o[2])], x[n, U(o[3])]
    x4, x5, x6, x7 = x3, x3, x3, x3
    if PIXELS == 8:
        x4, x5, x6, x7 = x[n, U(o[4])], x[n, U(o[5])], x[n, U(o[6])], x[n, U(o[7])]
    for t in range(LANES):
        _fma_pixels(acc, 0, t, x0, x1, x2, x3, x4, x5, x6, x7, packed[b0, c, U(t)])
        if BLOCKS == 2 and both:
            _fma_pixels(acc, 1, t, x0, x1, x2, x3, x4, x5, x6, x7, packed[b1, c, U(t)])


@numba.njit(inline="always")
def _accumulate(acc, x, n, p0, pixels, channels, packed, b0, b1, both):
    """Every input channel into the tile, in order; block ``b1`` too when ``both`` (a constant
    where this is inlined: the single-block loop is one of its own)."""
    for cb in range((channels + LANES - 1) // LANES):
        lanes = min(LANES, channels - cb * LANES)
        if lanes == LANES:  # a whole block: a constant trip count
            for lane in range(LANES):
                _channel(acc, x, n, _offsets(p0, pixels, cb, lane), cb * LANES + lane, packed,
                         b0, b1, both)
        else:
            for lane in range(lanes):
                _channel(acc, x, n, _offsets(p0, pixels, cb, lane), cb * LANES + lane, packed,
                         b0, b1, both)


@numba.njit(inline="always")
def _offsets(p0, pixels, cb, lane):
    """The tile's 8 pixels' offsets of lane ``lane`` of input block ``cb`` (pixels past the
    plane repeat its last one)."""
    base = cb * pixels * LANES + lane
    last = pixels - 1
    return (base + min(p0, last) * LANES, base + min(p0 + 1, last) * LANES,
            base + min(p0 + 2, last) * LANES, base + min(p0 + 3, last) * LANES,
            base + min(p0 + 4, last) * LANES, base + min(p0 + 5, last) * LANES,
            base + min(p0 + 6, last) * LANES, base + min(p0 + 7, last) * LANES)


def _compute_kernel(x: np.ndarray, packed: np.ndarray, bias: np.ndarray, channels: int,
                    code: int, low: float, high: float, z: np.ndarray, has_residual: bool,
                    out: np.ndarray) -> None:
    """``out`` (N, K/16, P * 16) from ``x`` (N, C/16 * P * 16), the packed weights (K/16, C, 16)
    and bias (K/16 * 16), plus ``z`` (laid out as ``out``) when ``has_residual``.  Jobs are
    numbered (image, pixel tile, block pair), so that a worker's consecutive jobs read the
    same pixels from L1."""
    batch, out_blocks = out.shape[0], out.shape[1]
    pixels = out.shape[2] // LANES
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    bounded, floor, ceiling = bounds(code, low, high, out)
    pairs = (out_blocks + BLOCKS - 1) // BLOCKS
    tiles = max(1, (pixels + PIXELS - 1) // PIXELS)
    per_image = tiles * pairs
    stored = min(PIXELS, pixels)
    for job in prange(batch * per_image):
        acc = numba.carray(stack_buffer(TILE, out.dtype), (BLOCKS, PIXELS, LANES))
        scratch = numba.carray(stack_buffer(TILE, out.dtype), TILE)
        n = job // per_image
        rest = job - n * per_image
        tile = rest // pairs
        b0 = (rest - tile * pairs) * BLOCKS
        b1 = min(b0 + 1, out_blocks - 1)
        p0 = max(0, min(tile * PIXELS, pixels - PIXELS))
        for a in range(BLOCKS):
            for p in range(PIXELS):
                for t in range(LANES):
                    acc[a, p, t] = 0
        if b1 != b0:
            _accumulate(acc, x, n, p0, pixels, channels, packed, b0, b1, True)
        else:  # a last block of its own: half the multiply-adds
            _accumulate(acc, x, n, p0, pixels, channels, packed, b0, b1, False)
        # the tile plus the bias: pixels written out inside the lane loop, so that LLVM
        # vectorises over lanes (looping over pixels, it gathered and scattered the tile)
        for t in range(LANES):
            _add_bias(scratch, 0, acc, 0, t, bias[U(b0 * LANES + t)])
            if BLOCKS == 2:
                _add_bias(scratch, PIXELS * LANES, acc, 1, t, bias[U(b1 * LANES + t)])
        if has_residual:
            for a in range(BLOCKS):
                ob = b0 if a == 0 else b1
                for e in range(stored * LANES):
                    scratch[U(a * PIXELS * LANES + e)] += z[n, ob, U(p0 * LANES + e)]
        finish_tile(scratch, TILE, bounded, floor, ceiling, code, low_v, high_v)
        for a in range(BLOCKS):
            if a == 1 and b1 == b0:
                break
            ob = b0 if a == 0 else b1
            for e in range(stored * LANES):
                out[n, ob, U(p0 * LANES + e)] = scratch[U(a * PIXELS * LANES + e)]


def _pack_kernel(w: np.ndarray, bias: np.ndarray, has_bias: bool, packed: np.ndarray,
                 packed_bias: np.ndarray) -> None:
    """``packed[b, c, t] = w[b*16 + t, c]`` and ``packed_bias[b*16 + t] = bias[b*16 + t]``,
    zeros past K."""
    k_total, channels = w.shape
    for b in range(packed.shape[0]):
        for t in range(LANES):
            k = b * LANES + t
            for c in range(channels):
                packed[b, c, t] = w[k, c] if k < k_total else 0
            packed_bias[k] = bias[k] if has_bias and k < k_total else 0


@functools.cache
def _compiled() -> tuple[Callable[..., None], Callable[..., None]]:
    """(pack, compute) for float32, compiled (or loaded from numba's cache) on first use."""
    f32 = np.dtype(np.float32)
    c_in = functools.partial(types.Array, item_type(f32), layout="C", readonly=True)
    pack = numba.njit(types.void(readonly(f32, 2), readonly(f32, 1), types.boolean,
                                 buffer(f32, 3), buffer(f32, 1)), cache=CACHE)(_pack_kernel)
    compute = numba.njit(
        types.void(c_in(ndim=2), c_in(ndim=3), c_in(ndim=1), types.intp, types.intp,
                   types.float64, types.float64, c_in(ndim=3), types.boolean, buffer(f32, 3)),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_compute_kernel)
    return pack, compute


class BlockedPointwiseConv(ConvAlgorithm):
    """1x1 convolution on ``nchw16c`` tensors with register tiles over output blocks and
    pixels (see the module docstring)."""

    operator = "conv"
    name = "blocked_1x1"
    attributes = AlgoAttribute.REPRODUCIBLE
    layouts = (BLOCKED,)

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if problem.dtypes[0] != "float32":
            return f"blocked_1x1 computes float32 only (got {problem.dtypes[0]})"
        if (geo.r, geo.s) != (1, 1) or (geo.stride_h, geo.stride_w) != (1, 1):
            return (f"blocked_1x1 needs a 1x1 kernel at stride 1; got {geo.r}x{geo.s} at "
                    f"stride {geo.stride_h}x{geo.stride_w}")
        if geo.pad_top or geo.pad_left or geo.pad_bottom or geo.pad_right:
            return "blocked_1x1 takes no padding"
        if geo.group != 1:
            return f"blocked_1x1 needs one group (got {geo.group})"
        return None

    def workspace_bytes(self, problem: Problem) -> int:
        """The packed weights and bias when they are not preprocessed."""
        if problem.weight_preprocess:
            return 0
        geo = geometry(problem)
        return 4 * blocks(geo.k) * LANES * (geo.c + 1)

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The weights as (K/16, C, 16) and the bias as (K/16 * 16,), zero past K."""
        geo = geometry(problem)
        w = np.ascontiguousarray(inputs[1], dtype=np.float32).reshape(geo.k, geo.c)
        bias = np.asarray(inputs[2], np.float32) if geo.has_bias else np.zeros(1, np.float32)
        packed = np.empty((blocks(geo.k), geo.c, LANES), dtype=np.float32)
        packed_bias = np.empty(blocks(geo.k) * LANES, dtype=np.float32)
        _compiled()[0](w, bias, geo.has_bias, packed, packed_bias)
        return packed, packed_bias

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        packed, packed_bias = self.preprocess(problem, inputs) if prepared is None else prepared
        x = np.ascontiguousarray(inputs[0]).reshape(geo.n, -1)
        out = np.empty(geo.out_shape, dtype=np.float32)
        flat = out.reshape(geo.n, blocks(geo.k), -1)
        z = residual_operand(geo, inputs)
        z = z.reshape(flat.shape) if geo.has_residual else z.reshape(1, 1, 1)
        _compiled()[1](x, packed, packed_bias, geo.c, *epilogue_args(geo), z, geo.has_residual,
                       flat)
        if geo.k % LANES:  # the activation of a zero sum need not be zero
            out[:, -1, ..., geo.k % LANES:] = 0
        return out

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (0, 0)  # first wherever usable: made for these layers


def algorithms() -> list[Algorithm]:
    return [BlockedPointwiseConv()]
