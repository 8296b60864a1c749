"""The ``reorder`` algorithms: numpy's strided copy, and numba's workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import NumpyRanked, ParallelRanked
from fastrun_algorithms.layout.blocking import (
    BLOCKED,
    to_blocked,
    to_blocked_parallel,
    to_nchw,
    to_nchw_parallel,
)


class _Reorder(Algorithm):
    """A conversion by a pair of functions, one per direction."""

    operator = "reorder"
    #: moving data is exact and done the same way every run
    attributes = AlgoAttribute.REPRODUCIBLE
    blocking = staticmethod(to_blocked)
    unblocking = staticmethod(to_nchw)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.asarray(inputs[0])
        if problem.param("to") == BLOCKED:
            return self.blocking(x)
        return self.unblocking(x, problem.param("channels"))


class NumpyReorder(NumpyRanked, _Reorder):
    """A padded copy and a transposing copy, on one thread."""

    name = "numpy"


class ParallelReorder(ParallelRanked, _Reorder):
    """One pass by numba's workers, in tasks of a few hundred pixels of one channel block, so
    a batch-1 tensor has work for every thread."""

    name = "parallel"
    blocking = staticmethod(to_blocked_parallel)
    unblocking = staticmethod(to_nchw_parallel)


def algorithms(pays: Callable[[Problem], bool]) -> list[Algorithm]:
    """The reorder algorithms, the parallel one ranked by the operator's ``parallel_pays``."""
    return [NumpyReorder(), ParallelReorder(pays)]
