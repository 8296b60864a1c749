"""One level of Strassen's algorithm, with the seven half-size products as matmul sub-problems.

Strassen trades one of the eight block products of a 2 x 2 blocked matmul for 18 block
additions.  The products are declared as sub-problems and computed through
:meth:`RunContext.call`, so the framework profiles them first and runs each with the algorithm
it chose for the half-size problem: BLAS, a blocked tile, or Strassen again one level down.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import types

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE
from fastrun_algorithms.matmul import heuristic
from fastrun_algorithms.matmul._batch import layout_of, numba_dtype

#: Strassen's seven products (M1..M7), which is how many times a level calls its sub-problem.
PRODUCTS = 7


def _combine_kernel(x: np.ndarray, y: np.ndarray, sign: float, out: np.ndarray) -> None:
    """out = x + sign * y elementwise (sign is +1 or -1, so this is an exact add or subtract);
    ``out`` may be ``x`` itself."""
    batch, rows, cols = out.shape
    for p in range(batch):
        for i in range(rows):
            for j in range(cols):
                out[p, i, j] = x[p, i, j] + sign * y[p, i, j]


@functools.cache
def _compiled_combine(dtype: np.dtype) -> Callable[..., None]:
    """The combine kernel for one dtype, compiled (or loaded from numba's cache) on first use.

    Quadrant sums go through numba rather than ``np.add`` because numpy's ufuncs allocate an
    iteration buffer of up to ``np.getbufsize()`` elements for every non-contiguous operand,
    and quadrants are never contiguous: that hidden memory would make the workspace this
    algorithm reports untrue.  This kernel allocates nothing.

    It is sequential on purpose: Strassen alternates sums with (BLAS) products, and while
    numba's OpenMP threads still spin-wait after a parallel region, they take the cores
    OpenBLAS wants (measured with a parallel version: a 256^3 Strassen took ~50 ms instead of
    ~0.4 ms).
    """
    item = numba_dtype(dtype)
    operand = types.Array(item, 3, "A", readonly=True)
    signature = types.void(operand, operand, item, types.Array(item, 3, "A"))
    return numba.njit(signature, cache=CACHE)(_combine_kernel)


def _combine(x: np.ndarray, y: np.ndarray, sign: float, out: np.ndarray) -> np.ndarray:
    """out = x + sign * y for arrays of one shape with any number of batch dimensions.

    The kernel is 3-D; more batch dimensions are walked in Python, because merging them with a
    reshape would copy operands whose batch strides do not merge.
    """
    if out.ndim > 3:
        for index in range(out.shape[0]):
            _combine(x[index], y[index], sign, out[index])
    elif out.ndim == 2:
        _compiled_combine(out.dtype)(x[np.newaxis], y[np.newaxis], sign, out[np.newaxis])
    else:
        _compiled_combine(out.dtype)(x, y, sign, out)
    return out


@functools.lru_cache(maxsize=1024)
def half_problem(problem: Problem) -> Problem:
    """The sub-problem of every product: each operand with its last two dimensions halved and
    its own batch dimensions kept, so broadcasting stays in the sub-problem and is never
    materialised here."""
    (a_shape, b_shape), dtypes = problem.shapes, problem.dtypes
    half_a = (*a_shape[:-2], a_shape[-2] // 2, a_shape[-1] // 2)
    half_b = (*b_shape[:-2], b_shape[-2] // 2, b_shape[-1] // 2)
    return Problem.create(problem.operator, (half_a, half_b), dtypes)


class StrassenMatmul(Algorithm):
    """One Strassen level: 7 half-size products instead of 8.

    Usable when both operands are at least 2-D and M, K and N are all even.  The additions are
    memory bound, so it needs large shapes to pay off: with BLAS products it beats every
    blocked tile here from 256 on but still trails BLAS itself (by 1.1x at 2048); with slower
    products, or as a way to fit a product under a workspace limit, it can win.  Profiling
    decides.
    """

    operator = "matmul"
    name = "strassen"
    attributes = AlgoAttribute.USABLE_DEPEND_ON_SHAPE | AlgoAttribute.REPRODUCIBLE
    sub_operators = ("matmul",)

    def unusable_reason(self, problem: Problem) -> str | None:
        if any(len(shape) < 2 for shape in problem.shapes):
            return ("strassen needs 2-D (or batched) operands; a 1-D operand makes a "
                    "matrix-vector product, which has no 2 x 2 block structure to exploit")
        layout = layout_of(problem)
        bad = [f"{name}={size}" for name, size in (("M", layout.m), ("K", layout.k),
                                                   ("N", layout.n)) if size < 2 or size % 2]
        if bad:
            return (f"strassen splits M, K and N in halves, so all must be even and >= 2; "
                    f"got {', '.join(bad)}")
        return None

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        """The seven products, in the order :meth:`run` calls them (the same half-size
        problem each time)."""
        return [half_problem(problem)] * PRODUCTS

    def workspace_bytes(self, problem: Problem) -> int:
        """Bytes of the temporaries :meth:`run` holds at its peak: one buffer for a sum or
        difference of A quadrants, one for B quadrants (both reused by all seven products),
        and one product, which the sub-problem allocates as its output and which is folded
        into the result and freed before the next product is computed.  The result itself is
        the output, not workspace; the sub-problem's own workspace is added by the framework
        along the execution policy."""
        half = half_problem(problem)
        layout = layout_of(half)
        itemsize = np.dtype(problem.dtypes[0]).itemsize
        elements = math.prod(half.shapes[0]) + math.prod(half.shapes[1]) + math.prod(
            layout.out_shape)
        return elements * itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        a, b = inputs
        half = half_problem(problem)
        layout = layout_of(problem)
        m2, k2, n2 = layout.m // 2, layout.k // 2, layout.n // 2
        a11, a12 = a[..., :m2, :k2], a[..., :m2, k2:]
        a21, a22 = a[..., m2:, :k2], a[..., m2:, k2:]
        b11, b12 = b[..., :k2, :n2], b[..., :k2, n2:]
        b21, b22 = b[..., k2:, :n2], b[..., k2:, n2:]
        c = np.empty(layout.out_shape, dtype=a.dtype)
        c11, c12 = c[..., :m2, :n2], c[..., :m2, n2:]
        c21, c22 = c[..., m2:, :n2], c[..., m2:, n2:]
        s = np.empty(half.shapes[0], dtype=a.dtype)
        t = np.empty(half.shapes[1], dtype=b.dtype)

        # Each product is folded into the result quadrants in place and dropped before the next
        # one is computed, so only one product is alive at a time (see workspace_bytes):
        #   C11 = M1 + M4 - M5 + M7   C12 = M3 + M5   C21 = M2 + M4   C22 = M1 - M2 + M3 + M6
        # (np.copyto needs no iteration buffers; every sum goes through _combine.)
        p = ctx.call(half, _combine(a11, a22, 1.0, s), _combine(b11, b22, 1.0, t))  # M1
        np.copyto(c11, p)
        np.copyto(c22, p)
        del p
        p = ctx.call(half, _combine(a21, a22, 1.0, s), b11)  # M2
        np.copyto(c21, p)
        _combine(c22, p, -1.0, c22)
        del p
        p = ctx.call(half, a11, _combine(b12, b22, -1.0, t))  # M3
        np.copyto(c12, p)
        _combine(c22, p, 1.0, c22)
        del p
        p = ctx.call(half, a22, _combine(b21, b11, -1.0, t))  # M4
        _combine(c11, p, 1.0, c11)
        _combine(c21, p, 1.0, c21)
        del p
        p = ctx.call(half, _combine(a11, a12, 1.0, s), b22)  # M5
        _combine(c11, p, -1.0, c11)
        _combine(c12, p, 1.0, c12)
        del p
        p = ctx.call(half, _combine(a21, a11, -1.0, s), _combine(b11, b12, 1.0, t))  # M6
        _combine(c22, p, 1.0, c22)
        del p
        p = ctx.call(half, _combine(a12, a22, -1.0, s), _combine(b21, b22, 1.0, t))  # M7
        _combine(c11, p, 1.0, c11)
        return c

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        early = heuristic.strassen_early(layout_of(problem)) and self.usable(problem)
        return (1,) if early else (3,)  # rules 4 and 6

