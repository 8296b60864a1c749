"""The ``parallel`` algorithm of concat: the inputs' bytes copied into the output by numba's
workers.

Why: ``np.concatenate`` copies on one thread.  In SqueezeNet every fire module ends in a concat
of two (N, 64..256, H, W) tensors; at batch 8 on the 16-core host those eight concats took
0.8-1.9 ms each, a third of the model's time, while the convolutions around them ran on all
cores.  A copy is as memory-bound as relu, so it pays from the same size on
(:data:`~fastrun_algorithms.activation.operator.PARALLEL_MIN_BYTES`, see
:meth:`~fastrun_algorithms.tensor.operator.ConcatOperator.parallel_pays`).

How: the output is viewed as ``outer`` rows (the product of the dimensions before the axis) of
bytes, each input as ``outer`` rows of its share; one parallel region per input copies its rows
in chunks of :data:`CHUNK` bytes, so a batch-1 concat of two large planes still has a task for
every thread.  Working on bytes makes one compiled kernel serve every dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, ParallelRanked, U

#: Bytes one task copies: large enough that a task outweighs taking it, small enough that a
#: (1, 128, 56, 56) float32 input (1.6 MB) makes 24 tasks.
CHUNK = 64 * 1024


@numba.njit(parallel=True, cache=CACHE)
def _copy_rows(src, out, offset):
    """``out[r, offset:offset + src.shape[1]] = src[r]`` for every row r, in byte chunks.

    The indices are unsigned (:data:`~fastrun_algorithms._common.U`): with signed ones numba
    checks each for wraparound and LLVM does not vectorise the loop, which then copied 10x
    slower than numpy (2.5 ms against 0.24 for SqueezeNet's largest concat on 2 threads)."""
    rows, width = src.shape
    chunks = (width + CHUNK - 1) // CHUNK
    for task in prange(rows * chunks):
        r = task // chunks
        start = (task - r * chunks) * CHUNK
        stop = min(start + CHUNK, width)
        for b in range(start, stop):
            out[r, U(offset + b)] = src[r, U(b)]


class ParallelConcat(ParallelRanked, Algorithm):
    """Concat as parallel byte copies (see the module docstring); any dtype."""

    operator = "concat"
    name = "parallel"
    #: moving data is exact and done the same way every run
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """None: inputs are read where they lie (a runtime passes them C-contiguous; only a
        strided view would be copied first)."""
        return 0

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        axis = problem.param("axis")
        dtype = np.dtype(problem.dtypes[0])
        shape = list(problem.shapes[0])
        shape[axis] = sum(s[axis] for s in problem.shapes)
        out = np.empty(shape, dtype=dtype)
        outer = math.prod(shape[:axis])
        if out.size == 0:
            return out
        out_bytes = out.reshape(outer, -1).view(np.uint8)
        offset = 0
        for x in inputs:
            src = np.ascontiguousarray(x)
            if src.size:
                _copy_rows(src.reshape(outer, -1).view(np.uint8), out_bytes, offset)
            offset += src.nbytes // outer
        return out


def algorithms(concat_pays: Callable[[Problem], bool]) -> list[Algorithm]:
    """The parallel tensor algorithms, ranked by the concat operator's ``parallel_pays``."""
    return [ParallelConcat(concat_pays)]
