"""The ``linear`` operator's CPU algorithms: BLAS products finished by a numba epilogue.

``blas``: numpy's matmul (OpenBLAS on the calling thread), then one parallel pass over the
output's rows that adds the bias and the residual and applies the activation.

``blas_split``: ``matmul``'s ``blas_split`` kernel (one single-threaded gemm per block of output
rows, or columns when there are few rows, on each of numba's workers) with a block finisher:
each worker applies the bias, the residual and the activation to its block right after its
gemm, while the block is in cache: one parallel region and one pass over the output instead of
two of each.

REPRODUCIBLE as ``matmul``'s ``blas`` and ``blas_split`` are: every output value is summed
over K by one gemm call in an order fixed by the shapes and the thread count.
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
from fastrun_algorithms._common import CACHE, U, thread_count
from fastrun_algorithms.activation.gelu import gelu_exact
from fastrun_algorithms.linear.operator import CODES, operands
from fastrun_algorithms.matmul.blas_split import gemm_unusable_reason, split_kernel, split_plan

#: rows per task of ``blas``'s epilogue pass
ROWS_PER_TASK = 8


@numba.njit(inline="always", error_model="numpy")
def finish_value(v, bias, z, r, c, has_bias, has_residual, code, zero):
    """Output (r, c)'s product ``v`` finished: plus the bias, plus the residual (``z``, laid
    out as the output), then the activation (:data:`CODES`; ``zero`` of the output's dtype, so
    that a relu keeps a NaN and the dtype).  Every CPU algorithm of the operator finishes its
    values here."""
    if has_bias:
        v += bias[U(c)]
    if has_residual:
        v += z[r, U(c)]
    if code == 1:
        v = zero if v < zero else v
    elif code == 2:
        v = gelu_exact(v)
    return v


@numba.njit(inline="always", error_model="numpy")
def _finish(out, bias, r0, r1, c0, c1, has_bias, code, z, has_residual):
    """Bias, residual and activation on out[r0:r1, c0:c1] in place."""
    zero = out.dtype.type(0)
    for r in range(r0, r1):
        for c in range(c0, c1):
            out[r, U(c)] = finish_value(out[r, U(c)], bias, z, r, c, has_bias, has_residual,
                                        code, zero)


@numba.njit(parallel=True, cache=CACHE, error_model="numpy")
def _finish_rows(out, bias, has_bias, code, z, has_residual):
    rows, cols = out.shape
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        r0 = task * ROWS_PER_TASK
        _finish(out, bias, r0, min(rows, r0 + ROWS_PER_TASK), 0, cols, has_bias, code, z,
                has_residual)


def finishing(problem: Problem, inputs: Sequence[Any], out: np.ndarray) -> tuple[Any, ...]:
    """The finishing kernels' arguments after the product ``out`` (M, N): (bias, has_bias,
    activation code, Z as (M, N), has_residual); an absent bias or Z is stood in for by a
    one-value array of the right type, never read."""
    _, _, bias, z = operands(problem, inputs)
    return (np.zeros(1, out.dtype) if bias is None else np.ascontiguousarray(bias, out.dtype),
            bias is not None, CODES[problem.param("activation")],
            np.zeros((1, 1), out.dtype) if z is None
            else np.ascontiguousarray(z, out.dtype).reshape(out.shape), z is not None)


def _operands(problem: Problem, inputs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    x, w = operands(problem, inputs)[:2]
    return np.ascontiguousarray(x), np.ascontiguousarray(w)


class BlasLinear(Algorithm):
    """numpy's matmul, then a parallel bias and activation pass (see the module docstring)."""

    operator = "linear"
    name = "blas"
    attributes = AlgoAttribute.REPRODUCIBLE

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (1.0,)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x, w = _operands(problem, inputs)
        out = np.matmul(x, w)
        bias, has_bias, code, z, has_residual = finishing(problem, inputs, out)
        if out.size and (has_bias or code or has_residual):
            _finish_rows(out, bias, has_bias, code, z, has_residual)
        return out


@numba.njit(inline="always", error_model="numpy")
def _finish_block(out, p, r0, r1, c0, c1, extra):
    """``matmul.blas_split``'s block finisher for a (1, M, N) product: bias, residual and
    activation (``extra``: :func:`finishing`'s arguments)."""
    bias, has_bias, code, z, has_residual = extra
    _finish(out[0], bias, r0, r1, c0, c1, has_bias, code, z, has_residual)


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
        x, w = _operands(problem, inputs)
        (m, k), n = x.shape, w.shape[1]
        if 0 in (m, k, n):  # no product to split: the epilogue of zeros
            out = np.zeros((m, n), x.dtype)
            if out.size:
                _finish_rows(out, *finishing(problem, inputs, out))
            return out
        out = np.empty((1, m, n), x.dtype)
        row_parts, col_parts = split_plan(1, m, n, thread_count())
        split_kernel(problem.dtypes[0], _finish_block)(
            x.reshape(1, m, k), w.reshape(1, k, n), out, row_parts, col_parts,
            finishing(problem, inputs, out[0]))
        return out[0]
