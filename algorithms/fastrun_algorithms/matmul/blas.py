"""matmul through numpy, i.e. the BLAS numpy is linked against (OpenBLAS in the wheels)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem


class BlasMatmul(Algorithm):
    """``np.matmul``: hand-tuned BLAS kernels, the one to beat.

    REPRODUCIBLE because OpenBLAS splits the work between its threads statically: gemm gives
    each thread whole output blocks and sums every element over K in an order fixed by its
    blocking; the vector kernels (1-D operands) combine per-thread partial results in thread
    order.  That order depends only on the shapes, the thread count and the CPU kernel OpenBLAS
    selected, with no atomics or first-come reductions, and the thread count, the CPU model and
    the BLAS build are all in the CPU device's cache category, so within one category the
    results are bit-identical run to run.  (numpy's own fallback loop, for operands BLAS cannot
    take, is sequential.)
    """

    operator = "matmul"
    name = "blas"
    attributes = AlgoAttribute.REPRODUCIBLE

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        out = np.matmul(inputs[0], inputs[1])
        # Two 1-D operands give a numpy scalar; the contract is an array of the output shape.
        return out if isinstance(out, np.ndarray) else np.asarray(out)

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (0, 0)  # rule 3 of fastrun_algorithms.matmul.heuristic

