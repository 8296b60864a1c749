"""Depthwise convolution (group == C, one input channel per group) in parallel numba.

MobileNet-style depthwise layers do few multiply-adds per value moved (nine for a 3x3 kernel),
so what matters is streaming each plane once with long vector loops, not blocking over output
channels: a general direct kernel wastes its channel blocking on them (one output channel per
group).  Here a task is (image, input channel, block of output rows): it stages that block of
the channel's plane once (padded, phase-split for strides > 1, see :mod:`._kernels_common`),
then for each of the channel's ``K/C`` output channels (the channel multiplier, usually 1)
computes the block.  Tasks are dealt in small parts (:data:`PARTS_PER_THREAD`) to whichever
thread is free (not one share per thread: a share waits for its slowest thread), and each
thread stages into buffers of its own, kept from one call to the next (:class:`ScratchPool`:
their padding is zeroed once, the index maps below are computed once, and a small layer does
not pay for allocating them).
MobileNetV2 at 16 threads went from 3.5-4.1 to 2.9-3.1 ms with these two changes (same
16-core host, same run).  A 3x3 kernel, the common case, takes one pass that sums all nine
taps per output and writes it through the epilogue, with no accumulator; other kernels
accumulate over the whole block as one flat loop, a 5x5 kernel all 25 taps in one pass and
others up to four taps per pass, then go through the epilogue.

Planes whose output rows are shorter than a vector (the 7x7 and 14x14 stride-2 layers at the end
of MobileNet, hundreds of channels) go through "flat mode": per-row loops would be all setup
and scalar remainder there, so the plane is staged by one scatter through a precomputed index
map, computed by one flat loop over the whole block, and written by one gather through a second
map (measured 1.7x faster than per-row loops on 960 planes of 7x7, slower from 28x28 up).

Summation order is fixed by the loops (the taps in row-major order), independent of the thread
count: reproducible.
"""

from __future__ import annotations

import functools
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
    PARTS_PER_THREAD,
    RunsThroughBind,
    ScratchPool,
    stack_buffer,
    thread_count,
)
from fastrun_algorithms.conv._kernels_common import (
    LANES,
    aligned_empty,
    aligned_nbytes,
    aligned_zeros,
    block_positions,
    block_width,
    chunk_taps,
    kernel_signature,
    layout,
    next_tap,
    operands,
    row_taps,
    stage_block,
    staged_size,
    store_rows,
    store_taps3x3,
    sum_taps3x3,
    sum_taps5x5,
    tap_after_pass,
    tap_offset,
)
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    activate_in_place,
    bounds,
    clamp,
    epilogue_args,
    residual_operand,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry

#: Outputs (including each row's junk tail) a task covers at most: whole planes up to 56x56,
#: so that the flat loops are long, but blocks of rows for larger planes, so that the staged
#: block and the accumulator stay in L2 and a layer with few channels still splits over cores.
BLOCK_LENGTH = 4096
#: Planes whose output rows are shorter than this go through flat mode (a vector loop of
#: 16 float32 needs at least 16 columns to run once per row).
FLAT_WIDTH = 16


#: The per-thread buffers of the problems run so far (see :class:`ScratchPool`).
_SCRATCH = ScratchPool()


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _depthwise_tasks(first, last, x, w, bias, out, sh, sw, dh, dw, pt, pl, group, has_bias, code,
                     low, high, z, has_residual, ob, acc, xs, x2, out2, in_map, out_map):
    """Tasks ``first`` to ``last`` (each an image, an input channel and a block of output
    rows) with the running thread's accumulator ``acc`` (1, 1, positions) and staged block
    ``xs``, whose padding positions are zero (written when the buffer was made and never
    since, see :func:`stage_row`).

    With index maps (``in_map`` not empty: small planes, see :meth:`DepthwiseConv.flat`), a
    plane is staged by one scatter ``xs[in_map[e]] = x2[plane, e]`` over its flat input and
    written by one gather ``out2[plane, e] = epilogue(acc[out_map[e]])``, instead of a loop per
    row: a 7x7 plane's rows are too short for anything but loop overhead.  A plain function
    called from the parallel loop rather than the loop's body itself: numba's parallel passes
    then see a one-line loop, which keeps compilation several times faster.
    """
    channels_out, out_h, out_w = out.shape[1], out.shape[2], out.shape[3]
    kernel_h, kernel_w = w.shape[2], w.shape[3]
    multiplier = channels_out // group
    rblocks = (out_h + ob - 1) // ob
    per_image = group * rblocks
    hb = ob + (kernel_h - 1) * dh // sh
    wq = out_w + (kernel_w - 1) * dw // sw
    flat = in_map.shape[0] > 0
    three = kernel_h == 3 and kernel_w == 3
    five = kernel_h == 5 and kernel_w == 5
    d25 = numba.carray(stack_buffer(25, np.int64), 25)
    if five:
        for i in range(5):
            for j in range(5):
                d25[5 * i + j] = tap_offset(i, j, dh, dw, sh, sw, hb, wq)
    zero = acc.dtype.type(0)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    bounded, floor, ceiling = bounds(code, low, high, out)
    d9 = (tap_offset(0, 0, dh, dw, sh, sw, hb, wq), tap_offset(0, 1, dh, dw, sh, sw, hb, wq),
          tap_offset(0, 2, dh, dw, sh, sw, hb, wq), tap_offset(1, 0, dh, dw, sh, sw, hb, wq),
          tap_offset(1, 1, dh, dw, sh, sw, hb, wq), tap_offset(1, 2, dh, dw, sh, sw, hb, wq),
          tap_offset(2, 0, dh, dw, sh, sw, hb, wq), tap_offset(2, 1, dh, dw, sh, sw, hb, wq),
          tap_offset(2, 2, dh, dw, sh, sw, hb, wq))
    for task in range(first, last):
        n = task // per_image
        c = (task - n * per_image) // rblocks
        oh0 = (task - n * per_image - c * rblocks) * ob
        t_rows = min(ob, out_h - oh0)
        if flat:
            plane = n * group + c
            for e in range(in_map.shape[0]):
                xs[in_map[e]] = x2[plane, e]
        else:
            stage_block(xs, x, n, c, oh0 * sh, hb, wq, sh, sw, pt, pl)
        if three and not flat:
            # The common case: all nine taps in one pass, straight into the output.
            for k in range(c * multiplier, (c + 1) * multiplier):
                bias_k = bias[k] if has_bias else zero
                store_taps3x3(out, n, k, oh0, t_rows, w, 0, xs, d9, wq, bias_k, code, low,
                              high)
            continue
        length = -(-((t_rows - 1) * wq + out_w) // LANES) * LANES
        for k in range(c * multiplier, (c + 1) * multiplier):
            if three:
                sum_taps3x3(acc[0, 0], xs, w, k, 0, d9, 0, length)
            elif five:
                sum_taps5x5(acc[0, 0], xs, w, k, d25, length)
            else:
                for u in range(length):
                    acc[0, 0, u] = 0
                # Other kernels: the taps in row-major order, up to four per pass.
                i0, j0 = 0, 0
                remaining = kernel_h * kernel_w
                while remaining > 0:
                    taps = chunk_taps(remaining)
                    i1, j1 = next_tap(i0, j0, kernel_w)
                    i2, j2 = next_tap(i1, j1, kernel_w)
                    i3, j3 = next_tap(i2, j2, kernel_w)
                    wv = (w[k, 0, i0, j0], w[k, 0, i1, j1] if taps > 1 else zero,
                          w[k, 0, i2, j2] if taps > 2 else zero,
                          w[k, 0, i3, j3] if taps > 3 else zero)
                    d = (tap_offset(i0, j0, dh, dw, sh, sw, hb, wq),
                         tap_offset(i1, j1, dh, dw, sh, sw, hb, wq),
                         tap_offset(i2, j2, dh, dw, sh, sw, hb, wq),
                         tap_offset(i3, j3, dh, dw, sh, sw, hb, wq))
                    row_taps(acc, wv, xs, d, taps, length)
                    i0, j0 = tap_after_pass(taps, i1, j1, i2, j2, i3, j3, kernel_w)
                    remaining -= taps
            bias_k = bias[k] if has_bias else zero
            if flat:
                plane = n * channels_out + k
                # None, relu and clip as clamps in the gather; the other activations over
                # what it stored, in a loop of their own per activation: with a test of the
                # code per value (activate's) only the identity epilogue vectorised, and a
                # Relu or HardSwish layer took 2-3x the time of the same layer without one.
                if bounded:
                    for e in range(out_map.shape[0]):
                        out2[plane, e] = clamp(acc[0, 0, out_map[e]] + bias_k, floor, ceiling)
                else:
                    for e in range(out_map.shape[0]):
                        out2[plane, e] = acc[0, 0, out_map[e]] + bias_k
                    activate_in_place(out2[plane], 0, out_map.shape[0], code, low_v, high_v)
            else:
                store_rows(out, n, k, oh0, t_rows, acc, 0, 0, wq, bias_k, code, low, high, z,
                           has_residual)


@numba.njit(cache=CACHE)
def _plane_maps(in_map, out_map, height, width, out_w, sh, sw, pt, pl, hb, wq, unused):
    """The index maps of flat mode: where each input value of a plane goes in the staged
    block (``unused``, a slack position, for values no output reads), and where each output
    value of a plane is in the accumulator."""
    for e in range(height * width):
        row, column = e // width + pt, e % width + pl
        a, m = row // sh, column // sw
        if a < hb and m < wq:
            in_map[e] = (((row - a * sh) * sw + column - m * sw) * hb + a) * wq + m
        else:
            in_map[e] = unused
    for e in range(out_map.shape[0]):
        out_map[e] = (e // out_w) * wq + e % out_w


def _depthwise_kernel(x, w, bias, out, sh, sw, dh, dw, pt, pl, group, has_bias, code, low, high,
                      z, has_residual, ob, acc_ws, stage_ws, x2, out2, in_map, out_map):
    """out = act(conv(x, w) + bias) for group == C (see the module docstring): every task on
    whichever thread is free, thread ``t`` using ``acc_ws[t]`` and ``stage_ws[t]`` (one set per
    numba thread, made by :meth:`DepthwiseConv.run`), so the kernel allocates nothing itself."""
    tasks = out.shape[0] * group * ((out.shape[2] + ob - 1) // ob)
    parts = min(tasks, PARTS_PER_THREAD * acc_ws.shape[0])
    for part in prange(parts):
        thread = numba.get_thread_id()
        _depthwise_tasks(part * tasks // parts, (part + 1) * tasks // parts, x, w, bias, out,
                         sh, sw, dh, dw, pt, pl, group, has_bias, code, low, high, z,
                         has_residual, ob, acc_ws[thread], stage_ws[thread], x2, out2, in_map,
                         out_map)


@functools.cache
def _compiled(dtype: np.dtype, array_layout: str) -> Callable[..., None]:
    """The kernel for one dtype and operand layout, compiled (or loaded from numba's cache) on
    first use, so that only the variants actually used are compiled."""
    item = numba.from_dtype(dtype)
    signature = kernel_signature(dtype, array_layout, types.intp, types.Array(item, 4, "C"),
                                 types.Array(item, 2, "C"),
                                 types.Array(item, 2, "C", readonly=True),
                                 types.Array(item, 2, "C"), types.Array(types.int64, 1, "C"),
                                 types.Array(types.int64, 1, "C"))
    return numba.njit(signature, parallel=True, cache=CACHE,
                      fastmath=FASTMATH)(_depthwise_kernel)


class DepthwiseConv(RunsThroughBind, ConvAlgorithm):
    """Parallel depthwise convolution: group == C with any channel multiplier K/C, any
    kernel, stride, dilation and padding."""

    operator = "conv"
    name = "depthwise"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: 3x3 taps summed over whole rows at once, up to 2x faster (store_taps3x3), and 5x5
    #: taps in one pass (sum_taps5x5); 3: flat mode's activation in a loop of its own, 2-3x
    #: faster on a layer with one; 4: relu and clip as clamps, the other activations in a
    #: loop per activation (flat mode and whole rows), 2-3x faster again on such layers; 5: the
    #: same for 3x3 kernels (``store_taps3x3``) and residuals (``store_rows``)
    version = 5
    #: where its per-thread buffers are kept between calls
    scratch = _SCRATCH

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if not geo.is_depthwise:
            return (f"depthwise needs one input channel per group (group == C), got group="
                    f"{geo.group} with C={geo.c} ({geo.cg} input channels per group)")
        if geo.has_residual:
            return "depthwise does not add a residual (its 3x3 and flat paths store directly)"
        return None

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (0, 0)  # first wherever usable: made for these layers

    @staticmethod
    def row_block(geo: ConvGeometry) -> int:
        """Output rows per task: at most :data:`BLOCK_LENGTH` outputs."""
        return max(1, min(geo.oh, BLOCK_LENGTH // block_width(geo)))

    def flat(self, geo: ConvGeometry) -> bool:
        """Whether planes go through flat mode (see :func:`_depthwise_worker`): whole planes
        whose output rows are shorter than :data:`FLAT_WIDTH`."""
        return geo.ow < FLAT_WIDTH and self.row_block(geo) == geo.oh

    def workers(self, geo: ConvGeometry) -> int:
        """One set of buffers per numba thread: any thread may run any task."""
        return thread_count()

    def _buffer_shapes(self, geo: ConvGeometry) -> list[tuple[tuple[int, ...], type]]:
        """Shapes and dtypes of the buffers :meth:`run` allocates: the accumulators and staged
        blocks of all workers, and in flat mode the two index maps.  A 3x3 kernel outside flat
        mode needs no accumulator; one position per worker is still allocated so the kernel
        has a single signature."""
        ob = self.row_block(geo)
        flat = self.flat(geo)
        positions = 1 if (geo.r, geo.s) == (3, 3) and not flat else block_positions(geo, ob)
        workers = self.workers(geo)
        shapes = [((workers, 1, 1, positions), geo.dtype),
                  ((workers, staged_size(geo, ob)), geo.dtype)]
        if flat:
            shapes += [((geo.h * geo.w,), np.int64), ((geo.oh * geo.ow,), np.int64)]
        return shapes

    def workspace_bytes(self, problem: Problem) -> int:
        """Per numba thread, the accumulator of one output block (none for 3x3 kernels outside
        flat mode) and the staged input block, in the problem's dtype, each buffer aligned (see
        :func:`aligned_empty`); in flat mode, the two index maps (int64, one entry per value of
        an input and of an output plane).  Made before the kernel starts (the kernel allocates
        nothing) and kept for the next call of the same problem (:class:`ScratchPool`)."""
        geo = geometry(problem)
        return sum(aligned_nbytes(shape, dtype) for shape, dtype in self._buffer_shapes(geo))

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        geo = geometry(problem)
        dtype = np.dtype(geo.dtype)
        shape = (geo.n, geo.k, geo.oh, geo.ow)
        head = (geo.stride_h, geo.stride_w, geo.dil_h, geo.dil_w, geo.pad_top, geo.pad_left,
                geo.group, geo.has_bias, *epilogue_args(geo))
        row_block = self.row_block(geo)
        unused = (_unused_2d(dtype), _unused_2d(dtype), _unused_map(), _unused_map())

        def call(*inputs: Any) -> np.ndarray:
            x, w, bias = operands(geo, inputs)
            out = np.empty(shape, dtype=dtype)
            key = (problem.key, thread_count())
            buffers = _SCRATCH.take(key, lambda: self._make_buffers(geo))
            if len(buffers) == 4 and x.flags.c_contiguous:
                # flat views of X and the output (views, not copies: both are C-contiguous)
                flat = (x.reshape(geo.n * geo.c, geo.h * geo.w),
                        out.reshape(geo.n * geo.k, geo.oh * geo.ow), *buffers[2:])
            else:
                # not flat, or a strided X that has no flat view: the maps (if made, so that
                # the workspace stays what workspace_bytes says) are left unused
                flat = unused
            _compiled(dtype, layout(x, w))(x, w, bias, out, *head,
                                           residual_operand(geo, inputs), geo.has_residual,
                                           row_block, *buffers[:2], *flat)
            _SCRATCH.give(key, buffers)
            return geo.output_view(out)
        return call

    def _make_buffers(self, geo: ConvGeometry) -> tuple[np.ndarray, ...]:
        """The buffers of :meth:`_buffer_shapes`, staged blocks zeroed (their padding is never
        written again) and the index maps of flat mode filled."""
        shapes = self._buffer_shapes(geo)
        (acc_shape, dtype), (stage_shape, _) = shapes[:2]
        buffers = [aligned_empty(acc_shape, dtype), aligned_zeros(stage_shape, dtype)]
        if len(shapes) == 4:
            in_map, out_map = np.empty(shapes[2][0], np.int64), np.empty(shapes[3][0], np.int64)
            ob = self.row_block(geo)
            _plane_maps(in_map, out_map, geo.h, geo.w, geo.ow, geo.stride_h, geo.stride_w,
                        geo.pad_top, geo.pad_left, ob + (geo.r - 1) * geo.dil_h // geo.stride_h,
                        block_width(geo), stage_shape[1] - 1)
            buffers += [in_map, out_map]
        return tuple(buffers)


@functools.cache
def _unused_2d(dtype: np.dtype) -> np.ndarray:
    """Placeholder for the flat views outside flat mode (shared, so no call allocates it)."""
    return np.zeros((0, 0), dtype=dtype)


@functools.cache
def _unused_map() -> np.ndarray:
    """Placeholder for the index maps outside flat mode: empty means "not flat"."""
    return np.zeros(0, dtype=np.int64)


def algorithms() -> list[Algorithm]:
    return [DepthwiseConv()]
