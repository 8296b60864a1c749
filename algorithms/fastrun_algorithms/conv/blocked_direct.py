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
first staged into a zero-bordered copy (one parallel pass, ``(N, C, Hp, Wp)``); unpadded
inputs are read where they lie.  The epilogue (bias, residual, activation) is applied as the
tile is stored into the output.

Layouts.  NCHW, and ``nchw16c`` (see :mod:`fastrun_algorithms.layout.blocking`): there the
tables count in elements of the blocked tensor, the staged copy is blocked too, and a tile is
stored as whole 16-lane vectors instead of 16 strided rows.

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
from fastrun_algorithms._common import FASTMATH, U, stack_buffer
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._gemm_common import buffer, item_type, no_bias, operands, readonly
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    activation_code,
    epilogue_residual,
    epilogue_value,
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


@numba.njit(inline="always")
def _fma_tile(acc, t, x0, x1, x2, x3, x4, x5, wa, wb):
    """Lane ``t`` of the tile: ``acc[b, p, t] += x_p * w_b`` for both blocks and 6 pixels.
    Called in a loop over t, each line becomes one vector multiply-add of a broadcast pixel."""
    acc[0, 0, t] += x0 * wa
    acc[0, 1, t] += x1 * wa
    acc[0, 2, t] += x2 * wa
    acc[0, 3, t] += x3 * wa
    acc[0, 4, t] += x4 * wa
    acc[0, 5, t] += x5 * wa
    acc[1, 0, t] += x0 * wb
    acc[1, 1, t] += x1 * wb
    acc[1, 2, t] += x2 * wb
    acc[1, 3, t] += x3 * wb
    acc[1, 4, t] += x4 * wb
    acc[1, 5, t] += x5 * wb


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
            _fma_tile(acc, t, x0, x1, x2, x3, x4, x5, packed[g, b0, d, U(t)],
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


def _stage_kernel(x: np.ndarray, staged: np.ndarray, pt: int, pl: int) -> None:
    """``staged[n, c, h, w] = x[n, c, h - pt, w - pl]``, zero outside x; parallel over the
    (image, channel) planes."""
    batch, channels, height, width = x.shape
    rows, cols = staged.shape[2], staged.shape[3]
    for plane in prange(batch * channels):
        n = plane // channels
        c = plane - n * channels
        for h in range(rows):
            ih = h - pt
            if 0 <= ih < height:
                for v in range(min(pl, cols)):
                    staged[n, c, h, v] = 0
                for v in range(pl, min(pl + width, cols)):
                    staged[n, c, h, v] = x[n, c, ih, v - pl]
                for v in range(pl + width, cols):
                    staged[n, c, h, v] = 0
            else:
                for v in range(cols):
                    staged[n, c, h, v] = 0


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
    for job in prange(batch * per_image):
        n, g, b0, b1, p0 = _job(job, per_image, blocks, base)
        acc = numba.carray(stack_buffer(TILE, out.dtype), (2, PIXELS, LANES))
        _accumulate(acc, xs, n, packed, g, b0, b1, base, p0, g * group_stride, taps)
        last = min(PIXELS, pixels - p0)
        for i in range(2 if b1 > b0 else 1):
            k0 = (b0 + i) * LANES
            for t in range(min(LANES, kg - k0)):
                k = g * kg + k0 + t
                b = bias[k] if has_bias else bias[0] - bias[0]
                if has_residual:
                    for p in range(last):
                        out[n, k, U(p0 + p)] = epilogue_residual(
                            acc[i, p, t], b, z[n, k, U(p0 + p)], code, low_v, high_v)
                else:
                    for p in range(last):
                        out[n, k, U(p0 + p)] = epilogue_value(acc[i, p, t], b, code, low_v,
                                                              high_v)


def _compute_blocked_kernel(xs: np.ndarray, packed: np.ndarray, base: np.ndarray,
                            taps: np.ndarray, group_stride: int, bias: np.ndarray,
                            has_bias: bool, code: int, low: float, high: float, z: np.ndarray,
                            has_residual: bool, k_total: int, out: np.ndarray) -> None:
    """:func:`_compute_kernel` for the ``nchw16c`` layout: ``out`` (N, K/16, P, 16) and ``z``
    alike, so a tile is stored as 6 whole vectors.  Lanes past K are not written (the caller
    zeroes them: a second store loop here made LLVM spill the accumulator tile, 2.5x slower).
    A group's channels start on a block boundary (group 1, or C/group and K/group multiples of
    16), so group g's first output block is ``g * blocks``."""
    batch, _, pixels, _ = out.shape
    group, blocks = packed.shape[0], packed.shape[1]
    per_image = group * _per_group(blocks, base)
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    zero = out.dtype.type(0)
    for job in prange(batch * per_image):
        n, g, b0, b1, p0 = _job(job, per_image, blocks, base)
        acc = numba.carray(stack_buffer(TILE, out.dtype), (2, PIXELS, LANES))
        _accumulate(acc, xs, n, packed, g, b0, b1, base, p0, g * group_stride, taps)
        last = min(PIXELS, pixels - p0)
        for i in range(2 if b1 > b0 else 1):
            ob = g * blocks + b0 + i
            k0 = ob * LANES
            valid = min(LANES, k_total - k0)
            for t in range(valid):
                b = bias[U(k0 + t)] if has_bias else zero
                if has_residual:
                    for p in range(last):
                        out[n, ob, U(p0 + p), t] = epilogue_residual(
                            acc[i, p, t], b, z[n, ob, U(p0 + p), t], code, low_v, high_v)
                else:
                    for p in range(last):
                        out[n, ob, U(p0 + p), t] = epilogue_value(acc[i, p, t], b, code,
                                                                  low_v, high_v)


@functools.cache
def _compiled() -> tuple[Callable[..., None], ...]:
    """(pack, stage, compute, compute_blocked) for float32, compiled (or loaded from numba's
    cache) on first use.  Inputs of any layout share one variant of pack and stage (each reads
    them once); the compute kernels take only C-contiguous arrays, whose strides LLVM then
    knows."""
    f32 = np.dtype(np.float32)
    intp = types.intp
    c_in = functools.partial(types.Array, item_type(f32), layout="C", readonly=True)
    pack = numba.njit(types.void(readonly(f32, 4), buffer(f32, 4)), parallel=True,
                      cache=True)(_pack_kernel)
    stage = numba.njit(types.void(readonly(f32, 4), buffer(f32, 4), intp, intp), parallel=True,
                       cache=True)(_stage_kernel)
    index = types.Array(types.int64, 1, "C", readonly=True)
    head = (c_in(ndim=2), c_in(ndim=4), index, index, intp, readonly(f32, 1), types.boolean,
            intp, types.float64, types.float64)
    compute = numba.njit(
        types.void(*head, c_in(ndim=3), types.boolean, buffer(f32, 3)),
        parallel=True, cache=True, fastmath=FASTMATH)(_compute_kernel)
    compute_blocked = numba.njit(
        types.void(*head, c_in(ndim=4), types.boolean, intp, buffer(f32, 4)),
        parallel=True, cache=True, fastmath=FASTMATH)(_compute_blocked_kernel)
    return pack, stage, compute, compute_blocked


class _Plan:
    """What one problem's calls share: the staged planes' shape, the pixel and tap offset
    tables (read-only, built once per problem) and the packed weights' shape.

    In ``nchw16c`` every offset is in elements of the blocked tensor: a pixel is 16 elements
    wide, channel c sits in block c // 16 at lane c % 16, and the staged copy is blocked too.
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
        if geo.blocked:
            self.group_stride = geo.cg // LANES * plane  # groups start on block boundaries
            channel = [c // LANES * plane + c % LANES for c in range(geo.cg)]
            self.staged_shape = (geo.n, blocks(geo.c), self.rows, self.cols, LANES)
        else:
            self.group_stride = geo.cg * plane
            channel = [c * plane for c in range(geo.cg)]
            self.staged_shape = (geo.n, geo.c, self.rows, self.cols)
        self.taps = _frozen([channel[c] + (r * geo.dil_h * self.cols + s * geo.dil_w) * self.step
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


class BlockedDirectConv(ConvAlgorithm):
    """Direct convolution with 16-channel weight blocks and register tiles of 2 blocks x 6
    pixels (see the module docstring); float32, any group, stride, dilation and padding."""

    operator = "conv"
    name = "blocked_direct"
    attributes = AlgoAttribute.REPRODUCIBLE

    layouts = (NCHW, BLOCKED)

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        if problem.dtypes[0] != "float32":
            return (f"blocked_direct computes float32 only (got {problem.dtypes[0]}): its tile "
                    f"of 16-lane blocks would not fit the vector registers in float64")
        geo = geometry(problem)
        if geo.blocked and geo.group > 1 and (geo.cg % LANES or geo.kg % LANES):
            return (f"in {BLOCKED} its groups must start on channel blocks: C/group={geo.cg} "
                    f"and K/group={geo.kg} are not multiples of {LANES}")
        return None

    def workspace_bytes(self, problem: Problem) -> int:
        """The staged copy of a padded input, and the packed weights when they are not
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
        packed = np.empty(_plan(problem).packed_shape, dtype=np.float32)
        _compiled()[0](w, packed)
        return packed

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        plan = _plan(problem)
        x, w, bias = operands(geo, inputs)
        _, stage, compute, compute_blocked = _compiled()
        packed = self._pack(problem, w) if prepared is None else prepared
        if plan.staged:
            xs = np.empty(plan.staged_shape, dtype=np.float32)
            # nchw16c stages as NCHW planes whose rows are 16 times as wide
            stage(x.reshape(*plan.staged_shape[:2], geo.h, -1) if geo.blocked else x,
                  xs.reshape(*plan.staged_shape[:3], -1), geo.pad_top, geo.pad_left * plan.step)
        else:
            xs = np.ascontiguousarray(x)
        z = residual_operand(geo, inputs)
        args = (xs.reshape(geo.n, -1), packed, plan.base, plan.taps, plan.group_stride,
                no_bias(np.dtype(np.float32)) if bias is None else bias, bias is not None,
                activation_code(geo), float(geo.clip_min), float(geo.clip_max))
        if geo.blocked:
            out = np.empty(geo.out_shape, dtype=np.float32)
            if geo.has_residual:
                z = z.reshape(*z.shape[:2], -1, LANES)
            compute_blocked(*args, z, geo.has_residual, geo.k,
                            out.reshape(geo.n, -1, geo.oh * geo.ow, LANES))
            if geo.k % LANES:
                out[:, -1, ..., geo.k % LANES:] = 0
            return out
        out = np.empty((geo.n, geo.k, geo.oh * geo.ow), dtype=np.float32)
        compute(*args, z.reshape(z.shape[0], z.shape[1], -1), geo.has_residual, out)
        return geo.output_view(out.reshape(geo.n, geo.k, geo.oh, geo.ow))

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        if geo.kg < heuristic.BLOCKED_MIN_CHANNELS:
            return (4, 1)
        if heuristic.few_channels(geo):
            return (1, 2.5)
        if numba.get_num_threads() >= heuristic.BLOCKED_MIN_THREADS:
            if (geo.r, geo.s) == (1, 1) and geo.n == 1 \
                    and geo.cg >= heuristic.BLOCKED_MIN_DEPTH_1X1:
                return (0, 0.5)
            if geo.n * geo.oh * geo.ow < heuristic.BLOCKED_MAX_WINOGRAD_PIXELS:
                return (1, -1)
        return (2, 0)


def algorithms() -> list[Algorithm]:
    return [BlockedDirectConv()]
