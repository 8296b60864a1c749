"""Direct convolution with vectors over output channels: weights packed in blocks of 16.

Why it exists.  The other direct kernels put the vector over output pixels, which wastes most
of it on the small images of a network's deep layers (7x7 and 14x14 with 256-512 channels) and
needs a staged copy shaped for each stride.  Here the vector runs over 16 output channels,
the block that makes a float32 AVX-512 register (two AVX2 ones); the weights are packed once
into (group, channel block, C/group * R * S, 16), the "OIhw16o" order of oneDNN and MLAS's
NCHWc kernels, so one aligned vector load gives a tap's weights for 16 output channels.

How.  A job computes 2 channel blocks x 6 output pixels, a tile of 12 vector accumulators held
in registers (a stack buffer, :func:`fastrun_algorithms._common.stack_buffer`): for every
(input channel, tap) it broadcasts 6 input values, loads two weight vectors and does 12 vector
multiply-adds.  Six, not eight: LLVM unrolls the loop twice, and with 8 pixels the 16
accumulators, 16 broadcasts and 4 weight vectors outgrew AVX-512's 32 registers; the spills
it then chose depended on unrelated code in the kernel (1.6x slower after a change to the
epilogue).  Pixels are numbered across rows (the output plane flattened), so an image of
7x7 fills 8 whole tiles and one overlapping tile instead of 7 row tiles with idle lanes,
and each pixel's input address comes from a small table built once per problem, as does each
(channel, tap)'s offset: the loop does no division and no bounds check.  Padded inputs are
first staged into a zero-bordered copy (``(N, C, Hp, Wp)``, kept between calls, so a call
copies only the interior rows, in parallel); unpadded inputs are read where they lie.  The
epilogue (bias, residual, activation) is applied as the tile is stored into the output.

Layouts.  NCHW, and ``nchw16c`` (see :mod:`fastrun_algorithms.layout.blocking`), where the
kernel is shaped like MLAS's NCHWc one: a job computes 4 channel blocks x 6 pixels (24
accumulators), and the loop runs over (input channel block, tap, input channel in the block),
so the 6 inputs of consecutive steps are neighbours in memory (one lane further) and each
step's 4 weight vectors follow the previous ones: the weights are packed as (group, output
block, input block, tap, 16 input channels, 16 output channels).  On the 16-core Xeon host
(2026-11-27, one layer alone, 16 threads) this kernel made 661-942 GFLOP/s on ResNet-18's
stride-1 3x3 layers and 500-855 on ResNet-50's 1x1 ones; a scratch kernel of the same loop
with a plain bias + ReLU store made 1190-1200 on the 3x3 layers of 128 and 256 channels
(torch's single-precision GEMM on 2048: 1231), so the epilogue's store is where the rest
lies.  The NCHW path's 2 x 6 tile, driven by an offset per (channel, tap), made 563-685 on
those 3x3 layers.  The staged
copy is blocked too, and a tile is stored as whole 16-lane vectors instead of 16 strided rows.

Edges.  The last pixel tile is shifted back to end at the last pixel, overlapping the one before
it (the overlap is computed twice, identically); a plane of fewer than 6 pixels repeats its last
pixel.  Output channels past a multiple of 16 get zero weights and are not stored; an odd block
count pairs the last block with itself.

Float32 only: 16 float64 lanes are two registers each, and the tile would no longer fit in
the register file; the other algorithms serve float64.

REPRODUCIBLE: every output value is summed in (channel, tap) order by one job, with FMA
contraction only, whatever the thread count.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
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
    ScratchPool,
    U,
    stack_buffer,
    thread_count,
    vector_registers,
)
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._gemm_common import buffer, item_type, no_bias, operands, readonly
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    bounds,
    epilogue_args,
    epilogue_residual,
    epilogue_value,
    finish_tile,
    residual_operand,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.layout.blocking import BLOCKED, LANES, NCHW, blocks

#: Output pixels per tile: with two blocks, 12 accumulators, enough to keep both multiply-add
#: units of a core busy through their latency, few enough that the loop unrolled twice still
#: fits AVX-512's 32 registers (see the module docstring).
PIXELS = 6
#: Elements of one job's tile: a global, so that numba sees the literal the stack buffer needs.
TILE = 2 * PIXELS * LANES


def _blocked_tile(registers: int, lanes: int) -> tuple[int, int]:
    """(output channel blocks, pixels) of one job's ``nchw16c`` tile, for vector registers of
    ``lanes`` float32 lanes.

    Where a 16-lane block is one register and there are 32 (AVX-512): 4 blocks x 6 pixels,
    24 accumulators, 4 weight vectors and a broadcast, 29 of the 32 registers; in a scratch
    kernel of the same loop on the Xeon, tiles of 2 x 6, 2 x 8, 4 x 4, 3 x 6 and 1 x 14 were
    slower.  Elsewhere one block of 4 pixels: with AVX2's 16 registers a block takes two, and
    LLVM keeps a tile's broadcasts in registers for both halves of the block, so 1 x 6 needed
    12 accumulators and 6 broadcasts and spilled, and 4 x 6 spilled throughout (2-5x the NCHW
    kernels' time on MobileNetV3's 1x1 layers on the 2-core AVX2 VM); 1 x 4 takes 8
    accumulators, 4 broadcasts and 2 weight vectors, and ran those layers at 1.1-2.2x the
    NCHW kernels' time (the most on the wide planes of 16-24 input channels, where a tile's
    set-up and store outweigh its 16-24 multiply-adds per output)."""
    if registers >= 32 and lanes >= LANES:
        return 4, PIXELS
    return 1, 4


BLOCKED_BLOCKS, BLOCKED_PIXELS = _blocked_tile(*vector_registers())
#: Elements of the ``nchw16c`` tile.
BLOCKED_TILE = BLOCKED_BLOCKS * BLOCKED_PIXELS * LANES


@numba.njit(inline="always")
def _fma_tile(acc, b, t, x0, x1, x2, x3, x4, x5, wa, wb):
    """Lane ``t`` of blocks ``b`` and ``b + 1`` of the tile: ``acc[b + i, p, t] += x_p * w_i``
    for 6 pixels.  Called in a loop over t, each line becomes one vector multiply-add of a
    broadcast pixel (``b`` is a constant where it is inlined)."""
    acc[b, 0, t] += x0 * wa
    acc[b, 1, t] += x1 * wa
    acc[b, 2, t] += x2 * wa
    acc[b, 3, t] += x3 * wa
    acc[b, 4, t] += x4 * wa
    acc[b, 5, t] += x5 * wa
    acc[b + 1, 0, t] += x0 * wb
    acc[b + 1, 1, t] += x1 * wb
    acc[b + 1, 2, t] += x2 * wb
    acc[b + 1, 3, t] += x3 * wb
    acc[b + 1, 4, t] += x4 * wb
    acc[b + 1, 5, t] += x5 * wb


@numba.njit(inline="always")
def _per_group(blocks, base):
    """Jobs per group: block pairs times pixel tiles."""
    return (blocks + 1) // 2 * ((base.shape[0] + PIXELS - 1) // PIXELS)


@numba.njit(inline="always")
def _job(job, per_image, blocks, base):
    """(image, group, first block, second block, first pixel) of job number ``job``, numbered
    (image, group, block pair, pixel tile) so that one worker's contiguous share of them
    reuses one block pair's weights from cache across consecutive tiles.  The last tile is
    shifted back to end at the last pixel; an odd block count pairs the last block with
    itself."""
    tiles = (base.shape[0] + PIXELS - 1) // PIXELS
    per_group = (blocks + 1) // 2 * tiles
    n = job // per_image
    rest = job - n * per_image
    g = rest // per_group
    rest -= g * per_group
    pair = rest // tiles
    p0 = min((rest - pair * tiles) * PIXELS, base.shape[0] - PIXELS)
    b0 = 2 * pair
    return n, g, b0, min(b0 + 1, blocks - 1), p0


@numba.njit(inline="always")
def _accumulate(acc, xs, n, packed, g, b0, b1, base, p0, origin, taps):
    """The tile of image n, group g, blocks b0 and b1 and pixels p0..p0+5, from zero: for
    every (input channel, tap) 6 input values (offsets from the tables) times two weight
    vectors."""
    for i in range(2):
        for p in range(PIXELS):
            for t in range(LANES):
                acc[i, p, t] = 0
    o0, o1 = base[p0] + origin, base[p0 + 1] + origin
    o2, o3 = base[p0 + 2] + origin, base[p0 + 3] + origin
    o4, o5 = base[p0 + 4] + origin, base[p0 + 5] + origin
    for d in range(packed.shape[2]):
        q = taps[d]
        x0, x1 = xs[n, U(o0 + q)], xs[n, U(o1 + q)]
        x2, x3 = xs[n, U(o2 + q)], xs[n, U(o3 + q)]
        x4, x5 = xs[n, U(o4 + q)], xs[n, U(o5 + q)]
        for t in range(LANES):
            _fma_tile(acc, 0, t, x0, x1, x2, x3, x4, x5, packed[g, b0, d, U(t)],
                      packed[g, b1, d, U(t)])


def _pack_kernel(w: np.ndarray, packed: np.ndarray) -> None:
    """``packed[g, b, (c*R + r)*S + s, t] = w[g*kg + b*16 + t, c, r, s]``, zero past kg."""
    k_total, cg, kernel_h, kernel_w = w.shape
    group, blocks, depth = packed.shape[0], packed.shape[1], packed.shape[2]
    kg = k_total // group
    for gb in prange(group * blocks):
        g = gb // blocks
        b = gb - g * blocks
        for t in range(LANES):
            k = b * LANES + t
            if k < kg:
                for c in range(cg):
                    for r in range(kernel_h):
                        for s in range(kernel_w):
                            packed[g, b, (c * kernel_h + r) * kernel_w + s, t] = \
                                w[g * kg + k, c, r, s]
            else:
                for d in range(depth):
                    packed[g, b, d, t] = 0


@numba.njit(inline="always")
def _fma_pixels(acc, b, t, x0, x1, x2, x3, x4, x5, w):
    """Lane ``t`` of block ``b`` of the ``nchw16c`` tile: ``acc[b, p, t] += x_p * w`` for its
    :data:`BLOCKED_PIXELS` pixels (a constant: the test compiles away)."""
    acc[b, 0, t] += x0 * w
    acc[b, 1, t] += x1 * w
    acc[b, 2, t] += x2 * w
    acc[b, 3, t] += x3 * w
    if BLOCKED_PIXELS == 6:
        acc[b, 4, t] += x4 * w
        acc[b, 5, t] += x5 * w


@numba.njit(inline="always")
def _step4(acc, xs, n, q, o, packed, g, b0, b1, b2, b3, cb, d, i):
    """One input channel of one tap for the ``nchw16c`` tile: a broadcast per pixel (``o``:
    the pixels' offsets), a weight vector per block and a multiply-add per pixel and block
    (:data:`BLOCKED_BLOCKS`, a constant: the tests on it compile away)."""
    x0, x1 = xs[n, U(o[0] + q)], xs[n, U(o[1] + q)]
    x2, x3 = xs[n, U(o[2] + q)], xs[n, U(o[3] + q)]
    x4, x5 = x3, x3
    if BLOCKED_PIXELS == 6:
        x4, x5 = xs[n, U(o[4] + q)], xs[n, U(o[5] + q)]
    for t in range(LANES):
        _fma_pixels(acc, 0, t, x0, x1, x2, x3, x4, x5, packed[g, b0, cb, d, i, U(t)])
        if BLOCKED_BLOCKS >= 2:
            _fma_pixels(acc, 1, t, x0, x1, x2, x3, x4, x5, packed[g, b1, cb, d, i, U(t)])
        if BLOCKED_BLOCKS == 4:
            _fma_pixels(acc, 2, t, x0, x1, x2, x3, x4, x5, packed[g, b2, cb, d, i, U(t)])
            _fma_pixels(acc, 3, t, x0, x1, x2, x3, x4, x5, packed[g, b3, cb, d, i, U(t)])


def _pack_blocked_kernel(w: np.ndarray, packed: np.ndarray) -> None:
    """``packed[g, b, cb, r*S + s, i, t] = w[g*kg + b*16 + t, cb*16 + i, r, s]``, zero past kg
    and past C/group."""
    k_total, cg, kernel_h, kernel_w = w.shape
    group, blocks, in_blocks = packed.shape[0], packed.shape[1], packed.shape[2]
    kg = k_total // group
    for gb in prange(group * blocks):
        g = gb // blocks
        b = gb - g * blocks
        for cb in range(in_blocks):
            for r in range(kernel_h):
                for s in range(kernel_w):
                    for i in range(LANES):
                        c = cb * LANES + i
                        for t in range(LANES):
                            k = b * LANES + t
                            packed[g, b, cb, r * kernel_w + s, i, t] = \
                                w[g * kg + k, c, r, s] if k < kg and c < cg else 0


def _stage_kernel(x: np.ndarray, staged: np.ndarray, pt: int, pl: int) -> None:
    """``staged[n, c, h, w] = x[n, c, h - pt, w - pl]`` inside the border; the border is
    zero from when the buffer was made (:class:`ScratchPool` keeps it) and is not written.
    Parallel over input rows: a blocked tensor has few planes (4 for 64 channels), too few
    for 16 threads."""
    batch, channels, height, width = x.shape
    # the staged rows and columns end where the last output reads: input past them is unused
    read_rows = min(height, staged.shape[2] - pt)
    read_cols = min(width, staged.shape[3] - pl)
    rows = batch * channels * read_rows
    for row in prange(rows):
        plane = row // read_rows
        ih = row - plane * read_rows
        n = plane // channels
        c = plane - n * channels
        for v in range(read_cols):
            staged[n, c, ih + pt, v + pl] = x[n, c, ih, v]


def _compute_kernel(xs: np.ndarray, packed: np.ndarray, base: np.ndarray, taps: np.ndarray,
                    group_stride: int, bias: np.ndarray, has_bias: bool, code: int, low: float,
                    high: float, z: np.ndarray, has_residual: bool, out: np.ndarray) -> None:
    """``out`` (N, K, P) from the input planes ``xs`` (N, C*plane): ``base[p]`` is output pixel
    p's input offset within a plane (at least 6 entries), ``taps[(c*R + r)*S + s]`` the offset
    of a group's channel c's tap (r, s), and ``group_stride`` the offset between groups; jobs
    as :func:`_job` numbers them.
    """
    batch, k_total, pixels = out.shape
    group, blocks = packed.shape[0], packed.shape[1]
    kg = k_total // group
    per_image = group * _per_group(blocks, base)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    bounded, floor, ceiling = bounds(code, low, high, out)
    for job in prange(batch * per_image):
        n, g, b0, b1, p0 = _job(job, per_image, blocks, base)
        acc = numba.carray(stack_buffer(TILE, out.dtype), (2, PIXELS, LANES))
        _accumulate(acc, xs, n, packed, g, b0, b1, base, p0, g * group_stride, taps)
        last = min(PIXELS, pixels - p0)
        filled = 2 if b1 > b0 else 1  # channel blocks this job computes
        # The sums plus bias (and residual) copied out of the register tile, finished in one
        # loop, then stored transposed (epilogue.store_tile says why).
        scratch = numba.carray(stack_buffer(TILE, out.dtype), (TILE,))
        for i in range(filled):
            kb = g * kg + (b0 + i) * LANES
            lanes = min(LANES, kg - (b0 + i) * LANES)
            for p in range(last):
                for t in range(lanes):
                    v = acc[i, p, t] + (bias[kb + t] if has_bias else bias[0] - bias[0])
                    scratch[(i * PIXELS + p) * LANES + t] = (v + z[n, kb + t, p0 + p]
                                                             if has_residual else v)
        finish_tile(scratch, filled * PIXELS * LANES, bounded, floor, ceiling, code, low_v,
                    high_v)
        for i in range(filled):
            kb = g * kg + (b0 + i) * LANES
            for t in range(min(LANES, kg - (b0 + i) * LANES)):
                for p in range(last):
                    out[n, kb + t, p0 + p] = scratch[(i * PIXELS + p) * LANES + t]


@numba.njit(inline="always")
def _accumulate4(acc, xs, n, g, b0, p0, packed, base, taps, group_stride, plane, cg):
    """The ``nchw16c`` tile of image ``n``, group ``g``, blocks from ``b0`` and pixels from
    ``p0``, from zero (see :func:`_compute_blocked_kernel`)."""
    blocks, in_blocks, ntaps = packed.shape[1], packed.shape[2], packed.shape[3]
    b1, b2, b3 = min(b0 + 1, blocks - 1), min(b0 + 2, blocks - 1), min(b0 + 3, blocks - 1)
    for i in range(BLOCKED_BLOCKS):
        for p in range(BLOCKED_PIXELS):
            for t in range(LANES):
                acc[i, p, t] = 0
    origin = g * group_stride
    o = (base[p0] + origin, base[p0 + 1] + origin, base[p0 + 2] + origin,
         base[p0 + 3] + origin, base[min(p0 + 4, base.shape[0] - 1)] + origin,
         base[min(p0 + 5, base.shape[0] - 1)] + origin)
    for cb in range(in_blocks):
        lanes = min(LANES, cg - cb * LANES)
        for d in range(ntaps):
            offset = cb * plane + taps[d]
            if lanes == LANES:  # a whole block: a constant trip count
                for i in range(LANES):
                    _step4(acc, xs, n, offset + i, o, packed, g, b0, b1, b2, b3, cb, d, i)
            else:
                for i in range(lanes):
                    _step4(acc, xs, n, offset + i, o, packed, g, b0, b1, b2, b3, cb, d, i)


@numba.njit(inline="always")
def _store(out, acc, z, n, ob, q, i, p, t, b, code, low, high):
    """One output value of the ``nchw16c`` tile, with the residual unless ``z`` is None (a
    test that compiles away: None is a type of its own)."""
    if z is None:
        out[n, ob, q, t] = epilogue_value(acc[i, p, t], b, code, low, high)
    else:
        out[n, ob, q, t] = epilogue_residual(acc[i, p, t], b, z[n, ob, q, t], code, low, high)


def _compute_blocked_kernel(xs: np.ndarray, packed: np.ndarray, base: np.ndarray,
                            taps: np.ndarray, group_stride: int, plane: int, cg: int,
                            bias: np.ndarray, has_bias: bool, code: int, low: float, high: float,
                            k_total: int, z: np.ndarray | None, out: np.ndarray) -> None:
    """The ``nchw16c`` kernel: ``out`` (N, K/16, P, 16) from the blocked input planes ``xs``
    (N, C/16 * plane) and the weights packed by :func:`_pack_blocked_kernel`, plus the residual
    ``z`` (laid out as ``out``) unless it is None; ``base[p]`` is output pixel p's input offset
    within a block's plane, ``taps[r*S + s]`` the offset of tap (r, s), ``group_stride`` the
    offset between groups.  Jobs are numbered (image, group, :data:`BLOCKED_BLOCKS` output
    blocks, pixel tile), so that one worker's consecutive jobs reuse the same weights; an
    output block count that is not a multiple of :data:`BLOCKED_BLOCKS` repeats its last block
    in the last job (computed, not stored).  Lanes past K are not written (the caller zeroes
    them), and input lanes past C/group are never read (they may hold anything).  A group's
    channels start on a block boundary (group 1, or C/group and K/group multiples of 16).

    A whole tile is stored with constant trip counts, and the residual's test
    is decided when the kernel compiles (``z`` typed None or an array: two compiled variants):
    with that branch or variable counts in this loop LLVM kept the accumulators in memory (4x
    slower)."""
    batch, _, pixels, _ = out.shape
    group, blocks = packed.shape[0], packed.shape[1]
    # tiles of the plane's own pixels: ``base`` is padded to 6 entries for planes of fewer,
    # which a 4-pixel tile would otherwise cover twice
    tiles = (pixels + BLOCKED_PIXELS - 1) // BLOCKED_PIXELS
    per_group = (blocks + BLOCKED_BLOCKS - 1) // BLOCKED_BLOCKS * tiles
    per_image = group * per_group
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    zero = out.dtype.type(0)
    for job in prange(batch * per_image):
        acc = numba.carray(stack_buffer(BLOCKED_TILE, out.dtype),
                           (BLOCKED_BLOCKS, BLOCKED_PIXELS, LANES))
        n = job // per_image
        rest = job - n * per_image
        g = rest // per_group
        rest -= g * per_group
        quad = rest // tiles
        b0 = BLOCKED_BLOCKS * quad
        p0 = min((rest - quad * tiles) * BLOCKED_PIXELS, base.shape[0] - BLOCKED_PIXELS)
        _accumulate4(acc, xs, n, g, b0, p0, packed, base, taps, group_stride, plane, cg)
        last = min(BLOCKED_PIXELS, pixels - p0)
        for i in range(min(BLOCKED_BLOCKS, blocks - b0)):
            ob = g * blocks + b0 + i
            k0 = ob * LANES
            if last == BLOCKED_PIXELS and k0 + LANES <= k_total:  # a whole tile
                for t in range(LANES):
                    b = bias[U(k0 + t)] if has_bias else zero
                    for p in range(BLOCKED_PIXELS):
                        _store(out, acc, z, n, ob, U(p0 + p), i, p, t, b, code, low_v, high_v)
            else:
                for t in range(min(LANES, k_total - k0)):
                    b = bias[U(k0 + t)] if has_bias else zero
                    for p in range(last):
                        _store(out, acc, z, n, ob, U(p0 + p), i, p, t, b, code, low_v, high_v)


#: The zero-bordered staged inputs of padded problems, kept from one call to the next.
_SCRATCH = ScratchPool()


@functools.cache
def _compiled() -> tuple[Callable[..., None], ...]:
    """(pack, pack_blocked, stage, compute, compute_blocked) for float32, compiled (or loaded
    from numba's cache) on first use.  Inputs of any layout share one variant of each pack and
    of stage (each reads them once); the compute kernels take only C-contiguous arrays, whose
    strides LLVM then knows."""
    f32 = np.dtype(np.float32)
    intp = types.intp
    c_in = functools.partial(types.Array, item_type(f32), layout="C", readonly=True)
    pack = numba.njit(types.void(readonly(f32, 4), buffer(f32, 4)), parallel=True,
                      cache=CACHE)(_pack_kernel)
    pack_blocked = numba.njit(types.void(readonly(f32, 4), buffer(f32, 6)), parallel=True,
                              cache=CACHE)(_pack_blocked_kernel)
    stage = numba.njit(types.void(readonly(f32, 4), buffer(f32, 4), intp, intp), parallel=True,
                       cache=CACHE)(_stage_kernel)
    index = types.Array(types.int64, 1, "C", readonly=True)
    head = (c_in(ndim=2), c_in(ndim=4), index, index, intp, readonly(f32, 1), types.boolean,
            intp, types.float64, types.float64)
    compute = numba.njit(
        types.void(*head, c_in(ndim=3), types.boolean, buffer(f32, 3)),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_compute_kernel)
    blocked_head = (c_in(ndim=2), c_in(ndim=6), index, index, intp, intp, intp, *head[5:], intp)
    compute_blocked = numba.njit(
        [types.void(*blocked_head, residual, buffer(f32, 4))
         for residual in (types.none, c_in(ndim=4))],
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_compute_blocked_kernel)
    return pack, pack_blocked, stage, compute, compute_blocked


class _Plan:
    """What one problem's calls share: the staged planes' shape, the pixel and tap offset
    tables (read-only, built once per problem) and the packed weights' shape.

    In ``nchw16c`` every offset is in elements of the blocked tensor: a pixel is 16 elements
    wide, channel c sits in block c // 16 at lane c % 16, and the staged copy is blocked too;
    the kernel walks the channels of a block itself, so the tap table has one entry per tap.
    """

    def __init__(self, geo: ConvGeometry):
        #: whether the input needs a zero-bordered copy (any padding); otherwise the kernel
        #: reads X where it lies
        self.staged = any((geo.pad_top, geo.pad_left, geo.pad_bottom, geo.pad_right))
        if self.staged:
            self.rows = (geo.oh - 1) * geo.stride_h + (geo.r - 1) * geo.dil_h + 1
            self.cols = (geo.ow - 1) * geo.stride_w + (geo.s - 1) * geo.dil_w + 1
        else:
            self.rows, self.cols = geo.h, geo.w
        #: elements per pixel: 16 channels in nchw16c, one in NCHW
        self.step = LANES if geo.blocked else 1
        plane = self.rows * self.cols * self.step
        base = [(oh * geo.stride_h * self.cols + ow * geo.stride_w) * self.step
                for oh in range(geo.oh) for ow in range(geo.ow)]
        base += base[-1:] * (PIXELS - len(base))  # a plane of fewer than 6 pixels
        self.base = _frozen(base)
        self.plane = plane
        if geo.blocked:
            self.group_stride = geo.cg // LANES * plane  # groups start on block boundaries
            self.staged_shape = (geo.n, blocks(geo.c), self.rows, self.cols, LANES)
            #: the offset of each tap (r, s) within a block's plane
            self.taps = _frozen([(r * geo.dil_h * self.cols + s * geo.dil_w) * self.step
                                 for r in range(geo.r) for s in range(geo.s)])
            self.packed_shape = (geo.group, -(-geo.kg // LANES), -(-geo.cg // LANES),
                                 geo.r * geo.s, LANES, LANES)
        else:
            self.group_stride = geo.cg * plane
            self.staged_shape = (geo.n, geo.c, self.rows, self.cols)
            #: the offset of each (channel, tap) within a group
            self.taps = _frozen([c * plane + (r * geo.dil_h * self.cols + s * geo.dil_w)
                                 for c in range(geo.cg) for r in range(geo.r)
                                 for s in range(geo.s)])
            self.packed_shape = (geo.group, -(-geo.kg // LANES), geo.cg * geo.r * geo.s, LANES)


def _frozen(values: list[int]) -> np.ndarray:
    table = np.array(values, dtype=np.int64)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=1024)
def _plan(problem: Problem) -> _Plan:
    return _Plan(geometry(problem))


class BlockedDirectConv(RunsThroughBind, ConvAlgorithm):
    """Direct convolution with 16-channel weight blocks and register tiles of 2 blocks x 6
    pixels (see the module docstring); float32, any group, stride, dilation and padding."""

    operator = "conv"
    name = "blocked_direct"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the NCHW store's epilogue in vector loops; 3: over the whole tile at once
    #: (``epilogue.finish_tile``)
    version = 3

    layouts = (NCHW, BLOCKED)
    #: where the staged inputs of padded problems are kept between calls
    scratch = _SCRATCH

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        if problem.dtypes[0] != "float32":
            return (f"blocked_direct computes float32 only (got {problem.dtypes[0]}): its tile "
                    f"of 16-lane blocks would not fit the vector registers in float64")
        geo = geometry(problem)
        if geo.blocked and geo.group > 1 and (geo.cg % LANES or geo.kg % LANES):
            return (f"in {BLOCKED} its groups must start on channel blocks: C/group={geo.cg} "
                    f"and K/group={geo.kg} are not multiples of {LANES}")
        return None

    def work(self, problem: Problem) -> float:
        """Whole tiles: each image's pixels in tiles of :data:`PIXELS`, the output channels
        of a group in blocks of 16 lanes."""
        geo = geometry(problem)
        pixel_tiles = -(-geo.oh * geo.ow // PIXELS)
        return float(geo.n * geo.group * pixel_tiles * -(-geo.kg // LANES)
                     * geo.cg * geo.r * geo.s)

    def workspace_bytes(self, problem: Problem) -> int:
        """The staged copy of a padded input (made by the first call of a problem and kept for
        the next, :class:`ScratchPool`), and the packed weights when they are not
        preprocessed.  The offset tables are built once per problem and kept; only an input
        that is not C-contiguous (never one a runtime or the profiler passes) would be copied
        besides."""
        plan = _plan(problem)
        size = 4 * math.prod(plan.staged_shape) if plan.staged else 0
        if not problem.weight_preprocess:
            size += 4 * math.prod(plan.packed_shape)
        return size

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> np.ndarray:
        """The weights packed into 16-channel blocks, (group, blocks, C/group * R * S, 16)."""
        geo = geometry(problem)
        _, w, _ = operands(geo, inputs)
        return self._pack(problem, w)

    @staticmethod
    def _pack(problem: Problem, w: np.ndarray) -> np.ndarray:
        plan = _plan(problem)
        packed = np.empty(plan.packed_shape, dtype=np.float32)
        pack, pack_blocked = _compiled()[:2]
        (pack_blocked if len(plan.packed_shape) == 6 else pack)(w, packed)
        return packed

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        geo = geometry(problem)
        plan = _plan(problem)
        _, _, stage, compute, compute_blocked = _compiled()
        epilogue = epilogue_args(geo)
        staged_view = (*plan.staged_shape[:2], geo.h, -1)

        def call(*inputs: Any) -> np.ndarray:
            x, w, bias = operands(geo, inputs)
            packed = self._pack(problem, w) if prepared is None else prepared
            kept = None
            if plan.staged:
                kept = _SCRATCH.take(problem.key, lambda: (
                    np.zeros(plan.staged_shape, dtype=np.float32),))
                xs = kept[0]
                # nchw16c stages as NCHW planes whose rows are 16 times as wide
                stage(x.reshape(staged_view) if geo.blocked else x,
                      xs.reshape(*plan.staged_shape[:3], -1), geo.pad_top,
                      geo.pad_left * plan.step)
            else:
                xs = np.ascontiguousarray(x)
            z = residual_operand(geo, inputs)
            bias_args = (no_bias(np.dtype(np.float32)) if bias is None else bias,
                         bias is not None)
            if geo.blocked:
                out = np.empty(geo.out_shape, dtype=np.float32)
                if geo.has_residual:
                    z = z.reshape(*z.shape[:2], -1, LANES)
                compute_blocked(xs.reshape(geo.n, -1), packed, plan.base, plan.taps,
                                plan.group_stride, plan.plane, geo.cg, *bias_args, *epilogue,
                                geo.k, z if geo.has_residual else None,
                                out.reshape(geo.n, -1, geo.oh * geo.ow, LANES))
                if geo.k % LANES:
                    out[:, -1, ..., geo.k % LANES:] = 0
                if kept is not None:
                    _SCRATCH.give(problem.key, kept)
                return out
            out = np.empty((geo.n, geo.k, geo.oh * geo.ow), dtype=np.float32)
            compute(xs.reshape(geo.n, -1), packed, plan.base, plan.taps, plan.group_stride,
                    *bias_args, *epilogue, z.reshape(z.shape[0], z.shape[1], -1),
                    geo.has_residual, out)
            if kept is not None:
                _SCRATCH.give(problem.key, kept)
            return geo.output_view(out.reshape(geo.n, geo.k, geo.oh, geo.ow))
        return call

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        if geo.kg < heuristic.BLOCKED_MIN_CHANNELS:
            return (4, 1)
        if heuristic.few_channels(geo):
            return (1, 2.5)
        if thread_count() >= heuristic.BLOCKED_MIN_THREADS:
            if (geo.r, geo.s) == (1, 1) and geo.n == 1 \
                    and geo.cg >= heuristic.BLOCKED_MIN_DEPTH_1X1:
                return (0, 0.5)
            if geo.n * geo.oh * geo.ow < heuristic.BLOCKED_MAX_WINOGRAD_PIXELS:
                return (1, -1)
        return (2, 0)


def algorithms() -> list[Algorithm]:
    return [BlockedDirectConv()]
