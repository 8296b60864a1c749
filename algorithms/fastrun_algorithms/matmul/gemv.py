"""Matrix-vector products (one row of A) on every thread: a classifier layer at batch 1.

Why it exists.  A CNN ends in a fully connected layer, a (1, K) @ (K, N) product whose cost is
reading B once: 5 MB for MobileNetV2's (1280, 1000).  OpenBLAS runs it on the calling thread
(``fastrun/devices/cpu/threads.py``), ``blas_split`` splits the output's rows (there is one), and
``register_tiled`` wastes seven of its eight tile rows; on the 16-core host that layer took
200-250 us of MobileNetV2's 3.8-4.4 ms, one core streaming B from memory while fifteen waited.

How.  The columns are cut into chunks of 64, one task each (16 tasks for N = 1000, so 16
threads each stream a 1/16 slice of B): a task keeps its 64 sums in four vector registers (a
stack buffer) and, for every k, adds ``a[k]`` times the 64 values of B's row k.  The last chunk
is shifted back to end at column N, overlapping the one before it (computed twice,
identically); fewer than 64 columns take one short task.  A batch of products is a batch of
such rows.

REPRODUCIBLE: each output is summed in k order by one task, with FMA contraction only,
whatever the thread count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange, types

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, FASTMATH, U, stack_buffer
from fastrun_algorithms.matmul import heuristic
from fastrun_algorithms.matmul._batch import (
    layout_of,
    materialised_bytes,
    numba_dtype,
    run_3d,
)

#: Columns one task sums: four AVX-512 float32 vectors.
CHUNK = 64


def _gemv_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[p, 0] = a[p or 0, 0] @ b[p or 0]; a (batch|1, 1, K), b (batch|1, K, N)."""
    batch, _, n = out.shape
    k = a.shape[2]
    a_step = 1 if a.shape[0] > 1 else 0
    b_step = 1 if b.shape[0] > 1 else 0
    chunks = (n + CHUNK - 1) // CHUNK
    for task in prange(batch * chunks):
        p = task // chunks
        j0 = U(max(0, min((task - p * chunks) * CHUNK, n - CHUNK)))
        width = min(CHUNK, n)
        pa, pb = p * a_step, p * b_step
        acc = numba.carray(stack_buffer(CHUNK, out.dtype), (CHUNK,))
        for t in range(CHUNK):
            acc[t] = 0
        if width == CHUNK:
            for c in range(k):
                w = a[pa, 0, c]
                for t in range(CHUNK):
                    acc[t] += w * b[pb, c, j0 + U(t)]
            for t in range(CHUNK):
                out[p, 0, j0 + U(t)] = acc[t]
        else:  # fewer columns than one chunk
            for c in range(k):
                w = a[pa, 0, c]
                for t in range(width):
                    acc[t] += w * b[pb, c, U(t)]
            for t in range(width):
                out[p, 0, U(t)] = acc[t]


@functools.cache
def _compiled(dtype: np.dtype, a_layout: str, b_layout: str) -> Callable[..., None]:
    """The kernel for one dtype and pair of operand layouts ("C" or "A"), compiled (or loaded
    from numba's cache) on first use."""
    item = numba_dtype(dtype)
    signature = types.void(types.Array(item, 3, a_layout, readonly=True),
                           types.Array(item, 3, b_layout, readonly=True),
                           types.Array(item, 3, "C"))
    return numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(_gemv_kernel)


class GemvMatmul(Algorithm):
    """Products of one row of A, split over chunks of 64 output columns (see the module
    docstring); float32 and float64."""

    operator = "matmul"
    name = "gemv"
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem: Problem) -> str | None:
        layout = layout_of(problem)
        if layout.m != 1:
            return f"gemv needs one row of A (M == 1), got M={layout.m}"
        return None

    def workspace_bytes(self, problem: Problem) -> int:
        """Operands materialised at the full batch (:func:`materialised_bytes`); the kernel
        allocates nothing."""
        return materialised_bytes(problem)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        return run_3d(problem, inputs, _compiled)

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (-2,) if heuristic.gemv_first(problem) else (1, 3)  # rule 0

