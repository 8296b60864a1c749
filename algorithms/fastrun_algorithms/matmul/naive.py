"""The naive matmul: a plain triple loop, the algorithm every other one can be checked against."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE
from fastrun_algorithms.matmul._batch import kernel_signature, layout_of


def _naive_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[p] = a[p] @ b[p], one dot product per output element, summed in k order in the
    operands' dtype (no reassociation, so the result is the same on every run)."""
    batch, m, k = a.shape
    n = b.shape[2]
    for p in range(batch):
        for i in range(m):
            for j in range(n):
                acc = out.dtype.type(0)
                for q in range(k):
                    acc += a[p, i, q] * b[p, q, j]
                out[p, i, j] = acc


@functools.cache
def _compiled(dtype: np.dtype) -> Callable[..., None]:
    """The kernel for one dtype, compiled (or loaded from numba's cache) on first use.

    Compiled lazily rather than with ``@njit`` at import so that loading the plugin stays cheap
    and only the dtypes actually used are compiled; one general signature per dtype (see
    :func:`kernel_signature`) covers contiguous, strided and broadcast operands.
    """
    return numba.njit(kernel_signature(dtype), cache=CACHE)(_naive_kernel)


class NaiveMatmul(Algorithm):
    """Triple loop over the batched 3-D form: slow, usable for every matmul problem, and the
    baseline the profiler's numbers are easiest to sanity-check against."""

    operator = "matmul"
    name = "naive"
    attributes = AlgoAttribute.NAIVE | AlgoAttribute.REPRODUCIBLE

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        layout = layout_of(problem)
        a3, b3 = layout.to_3d(inputs[0], inputs[1])
        out = np.empty(layout.out3_shape, dtype=a3.dtype)
        _compiled(a3.dtype)(a3, b3, out)
        return layout.from_3d(out)

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (5,)  # rule 7

