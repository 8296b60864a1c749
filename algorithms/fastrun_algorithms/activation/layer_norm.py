"""The layer_norm algorithms: ``numpy`` (whole-tensor reductions in float64) and ``parallel``
(numba, rows shared out among the workers, each row in float64 in two passes: the mean, then
the squared deviations, each summed in sixteen lanes so that the passes vectorise).

Both accumulate in float64 and round once, so a float32 row of 768 or 3072 values keeps what
a float32 sum would lose; each row is computed by one worker in index order: reproducible.
Transformer rows are small (a BERT-base row is 3 KB) and many (a row per token), so the
parallel split is over rows; the search measures where it beats numpy's one thread.
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
from fastrun_algorithms._common import CACHE, NumpyRanked, ParallelRanked, U, stack_buffer
from fastrun_algorithms.activation.numpy_impl import ufunc_buffer_bytes


def _rows(problem: Problem) -> tuple[int, int]:
    """(rows, row length): X as a matrix whose rows are normalised."""
    shape, axis = problem.shapes[0], problem.param("axis")
    return math.prod(shape[:axis]), math.prod(shape[axis:])


class NumpyLayerNorm(NumpyRanked, Algorithm):
    """float64 reductions over the rows, then one pass to the output."""

    operator = "layer_norm"
    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """X in float64 (the deviations are computed in place), a few values per row, and
        numpy's buffers for the broadcast passes."""
        rows, length = _rows(problem)
        return rows * length * 8 + 4 * rows * 8 + ufunc_buffer_bytes("float64")

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        rows, length = _rows(problem)
        if rows * length == 0:
            return np.empty(problem.shapes[0], problem.dtypes[0])
        x = np.array(inputs[0], np.float64).reshape(rows, length)  # a copy: worked in place
        scale, bias = (np.asarray(a).reshape(length) for a in inputs[1:])
        with np.errstate(divide="ignore", invalid="ignore"):
            x -= x.mean(axis=1, keepdims=True)
            spread = np.einsum("ij,ij->i", x, x)
            spread /= max(length, 1)
            spread += problem.param("epsilon")
            np.sqrt(spread, out=spread)
            x /= spread[:, None]
        out = x.astype(problem.dtypes[0])
        out *= scale
        out += bias
        return out.reshape(problem.shapes[0])


#: Partial sums per row: one running float sum is a chain LLVM may not reorder, so it stays
#: scalar; sixteen independent ones are vectors, in an order the code still fixes.
LANES = 16


@numba.njit(inline="always")
def _deviation_sum(x, base, length, mean, power):
    """sum((x[base:base + length] - mean) ** power) in float64, power 1 or 2, in lanes."""
    lanes = numba.carray(stack_buffer(LANES, np.float64), LANES)
    for j in range(LANES):
        lanes[j] = 0.0
    full = length - length % LANES
    for i in range(0, full, LANES):
        for j in range(LANES):
            d = np.float64(x[U(base + i + j)]) - mean
            lanes[j] += d * d if power == 2 else d
    total = 0.0
    for i in range(full, length):
        d = np.float64(x[U(base + i)]) - mean
        total += d * d if power == 2 else d
    for j in range(LANES):
        total += lanes[j]
    return total


@numba.njit(parallel=True, cache=CACHE)
def _layer_norm_rows(x, scale, bias, out, length, epsilon):
    """Rows of ``length`` in the flat ``x`` and ``out``: the mean, then the squared
    deviations (two passes, each in float64 lanes), then the output."""
    for r in prange(x.size // length):
        base = r * length
        mean = _deviation_sum(x, base, length, 0.0, 1) / length
        inv = 1.0 / math.sqrt(_deviation_sum(x, base, length, mean, 2) / length + epsilon)
        for i in range(length):
            out[U(base + i)] = ((np.float64(x[U(base + i)]) - mean) * inv * scale[U(i)]
                                + bias[U(i)])


class ParallelLayerNorm(ParallelRanked, Algorithm):
    """numba over the rows, each in float64 (see the module docstring)."""

    operator = "layer_norm"
    name = "parallel"
    attributes = AlgoAttribute.REPRODUCIBLE

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        rows, length = _rows(problem)
        x = np.ascontiguousarray(inputs[0]).reshape(-1)
        scale, bias = (np.ascontiguousarray(a).reshape(length) for a in inputs[1:])
        out = np.empty(rows * length, problem.dtypes[0])
        if out.size:
            _layer_norm_rows(x, scale, bias, out, length, problem.param("epsilon"))
        return out.reshape(problem.shapes[0])
