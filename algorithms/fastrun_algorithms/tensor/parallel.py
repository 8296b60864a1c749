"""The ``parallel`` algorithms of concat and transpose: data copied into the output by numba's
workers.

Transpose.  In a transformer every attention layer splits its heads out and back in with
4-D transposes (BERT-base: 48 of them per inference, each (1, 128, 12, 64) float32, 393 KB),
which ``np.transpose`` copies on one thread.  On the 16-core host, in the model, BERT-base's
transposes took 4.4 ms with numpy alone and 3.1 ms once the search could pick this kernel
(it did for two of the three shapes, at 22 and 48 us; numpy's took 92 us on average in the
model).  The permutation is first reduced to as few axes as it really moves (axes of size 1
dropped, input axes that stay neighbours in the output merged), at most four; the output is
walked as rows of its last axis, shared out among the workers, and each row read from the
input with that axis's stride (a unit stride, a plain copy, when the last axis stays last).
Elements are moved as unsigned integers of their width, so one compiled kernel per width
serves every dtype.  Where it pays is the tensor operators' rule for copies
(:meth:`~fastrun_algorithms.tensor.operator.TensorOperator.parallel_pays`).

Concat.  ``np.concatenate`` copies on one thread.  In SqueezeNet every fire module ends in a
concat of two (N, 64..256, H, W) tensors; at batch 8 on the 16-core host those eight concats
took 0.8-1.9 ms each, a third of the model's time, while the convolutions around them ran on
all cores.  A copy is as memory-bound as relu, so it pays from the same size on
(:data:`~fastrun_algorithms.activation.operator.PARALLEL_MIN_BYTES`).

How: the output is viewed as ``outer`` rows (the product of the dimensions before the axis) of
bytes, each input as ``outer`` rows of its share; one parallel region per input copies its rows
in chunks of :data:`CHUNK` bytes, so a batch-1 concat of two large planes still has a task for
every thread.  Working on bytes makes one compiled kernel serve every dtype.
"""

from __future__ import annotations

import functools
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


#: Axes a reduced permutation may keep (the kernel's loops); more go to numpy.
MAX_AXES = 4
#: The unsigned type of each element width: the kernel copies bits, whatever they mean.
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def reduced_permutation(shape: Sequence[int], perm: Sequence[int]
                        ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input shape, permutation) of the same copy with size-1 axes dropped and input axes
    that stay adjacent and in order in the output merged: (1, 128, 12, 64) by (0, 2, 1, 3)
    is (128, 12, 64) by (1, 0, 2)."""
    kept = [p for p in perm if shape[p] != 1]
    groups: list[list[int]] = []  # runs of input axes, in output order
    for axis in kept:
        if groups and groups[-1][-1] + 1 == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    new_shape = tuple(math.prod(shape[a] for a in groups[g]) for g in by_input)
    position = {g: i for i, g in enumerate(by_input)}
    return new_shape, tuple(position[g] for g in range(len(groups)))


@numba.njit(parallel=True, cache=CACHE)
def _transpose_rows(x, out, dims, strides):
    """``out`` (flat, C order over ``dims``, 4 axes) from the flat ``x``: output element
    (a, b, c, d) is ``x[a*s0 + b*s1 + c*s2 + d*s3]`` with ``strides`` (s0..s3), in elements."""
    d1, d2, d3 = dims[1], dims[2], dims[3]
    s0, s1, s2, s3 = strides[0], strides[1], strides[2], strides[3]
    for row in prange(dims[0] * d1 * d2):
        a = row // (d1 * d2)
        rest = row - a * d1 * d2
        b = rest // d2
        c = rest - b * d2
        base = a * s0 + b * s1 + c * s2
        first = row * d3
        if s3 == 1:  # the last axis stays last: a copy LLVM vectorises
            for d in range(d3):
                out[U(first + d)] = x[U(base + d)]
        else:
            for d in range(d3):
                out[U(first + d)] = x[U(base + d * s3)]


class ParallelTranspose(ParallelRanked, Algorithm):
    """Transpose as rows of the output gathered by numba's workers (see the module
    docstring); any dtype, permutations that move at most four axes."""

    operator = "transpose"
    name = "parallel"
    #: moving data is exact and done the same way every run
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem: Problem) -> str | None:
        shape, _ = reduced_permutation(problem.shapes[0], problem.param("perm"))
        if len(shape) > MAX_AXES:
            return (f"the permutation moves {len(shape)} axes of {list(problem.shapes[0])} "
                    f"(after merging); the kernel walks at most {MAX_AXES}")
        return None

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def _walk(problem: Problem) -> tuple[np.ndarray, np.ndarray] | None:
        """The kernel's (dims, strides) for ``problem``, made once per problem: a model runs
        the same transposes every inference, and a small one's call is mostly this setup.
        None when every axis has size 1 (one element)."""
        shape, reduced = reduced_permutation(problem.shapes[0], problem.param("perm"))
        if not shape:
            return None
        steps = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        pad = MAX_AXES - len(shape)
        dims = np.array([1] * pad + [shape[p] for p in reduced], dtype=np.int64)
        strides = np.array([0] * pad + [steps[p] for p in reduced], dtype=np.int64)
        dims.flags.writeable = strides.flags.writeable = False
        return dims, strides

    def workspace_bytes(self, problem: Problem) -> int:
        return 0

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        dtype = np.dtype(problem.dtypes[0])
        perm = problem.param("perm")
        out = np.empty(tuple(problem.shapes[0][p] for p in perm), dtype=dtype)
        if out.size == 0:
            return out
        walk = self._walk(problem)
        x = np.ascontiguousarray(inputs[0]).reshape(-1)
        if walk is None:  # every axis of size 1: one element
            out.reshape(-1)[0] = x[0]
            return out
        dims, strides = walk
        bits = _UNSIGNED[dtype.itemsize]
        _transpose_rows(x.view(bits), out.reshape(-1).view(bits), dims, strides)
        return out


def algorithms(concat_pays: Callable[[Problem], bool],
               transpose_pays: Callable[[Problem], bool]) -> list[Algorithm]:
    """The parallel tensor algorithms, each ranked by its operator's ``parallel_pays``."""
    return [ParallelConcat(concat_pays), ParallelTranspose(transpose_pays)]
