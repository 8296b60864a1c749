"""Grouped convolution of NCHW tensors with vectors over a group's output channels.

Why it exists.  RegNet-Y and ResNeXt split their 3x3 layers into groups of 8 to 32 channels,
and such a group is a product too small for the GEMM families: 8 output channels by 72 taps
by 49 pixels at RegNet-Y-400MF's 7x7 stage.  ``im2col`` then spends its time unfolding and
calling a product per group, and ``direct``'s vectors over output rows are mostly idle on
short rows.  Here a task stages one group's input rows (zero padded) and computes register
tiles of pixels by output channels: per tap, one vector of a block's output-channel weights
and one broadcast input value per pixel of the tile, as the 1x1 kernels' tiles do with the
roles of the operands swapped.  The vector length is what a group has to offer (8 or 16
output channels), independent of the image size, so it serves 7x7 planes as well as 56x56.

Measured layer by layer against onnxruntime's Conv (``python -m benchmarks.probe_conv_kernels
--layers grouped``: RegNet-Y-400MF's and ResNeXt-50's grouped 3x3 layers), it runs at
0.95-1.28x onnxruntime's time, where ``direct`` and ``im2col``, the best before it, took
1.5-7x (docs/performance.md).

How. A task is (image, group, block of output rows). It stages its group's input rows, channel
by channel, into a buffer of its own with zeros where the kernel reads padding (the padding
columns are written once, when the buffer is made; it is kept between calls,
:class:`ScratchPool`), so every tap of every output pixel is a read at a fixed offset. Then for
each block of ``cb`` output channels of the group (8 where the group has fewer than 16, else
16; a last block that would pass the group's end starts earlier and overlaps the one before it,
those channels computed twice, identically) and each tile of consecutive pixels of an output
row (a last tile that would pass the row's end ends at it; a row narrower than a tile computes
pixels past it that are not stored) it sums every input channel's taps into the tile, then
stores it with the bias, relu or clip as clamps; the other activations run over the group's
stored rows once all its blocks are stored, a loop per activation
(``epilogue.activate_in_place``). The tile is 8 pixels by 8 channels, or by 16 with 32 vector
registers; 4 by 16 with AVX2's 16 (:func:`fastrun_algorithms._common.register_tile`).

Float32, groups of at least 8 output channels, more than one group, no residual; any kernel,
stride, dilation and padding.  REPRODUCIBLE: each output sums its taps in one fixed order (input
channel, kernel row, kernel column) in one task, whatever the thread count.
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
    ceil_div,
    register_tile,
    stack_buffer,
    thread_count,
    tile_fma4,
    tile_fma8,
)
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

#: Output channels per block: a group of 8 to 15 takes blocks of 8, a larger one blocks of 16.
NARROW, WIDE = 8, 16
#: Pixels of a 16-channel tile: 4 with AVX2's 16 vector registers (two per pixel), 8 with 32.
WIDE_ROWS = register_tile(WIDE)[0]
#: Pixels of an 8-channel tile (one vector, or half of one, per pixel).
NARROW_ROWS = 8
#: Elements of the largest tile, for the stack buffer (a global: numba needs the literal).
TILE = 8 * WIDE
#: Output pixels a task covers at most, so that its staged rows stay in L2.
BLOCK_OUTPUTS = 1024
#: Input channels per group past which the layer is a dense convolution in all but name, and
#: the GEMM families go first in the rule of thumb.
MAX_GROUP_DEPTH = 64

#: The per-thread staged rows of the problems run so far.
_SCRATCH = ScratchPool()


def channel_block(kg: int) -> int:
    """Output channels of a tile for groups of ``kg`` output channels."""
    return NARROW if kg < WIDE else WIDE


@numba.njit(inline="always")
def _tap8(acc, xs, wp, row, q, o, d, sw, cb):
    """Tap ``q`` into an 8-pixel tile of ``cb`` (a literal) channels: the block's weights
    as one vector, and the input value of each pixel (staged positions ``o + i*sw``, the
    tap ``d`` further on) broadcast."""
    x0, x1 = xs[U(o + d)], xs[U(o + sw + d)]
    x2, x3 = xs[U(o + 2 * sw + d)], xs[U(o + 3 * sw + d)]
    x4, x5 = xs[U(o + 4 * sw + d)], xs[U(o + 5 * sw + d)]
    x6, x7 = xs[U(o + 6 * sw + d)], xs[U(o + 7 * sw + d)]
    base = q * cb
    for t in range(cb):
        tile_fma8(acc, t, wp[row, U(base + t)], x0, x1, x2, x3, x4, x5, x6, x7)


@numba.njit(inline="always")
def _tap4(acc, xs, wp, row, q, o, d, sw, cb):
    """Tap ``q`` into a 4-pixel tile (see :func:`_tap8`)."""
    x0, x1 = xs[U(o + d)], xs[U(o + sw + d)]
    x2, x3 = xs[U(o + 2 * sw + d)], xs[U(o + 3 * sw + d)]
    base = q * cb
    for t in range(cb):
        tile_fma4(acc, t, wp[row, U(base + t)], x0, x1, x2, x3)


@numba.njit(inline="always")
def _sum8(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, cb):
    """Every tap into an 8-pixel tile, kernel row by kernel row (``roffs``: each (input
    channel, kernel row)'s staged offset).  Called with a literal kernel width, stride and
    dilation, the taps of a kernel row unroll and the pixels they share are loaded once:
    with three taps at stride 1, ten loads serve 24 multiply-adds instead of 24."""
    for q in range(roffs.shape[0]):
        d = roffs[q]
        for s in range(kernel_w):
            _tap8(acc, xs, wp, row, q * kernel_w + s, o, d + s * dw, sw, cb)


@numba.njit(inline="always")
def _sum4(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, cb):
    """Every tap into a 4-pixel tile (see :func:`_sum8`)."""
    for q in range(roffs.shape[0]):
        d = roffs[q]
        for s in range(kernel_w):
            _tap4(acc, xs, wp, row, q * kernel_w + s, o, d + s * dw, sw, cb)


@numba.njit(inline="always")
def _sum_tile(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, cb, tile_rows):
    """Every tap into the tile of ``tile_rows`` pixels by ``cb`` channels, each shape with
    its channel count as a literal."""
    if tile_rows == 4:
        _sum4(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, WIDE)
    elif cb == WIDE:
        _sum8(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, WIDE)
    else:
        _sum8(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, NARROW)


@numba.njit(inline="always")
def _sum(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, cb, tile_rows):
    """Every tap into the tile, with the kernel row's width, stride and dilation as literals
    for the common rows (three taps, stride 1 or 2, no dilation), else the general loop."""
    if kernel_w == 3 and dw == 1 and sw == 1:
        _sum_tile(acc, xs, wp, row, roffs, o, 3, 1, 1, cb, tile_rows)
    elif kernel_w == 3 and dw == 1 and sw == 2:
        _sum_tile(acc, xs, wp, row, roffs, o, 3, 2, 1, cb, tile_rows)
    else:
        _sum_tile(acc, xs, wp, row, roffs, o, kernel_w, sw, dw, cb, tile_rows)


@numba.njit(inline="always")
def _stage(xs, x, first_plane, cg, in_plane, width, height, y_first, rows_in, staged_w,
           plane, pl, copy_w):
    """The group's input rows ``y_first`` on, ``rows_in`` of them, into ``xs`` (one plane of
    ``plane`` positions per input channel), zeros for rows outside the image; the padding
    columns are zero already."""
    zero = xs.dtype.type(0)
    for j in range(cg):
        src_plane = (first_plane + j) * in_plane
        for sy in range(rows_in):
            y = y_first + sy
            at = j * plane + sy * staged_w + pl
            if 0 <= y < height:
                src = src_plane + y * width
                for ix in range(copy_w):
                    xs[U(at + ix)] = x[U(src + ix)]
            else:
                for ix in range(copy_w):
                    xs[U(at + ix)] = zero


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _tasks(first, last, x, x_shape, wp, bp, roffs, kg, cb, kernel_h, kernel_w, sh, sw, dh, dw,
           pt, pl, rows, staged_w, plane, code, low, high, xs, out_shape, out):
    """Tasks ``first`` to ``last`` with the running thread's staged rows ``xs`` (``plane``
    positions per input channel); X and the output flat (``x_shape``, ``out_shape`` their
    4-D shapes), the weights packed as (group * blocks, taps * cb) and the bias as
    (group * blocks, cb); ``roffs`` holds each (input channel, kernel row)'s staged offset
    from its output pixel's position.  A plain function called from the parallel loop:
    numba's parallel passes then see a one-line loop."""
    channels, height, width = x_shape[1], x_shape[2], x_shape[3]
    k_total, out_h, out_w = out_shape[1], out_shape[2], out_shape[3]
    group = k_total // kg
    cblocks = wp.shape[0] // group
    cg = channels // group
    in_plane, out_plane = height * width, out_h * out_w
    rblocks = (out_h + rows - 1) // rows
    copy_w = min(width, staged_w - pl)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    bounded, floor, ceiling = bounds(code, low, high, out)
    tile_rows = NARROW_ROWS if cb == NARROW else WIDE_ROWS
    for task in range(first, last):
        n = task // (group * rblocks)
        rest = task - n * group * rblocks
        g = rest // rblocks
        oy0 = (rest - g * rblocks) * rows
        t_rows = min(rows, out_h - oy0)
        rows_in = (t_rows - 1) * sh + (kernel_h - 1) * dh + 1
        _stage(xs, x, n * channels + g * cg, cg, in_plane, width, height, oy0 * sh - pt,
               rows_in, staged_w, plane, pl, copy_w)
        for block in range(cblocks):
            row = g * cblocks + block
            k0 = g * kg + min(block * cb, kg - cb)
            for ry in range(t_rows):
                out_row = (n * k_total + k0) * out_plane + (oy0 + ry) * out_w
                for x0 in range(0, out_w, tile_rows):
                    # a last tile that would pass the row's end ends at it instead; a row
                    # narrower than a tile computes pixels past its end that are not stored
                    # (their reads stay inside the staged buffer, which has room for them)
                    x0 = max(0, min(x0, out_w - tile_rows))
                    acc = numba.carray(stack_buffer(TILE, out.dtype), (8, WIDE))
                    for i in range(8):
                        for t in range(WIDE):
                            acc[i, t] = 0
                    _sum(acc, xs, wp, row, roffs, ry * sh * staged_w + x0 * sw, kernel_w, sw,
                         dw, cb, tile_rows)
                    for i in range(min(tile_rows, out_w - x0)):
                        dst = out_row + x0 + i
                        for t in range(cb):
                            out[U(dst + t * out_plane)] = clamp(acc[i, t] + bp[row, t], floor,
                                                                ceiling)
        if not bounded:
            # the other activations over the group's stored rows, plane by plane, once all
            # its blocks are stored (overlapping blocks store some channels twice)
            for k in range(g * kg, (g + 1) * kg):
                activate_in_place(out, (n * k_total + k) * out_plane + oy0 * out_w,
                                  t_rows * out_w, code, low_v, high_v)


def _kernel(x, wp, bp, roffs, kg, cb, kernel_h, kernel_w, sh, sw, dh, dw, pt, pl, rows,
            staged_w, plane, code, low, high, stage_ws, out):
    """``out = act(conv(x, w) + bias)`` over every task, thread ``t`` staging into
    ``stage_ws[t]``; tasks are dealt in small parts to whichever thread is free."""
    x1, out1 = x.reshape(x.size), out.reshape(out.size)
    group = out.shape[1] // kg
    tasks = out.shape[0] * group * ((out.shape[2] + rows - 1) // rows)
    parts = min(tasks, PARTS_PER_THREAD * stage_ws.shape[0])
    for part in prange(parts):
        thread = numba.get_thread_id()
        _tasks(part * tasks // parts, (part + 1) * tasks // parts, x1, x.shape, wp, bp, roffs,
               kg, cb, kernel_h, kernel_w, sh, sw, dh, dw, pt, pl, rows, staged_w, plane, code,
               low, high, stage_ws[thread], out.shape, out1)


@functools.cache
def _compiled() -> Callable[..., None]:
    """The float32 kernel, compiled (or loaded from numba's cache) on first use."""
    f32 = types.float32
    c2 = functools.partial(types.Array, f32, 2, "C")
    ints = [types.intp] * 13
    signature = types.void(types.Array(f32, 4, "C", readonly=True), c2(readonly=True),
                           c2(readonly=True), types.Array(types.int64, 1, "C", readonly=True),
                           *ints, types.intp, types.float64, types.float64, c2(),
                           types.Array(f32, 4, "C"))
    return numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(_kernel)


class GroupedLanesConv(RunsThroughBind, ConvAlgorithm):
    """NCHW grouped convolution with vectors over a group's output channels (see the module
    docstring)."""

    operator = "conv"
    name = "grouped_lanes"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: activations other than relu and clip over the stored rows, 3.3x faster on a
    #: HardSwish layer
    version = 2
    #: where its per-thread staged rows are kept between calls
    scratch = _SCRATCH

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if geo.dtype != "float32":
            return f"grouped_lanes computes float32 only (got {geo.dtype})"
        if geo.group < 2:
            return "grouped_lanes needs more than one group"
        if geo.kg < NARROW:
            return (f"grouped_lanes needs at least {NARROW} output channels per group "
                    f"(got {geo.kg})")
        if geo.has_residual:
            return "grouped_lanes does not add a residual"
        return None

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        """First among the general kernels on groups of a few channels; after the GEMM
        families on groups deep enough to be dense layers of their own."""
        return (1, -1) if geo.cg <= MAX_GROUP_DEPTH else (6, 0)

    @staticmethod
    def row_block(geo: ConvGeometry) -> int:
        """Output rows per task: at most :data:`BLOCK_OUTPUTS` outputs, and enough tasks for
        every thread where the image has few groups."""
        return task_rows(geo, geo.n * geo.group, BLOCK_OUTPUTS)

    @staticmethod
    def _plane(geo: ConvGeometry, rows: int) -> int:
        """Staged positions per input channel, for tasks of ``rows`` output rows."""
        return staged_rows(geo, rows) * staged_columns(geo)

    def _row_offsets(self, geo: ConvGeometry) -> np.ndarray:
        """The staged offset of each (input channel, kernel row) from an output pixel's
        position."""
        j, r = np.meshgrid(np.arange(geo.cg), np.arange(geo.r), indexing="ij")
        offsets = j * self._plane(geo, self.row_block(geo)) + r * geo.dil_h * staged_columns(geo)
        return offsets.reshape(-1).astype(np.int64)

    def _staged_size(self, geo: ConvGeometry) -> int:
        """A thread's staged buffer: the group's planes, and room for the pixels a row
        narrower than a tile computes past its end."""
        tile_rows = NARROW_ROWS if channel_block(geo.kg) == NARROW else WIDE_ROWS
        return geo.cg * self._plane(geo, self.row_block(geo)) + tile_rows * geo.stride_w

    def workspace_bytes(self, problem: Problem) -> int:
        """Per numba thread, one group's staged rows, kept for the next call of the same
        problem; and the packed weights and bias unless they are preprocessed."""
        geo = geometry(problem)
        staged = thread_count() * self._staged_size(geo) * 4
        cb = channel_block(geo.kg)
        blocks = geo.group * ceil_div(geo.kg, cb)
        packed = 0 if problem.weight_preprocess else 4 * blocks * cb * (geo.cg * geo.r * geo.s
                                                                        + 1)
        return staged + packed

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The weights as (group * blocks, taps * cb), each block's weights tap by tap with
        its channels minor, and the bias as (group * blocks, cb)."""
        geo = geometry(problem)
        cb = channel_block(geo.kg)
        starts = [min(b * cb, geo.kg - cb) for b in range(ceil_div(geo.kg, cb))]
        w = np.asarray(inputs[1], dtype=np.float32).reshape(geo.group, geo.kg, -1)
        bias = (np.asarray(inputs[2], dtype=np.float32) if geo.has_bias
                else np.zeros(geo.k, np.float32)).reshape(geo.group, geo.kg)
        packed = np.empty((geo.group, len(starts), geo.cg * geo.r * geo.s, cb), np.float32)
        packed_bias = np.empty((geo.group, len(starts), cb), np.float32)
        for block, start in enumerate(starts):
            packed[:, block] = w[:, start:start + cb, :].transpose(0, 2, 1)
            packed_bias[:, block] = bias[:, start:start + cb]
        packed = packed.reshape(geo.group * len(starts), -1)
        packed_bias = packed_bias.reshape(-1, cb)
        return packed, packed_bias

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        geo = geometry(problem)
        kernel = _compiled()
        head = (geo.kg, channel_block(geo.kg), geo.r, geo.s, geo.stride_h, geo.stride_w,
                geo.dil_h, geo.dil_w, geo.pad_top, geo.pad_left)
        columns, epilogue = staged_columns(geo), epilogue_args(geo)

        def plan() -> tuple[int, int]:
            """(rows per task, staged positions per input channel)."""
            rows = self.row_block(geo)
            return rows, self._plane(geo, rows)
        plan_now = per_thread_count(plan)

        def call(*inputs: Any) -> np.ndarray:
            packed, packed_bias = self.preprocess(problem, inputs) if prepared is None \
                else prepared
            x, out = input_and_output(geo, inputs)
            threads, (rows, plane) = plan_now()
            key = (problem.key, threads)
            offsets, buffers = _SCRATCH.take(key, lambda: (
                self._row_offsets(geo), np.zeros((threads, self._staged_size(geo)),
                                                 np.float32)))
            kernel(x, packed, packed_bias, offsets, *head, rows, columns, plane, *epilogue,
                   buffers, out)
            _SCRATCH.give(key, (offsets, buffers))
            return geo.output_view(out)
        return call


def algorithms() -> list[Algorithm]:
    return [GroupedLanesConv()]
