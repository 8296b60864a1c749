"""maxpool an output row at a time: the window's input rows reduced first, then the columns.

Why it exists.  ``direct`` stages each input plane split into column phases, then combines one
staged run per tap into the output row; on SqueezeNet's 3x3 stride-2 pools (64 x 111x111,
128 x 55x55, 256 x 27x27) on the 2-core VM it took 336, 265 and 245 us, 3-4x this algorithm's
time (121, 77 and 58 us), and the three took 0.83 ms inside the model against onnxruntime's
0.19 ms.  A max is separable: the max over a window is the max over its columns of the max
over its rows.  So for each output row, the window's input rows are reduced elementwise into
one row (contiguous loads on every side: a vector loop), written into a stack buffer between
padding columns that hold -inf; then each output takes the max of its ``kw`` entries of that
row (a short loop over L1-resident values, strided for stride 2).  Nothing is staged or copied,
and every input row is read from where it lies.

Rows outside the input are skipped (padding above and below reads nothing); columns outside
it read the -inf padding of the buffer, as ONNX's MaxPool treats padding.  ceil_mode's
overhang is padding too.  A NaN in a window wins and stays, as with ``np.maximum``.

1-D as 2-D with a height of 1; any dilation.  Exact, so REPRODUCIBLE whatever the thread count.
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
from fastrun_algorithms._common import CACHE, U, stack_buffer
from fastrun_algorithms.pooling.direct import as_2d, nan_max
from fastrun_algorithms.pooling.geometry import PoolGeometry, pool_geometry

#: Longest padded row the stack buffer holds (input columns, both paddings and ceil_mode's
#: overhang): 16 KB of float32 on a worker's stack.
ROW = 4096


@numba.njit(cache=CACHE, inline="always")
def _reduce_rows(x, n, c, v, pl, ih0, rows, dh):
    """``v[pl + i] = max over the ``rows`` input rows ih0, ih0 + dh, ... of x[n, c, row, i]``:
    three rows in one pass (the common 3x3 window), others one row at a time."""
    width = x.shape[3]
    if rows == 3:
        a, b, d = x[n, c, ih0], x[n, c, ih0 + dh], x[n, c, ih0 + 2 * dh]
        for i in range(width):
            v[U(pl + i)] = nan_max(nan_max(a[U(i)], b[U(i)]), d[U(i)])
        return
    a = x[n, c, ih0]
    for i in range(width):
        v[U(pl + i)] = a[U(i)]
    for r in range(1, rows):
        a = x[n, c, ih0 + r * dh]
        for i in range(width):
            v[U(pl + i)] = nan_max(v[U(pl + i)], a[U(i)])


def _max_rows_kernel(x, out, kh, kw, sh, sw, dh, dw, pt, pl, span):
    """out = maxpool(x), one (image, channel) plane per task (see the module docstring);
    ``span``: the entries of the row buffer in use (:func:`_span`)."""
    images, channels, height, width = x.shape
    out_h, out_w = out.shape[2], out.shape[3]
    for plane in prange(images * channels):
        n = plane // channels
        c = plane - n * channels
        v = numba.carray(stack_buffer(ROW, x.dtype), (ROW,))
        low = -np.inf
        for i in range(pl):
            v[i] = low
        for i in range(pl + width, span):
            v[i] = low
        for oh in range(out_h):
            top = oh * sh - pt
            first = 0 if top >= 0 else (dh - 1 - top) // dh  # taps above the input skipped
            last = min(kh, (height - 1 - top) // dh + 1)  # ... and below it
            o = out[n, c, oh]
            if last <= first:  # a window wholly in the padding: ONNX's -inf
                for ow in range(out_w):
                    o[ow] = low
                continue
            _reduce_rows(x, n, c, v, pl, top + first * dh, last - first, dh)
            if kw == 3 and dw == 1:
                for ow in range(out_w):
                    s = U(ow * sw)
                    o[U(ow)] = nan_max(nan_max(v[s], v[s + U(1)]), v[s + U(2)])
            else:
                for ow in range(out_w):
                    s = ow * sw
                    a = v[U(s)]
                    for j in range(1, kw):
                        a = nan_max(a, v[U(s + j * dw)])
                    o[U(ow)] = a


@functools.cache
def _compiled(dtype: np.dtype, layout: str) -> Callable[..., None]:
    """The kernel for one dtype and X layout ("C", or "A" for strided views read in place)."""
    item = numba.from_dtype(dtype)
    signature = types.void(types.Array(item, 4, layout, readonly=True),
                           types.Array(item, 4, "C"), *[types.intp] * 9)
    return numba.njit(signature, parallel=True, cache=CACHE)(_max_rows_kernel)


def _span(geo: PoolGeometry) -> int:
    """Entries of the row buffer a problem uses: the left padding, the input's columns and
    whatever the windows read past them."""
    (_, kw), (_, sw), (_, dw), (_, pl), _, (_, width) = as_2d(geo)
    return max(pl + width, (geo.out[-1] - 1) * sw + (kw - 1) * dw + 1)


class MaxRowsPool(Algorithm):
    """maxpool by rows, then columns, one plane per task (see the module docstring)."""

    operator = "maxpool"
    name = "rows"
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem: Problem) -> str | None:
        spatial = len(problem.shapes[0]) - 2
        if spatial > 2:
            return f"rows pools 1-D and 2-D inputs only, X is {spatial}-D"
        span = _span(pool_geometry(problem))
        if span > ROW:
            return f"rows holds padded rows of at most {ROW} values, this one has {span}"
        return None

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = pool_geometry(problem)
        x = inputs[0]
        out = np.empty(geo.out_shape, dtype=geo.dtype)
        x4, out4 = (x[:, :, None, :], out[:, :, None, :]) if geo.spatial == 1 else (x, out)
        (kh, kw), (sh, sw), (dh, dw), (pt, pl), _, _ = as_2d(geo)
        layout = "C" if x4.flags.c_contiguous else "A"
        _compiled(np.dtype(geo.dtype), layout)(x4, out4, kh, kw, sh, sw, dh, dw, pt, pl,
                                               _span(geo))
        return out

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (-1,)


def algorithms() -> list[Algorithm]:
    return [MaxRowsPool()]
