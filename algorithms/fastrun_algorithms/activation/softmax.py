"""Softmax over the last axis in numba: per row, the maximum, ``exp(x - max)``, its sum and the
scaling, four passes while the row is in cache.

Why beside numpy's: numpy's softmax makes five passes over the whole tensor (max, subtract,
exp, sum, divide), and numba's scalar libm exp would make a loop of one pass slower still.
With exp of a non-positive number vectorised in float32
(:func:`fastrun_algorithms._fastmath.exp_le0`), a row costs four passes that stay in L1.  An
attention's scores are many short rows (ViT-B/16: 12 x 197 rows of 197), which ``parallel``
deals out to the threads; on the 2-core development VM numpy took 1.7 ms per (1, 12, 197, 197)
step at two threads.  Only the last axis, the one attention and classifiers use; any other axis
is numpy's.

Rows follow ONNX's rules through the arithmetic: a row with NaN gives NaN (the maximum skips
it, but its exp makes the sum NaN, and the sum scales every element), a row holding +inf gives
NaN (inf - inf), a row of -inf gives NaN (0 / 0), as the reference does.

REPRODUCIBLE: each row is summed in order by one thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, SERIAL_RANK, ParallelRanked, U, stack_buffer
from fastrun_algorithms._fastmath import exp_le0

#: Partial maxima and sums kept per row: a float reduction written as one running value is a
#: chain LLVM may not reorder (that would change the result), so it stays scalar; sixteen
#: independent ones are vectors, and their order is still fixed by the code.
LANES = 16


@numba.njit(inline="always", error_model="numpy")
def _softmax_row(x, out, base, length, s):
    full = length - length % LANES
    top_lanes = numba.carray(stack_buffer(LANES, x.dtype), LANES)
    first = x[U(base)]
    for j in range(LANES):
        top_lanes[j] = first
    for i in range(0, full, LANES):
        for j in range(LANES):
            v = x[U(base + i + j)]
            m = top_lanes[j]
            top_lanes[j] = v if v > m else m
    top = first
    for j in range(LANES):
        v = top_lanes[j]
        top = v if v > top else top
    for i in range(full, length):
        v = x[U(base + i)]
        top = v if v > top else top
    for i in range(length):  # exp in a loop of its own: with the sum in it, it stays scalar
        out[U(base + i)] = exp_le0((x[U(base + i)] - top) * s)
    # the sum in float64: a long row's float32 sum would drift past the tolerance
    sum_lanes = numba.carray(stack_buffer(LANES, np.float64), LANES)
    for j in range(LANES):
        sum_lanes[j] = 0.0
    for i in range(0, full, LANES):
        for j in range(LANES):
            sum_lanes[j] += out[U(base + i + j)]
    total = 0.0
    for i in range(full, length):
        total += out[U(base + i)]
    for j in range(LANES):
        total += sum_lanes[j]
    scale = x.dtype.type(1.0 / total)
    for i in range(length):
        out[U(base + i)] *= scale


@numba.njit(cache=CACHE, error_model="numpy")
def softmax_rows_serial(x, out, length, scale):
    s = x.dtype.type(scale)
    for r in range(x.size // length):
        _softmax_row(x, out, r * length, length, s)


@numba.njit(parallel=True, cache=CACHE, error_model="numpy")
def softmax_rows_parallel(x, out, length, scale):
    s = x.dtype.type(scale)
    for r in prange(x.size // length):
        _softmax_row(x, out, r * length, length, s)


class _SoftmaxRows(Algorithm):
    operator = "softmax"
    attributes = AlgoAttribute.REPRODUCIBLE
    kernel: Any = None

    def unusable_reason(self, problem: Problem) -> str | None:
        if problem.param("axis") != len(problem.shapes[0]) - 1:
            return "computes softmax over the last axis only"
        return None

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        shape = problem.shapes[0]
        x = np.ascontiguousarray(inputs[0])
        out = np.empty(shape, x.dtype)
        if out.size:
            type(self).kernel(x.reshape(-1), out.reshape(-1), shape[-1],
                              float(problem.param("scale", 1.0)))
        return out


class SerialSoftmax(_SoftmaxRows):
    """The rows in order on one thread."""

    name = "serial"
    kernel = softmax_rows_serial

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return SERIAL_RANK


class ParallelSoftmax(ParallelRanked, _SoftmaxRows):
    """The rows dealt out to numba's threads."""

    name = "parallel"
    kernel = softmax_rows_parallel
