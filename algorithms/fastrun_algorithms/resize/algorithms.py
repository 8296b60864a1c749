"""The resize algorithms: ``numpy`` (any rank, axis by axis, on one thread) and ``parallel`` (a
numba kernel for the case models have: NCHW with only H and W resized, output rows shared out
among numba's workers).

Both build each axis's table once per problem (:func:`~fastrun_algorithms.resize.operator.
axis_table`, kept in a small cache) and blend in X's dtype: ``parallel`` computes
``low + (high - low) * w`` along W then H, ``numpy`` the weighted taps axis by axis,
so the two may differ from each other in the last bits of a float32 result (each is
reproducible: one fixed order per shape, whatever the thread count).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, NumpyRanked, ParallelRanked, U
from fastrun_algorithms.resize.operator import (
    AxisTable,
    axis_table,
    blend_sizes,
    one_tap,
    out_size,
    resample,
    tap_weights,
)


@functools.lru_cache(maxsize=256)
def tables(problem: Problem) -> tuple[AxisTable, ...]:
    """Every axis's table, built once per problem."""
    return tuple(axis_table(problem, axis) for axis in range(len(problem.shapes[0])))


@functools.lru_cache(maxsize=256)
def _cast_weights(problem: Problem) -> tuple[np.ndarray, ...]:
    """Every axis's tap weights in X's dtype, made once per problem."""
    dtype = np.dtype(problem.dtypes[0])
    return tuple(tap_weights(t, dtype) for t in tables(problem))


class NumpyResize(NumpyRanked, Algorithm):
    """numpy's gathers: nearest as one gather over every axis, linear and cubic as one
    weighted sum of gathers per resized axis.  REPRODUCIBLE."""

    name = "numpy"
    operator = "resize"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """What :func:`blend` holds at its peak besides the output: while an axis is resized,
        the previous axis's result, the running sum and one weighted tap, plus numpy's ufunc
        buffer (none of it for a one-tap gather)."""
        axes = tables(problem)
        if one_tap(axes):
            return 0
        steps = blend_sizes(problem, axes)
        peak, previous = 0, 0
        for size, taps in steps:
            peak = max(peak, previous + size + (size if taps > 1 else 0))
            previous = size
        itemsize = np.dtype(problem.dtypes[0]).itemsize
        # weighting an axis that is not the last, numpy's ufunc loop buffers the broadcast
        # weights: one buffer of np.getbufsize() elements
        inner = any(not t.identity for t in axes[:-1])
        return (peak - steps[-1][0] + (np.getbufsize() if inner else 0)) * itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        return resample(problem, np.asarray(inputs[0]), tables(problem),
                        _cast_weights(problem))


@numba.njit(parallel=True, cache=CACHE)
def _nearest_rows(x, out, rows, cols):
    """out[p, oh, ow] = x[p, rows[oh], cols[ow]]: each task one output row of one plane."""
    planes, out_h, out_w = out.shape
    for task in prange(planes * out_h):
        p = task // out_h
        oh = task - p * out_h
        src = rows[oh]
        for ow in range(out_w):
            out[p, oh, ow] = x[p, src, cols[U(ow)]]


@numba.njit(parallel=True, cache=CACHE)
def _linear_rows(x, out, row_low, row_high, row_weight, col_low, col_high, col_weight):
    """Bilinear over H and W: each task one output row of one plane, blending its two input
    rows along W first, then the two results along H."""
    planes, out_h, out_w = out.shape
    for task in prange(planes * out_h):
        p = task // out_h
        oh = task - p * out_h
        r0, r1, wr = row_low[oh], row_high[oh], row_weight[oh]
        for ow in range(out_w):
            c0, c1, wc = col_low[U(ow)], col_high[U(ow)], col_weight[U(ow)]
            a, b = x[p, r0, c0], x[p, r0, c1]
            top = a + (b - a) * wc
            a, b = x[p, r1, c0], x[p, r1, c1]
            bottom = a + (b - a) * wc
            out[p, oh, ow] = top + (bottom - top) * wr


@numba.njit(parallel=True, cache=CACHE)
def _linear_rows_two_pass(x, rows_w, out, row_low, row_high, row_weight, col_low, col_high,
                          col_weight):
    """:func:`_linear_rows`' values, blended along W once per input row into ``rows_w``
    (planes, H, out W), then along H one contiguous output row at a time: an upsampling's
    output rows share their input rows, which the one-pass kernel blended again for each."""
    planes, height, _ = x.shape
    out_h, out_w = out.shape[1], out.shape[2]
    for task in prange(planes * height):
        p = task // height
        ih = task - p * height
        for ow in range(out_w):
            c0, c1, wc = col_low[U(ow)], col_high[U(ow)], col_weight[U(ow)]
            a, b = x[p, ih, c0], x[p, ih, c1]
            rows_w[p, ih, U(ow)] = a + (b - a) * wc
    for task in prange(planes * out_h):
        p = task // out_h
        oh = task - p * out_h
        r0, r1, wr = row_low[oh], row_high[oh], row_weight[oh]
        for ow in range(out_w):
            top, bottom = rows_w[p, r0, U(ow)], rows_w[p, r1, U(ow)]
            out[p, oh, U(ow)] = top + (bottom - top) * wr


def _two_pass(problem: Problem) -> bool:
    """Whether a linear resize blends along W once per input row first: when it makes more
    output rows than there are input rows (an upsampling along H), so that the W blend is
    shared.  A segmentation head's 8x bilinear upsampling of 21 class planes (28x28 to
    224x224) took 1.0-1.35 ms in one pass on the 2-core VM, where onnxruntime's took 0.5."""
    height, out_h = problem.shapes[0][2], problem.param("sizes")[2]
    return problem.param("mode") == "linear" and out_h > height


class ParallelResize(ParallelRanked, Algorithm):
    """numba over output rows, for 4-D inputs of which only H and W are resized (N and C
    copied as they are), nearest or linear (upsampling along H in two passes,
    :func:`_two_pass`), no crop box.  REPRODUCIBLE: each output is computed by one worker in
    one fixed order, the same in either pass plan."""

    name = "parallel"
    operator = "resize"
    attributes = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def unusable_reason(self, problem: Problem) -> str | None:
        if len(problem.shapes[0]) != 4:
            return f"parallel resizes 4-D (NCHW) inputs only, X is {len(problem.shapes[0])}-D"
        if np.dtype(problem.dtypes[0]).kind != "f":
            return "parallel resizes float inputs only"
        if problem.param("coordinate_transformation_mode") == "tf_crop_and_resize":
            return "parallel does not crop (tf_crop_and_resize)"
        if problem.param("exclude_outside"):
            return "parallel does not exclude outside taps"
        if problem.param("mode") == "cubic" or problem.param("antialias"):
            return "parallel takes one tap (nearest) or two (linear) per axis"
        axes = tables(problem)
        if not (axes[0].identity and axes[1].identity):
            return "parallel resizes H and W only: N or C changes"
        if not out_size(problem) or not math.prod(problem.shapes[0]):
            return "parallel needs a non-empty input and output"
        return None

    def workspace_bytes(self, problem: Problem) -> int:
        """The rows blended along W of a two-pass linear resize (:func:`_two_pass`)."""
        if not _two_pass(problem):
            return 0
        n, c, height, _ = problem.shapes[0]
        return n * c * height * problem.param("sizes")[3] * np.dtype(problem.dtypes[0]).itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.ascontiguousarray(inputs[0])
        n, c, height, width = x.shape
        sizes = problem.param("sizes")
        out = np.empty(sizes, x.dtype)
        planes = n * c
        rows, cols = tables(problem)[2:]
        x3 = x.reshape(planes, height, width)
        out3 = out.reshape(planes, sizes[2], sizes[3])
        if problem.param("mode") == "nearest":
            _nearest_rows(x3, out3, rows.index[:, 0], cols.index[:, 0])
        else:
            # the second tap's weights (the first weighs one minus it)
            row_weight, col_weight = (w[1] for w in _cast_weights(problem)[2:])
            taps = (rows.index[:, 0], rows.index[:, 1], row_weight, cols.index[:, 0],
                    cols.index[:, 1], col_weight)
            if _two_pass(problem):
                rows_w = np.empty((planes, height, sizes[3]), x.dtype)
                _linear_rows_two_pass(x3, rows_w, out3, *taps)
            else:
                _linear_rows(x3, out3, *taps)
        return out
