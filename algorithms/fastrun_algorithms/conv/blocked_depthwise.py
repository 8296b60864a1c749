"""Depthwise convolution in the channel-blocked layout: vectors over 16 channels.

Why it exists.  In NCHW a depthwise layer is one small plane per channel, and the deep layers of
MobileNet (7x7 and 14x14 planes, hundreds of channels) leave a vector over pixels mostly idle
or spend the time staging and re-indexing (``conv/depthwise.py``'s flat mode).  In ``nchw16c``
(see :mod:`fastrun_algorithms.layout.blocking`) the 16 channels of a block sit together for
every pixel, so one tap of one output pixel is one vector load of X, one of W and one vector
multiply-add, whatever the plane size: the layout MLAS and oneDNN use for the same reason.

How.  The weights are packed once into (C/16, R*S, 16), zero past C, like the bias.  A task is
(image, channel block, output row), enough for every thread at batch 1.  Each row's valid kernel
rows are found once; its interior pixels (every tap inside the input) go four at a time, four
vector accumulators in registers; the border pixels go one at a time over their valid taps, so
no padded copy is made.  The epilogue (bias, residual, activation) is applied at the store, and
lanes past C are stored as zeros.

A 3x3 kernel without dilation, nearly every depthwise layer of MobileNets, has a kernel of its
own (:func:`_compute3x3_kernel`): kernel rows above and below the input read a zero row instead
of being tested, so an interior pixel is nine taps unrolled with no loop and no branch, and
the lane loop is one vector operation per tap: the general loop's variable tap ranges and
border tests cost it about half its speed on these layers (measured by the search's timings in
``benchmarks.bench_scaling``, docs/performance.md).

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
from fastrun_algorithms._common import CACHE, FASTMATH, U, stack_buffer
from fastrun_algorithms.conv._gemm_common import buffer, item_type, readonly
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    epilogue_args,
    epilogue_residual,
    epilogue_value,
    residual_operand,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.layout.blocking import BLOCKED, LANES, blocks

#: Interior pixels computed together: four independent accumulator chains hide the latency of
#: the multiply-adds.
TILE = 4
TILE_ELEMENTS = TILE * LANES


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
def _store(acc, i, out, plane, o, zb, code, low, high, zero):
    """Pixel ``o`` of the output plane from ``acc[i]``, through the epilogue (``zb`` is the
    residual's plane, or an empty row without one): all 16 lanes, a loop of constant length
    (one vector operation); the caller zeroes the lanes past C afterwards."""
    base = o * LANES
    if zb.shape[0] > 0:
        for t in range(LANES):
            out[plane, U(base + t)] = epilogue_residual(acc[i, t], zero,
                                                        zb[U(base + t)], code, low, high)
    else:
        for t in range(LANES):
            out[plane, U(base + t)] = epilogue_value(acc[i, t], zero, code, low, high)


def _compute_kernel(x: np.ndarray, packed: np.ndarray, bias: np.ndarray, offsets: np.ndarray,
                    width: int,
                    sh: int, sw: int, dh: int, dw: int, pt: int, pl: int, kernel_w: int,
                    channels: int, ow_total: int, code: int, low: float, high: float,
                    z: np.ndarray, has_residual: bool, out: np.ndarray) -> None:
    """x (N*B, H*W*16), packed (B, R*S*16), out and z (N*B, OH*OW*16): flat planes.
    ``offsets[r*S + s]`` is tap (r, s)'s offset in a plane; the interior pixels loop over the
    row's valid taps as one flat loop (nested tap loops made LLVM keep the four accumulators
    in memory)."""
    planes, nb = x.shape[0], packed.shape[0]
    height = x.shape[1] // (width * LANES)
    oh_total = out.shape[1] // (ow_total * LANES)
    kernel_h = packed.shape[1] // (kernel_w * LANES)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    zero = out.dtype.type(0)
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
        one = numba.carray(stack_buffer(LANES, out.dtype), (1, LANES))
        tile = numba.carray(stack_buffer(TILE_ELEMENTS, out.dtype), (TILE, LANES))
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
                    _store(tile, i, out, plane, oh * ow_total + ow + i, zb, code, low_v,
                           high_v, zero)
                ow += TILE
            else:  # one pixel, its valid taps only
                for t in range(LANES):
                    one[0, t] = bias[U(b * LANES + t)]
                left = ow * sw - pl
                s_lo = max(0, (-left + dw - 1) // dw)
                s_hi = min(kernel_w, (width - left + dw - 1) // dw)
                for r in range(r_lo, r_hi):
                    start = (top + r * dh) * row + left * LANES
                    for s in range(s_lo, s_hi):
                        at = start + s * dw * LANES
                        wat = (r * kernel_w + s) * LANES
                        for t in range(LANES):
                            one[0, t] += x[plane, U(at + t)] * packed[b, U(wat + t)]
                _store(one, 0, out, plane, oh * ow_total + ow, zb, code, low_v, high_v, zero)
                ow += 1


@numba.njit(inline="always")
def _put(out, plane, at, value, z, code, low, high, zero):
    """One output value through the epilogue, plus the residual unless ``z`` is None (a test
    decided when the kernel compiles: None is a type of its own)."""
    if z is None:
        out[plane, U(at)] = epilogue_value(value, zero, code, low, high)
    else:
        out[plane, U(at)] = epilogue_residual(value, zero, z[plane, U(at)], code, low, high)


@numba.njit(inline="always")
def _kernel_row(acc, src, at, packed, b, tap, t):
    """``acc`` plus one kernel row's three taps on lane ``t``: the input pixels at ``at``,
    ``at + 16`` and ``at + 32`` times taps ``tap`` to ``tap + 2`` of block ``b``."""
    return ((acc + src[U(at + t)] * packed[b, U(tap * LANES + t)])
            + src[U(at + LANES + t)] * packed[b, U((tap + 1) * LANES + t)]) \
        + src[U(at + 2 * LANES + t)] * packed[b, U((tap + 2) * LANES + t)]


def _compute3x3_kernel(x: np.ndarray, packed: np.ndarray, bias: np.ndarray, zeros: np.ndarray,
                       width: int, sh: int, sw: int, pt: int, pl: int, ow_total: int,
                       code: int, low: float, high: float, z: np.ndarray | None,
                       out: np.ndarray) -> None:
    """The 3x3 kernel (no dilation, any stride and padding): operands as
    :func:`_compute_kernel`'s, ``zeros`` a zero row at least one input row long.

    A task is one output row.  Its three kernel rows read the input, or ``zeros`` where they
    fall above or below it, so the interior pixels (every column inside) take all nine taps
    with no test: per pixel 9 vector loads of X, 9 of W and 9 multiply-adds, the lane loop
    one vector operation.  The few border pixels test their columns."""
    planes, nb = x.shape[0], packed.shape[0]
    height = x.shape[1] // (width * LANES)
    oh_total = out.shape[1] // (ow_total * LANES)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    zero = out.dtype.type(0)
    row = width * LANES
    # interior columns: ow * sw - pl >= 0 and ow * sw - pl + 2 <= width - 1
    first = min((pl + sw - 1) // sw, ow_total)
    last = max(first, min((width - 3 + pl) // sw + 1, ow_total))
    for task in prange(planes * oh_total):
        plane = task // oh_total
        oh = task - plane * oh_total
        b = plane % nb
        top = oh * sh - pt
        s0 = x[plane] if 0 <= top < height else zeros
        s1 = x[plane] if 0 <= top + 1 < height else zeros
        s2 = x[plane] if 0 <= top + 2 < height else zeros
        a0 = top * row if 0 <= top < height else 0
        a1 = (top + 1) * row if 0 <= top + 1 < height else 0
        a2 = (top + 2) * row if 0 <= top + 2 < height else 0
        start = oh * ow_total * LANES
        for ow in range(first, last):
            c = (ow * sw - pl) * LANES
            at = start + ow * LANES
            for t in range(LANES):
                acc = bias[U(b * LANES + t)]
                acc = _kernel_row(acc, s0, a0 + c, packed, b, 0, t)
                acc = _kernel_row(acc, s1, a1 + c, packed, b, 3, t)
                acc = _kernel_row(acc, s2, a2 + c, packed, b, 6, t)
                _put(out, plane, at + t, acc, z, code, low_v, high_v, zero)
        for ow in range(ow_total):
            if first <= ow < last:
                continue
            left = ow * sw - pl
            at = start + ow * LANES
            for t in range(LANES):
                acc = bias[U(b * LANES + t)]
                for s in range(3):
                    if 0 <= left + s < width:
                        c = (left + s) * LANES + t
                        acc = ((acc + s0[U(a0 + c)] * packed[b, U(s * LANES + t)])
                               + s1[U(a1 + c)] * packed[b, U((3 + s) * LANES + t)]) \
                            + s2[U(a2 + c)] * packed[b, U((6 + s) * LANES + t)]
                _put(out, plane, at + t, acc, z, code, low_v, high_v, zero)


@functools.cache
def _compiled() -> tuple[Callable[..., None], ...]:
    """(pack, compute, compute3x3) for float32, compiled (or loaded from numba's cache) on
    first use."""
    f32 = np.dtype(np.float32)
    intp = types.intp
    c_in = functools.partial(types.Array, item_type(f32), layout="C", readonly=True)
    pack = numba.njit(types.void(readonly(f32, 4), readonly(f32, 1), types.boolean,
                                 buffer(f32, 3), buffer(f32, 1)), cache=CACHE)(_pack_kernel)
    compute = numba.njit(
        types.void(c_in(ndim=2), c_in(ndim=2), c_in(ndim=1),
                   types.Array(types.int64, 1, "C", readonly=True), *[intp] * 10, intp,
                   types.float64, types.float64, c_in(ndim=2), types.boolean, buffer(f32, 2)),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_compute_kernel)
    head = (c_in(ndim=2), c_in(ndim=2), c_in(ndim=1), c_in(ndim=1), *[intp] * 6, intp,
            types.float64, types.float64)
    compute3x3 = numba.njit(
        [types.void(*head, residual, buffer(f32, 2)) for residual in (types.none, c_in(ndim=2))],
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_compute3x3_kernel)
    return pack, compute, compute3x3


def _three_by_three(geo: ConvGeometry) -> bool:
    """Whether :func:`_compute3x3_kernel` serves the problem: a 3x3 kernel, no dilation."""
    return (geo.r, geo.s, geo.dil_h, geo.dil_w) == (3, 3, 1, 1)


@functools.lru_cache(maxsize=64)
def _zero_row(length: int) -> np.ndarray:
    """A read-only zero row that the 3x3 kernel reads for kernel rows outside the input."""
    row = np.zeros(length, dtype=np.float32)
    row.flags.writeable = False
    return row


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
        if _three_by_three(geo):
            _compiled()[2](x, packed.reshape(blocks(geo.c), -1), packed_bias,
                           _zero_row(geo.w * LANES), geo.w, geo.stride_h, geo.stride_w,
                           geo.pad_top, geo.pad_left, geo.ow, *epilogue,
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
