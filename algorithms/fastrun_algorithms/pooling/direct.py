"""maxpool and avgpool in parallel numba, one (image, channel) plane per task, no padded copy.

Made for the pooling layers of CNNs (3x3 stride 2 after the first convolution): the numpy
algorithm first copies X into a padded buffer.  Here each output row is its own accumulator:
every kernel tap that lands inside the input combines one strided input row segment into the
outputs it reaches (a long, independent, vectorised loop; a per-output window loop is bound by
the latency of its one accumulator instead), so padding is never read nor written, and the
range of outputs a tap reaches is computed once per row and tap.

One kernel covers max and both averages, 1-D (as 2-D with a height of 1) and 2-D, any input
layout, compiled once per dtype.  Each output is combined by one task in kernel-row-major order,
whatever the thread count: reproducible.
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
from fastrun_algorithms._common import floor_div
from fastrun_algorithms.pooling.geometry import pool_geometry

#: Unsigned index cast (see :func:`_combine_row`).
U = numba.uint64
#: ``mode`` argument of the kernel
MAX, AVERAGE, AVERAGE_WITH_PAD = 0, 1, 2


@numba.njit(cache=True, inline="always")
def _tap_range(start, kernel, dilation, limit):
    """The taps ``j`` in ``[first, end)`` with ``0 <= start + j * dilation < limit``."""
    first = 0 if start >= 0 else floor_div(dilation - 1 - start, dilation)
    if limit - start >= 1 + (kernel - 1) * dilation:
        end = kernel
    elif limit - 1 - start < 0:
        end = 0
    else:
        end = floor_div(limit - 1 - start, dilation) + 1
    return first, max(first, end)


@numba.njit(cache=True, inline="always")
def _combine_row(out, n, c, oh, first, end, x, ih, offset, step, is_max):
    """For ``ow`` in ``[first, end)``: ``out[n, c, oh, ow]`` combined with
    ``x[n, c, ih, offset + (ow - first) * step]``, by max (NaN wins and stays, as with
    np.maximum) or sum.  Indices are unsigned (never negative here), which spares numba's
    negative-index wraparound test; steps 1 and 2 are constants so that the loops vectorise."""
    count = end - first
    if is_max:
        if step == 1:
            for t in range(count):
                v = x[n, c, ih, U(offset) + U(t)]
                a = out[n, c, oh, U(first) + U(t)]
                out[n, c, oh, U(first) + U(t)] = v if v > a or v != v else a
        elif step == 2:
            for t in range(count):
                v = x[n, c, ih, U(offset) + U(t) * U(2)]
                a = out[n, c, oh, U(first) + U(t)]
                out[n, c, oh, U(first) + U(t)] = v if v > a or v != v else a
        else:
            for t in range(count):
                v = x[n, c, ih, U(offset + t * step)]
                a = out[n, c, oh, U(first) + U(t)]
                out[n, c, oh, U(first) + U(t)] = v if v > a or v != v else a
    elif step == 1:
        for t in range(count):
            out[n, c, oh, U(first) + U(t)] += x[n, c, ih, U(offset) + U(t)]
    elif step == 2:
        for t in range(count):
            out[n, c, oh, U(first) + U(t)] += x[n, c, ih, U(offset) + U(t) * U(2)]
    else:
        for t in range(count):
            out[n, c, oh, U(first) + U(t)] += x[n, c, ih, U(offset + t * step)]


@numba.njit(cache=True)
def _pool_plane(x, out, plane, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, mode):
    """Pool plane ``plane`` (image ``plane // C``, channel ``plane % C``) of ``x`` into
    ``out``, one output row at a time: the row is the accumulator, and each kernel tap inside
    the input adds one strided input row segment to the outputs it reaches.  A plain function
    called from the parallel loop rather than the loop's body: numba's parallel passes then see
    a one-line loop, which keeps compilation fast.  No views are made (a view costs an atomic
    reference count update, which threads contend for)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    out_h, out_w = out.shape[2], out.shape[3]
    n, c = plane // channels, plane % channels
    is_max = mode == MAX
    start = out.dtype.type(-np.inf) if is_max else out.dtype.type(0)
    # interior columns: every tap inside the input (their divisor along W is kw)
    col_first = min(out_w, floor_div(pl + sw - 1, sw))
    last_start = width - 1 - (kw - 1) * dw + pl
    col_end = max(col_first, min(out_w, floor_div(last_start, sw) + 1 if last_start >= 0
                                 else 0))
    for oh in range(out_h):
        for ow in range(out_w):
            out[n, c, oh, ow] = start
        h0 = oh * sh - pt
        i0, i1 = _tap_range(h0, kh, dh, height)
        for i in range(i0, i1):
            ih = h0 + i * dh
            for j in range(kw):
                # the outputs whose tap j lands inside the row: ow * sw + j * dw - pl in
                # [0, width)
                first, end = _tap_range(j * dw - pl, out_w, sw, width)
                if first < end:
                    _combine_row(out, n, c, oh, first, end, x, ih, first * sw + j * dw - pl,
                                 sw, is_max)
        if is_max:
            continue
        if mode == AVERAGE_WITH_PAD:  # taps inside the explicitly padded rows
            rows = _tap_range(h0 + pt, kh, dh, height + pt + pb)[1]
        else:
            rows = i1 - i0
        for ow in range(out_w):
            if col_first <= ow < col_end:
                cols = kw
            elif mode == AVERAGE_WITH_PAD:
                cols = _tap_range(ow * sw, kw, dw, width + pl + pr)[1]
            else:
                j0, j1 = _tap_range(ow * sw - pl, kw, dw, width)
                cols = j1 - j0
            out[n, c, oh, ow] /= rows * cols


def _pool_kernel(x, out, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, mode):
    """out = pool(x), one task per (image, channel) plane."""
    for plane in prange(out.shape[0] * out.shape[1]):
        _pool_plane(x, out, plane, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, mode)


@functools.cache
def _compiled(dtype: np.dtype) -> Callable[..., None]:
    """The kernel for one dtype, compiled (or loaded from numba's cache) on first use.  X of
    any layout ("A"): strided inputs are read in place, one compilation covers them all."""
    item = numba.from_dtype(dtype)
    signature = types.void(types.Array(item, 4, "A", readonly=True), types.Array(item, 4, "C"),
                           *[types.intp] * 11)
    return numba.njit(signature, parallel=True, cache=True)(_pool_kernel)


class DirectPool(Algorithm):
    """maxpool or avgpool by the parallel numba kernel; 1-D and 2-D only."""

    name = "direct"
    # usability is decided by kernel_shape's length alone, not by the sizes
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, operator: str):
        self.operator = operator
        super().__init__()

    def unusable_reason(self, problem: Problem) -> str | None:
        spatial = len(problem.shapes[0]) - 2
        if spatial > 2:
            return f"direct pools 1-D and 2-D inputs only, X is {spatial}-D"
        return None

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = pool_geometry(problem)
        x = inputs[0]
        out = np.empty(geo.out_shape, dtype=geo.dtype)
        if geo.spatial == 1:  # as 2-D with a height of 1
            x4, out4 = x[:, :, None, :], out[:, :, None, :]
            geometry = ((1, *geo.kernel), (1, *geo.strides), (1, *geo.dilations),
                        (0, *geo.begins), (0, *geo.ends))
        else:
            x4, out4 = x, out
            geometry = (geo.kernel, geo.strides, geo.dilations, geo.begins, geo.ends)
        (kh, kw), (sh, sw), (dh, dw), (pt, pl), (pb, pr) = geometry
        mode = (AVERAGE_WITH_PAD if geo.count_include_pad else AVERAGE) if geo.average else MAX
        _compiled(np.dtype(geo.dtype))(x4, out4, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, mode)
        return out


def algorithms() -> list[Algorithm]:
    return [DirectPool("maxpool"), DirectPool("avgpool")]
