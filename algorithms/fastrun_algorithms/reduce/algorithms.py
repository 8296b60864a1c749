"""The reduce algorithms: ``numpy`` (numpy's reductions, any axes, on one thread) and
``parallel`` (a numba kernel over adjacent reduced axes, output elements shared out among
numba's workers).

``numpy`` reduces floats in float64 (one temporary: the output in float64) and rounds once;
``parallel`` sums each output element's run in a float64 accumulator, in index order, whatever
the thread count: both are reproducible, and they may differ from each other in the last bit of
a float32 result.  ``parallel`` takes the (outer, reduced, inner) view of
:func:`~fastrun_algorithms.reduce.operator.blocks`; with inner == 1 (the last axes reduced: a
norm's row, a pool's plane) each worker walks contiguous runs, otherwise it walks the reduced
axis with a stride of inner for a block of consecutive inner positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, NumpyRanked, ParallelRanked, thread_count
from fastrun_algorithms.reduce.operator import (
    MODES,
    adjacent_float_reason,
    blocks,
    empty_value,
    kept_shape,
    output_shape,
)

_NUMPY_REDUCTIONS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


class NumpyReduce(NumpyRanked, Algorithm):
    """numpy's reductions over any axes.  REPRODUCIBLE: one fixed order per shape."""

    name = "numpy"
    operator = "reduce"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """Float inputs: the float64 accumulation of the output, and for l1, l2 and sum_square
        the float64 |x| or x * x of the whole input."""
        if np.dtype(problem.dtypes[0]).kind != "f":
            return 0
        out = math.prod(kept_shape(problem)) * 8
        if problem.param("mode") in ("l1", "l2", "sum_square"):
            out += math.prod(problem.shapes[0]) * 8
        return out

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.asarray(inputs[0])
        mode, axes = problem.param("mode"), problem.param("axes")
        if mode in ("max", "min") and x.size == 0:
            return self._run_empty(problem)
        floating = x.dtype.kind == "f"
        if mode in ("l1", "l2", "sum_square"):
            x = np.abs(x, dtype=np.float64) if mode == "l1" else np.square(x, dtype=np.float64)
        ufunc = _NUMPY_REDUCTIONS.get(mode, np.add)
        kept = kept_shape(problem)
        if floating:
            acc = np.empty(kept, np.float64)
            ufunc.reduce(x, axis=axes, keepdims=True, out=acc, dtype=np.float64)
            if mode == "mean":
                count = math.prod(problem.shapes[0][a] for a in axes)
                if count:
                    acc /= count
                else:  # the mean of nothing, as numpy gives it
                    acc[...] = np.nan
            elif mode == "l2":
                np.sqrt(acc, out=acc)
            out = acc.astype(problem.dtypes[0])
        else:
            out = np.empty(kept, problem.dtypes[0])
            ufunc.reduce(x, axis=axes, keepdims=True, out=out)
        return out.reshape(output_shape(problem))

    def _run_empty(self, problem: Problem) -> np.ndarray:
        """max or min of nothing: the reduction's identity everywhere (numpy refuses)."""
        return np.full(output_shape(problem), empty_value(problem.param("mode"),
                                                           problem.dtypes[0]),
                       problem.dtypes[0])


@numba.njit(inline="always")
def _start(code):
    """The accumulator's first value: 0 for the sums, the first element for max and min (the
    kernel starts from it), 1 for prod."""
    return 1.0 if code == 4 else 0.0


@numba.njit(inline="always")
def _combine(acc, v, code):
    if code == 2:
        return v if v > acc or v != v else acc  # a NaN wins, as in numpy's maximum
    if code == 3:
        return v if v < acc or v != v else acc
    if code == 4:
        return acc * v
    if code == 5:
        return acc + abs(v)
    if code == 6 or code == 7:
        return acc + v * v
    return acc + v


@numba.njit(inline="always")
def _finish(acc, code, count):
    if code == 1:
        return acc / count if count else np.nan
    if code == 6:
        return math.sqrt(acc)
    return acc


@numba.njit(parallel=True, cache=CACHE)
def _reduce_rows(x, out, code):
    """x (outer, reduced) -> out (outer,): one contiguous run per output element."""
    count = x.shape[1]
    for o in prange(x.shape[0]):
        acc = np.float64(x[o, 0]) if (code == 2 or code == 3) else _start(code)
        for r in range(count):
            acc = _combine(acc, np.float64(x[o, r]), code)
        out[o] = _finish(acc, code, count)


@numba.njit(parallel=True, cache=CACHE)
def _reduce_columns(x, out, acc, code):
    """x (outer, reduced, inner) -> out (outer, inner): each task one outer index, walking the
    reduced axis over a row of inner positions at a time (contiguous loads), into its own
    float64 accumulator row ``acc[thread]``."""
    count, inner = x.shape[1], x.shape[2]
    for o in prange(x.shape[0]):
        row = acc[numba.get_thread_id()]
        for i in range(inner):
            row[i] = np.float64(x[o, 0, i]) if (code == 2 or code == 3) else _start(code)
        for r in range(count):
            for i in range(inner):
                row[i] = _combine(row[i], np.float64(x[o, r, i]), code)
        for i in range(inner):
            out[o, i] = _finish(row[i], code, count)


class ParallelReduce(ParallelRanked, Algorithm):
    """numba over the output elements, float inputs, adjacent reduced axes, a non-empty
    reduction.  REPRODUCIBLE: each output element is reduced by one worker in index order."""

    name = "parallel"
    operator = "reduce"
    attributes = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def unusable_reason(self, problem: Problem) -> str | None:
        reason = adjacent_float_reason(problem, "parallel")
        if reason is None and blocks(problem)[1] == 0:
            return "parallel needs a non-empty reduction"
        return reason

    def workspace_bytes(self, problem: Problem) -> int:
        """A float64 row of inner positions per numba thread (none when inner == 1)."""
        view = blocks(problem)
        return 0 if view is None or view[2] == 1 else thread_count() * view[2] * 8

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        outer, count, inner = blocks(problem)
        x = np.ascontiguousarray(inputs[0])
        out = np.empty(outer * inner, problem.dtypes[0])
        code = MODES.index(problem.param("mode"))
        if out.size:
            if inner == 1:
                _reduce_rows(x.reshape(outer, count), out, code)
            else:
                acc = np.empty((thread_count(), inner), np.float64)
                _reduce_columns(x.reshape(outer, count, inner), out.reshape(outer, inner),
                                acc, code)
        return out.reshape(output_shape(problem))
