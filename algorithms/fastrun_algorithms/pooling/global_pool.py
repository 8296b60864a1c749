"""global_maxpool and global_avgpool: one numpy reduction over the spatial axes, or the planes
reduced in parallel by numba's workers.

A global pool reads each input once and writes N*C values.  On one thread numpy's single
reduction is as fast as memory allows; on many cores it is not: SqueezeNet's final pool over
(8, 1000, 13, 13) took 0.93 ms on the 16-core host, one thread reading while fifteen waited.
``parallel`` gives each worker whole (image, channel) planes, summed in float64 (so a float32
mean over a large plane loses nothing to the order).  A contiguous plane is summed as vectors
of partial sums (:data:`SUM_FASTMATH`): with one scalar accumulator the kernel ran at half
numpy's single-threaded speed on EfficientNet's 96 x 112x112 squeeze-excitation pool (2
threads, the 2-core AVX2 VM: 607 against 275 us).  Both reduce in an order fixed by the
shapes and, for the vector sum, by the code compiled for this instruction set: reproducible.
The heuristic puts the average's ``parallel`` first at every size on 2 threads, and
otherwise from the size where relu's parallel loop pays
(:func:`~fastrun_algorithms.pooling.heuristic.parallel_first`).
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
from fastrun_algorithms._common import CACHE, U
from fastrun_algorithms.pooling import heuristic


class NumpyGlobalPool(Algorithm):
    """A max or sum reduction over axes 2.. straight into the output (no workspace)."""

    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, operator: str):
        self.operator = operator
        super().__init__()

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = inputs[0]
        shape = problem.shapes[0]
        out = np.empty((shape[0], shape[1], *(1 for _ in shape[2:])), dtype=problem.dtypes[0])
        axes = tuple(range(2, len(shape)))
        if self.operator == "global_maxpool":
            np.maximum.reduce(x, axis=axes, keepdims=True, out=out)
        else:
            # a sum then one division: np.mean gives float32 a hidden buffer on large inputs
            np.add.reduce(x, axis=axes, keepdims=True, out=out)
            out /= math.prod(shape[2:])
        return out

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (1,) if heuristic.parallel_first(problem) else (0,)


@numba.njit(parallel=True, cache=CACHE)
def _mean_planes(x, out):
    """``out[n*C + c]`` = the mean of plane ``x[n, c]``; X of any strides, read in place."""
    images, channels, height, width = x.shape
    for p in prange(images * channels):
        n = p // channels
        c = p - n * channels
        total = 0.0
        for h in range(height):
            for w in range(width):
                total += x[n, c, h, w]
        out[p] = total / (height * width)


#: The one reassociation :func:`row_sum` allows: LLVM may split the sum into vector lanes
#: and partial sums, an order fixed when the kernel is compiled for this instruction set (part
#: of the CPU device's cache category), so a plane's sum is the same on every run.
SUM_FASTMATH = {"contract", "reassoc"}


@numba.njit(cache=CACHE, fastmath=SUM_FASTMATH)
def row_sum(x, start, length):
    """The float64 sum of ``x[start:start + length]`` (flat), as vectors of partial sums."""
    total = 0.0
    for i in range(start, start + length):
        total += x[U(i)]
    return total


@numba.njit(parallel=True, cache=CACHE)
def _mean_rows(x, length, out):
    """``out[p]`` = the mean of the ``p``-th run of ``length`` values of flat X."""
    for p in prange(out.shape[0]):
        out[p] = row_sum(x, p * length, length) / length


@numba.njit(parallel=True, cache=CACHE)
def _max_planes(x, out):
    """``out[n*C + c]`` = the max of plane ``x[n, c]``, NaN if the plane has one (as numpy's
    maximum gives)."""
    images, channels, height, width = x.shape
    for p in prange(images * channels):
        n = p // channels
        c = p - n * channels
        best = x[n, c, 0, 0]
        for h in range(height):
            for w in range(width):
                v = x[n, c, h, w]
                if v > best or v != v:
                    best = v
                    if v != v:  # nothing beats a NaN: it stays
                        break
            if best != best:
                break
        out[p] = best


class ParallelGlobalPool(Algorithm):
    """The (image, channel) planes reduced in parallel (see the module docstring); float32 and
    float64.  X is read where it lies, whatever its strides, except a strided X of 3-D images
    or more, which is copied first (a runtime passes contiguous tensors)."""

    name = "parallel"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the average's vector sum (its entries are measured again)
    version = 2

    def __init__(self, operator: str):
        self.operator = operator
        super().__init__()

    def unusable_reason(self, problem: Problem) -> str | None:
        if problem.dtypes[0] not in ("float32", "float64"):
            return f"parallel global pooling computes float32 and float64, not {problem.dtypes[0]}"
        return None

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        shape = problem.shapes[0]
        x = np.asarray(inputs[0])
        if x.ndim < 4:  # views: no spatial axis, or 1-D images, as planes of one row
            x = x.reshape(*x.shape[:2], *[1] * (4 - x.ndim), *x.shape[2:])
        elif x.ndim > 4:  # 3-D images and up as planes of rows (a copy only if X is strided)
            x = x.reshape(*x.shape[:2], -1, x.shape[-1])
        out = np.empty((shape[0], shape[1], *(1 for _ in shape[2:])), dtype=problem.dtypes[0])
        if self.operator == "global_maxpool":
            _max_planes(x, out.reshape(-1))
        elif x.flags.c_contiguous:  # planes as rows: the vector sum
            _mean_rows(x.reshape(-1), x.shape[2] * x.shape[3], out.reshape(-1))
        else:
            _mean_planes(x, out.reshape(-1))
        return out

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (0,) if heuristic.parallel_first(problem) else (1,)


def algorithms() -> list[Algorithm]:
    return [NumpyGlobalPool("global_maxpool"), NumpyGlobalPool("global_avgpool"),
            ParallelGlobalPool("global_maxpool"), ParallelGlobalPool("global_avgpool")]
