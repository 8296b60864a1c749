"""Depthwise convolution in the channel-blocked layout: vectors over 16 channels.

Why it exists.  In NCHW a depthwise layer is one small plane per channel, and the deep layers of
MobileNet (7x7 and 14x14 planes, hundreds of channels) leave a vector over pixels mostly idle
or spend the time staging and re-indexing (``conv/depthwise.py``'s flat mode).  In ``nchw16c``
(see :mod:`fastrun_algorithms.layout.blocking`) the 16 channels of a block sit together for
every pixel, so one tap of one output pixel is one vector load of X, one of W and one vector
multiply-add, whatever the plane size: the layout MLAS and oneDNN use for the same reason.

How.  The weights are packed once into (C/16, R*S, 16), zero past C, like the bias.

3x3 and 5x5 kernels without dilation, nearly every depthwise layer of MobileNets and
EfficientNets, take an unrolled kernel (:func:`_compute_kernel`).  A task is a few output rows
of a plane; it copies the input rows they read into a stack buffer, zero-padded, so that every
output pixel is its 9 or 25 taps unrolled with no test and no loop: per tap a vector load of
X and a multiply-add, the block's weights held in registers, the lane loop one vector operation.
The pixels go to a stack chunk, and the chunk through the epilogue (bias, residual, activation)
into the output.  Testing the border columns per pixel instead, and applying the activation
per lane as each pixel was stored (only a Relu's loop then vectorised), took 1.5-4x as long on
5x5 layers and on 3x3 layers with a HardSwish (2-core AVX-512 VM, both kernels in one process);
the staging copy costs most on 112x112 planes at stride 2, up to 1.14x a direct Relu kernel.
``python -m benchmarks.probe_conv_kernels --layers mobilenet-dw --layout nchw16c --algorithm
blocked_depthwise`` measures it against onnxruntime.

Other kernels, dilations, and planes too wide to stage take the general kernel
(:func:`_general_kernel`): a task is (image, channel block, output row); each row's valid kernel
rows are found once; its interior pixels go four at a time, four vector accumulators in
registers; the border pixels one at a time over their valid taps.

Float32 only, channel multiplier 1 (K == C == group), any kernel, stride, dilation and padding.
REPRODUCIBLE: each output sums its taps in row-major order in one task.
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
    U,
    stack_buffer,
    thread_count,
)
from fastrun_algorithms.conv._gemm_common import buffer, item_type, readonly
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    activate_in_place,
    bounds,
    clamp,
    epilogue_args,
    finish_span,
    residual_operand,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.layout.blocking import BLOCKED, LANES, blocks

#: Interior pixels computed together: four independent accumulator chains hide the latency of
#: the multiply-adds.
TILE = 4
TILE_ELEMENTS = TILE * LANES
#: Output pixels the unrolled kernel computes into a stack chunk before finishing and storing
#: them: a whole row of every MobileNet plane (112 pixels wide at most), 7 KiB of float32.
CHUNK = 112
CHUNK_ELEMENTS = CHUNK * LANES
#: Elements of the unrolled kernel's staged input rows (a stack buffer): 32 KiB of float32,
#: four padded rows of a 112-pixel plane.  Layers whose kernel rows do not fit take the
#: general kernel.
STAGE_ELEMENTS = 16384


def _pack_kernel(w: np.ndarray, bias: np.ndarray, has_bias: bool, packed: np.ndarray,
                 packed_bias: np.ndarray) -> None:
    """``packed[b, r*S + s, t] = w[b*16 + t, 0, r, s]`` and ``packed_bias[b*16 + t] =
    bias[b*16 + t]``, zeros past C."""
    channels, _, kernel_h, kernel_w = w.shape
    for b in range(packed.shape[0]):
        for t in range(LANES):
            c = b * LANES + t
            for r in range(kernel_h):
                for s in range(kernel_w):
                    packed[b, r * kernel_w + s, t] = w[c, 0, r, s] if c < channels else 0
            packed_bias[b * LANES + t] = bias[c] if has_bias and c < channels else 0


@numba.njit(inline="always")
def _finish_chunk(chunk, count, out, plane, first, z, code, low, high):
    """``chunk[:count]`` (a stack vector of raw sums plus bias) through the rest of the epilogue,
    stored to ``out[plane, first:first + count]``: the residual (``z``, laid out as the output;
    None without one, a type of its own so the test is decided when the kernel compiles), then
    relu and clip as clamps in the storing loop, the other activations in a loop of their own
    per activation before it.  With the activation applied per lane as each pixel was stored,
    only relu's loop vectorised, and a HardSwish or no activation at all took 2.5x the time of
    a Relu on 672 planes of 14x14."""
    if z is not None:
        for i in range(count):
            chunk[i] += z[plane, U(first + i)]
    bounded, floor, ceiling = bounds(code, low, high, out)
    if not bounded:
        activate_in_place(chunk, 0, count, code, low, high)
    for i in range(count):
        out[plane, U(first + i)] = clamp(chunk[i], floor, ceiling)


@numba.njit(inline="always")
def _kernel_row(acc, src, at, packed, b, tap, t, taps):
    """``acc`` plus one kernel row's ``taps`` (3 or 5) taps on lane ``t``: the input pixels at
    ``at``, ``at + 16``, ... times taps ``tap`` on of block ``b``, in column order."""
    acc = ((acc + src[U(at + t)] * packed[b, U(tap * LANES + t)])
           + src[U(at + LANES + t)] * packed[b, U((tap + 1) * LANES + t)]) \
        + src[U(at + 2 * LANES + t)] * packed[b, U((tap + 2) * LANES + t)]
    if taps == 5:
        acc = (acc + src[U(at + 3 * LANES + t)] * packed[b, U((tap + 3) * LANES + t)]) \
            + src[U(at + 4 * LANES + t)] * packed[b, U((tap + 4) * LANES + t)]
    return acc


@numba.njit(inline="always")
def _compute_pixels(chunk, stage, first, c0, c1, sw, padded, packed, bias, b, size):
    """Output pixels ``c0`` to ``c1`` of a row into ``chunk``: each pixel's ``size`` x
    ``size`` taps from the staged rows (the row's first kernel row at ``first``), one
    expression per lane."""
    for ow in range(c0, c1):
        c = first + ow * sw * LANES
        at = (ow - c0) * LANES
        for t in range(LANES):
            acc = bias[U(b * LANES + t)]
            acc = _kernel_row(acc, stage, c, packed, b, 0, t, size)
            acc = _kernel_row(acc, stage, c + padded, packed, b, size, t, size)
            acc = _kernel_row(acc, stage, c + 2 * padded, packed, b, 2 * size, t, size)
            if size == 5:
                acc = _kernel_row(acc, stage, c + 3 * padded, packed, b, 15, t, 5)
                acc = _kernel_row(acc, stage, c + 4 * padded, packed, b, 20, t, 5)
            chunk[U(at + t)] = acc


def _compute_kernel(x: np.ndarray, packed: np.ndarray, bias: np.ndarray, width: int, sh: int,
                    sw: int, pt: int, pl: int, ow_total: int, size: int, rows: int, code: int,
                    low: float, high: float, z: np.ndarray | None, out: np.ndarray) -> None:
    """A ``size`` x ``size`` kernel, 3 or 5, no dilation, any stride and padding: x (N*B,
    H*W*16), packed (B, size*size*16), out and z (N*B, OH*OW*16), flat planes.

    A task is ``rows`` output rows of a plane (a task per row cost as much again as its
    multiply-adds on 14x14 planes).  It first copies the input rows it reads into a stack
    buffer, zero-padded left and right and zero where they fall outside the input, so that
    every pixel takes all its taps with no test: per tap one vector load and one multiply-add,
    the lane loop one vector operation, the weights held in registers.  Testing the border
    pixels' taps instead took a third of the time on 14x14 planes, and the copy costs about
    one vector move per input value.  Pixels are computed into a stack chunk of :data:`CHUNK`
    pixels, then finished and stored (:func:`_finish_chunk`): stores into the output, which
    LLVM cannot prove apart from the weights, made it load every tap's weights again for every
    pixel."""
    planes, nb = x.shape[0], packed.shape[0]
    height = x.shape[1] // (width * LANES)
    oh_total = out.shape[1] // (ow_total * LANES)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    padded = _padded_width(width, pl, ow_total, sw, size) * LANES
    row_blocks = (oh_total + rows - 1) // rows
    for task in prange(planes * row_blocks):
        plane = task // row_blocks
        oh0 = (task - plane * row_blocks) * rows
        oh1 = min(oh0 + rows, oh_total)
        b = plane % nb
        stage = numba.carray(stack_buffer(STAGE_ELEMENTS, out.dtype), STAGE_ELEMENTS)
        chunk = numba.carray(stack_buffer(CHUNK_ELEMENTS, out.dtype), CHUNK_ELEMENTS)
        top = oh0 * sh - pt
        for i in range((oh1 - oh0 - 1) * sh + size):
            at = i * padded
            if 0 <= top + i < height:
                begin = (top + i) * width * LANES
                for e in range(pl * LANES):
                    stage[U(at + e)] = 0
                for e in range(width * LANES):
                    stage[U(at + pl * LANES + e)] = x[plane, U(begin + e)]
                for e in range((pl + width) * LANES, padded):
                    stage[U(at + e)] = 0
            else:
                for e in range(padded):
                    stage[U(at + e)] = 0
        for oh in range(oh0, oh1):
            first = (oh - oh0) * sh * padded
            for c0 in range(0, ow_total, CHUNK):
                c1 = min(ow_total, c0 + CHUNK)
                if size == 5:  # the tap count a constant in each inlined copy
                    _compute_pixels(chunk, stage, first, c0, c1, sw, padded, packed, bias, b, 5)
                else:
                    _compute_pixels(chunk, stage, first, c0, c1, sw, padded, packed, bias, b, 3)
                _finish_chunk(chunk, (c1 - c0) * LANES, out, plane,
                              (oh * ow_total + c0) * LANES, z, code, low_v, high_v)


@numba.njit(inline="always")
def _padded_width(width, pl, ow_total, sw, size):
    """Pixels of a staged input row: the padding on the left, the row, and on the right as
    many zero pixels as the last output pixel reads past the row."""
    return max(pl + width, (ow_total - 1) * sw + size)


def _general_kernel(x: np.ndarray, packed: np.ndarray, bias: np.ndarray, offsets: np.ndarray,
                    width: int,
                    sh: int, sw: int, dh: int, dw: int, pt: int, pl: int, kernel_w: int,
                    channels: int, ow_total: int, code: int, low: float, high: float,
                    z: np.ndarray, has_residual: bool, out: np.ndarray) -> None:
    """Any kernel and dilation: operands as :func:`_compute_kernel`'s, ``offsets[r*S + s]``
    tap (r, s)'s offset in a plane.  The interior pixels go four at a time and loop over the
    row's valid taps as one flat loop (nested tap loops made LLVM keep the four accumulators
    in memory); the border pixels one at a time over their valid taps."""
    planes, nb = x.shape[0], packed.shape[0]
    height = x.shape[1] // (width * LANES)
    oh_total = out.shape[1] // (ow_total * LANES)
    kernel_h = packed.shape[1] // (kernel_w * LANES)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    # interior columns: every tap inside the input
    first = min((pl + sw - 1) // sw, ow_total)
    last = (width - 1 + pl - (kernel_w - 1) * dw) // sw + 1
    last = max(first, min(last, ow_total))
    row = width * LANES
    step = sw * LANES
    for task in prange(planes * oh_total):
        plane = task // oh_total
        oh = task - plane * oh_total
        b = plane % nb
        zb = z[plane] if has_residual else z[0, :0]
        top = oh * sh - pt
        r_lo = max(0, (-top + dh - 1) // dh)
        r_hi = min(kernel_h, (height - top + dh - 1) // dh)
        tile = numba.carray(stack_buffer(TILE_ELEMENTS, out.dtype), (TILE, LANES))
        start = oh * ow_total * LANES
        ow = 0
        while ow < ow_total:
            if first <= ow and ow + TILE <= last:  # four interior pixels
                for i in range(TILE):
                    for t in range(LANES):
                        tile[i, t] = bias[U(b * LANES + t)]
                at0 = top * row + (ow * sw - pl) * LANES
                for k in range(r_lo * kernel_w, r_hi * kernel_w):
                    at = at0 + offsets[k]
                    wat = k * LANES
                    for t in range(LANES):
                        wv = packed[b, U(wat + t)]
                        tile[0, t] += x[plane, U(at + t)] * wv
                        tile[1, t] += x[plane, U(at + step + t)] * wv
                        tile[2, t] += x[plane, U(at + 2 * step + t)] * wv
                        tile[3, t] += x[plane, U(at + 3 * step + t)] * wv
                for i in range(TILE):
                    for t in range(LANES):
                        out[plane, U(start + (ow + i) * LANES + t)] = tile[i, t]
                ow += TILE
            else:  # one pixel, its valid taps only
                at_out = start + ow * LANES
                for t in range(LANES):
                    out[plane, U(at_out + t)] = bias[U(b * LANES + t)]
                left = ow * sw - pl
                s_lo = max(0, (-left + dw - 1) // dw)
                s_hi = min(kernel_w, (width - left + dw - 1) // dw)
                for r in range(r_lo, r_hi):
                    begin = (top + r * dh) * row + left * LANES
                    for s in range(s_lo, s_hi):
                        at = begin + s * dw * LANES
                        wat = (r * kernel_w + s) * LANES
                        for t in range(LANES):
                            out[plane, U(at_out + t)] += x[plane, U(at + t)] \
                                * packed[b, U(wat + t)]
                ow += 1
        # the residual and the activation over the row; adding -0.0 as the bias (already in)
        # leaves every value, the sign of a zero included, as it is
        finish_span(out[plane], start, ow_total * LANES, out.dtype.type(-0.0), zb,
                    has_residual, code, low_v, high_v)


@functools.cache
def _compiled() -> tuple[Callable[..., None], ...]:
    """(pack, general, unrolled) for float32, compiled (or loaded from numba's cache) on first
    use."""
    f32 = np.dtype(np.float32)
    intp = types.intp
    c_in = functools.partial(types.Array, item_type(f32), layout="C", readonly=True)
    pack = numba.njit(types.void(readonly(f32, 4), readonly(f32, 1), types.boolean,
                                 buffer(f32, 3), buffer(f32, 1)), cache=CACHE)(_pack_kernel)
    general = numba.njit(
        types.void(c_in(ndim=2), c_in(ndim=2), c_in(ndim=1),
                   types.Array(types.int64, 1, "C", readonly=True), *[intp] * 10, intp,
                   types.float64, types.float64, c_in(ndim=2), types.boolean, buffer(f32, 2)),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_general_kernel)
    head = (c_in(ndim=2), c_in(ndim=2), c_in(ndim=1), *[intp] * 8, intp,
            types.float64, types.float64)
    unrolled = numba.njit(
        [types.void(*head, residual, buffer(f32, 2)) for residual in (types.none, c_in(ndim=2))],
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_compute_kernel)
    return pack, general, unrolled


def _staged_rows(geo: ConvGeometry) -> int:
    """Input rows of a plane the unrolled kernel's stack buffer holds."""
    width = _padded_width(geo.w, geo.pad_left, geo.ow, geo.stride_w, geo.s)
    return STAGE_ELEMENTS // (width * LANES)


def _rows_per_task(geo: ConvGeometry, planes: int) -> int:
    """Output rows per task of the unrolled kernel: as many as leave
    :data:`~fastrun_algorithms._common.PARTS_PER_THREAD` tasks per thread, and whose input rows
    fit the stack buffer."""
    tasks = PARTS_PER_THREAD * thread_count()
    fit = (_staged_rows(geo) - geo.r) // geo.stride_h + 1
    return max(1, min(geo.oh, planes * geo.oh // tasks, fit))


def _unrolled(geo: ConvGeometry) -> bool:
    """Whether :func:`_compute_kernel` serves the problem: a 3x3 or 5x5 kernel, no dilation,
    and the kernel's input rows fit its stack buffer."""
    return (geo.r == geo.s and geo.r in (3, 5) and (geo.dil_h, geo.dil_w) == (1, 1)
            and _staged_rows(geo) >= geo.r)


@functools.lru_cache(maxsize=1024)
def _offsets(problem: Problem) -> np.ndarray:
    """Each tap's offset within a blocked input plane, in (r, s) order; read-only."""
    geo = geometry(problem)
    table = np.array([(r * geo.dil_h * geo.w + s * geo.dil_w) * LANES
                      for r in range(geo.r) for s in range(geo.s)], dtype=np.int64)
    table.flags.writeable = False
    return table


class BlockedDepthwiseConv(ConvAlgorithm):
    """Depthwise convolution on ``nchw16c`` tensors with vectors over 16 channels (see the
    module docstring)."""

    operator = "conv"
    name = "blocked_depthwise"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: every activation and the residual in a pass over each finished row, and 5x5 kernels
    #: unrolled as 3x3 ones are (:func:`_compute_kernel`)
    version = 2
    layouts = (BLOCKED,)

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if problem.dtypes[0] != "float32":
            return f"blocked_depthwise computes float32 only (got {problem.dtypes[0]})"
        if not geo.is_depthwise or geo.k != geo.c:
            return (f"blocked_depthwise needs group == C == K (one channel per group, "
                    f"multiplier 1); got C={geo.c}, K={geo.k}, group={geo.group}")
        return None

    def workspace_bytes(self, problem: Problem) -> int:
        """The packed weights and bias when they are not preprocessed."""
        if problem.weight_preprocess:
            return 0
        geo = geometry(problem)
        return 4 * blocks(geo.c) * LANES * (geo.r * geo.s + 1)

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
        """The weights as (C/16, R*S, 16) and the bias as (C/16 * 16,), zero past C."""
        geo = geometry(problem)
        w = np.asarray(inputs[1])
        bias = np.asarray(inputs[2]) if geo.has_bias else np.zeros(1, np.float32)
        packed = np.empty((blocks(geo.c), geo.r * geo.s, LANES), dtype=np.float32)
        packed_bias = np.empty(blocks(geo.c) * LANES, dtype=np.float32)
        _compiled()[0](w.reshape(geo.k, 1, geo.r, geo.s), bias, geo.has_bias, packed,
                       packed_bias)
        return packed, packed_bias

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        packed, packed_bias = self.preprocess(problem, inputs) if prepared is None else prepared
        planes = geo.n * blocks(geo.c)
        x = np.ascontiguousarray(inputs[0]).reshape(planes, -1)
        out = np.empty(geo.out_shape, dtype=np.float32)
        z = residual_operand(geo, inputs)
        z = z.reshape(planes, -1) if geo.has_residual else z.reshape(1, 1)
        epilogue = epilogue_args(geo)
        if _unrolled(geo):
            _compiled()[2](x, packed.reshape(blocks(geo.c), -1), packed_bias, geo.w,
                           geo.stride_h, geo.stride_w, geo.pad_top, geo.pad_left, geo.ow,
                           geo.r, _rows_per_task(geo, planes), *epilogue,
                           z if geo.has_residual else None, out.reshape(planes, -1))
        else:
            _compiled()[1](x, packed.reshape(blocks(geo.c), -1), packed_bias,
                           _offsets(problem), geo.w, geo.stride_h, geo.stride_w, geo.dil_h,
                           geo.dil_w, geo.pad_top, geo.pad_left, geo.s, geo.c, geo.ow,
                           *epilogue, z, geo.has_residual, out.reshape(planes, -1))
        if geo.c % LANES:  # zeroed here: a store loop in the kernel made LLVM spill
            out[:, -1, ..., geo.c % LANES:] = 0
        return out

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (0, 0)  # first wherever usable: made for these layers


def algorithms() -> list[Algorithm]:
    return [BlockedDepthwiseConv()]
