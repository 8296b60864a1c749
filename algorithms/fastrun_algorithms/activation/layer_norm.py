"""The layer_norm algorithms: ``numpy`` (whole-tensor reductions in float64) and ``parallel``
(numba, rows shared out among the workers, each row in float64 in two passes: the mean, then
the squared deviations).

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
from fastrun_algorithms._common import CACHE, NumpyRanked, ParallelRanked
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


@numba.njit(parallel=True, cache=CACHE)
def _layer_norm_rows(x, scale, bias, out, epsilon):
    rows, length = x.shape
    for r in prange(rows):
        total = 0.0
        for i in range(length):
            total += np.float64(x[r, i])
        mean = total / length
        squares = 0.0
        for i in range(length):
            d = np.float64(x[r, i]) - mean
            squares += d * d
        inv = 1.0 / math.sqrt(squares / length + epsilon)
        for i in range(length):
            out[r, i] = (np.float64(x[r, i]) - mean) * inv * scale[i] + bias[i]


class ParallelLayerNorm(ParallelRanked, Algorithm):
    """numba over the rows, each in float64 (see the module docstring)."""

    operator = "layer_norm"
    name = "parallel"
    attributes = AlgoAttribute.REPRODUCIBLE

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        rows, length = _rows(problem)
        x = np.ascontiguousarray(inputs[0]).reshape(rows, length)
        scale, bias = (np.ascontiguousarray(a).reshape(length) for a in inputs[1:])
        out = np.empty((rows, length), problem.dtypes[0])
        if out.size:
            _layer_norm_rows(x, scale, bias, out, problem.param("epsilon"))
        return out.reshape(problem.shapes[0])
