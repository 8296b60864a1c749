"""Implicit GEMM: im2col's product computed straight from the input, in 8 x 16 register tiles
(4 x 16 on AVX2, :func:`fastrun_algorithms._common.register_tile`, and 3 x 32 there on output
rows of 24 or more, :func:`fastrun_algorithms._common.three_row_tile`).

The output of one image is the product (K, C*R*S) @ cols, cols being the unfolded patches; this
kernel never builds cols.  The input is staged once, padded and split into column phases (the
same staging as im2col's unfold: phase p of a row holds padded columns ``m*sw + p``), so that
for any tap (c, r, s) the values 16 consecutive output columns read are 16 consecutive staged
values.  Each parallel job then computes an 8 x 16 tile of the output (8 output channels, 16
columns of one output row) like the ``register_tiled`` matmul: eight weights broadcast per tap,
one vector load of staged input, eight vector multiply-adds into a tile held in registers (a
stack buffer, :func:`fastrun_algorithms._common.stack_buffer`), and the epilogue (bias,
activation) applied as the tile is stored; none, relu and clip as selects
(``epilogue.clamp``), so that the store loop stays a vector loop.  With AVX2's 16 registers
the tile is 4 channels x two vectors: two loads and four broadcasts per eight multiply-adds
instead of one load and eight; on rows of 24 or more, 3 channels x four vectors (four loads and
three broadcasts per twelve).  The tap offsets are a small table computed once per
problem, so the loop over (channel, tap) does no division.

Where it wins: the first layer of an image network (3 input channels, a 7x7 stride-2 kernel,
112x112 outputs), whose unfolded matrix would be 147 x 12544 (7.4 MB per image) and whose
direct kernel keeps few values in registers.  Elsewhere im2col with a tuned product or Winograd
is usually faster; profiling decides.

Edges: the last column tile of a row is shifted left to end at the row's end, overlapping the
one before it (computed twice, identically); rows narrower than a tile compute a whole tile
and store the real ones (the staged rows are wide enough).  Output channels past a multiple
of the tile's rows repeat the last channel and are not stored.

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
    ScratchPool,
    U,
    register_tile,
    stack_buffer,
    three_row_tile,
    tile_fma3,
    tile_fma4,
    tile_fma8,
    tile_rows8,
    vector_registers,
)
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._gemm_common import buffer, item_type, no_bias, operands, readonly
from fastrun_algorithms.conv._kernels_common import stage_row
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    bounds,
    epilogue_args,
    residual_operand,
    store_tile,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry

#: Output channels and output columns of one job's tile (see ``matmul/register_tiled.py``):
#: 8 x 16 where there are 32 vector registers, 4 x 16 on AVX2's 16 ...
NARROW = register_tile(16)
#: ... and there 3 x 32 (:func:`fastrun_algorithms._common.three_row_tile`) on output rows of
#: at least :data:`WIDE_MIN_COLUMNS`: 0.85-0.95 of the 4 x 16 tile's time on rows of 27 to
#: 224 on the 2-core AVX2 VM, 1.7x on rows of 13, where most of its 32 columns are overhang.
WIDE = three_row_tile() if vector_registers()[0] < 32 else NARROW
WIDE_MIN_COLUMNS = 24
#: every tile a kernel is compiled for
TILES = tuple(dict.fromkeys((NARROW, WIDE)))


def _stage_kernel(x: np.ndarray, n: int, staged: np.ndarray, rows: int, wq: int, pt: int,
                  pl: int, sw: int) -> None:
    """``staged[(c*sw + p)*rows*wq + h*wq + m] = x[n, c, h - pt, m*sw + p - pl]``, parallel
    over (channel, input row): only the input's own values are written, the padding (rows and
    columns) having been zeroed when the buffer was made (:meth:`ImplicitGemmConv.run`).  One
    task per row rather than per channel: the first layer of an image network has three
    channels, which left all but three threads idle while a 640 KB buffer was zeroed."""
    channels, height = x.shape[1], x.shape[2]
    pitch = rows * wq
    per_channel = sw * pitch
    inside = max(0, min(height, rows - pt))  # input rows that land in the staged rows
    for task in prange(channels * inside):
        c = task // inside
        ih = task - c * inside
        stage_row(staged, c * per_channel + (ih + pt) * wq, pitch, x, n, c, ih, pl, sw, wq)


def _compute_kernel(mr: int, nr: int) -> Callable[..., None]:
    """The compute kernel for a tile of ``mr`` output channels x ``nr`` output columns (both
    compile-time constants of the closure)."""
    tile = mr * nr

    def compute(w: np.ndarray, staged: np.ndarray, taps: np.ndarray, bias: np.ndarray,
                has_bias: bool, code: int, low: float, high: float, out: np.ndarray, n: int,
                sh: int, sw: int, rows: int, wq: int, z: np.ndarray,
                has_residual: bool) -> None:
        """``out[n]`` from the staged image: ``w`` is the weights as (K, C*R*S), ``taps[r*S + s]``
        the staged offset of tap (r, s) from a channel's output-row origin; the residual ``z[n]``
        is added before the activation when ``has_residual``."""
        k_total = w.shape[0]
        taps_per_channel = taps.shape[0]
        channels = w.shape[1] // taps_per_channel
        out_h, out_w = out.shape[2], out.shape[3]
        plane = sw * rows * wq
        row_blocks = (k_total + mr - 1) // mr
        col_tiles = (out_w + nr - 1) // nr
        per_row = col_tiles * row_blocks
        low_v, high_v = out.dtype.type(low), out.dtype.type(high)
        bounded, floor, ceiling = bounds(code, low, high, out)
        out3 = out.reshape((out.shape[0], k_total, out_h * out_w))
        z3 = z.reshape((z.shape[0], z.shape[1], z.shape[2] * z.shape[3]))
        for job in prange(out_h * per_row):
            y = job // per_row
            rest = job - y * per_row
            tj = rest // row_blocks
            i0 = (rest - tj * row_blocks) * mr
            x0 = min(tj * nr, out_w - nr) if out_w >= nr else 0
            i_0, r1, r2, r3, r4, r5, r6, r7 = tile_rows8(i0, k_total - 1)
            acc = numba.carray(stack_buffer(tile, out.dtype), (mr, nr))
            scratch = numba.carray(stack_buffer(tile, out.dtype), (tile,))
            for a in range(mr):
                for t in range(nr):
                    acc[a, t] = 0
            origin = y * sh * wq + x0
            for c in range(channels):
                channel_origin = c * plane + origin
                for tap in range(taps_per_channel):
                    base = U(channel_origin + taps[tap])
                    k = c * taps_per_channel + tap
                    if mr == 8:
                        w0, w1, w2, w3 = w[i_0, k], w[r1, k], w[r2, k], w[r3, k]
                        w4, w5, w6, w7 = w[r4, k], w[r5, k], w[r6, k], w[r7, k]
                        for t in range(nr):
                            tile_fma8(acc, t, staged[base + U(t)], w0, w1, w2, w3, w4, w5,
                                      w6, w7)
                    elif mr == 4:
                        w0, w1, w2, w3 = w[i_0, k], w[r1, k], w[r2, k], w[r3, k]
                        for t in range(nr):
                            tile_fma4(acc, t, staged[base + U(t)], w0, w1, w2, w3)
                    else:
                        w0, w1, w2 = w[i_0, k], w[r1, k], w[r2, k]
                        for t in range(nr):
                            tile_fma3(acc, t, staged[base + U(t)], w0, w1, w2)
            store_tile(out3, z3, has_residual, n, i0, min(mr, k_total - i0), U(y * out_w + x0),
                       min(nr, out_w), acc, scratch, bias, has_bias, bounded, floor, ceiling,
                       code, low_v, high_v)

    return compute


@functools.cache
def _compiled_stage(dtype: np.dtype, x_layout: str) -> Callable[..., None]:
    """The staging kernel for one dtype and input layout ("C" or "A"), compiled (or loaded
    from numba's cache) on first use; the same for every tile."""
    intp = types.intp
    return numba.njit(
        types.void(types.Array(item_type(dtype), 4, x_layout, readonly=True), intp,
                   buffer(dtype, 1), intp, intp, intp, intp, intp),
        parallel=True, cache=CACHE)(_stage_kernel)


@functools.cache
def _compiled_compute(dtype: np.dtype, tile: tuple[int, int]) -> Callable[..., None]:
    """The compute kernel for one dtype and tile, compiled (or loaded from numba's cache) on
    first use; it reads the staged image, whatever the input's layout."""
    intp = types.intp
    return numba.njit(
        types.void(types.Array(item_type(dtype), 2, "C", readonly=True),
                   types.Array(item_type(dtype), 1, "C", readonly=True),
                   types.Array(types.int64, 1, "C", readonly=True), readonly(dtype, 1),
                   types.boolean, intp, types.float64, types.float64, buffer(dtype, 4), intp,
                   intp, intp, intp, intp, types.Array(item_type(dtype), 4, "C", readonly=True),
                   types.boolean),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_compute_kernel(*tile))


class _Plan:
    """The staged image's shape and the tap table for one problem (built once per problem, see
    :func:`_plan`: the table is read by every call)."""

    def __init__(self, geo: ConvGeometry):
        #: the register tile: the wide one on rows it mostly fills
        self.tile = WIDE if geo.ow >= WIDE_MIN_COLUMNS else NARROW
        #: staged rows: every padded input row some output row reads
        self.rows = (geo.oh - 1) * geo.stride_h + (geo.r - 1) * geo.dil_h + 1
        #: positions per phase row: a whole tile past the last tap's start, so that rows
        #: narrower than a tile stay inside the buffer
        self.wq = max(geo.ow, self.tile[1]) + (geo.s - 1) * geo.dil_w // geo.stride_w
        self.staged = geo.c * geo.stride_w * self.rows * self.wq
        sw = geo.stride_w
        #: staged offset of tap (r, s) from a channel's output-row origin, read-only (shared)
        self.taps = np.array([((s * geo.dil_w % sw) * self.rows + r * geo.dil_h) * self.wq
                              + s * geo.dil_w // sw
                              for r in range(geo.r) for s in range(geo.s)], dtype=np.int64)
        self.taps.flags.writeable = False


@functools.lru_cache(maxsize=1024)
def _plan(problem: Problem) -> _Plan:
    return _Plan(geometry(problem))


#: The staged images of the problems run so far, their padding zeroed once (ScratchPool).
_SCRATCH = ScratchPool()


class ImplicitGemmConv(ConvAlgorithm):
    """Register-tiled implicit GEMM from a staged copy of the input; group 1, any stride,
    dilation and padding."""

    operator = "conv"
    name = "implicit_gemm"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the 4 x 16 tile on 16 registers; 3: hard_swish, sigmoid, silu and hard_sigmoid in
    #: vector loops, and the 3 x 32 tile on wide rows there;
    #: 4: the epilogue over the whole tile (``epilogue.store_tile``)
    version = 4
    #: where its staged image is kept between calls
    scratch = _SCRATCH

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if geo.group != 1:
            return f"implicit_gemm needs group 1 (got {geo.group})"
        return None

    def workspace_bytes(self, problem: Problem) -> int:
        """The staged image (reused by every image of the batch, and kept for the next call of
        the problem); the tap table is built once per problem and kept.  The weights are
        viewed as (K, C*R*S); only a non-contiguous weight array (never one a runtime or the
        profiler passes) would be copied for that."""
        return _plan(problem).staged * geometry(problem).itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        plan = _plan(problem)
        x, w, bias = operands(geo, inputs)
        dtype = x.dtype
        stage = _compiled_stage(dtype, "C" if x.flags.c_contiguous else "A")
        compute = _compiled_compute(dtype, plan.tile)
        weights = np.ascontiguousarray(w.reshape(geo.k, math.prod(w.shape[1:])))
        out = np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=dtype)
        scratch = _SCRATCH.take(problem.key, lambda: (np.zeros(plan.staged, dtype=dtype),))
        staged = scratch[0]
        z = residual_operand(geo, inputs)
        for n in range(geo.n):
            stage(x, n, staged, plan.rows, plan.wq, geo.pad_top, geo.pad_left, geo.stride_w)
            compute(weights, staged, plan.taps, no_bias(dtype) if bias is None else bias,
                    bias is not None, *epilogue_args(geo), out, n, geo.stride_h,
                    geo.stride_w, plan.rows, plan.wq, z, geo.has_residual)
        _SCRATCH.give(problem.key, scratch)
        return geo.output_view(out)

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (1, 2) if heuristic.few_channels(geo) else (3, 1)


def algorithms() -> list[Algorithm]:
    return [ImplicitGemmConv()]
