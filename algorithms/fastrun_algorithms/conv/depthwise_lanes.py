"""Depthwise convolution of NCHW tensors with vectors over 16 channels, transposed in the task.

Why it exists.  In NCHW a depthwise layer is one plane per channel, and a vector over a plane's
pixels suits only wide planes: MobileNet's deep layers (14x14 and 7x7 planes of hundreds of
channels) leave it mostly idle, and ``depthwise``'s flat mode spends its time staging and
re-indexing.  ``blocked_depthwise`` puts the vector over 16 channels instead, which serves any
plane size, but needs the ``nchw16c`` layout, which a model's planner grants only where the
layers around the conv pay for the conversions (and by default not at all).  This algorithm
brings the vector over channels to an NCHW model, one step at a time: each task transposes
the 16 channels it computes into a small padded block of its own (channels minor) while
staging it, computes every output pixel of the block with one vector multiply-add per tap, and
transposes the results back as it stores them, all in one parallel region.

Each layer alone on 2 threads (the 2-core VM, AVX2; ``heuristic.DEPTHWISE_LANES_MAX_WIDTH``
and docs/performance.md have the figures): 0.35-0.65 of ``depthwise``'s time on 14x14 and 7x7
planes, 2.5x it at 56x56, so the search decides.  Whole-tensor reorders around
``blocked_depthwise`` took 146 us on a 576 x 14x14 3x3 layer (133 here, separate runs) and
435 on a 480 x 14x14 5x5 one (205 here): the blocked kernel has a 3x3 path of its own and a
general one for the rest.

How.  A task is (image, block of 16 channels, block of output rows).  The staged block holds
the input rows the output rows read, with the padding as zeros, so every output pixel is
interior.  A pixel's taps are one expression per lane (the 3x3, 5x5 and 7x7 kernels each have
their own), summed into a stack tile, and its 16 lanes stored to their 16 planes.  Relu and
clip are bounds applied in that expression as selects; the other activations run once the
task's rows are stored, over each plane's run of them (``epilogue.activate_in_place``), since a
switch over the activation codes inside the lane loop kept it scalar (with that switch for
every activation the kernel took 1.7-2.7x as long on the layers of docs/performance.md, and
over each pixel's 16 lanes a 5x5 HardSwish layer still 3.3x).  X, the output and the staged
block are indexed flat, with the lane count a constant.  When C is not a multiple of 16 the
last block starts at C - 16 and overlaps the one before it (those channels are computed twice
and stored once, by the earlier block); fewer than 16 channels are refused.  The weights are
packed once into (blocks, R*S, 16) with the bias (weight preprocessing).  Each thread stages
into a buffer of its own, kept between calls (:class:`ScratchPool`).

Float32, channel multiplier 1 (K == C == group), square 3x3, 5x5 or 7x7 kernels, no residual;
any stride, dilation and padding.  REPRODUCIBLE: each output sums its taps in a fixed order
in one task, whatever the thread count.
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
from fastrun_algorithms._common import (
    CACHE,
    FASTMATH,
    PARTS_PER_THREAD,
    RunsThroughBind,
    ScratchPool,
    U,
    stack_buffer,
    thread_count,
)
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._kernels_common import (
    input_and_output,
    per_thread_count,
    staged_columns,
    staged_rows,
    task_rows,
)
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import activate_in_place, bounds, clamp, epilogue_args
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.layout.blocking import LANES, blocks

# A task's channels are LANES (16, one float32 vector of AVX-512, two of AVX2), as many as a
# block of the channel-blocked layout, whose count ``blocks`` gives.

#: The kernel sizes (square) with a kernel of their own.
KERNELS = (3, 5, 7)
#: Output positions a task covers at most, so that its staged block stays in L2.
BLOCK_OUTPUTS = 1024

#: The per-thread staged blocks of the problems run so far.
_SCRATCH = ScratchPool()


@numba.njit(inline="always")
def _block_start(block, channels):
    """The first channel of ``block``: the last block ends at the last channel, overlapping
    the one before it when C is not a multiple of 16."""
    return min(block * LANES, channels - LANES)


def _pack_kernel(w: np.ndarray, bias: np.ndarray, has_bias: bool, packed: np.ndarray,
                 packed_bias: np.ndarray) -> None:
    """``packed[b, r*S + s, t] = w[c, 0, r, s]`` and ``packed_bias[b, t] = bias[c]`` with
    ``c = c0 + t``, block ``b`` starting at ``c0`` (:func:`_block_start`)."""
    channels, _, kernel_h, kernel_w = w.shape
    for b in range(packed.shape[0]):
        c0 = _block_start(b, channels)
        for t in range(LANES):
            for r in range(kernel_h):
                for s in range(kernel_w):
                    packed[b, r * kernel_w + s, t] = w[c0 + t, 0, r, s]
            packed_bias[b, t] = bias[c0 + t] if has_bias else 0


@numba.njit(inline="always")
def _taps3(xs, o, d, w, b, k, t):
    """Lane ``t`` of one kernel row of three taps: staged pixels ``o``, ``o + d``, ``o + 2d``
    times taps ``k`` to ``k + 2`` of block ``b``.  Flat indices with the lane count a
    constant: with a 2-D staged block every tap's index took a multiplication by a row
    length read from memory."""
    return (xs[U(o * LANES + t)] * w[b, U(k * LANES + t)]
            + xs[U((o + d) * LANES + t)] * w[b, U((k + 1) * LANES + t)]) \
        + xs[U((o + 2 * d) * LANES + t)] * w[b, U((k + 2) * LANES + t)]


@numba.njit(inline="always")
def _taps5(xs, o, d, w, b, k, t):
    """Lane ``t`` of one kernel row of five taps (see :func:`_taps3`)."""
    return _taps3(xs, o, d, w, b, k, t) + (
        xs[U((o + 3 * d) * LANES + t)] * w[b, U((k + 3) * LANES + t)]
        + xs[U((o + 4 * d) * LANES + t)] * w[b, U((k + 4) * LANES + t)])


@numba.njit(inline="always")
def _taps7(xs, o, d, w, b, k, t):
    """Lane ``t`` of one kernel row of seven taps (see :func:`_taps3`)."""
    return _taps5(xs, o, d, w, b, k, t) + (
        xs[U((o + 5 * d) * LANES + t)] * w[b, U((k + 5) * LANES + t)]
        + xs[U((o + 6 * d) * LANES + t)] * w[b, U((k + 6) * LANES + t)])


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _tasks(first, last, x, x_shape, packed, packed_bias, size, sh, sw, dh, dw, pt, pl, rows,
           staged_w, code, low, high, xs, out_shape, out):
    """Tasks ``first`` to ``last`` with the running thread's staged block ``xs``; X, the
    output and ``xs`` (positions x 16) flat, so that every index is a sum of offsets, not
    a product with a row length read from memory.  The staged block's columns left and right
    of the input are zero (written when the buffer was made and never since).  ``size``:
    the kernel's (3, 5 or 7, square).  A plain function called from the parallel loop:
    numba's parallel passes then see a one-line loop, which keeps compilation fast."""
    channels, height, width = x_shape[1], x_shape[2], x_shape[3]
    out_h, out_w = out_shape[2], out_shape[3]
    in_plane, out_plane = height * width, out_h * out_w
    nb = packed.shape[0]
    d1 = dh * staged_w  # positions between two kernel rows in the staged block
    tile = numba.carray(stack_buffer(LANES, out.dtype), LANES)
    rblocks = (out_h + rows - 1) // rows
    span = staged_w * sh  # positions between two output rows in the staged block
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    zero = out.dtype.type(0)
    copy_w = min(width, staged_w - pl)
    # none, relu and clip are bounds, applied in the lane loops without a test of the code
    bounded, floor, ceiling = bounds(code, low, high, out)
    for task in range(first, last):
        n = task // (nb * rblocks)
        rest = task - n * nb * rblocks
        b = rest // rblocks
        oy0 = (rest - b * rblocks) * rows
        t_rows = min(rows, out_h - oy0)
        start = _block_start(b, channels)
        first_plane = n * channels + start
        # the lanes this task stores: a last block that overlaps the one before it leaves the
        # shared channels to that block, so no channel is stored (and activated) by two tasks
        # at once: with both storing and then activating, one could activate the other's
        # already activated values a second time (a HardSwish applied twice)
        own = b * LANES - start
        # stage the input rows these output rows read, channels minor
        y_first = oy0 * sh - pt
        staged_h = (t_rows - 1) * sh + (size - 1) * dh + 1
        for sy in range(staged_h):
            y = y_first + sy
            at = (sy * staged_w + pl) * LANES
            if 0 <= y < height:
                # each pixel's 16 lanes together (one vector store, a gather of 16 planes):
                # lane by lane it took twice as long (as ``layout.blocking`` measured)
                src = first_plane * in_plane + y * width
                for ix in range(copy_w):
                    for t in range(LANES):
                        xs[U(at + ix * LANES + t)] = x[U(src + t * in_plane + ix)]
            else:
                for e in range(copy_w * LANES):
                    xs[U(at + e)] = zero
        # every output pixel is interior in the staged block; one pixel's taps are one
        # expression per lane, so the lane loop is a few vector operations with no
        # accumulator in memory
        for ry in range(t_rows):
            o = ry * span
            oy = oy0 + ry
            for ox in range(out_w):
                if size == 3:
                    for t in range(LANES):
                        tile[U(t)] = clamp(
                            packed_bias[b, U(t)] + _taps3(xs, o, dw, packed, b, 0, t)
                            + _taps3(xs, o + d1, dw, packed, b, 3, t)
                            + _taps3(xs, o + 2 * d1, dw, packed, b, 6, t), floor, ceiling)
                elif size == 5:
                    for t in range(LANES):
                        tile[U(t)] = clamp(
                            packed_bias[b, U(t)] + _taps5(xs, o, dw, packed, b, 0, t)
                            + _taps5(xs, o + d1, dw, packed, b, 5, t)
                            + _taps5(xs, o + 2 * d1, dw, packed, b, 10, t)
                            + _taps5(xs, o + 3 * d1, dw, packed, b, 15, t)
                            + _taps5(xs, o + 4 * d1, dw, packed, b, 20, t), floor, ceiling)
                else:
                    for t in range(LANES):
                        tile[U(t)] = clamp(
                            packed_bias[b, U(t)] + _taps7(xs, o, dw, packed, b, 0, t)
                            + _taps7(xs, o + d1, dw, packed, b, 7, t)
                            + _taps7(xs, o + 2 * d1, dw, packed, b, 14, t)
                            + _taps7(xs, o + 3 * d1, dw, packed, b, 21, t)
                            + _taps7(xs, o + 4 * d1, dw, packed, b, 28, t)
                            + _taps7(xs, o + 5 * d1, dw, packed, b, 35, t)
                            + _taps7(xs, o + 6 * d1, dw, packed, b, 42, t), floor, ceiling)
                dst = first_plane * out_plane + oy * out_w + ox
                for t in range(own, LANES):
                    out[U(dst + t * out_plane)] = tile[U(t)]
                o += sw
        if not bounded:
            # the other activations over the task's stored rows, plane by plane, in loops of
            # their own: in the lane loops above their test of the code kept the taps scalar,
            # and over each pixel's 16 lanes a 5x5 layer still took 2.5-3.3x its time without
            for t in range(own, LANES):
                activate_in_place(out, (first_plane + t) * out_plane + oy0 * out_w,
                                  t_rows * out_w, code, low_v, high_v)


def _kernel(x, packed, packed_bias, size, sh, sw, dh, dw, pt, pl, rows, staged_w, code, low,
            high, stage_ws, out):
    """``out = act(conv(x, w) + bias)`` over every task, thread ``t`` staging into
    ``stage_ws[t]``; tasks are dealt in small parts to whichever thread is free."""
    x1, out1 = x.reshape(x.size), out.reshape(out.size)
    tasks = out.shape[0] * packed.shape[0] * ((out.shape[2] + rows - 1) // rows)
    parts = min(tasks, PARTS_PER_THREAD * stage_ws.shape[0])
    for part in prange(parts):
        thread = numba.get_thread_id()
        _tasks(part * tasks // parts, (part + 1) * tasks // parts, x1, x.shape, packed,
               packed_bias, size, sh, sw, dh, dw, pt, pl, rows, staged_w, code, low, high,
               stage_ws[thread], out.shape, out1)


@functools.cache
def _compiled() -> tuple[Callable[..., None], Callable[..., None]]:
    """The packing and the convolution, float32, compiled (or loaded from numba's cache) on
    first use."""
    f32 = types.float32
    c4 = functools.partial(types.Array, f32, 4, "C")
    pack = numba.njit(types.void(types.Array(f32, 4, "A", readonly=True),
                                 types.Array(f32, 1, "A", readonly=True), types.boolean,
                                 types.Array(f32, 3, "C"), types.Array(f32, 2, "C")),
                      cache=CACHE)(_pack_kernel)
    ints = [types.intp] * 9
    signature = types.void(c4(readonly=True), types.Array(f32, 2, "C", readonly=True),
                           types.Array(f32, 2, "C", readonly=True), *ints,
                           types.intp, types.float64, types.float64, types.Array(f32, 2, "C"),
                           c4())
    conv = numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(_kernel)
    return pack, conv


class DepthwiseLanesConv(RunsThroughBind, ConvAlgorithm):
    """NCHW depthwise convolution with vectors over 16 channels (see the module docstring)."""

    operator = "conv"
    name = "depthwise_lanes"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the activations other than relu and clip over the stored rows, 2.5-3.3x faster on
    #: 5x5 HardSwish and sigmoid layers
    version = 2
    #: where its per-thread staged blocks are kept between calls
    scratch = _SCRATCH

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if geo.dtype != "float32":
            return f"depthwise_lanes computes float32 only (got {geo.dtype})"
        if not geo.is_depthwise or geo.k != geo.c:
            return (f"depthwise_lanes needs group == C == K (one channel per group, "
                    f"multiplier 1); got C={geo.c}, K={geo.k}, group={geo.group}")
        if geo.r != geo.s or geo.r not in KERNELS:
            return (f"depthwise_lanes needs a square kernel of {', '.join(map(str, KERNELS))} "
                    f"(got {geo.r}x{geo.s})")
        if geo.c < LANES:
            return f"depthwise_lanes needs at least {LANES} channels (got {geo.c})"
        if geo.has_residual:
            return "depthwise_lanes does not add a residual"
        return None

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        """Before ``depthwise`` on narrow output rows, after it on wide ones
        (:data:`~fastrun_algorithms.conv.heuristic.DEPTHWISE_LANES_MAX_WIDTH`)."""
        return (0, -1) if geo.ow < heuristic.DEPTHWISE_LANES_MAX_WIDTH else (0, 1)

    @staticmethod
    def row_block(geo: ConvGeometry) -> int:
        """Output rows per task: at most :data:`BLOCK_OUTPUTS` outputs, and enough tasks for
        every thread where the image has few channel blocks."""
        return task_rows(geo, geo.n * blocks(geo.c), BLOCK_OUTPUTS)

    def _stage_positions(self, geo: ConvGeometry) -> int:
        return staged_rows(geo, self.row_block(geo)) * staged_columns(geo)

    def workspace_bytes(self, problem: Problem) -> int:
        """Per numba thread, one staged block of 16 channels, kept for the next call of the
        same problem; and the packed weights and bias unless they are preprocessed."""
        geo = geometry(problem)
        staged = thread_count() * self._stage_positions(geo) * LANES * 4
        packed = 0 if problem.weight_preprocess else (
            4 * blocks(geo.c) * LANES * (geo.r * geo.s + 1))
        return staged + packed

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The weights as (blocks, R*S, 16) and the bias as (blocks, 16)."""
        geo = geometry(problem)
        w = np.asarray(inputs[1]).reshape(geo.k, 1, geo.r, geo.s)
        bias = np.asarray(inputs[2]) if geo.has_bias else np.zeros(1, np.float32)
        packed = np.empty((blocks(geo.c), geo.r * geo.s, LANES), dtype=np.float32)
        packed_bias = np.empty((blocks(geo.c), LANES), dtype=np.float32)
        _compiled()[0](w, bias, geo.has_bias, packed, packed_bias)
        return packed, packed_bias

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        geo = geometry(problem)
        kernel = _compiled()[1]
        head = (geo.r, geo.stride_h, geo.stride_w, geo.dil_h, geo.dil_w, geo.pad_top,
                geo.pad_left)
        tail = (staged_columns(geo), *epilogue_args(geo))
        # (rows per task, staged floats per thread)
        plan_now = per_thread_count(lambda: (self.row_block(geo),
                                             self._stage_positions(geo) * LANES))

        def call(*inputs: Any) -> np.ndarray:
            packed, packed_bias = self.preprocess(problem, inputs) if prepared is None \
                else prepared
            x, out = input_and_output(geo, inputs)
            threads, (rows, staged) = plan_now()
            key = (problem.key, threads)
            buffers = _SCRATCH.take(key, lambda: (np.zeros((threads, staged), np.float32),))
            kernel(x, packed.reshape(packed.shape[0], -1), packed_bias, *head, rows, *tail,
                   *buffers, out)
            _SCRATCH.give(key, buffers)
            return geo.output_view(out)
        return call


def algorithms() -> list[Algorithm]:
    return [DepthwiseLanesConv()]
