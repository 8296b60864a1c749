"""The ``linear`` operator's CPU algorithms: BLAS products finished by a numba epilogue.

``blas``: numpy's matmul (OpenBLAS on the calling thread), then one parallel pass over the
output's rows that adds the bias and applies the activation.

``blas_split``: the product as ``matmul``'s ``blas_split`` makes it, one single-threaded gemm
per block of output rows (or columns, when there are few rows) on each of numba's workers, and
each worker applies the bias and the activation to its block right after its gemm, while the
block is in cache: one parallel region and one pass over the output instead of two of each.

REPRODUCIBLE as ``matmul``'s ``blas`` and ``blas_split`` are: every output value is summed
over K by one gemm call in an order fixed by the shapes and the thread count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, U
from fastrun_algorithms.activation.gelu import gelu_exact
from fastrun_algorithms.matmul.blas_split import (
    NO_TRANS,
    ROW_MAJOR,
    _gemm_functions,
    gemm_unusable_reason,
    split_plan,
)

#: activation codes the kernels take
CODES = {"none": 0, "relu": 1, "gelu": 2}
#: rows per task of ``blas``'s epilogue pass
ROWS_PER_TASK = 8


@numba.njit(inline="always", error_model="numpy")
def _finish(out, bias, r0, r1, c0, c1, has_bias, code):
    """Bias and activation on out[r0:r1, c0:c1]."""
    zero = out.dtype.type(0)
    for r in range(r0, r1):
        for c in range(c0, c1):
            v = out[r, U(c)]
            if has_bias:
                v += bias[U(c)]
            if code == 1:
                v = zero if v < zero else v
            elif code == 2:
                v = gelu_exact(v)
            out[r, U(c)] = v


@numba.njit(parallel=True, cache=CACHE, error_model="numpy")
def _finish_rows(out, bias, has_bias, code):
    rows, cols = out.shape
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        r0 = task * ROWS_PER_TASK
        _finish(out, bias, r0, min(rows, r0 + ROWS_PER_TASK), 0, cols, has_bias, code)


def _operands(problem: Problem, inputs: Sequence[Any]) -> tuple[np.ndarray, ...]:
    x, w = (np.ascontiguousarray(a) for a in inputs[:2])
    bias = (np.ascontiguousarray(inputs[2], x.dtype) if len(inputs) > 2
            else np.zeros(1, x.dtype))
    return x, w, bias


class BlasLinear(Algorithm):
    """numpy's matmul, then a parallel bias and activation pass (see the module docstring)."""

    operator = "linear"
    name = "blas"
    attributes = AlgoAttribute.REPRODUCIBLE

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (1.0,)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x, w, bias = _operands(problem, inputs)
        out = np.matmul(x, w)
        code = CODES[problem.param("activation")]
        if out.size and (len(inputs) > 2 or code):
            _finish_rows(out, bias, len(inputs) > 2, code)
        return out


def _split_kernel(gemm: Callable[..., None]) -> Callable[..., None]:
    """The parallel loop over blocks for one gemm function (built per dtype at run time, as
    ``matmul.blas_split``'s is: the function's address is only known once it is loaded)."""

    def kernel(x, w, bias, out, parts, by_rows, has_bias, code):
        m, n = out.shape
        k = x.shape[1]
        item = out.itemsize
        x0, w0, c0 = np.int64(x.ctypes.data), np.int64(w.ctypes.data), np.int64(out.ctypes.data)
        for part in prange(parts):
            if by_rows:
                first, end = m * part // parts, m * (part + 1) // parts
                if end > first:
                    gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, end - first, n, k, 1.0,
                         x0 + first * k * item, k, w0, n, 0.0, c0 + first * n * item, n)
                    _finish(out, bias, first, end, 0, n, has_bias, code)
            else:
                first, end = n * part // parts, n * (part + 1) // parts
                if end > first:
                    gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, end - first, k, 1.0, x0, k,
                         w0 + first * item, n, 0.0, c0 + first * item, n)
                    _finish(out, bias, 0, m, first, end, has_bias, code)

    return numba.njit(parallel=True, error_model="numpy")(kernel)


@functools.cache
def _compiled(dtype: str) -> Callable[..., None]:
    return _split_kernel(_gemm_functions()[0][dtype])


class SplitBlasLinear(Algorithm):
    """A gemm per block of the output on each worker, finished in cache (see the module
    docstring)."""

    operator = "linear"
    name = "blas_split"
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem: Problem) -> str | None:
        return gemm_unusable_reason(problem.dtypes[0])

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (0.0,)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x, w, bias = _operands(problem, inputs)
        (m, k), n = x.shape, w.shape[1]
        if 0 in (m, k, n):  # no product to split: the epilogue of zeros
            out = np.zeros((m, n), x.dtype)
            if out.size:
                _finish_rows(out, bias, len(inputs) > 2, CODES[problem.param("activation")])
            return out
        out = np.empty((m, n), x.dtype)
        parts, by_rows = split_plan(1, m, n, numba.get_num_threads())
        _compiled(problem.dtypes[0])(x, w, bias, out, parts, by_rows, len(inputs) > 2,
                                     CODES[problem.param("activation")])
        return out
