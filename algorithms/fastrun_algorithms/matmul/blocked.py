"""Cache-blocked matmul in numba: one registered algorithm per tile configuration.

Which tile is fastest depends on the shape (a 128-wide tile wastes most of its work on an N=40
product, a small tile leaves cache reuse on the table for a large one) and on the processor's
caches, which is exactly what profiling settles; so every configuration is its own algorithm
with its tile in its identity.
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
from fastrun_algorithms._common import CACHE, thread_count
from fastrun_algorithms.matmul import heuristic
from fastrun_algorithms.matmul._batch import (
    MatmulLayout,
    kernel_signature,
    layout_of,
    numba_dtype,
)


def _blocked_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray, mb: int, nb: int, kb: int,
                    acc_ws: np.ndarray, panel_ws: np.ndarray) -> None:
    """out[p] = a[p] @ b[p] computed tile by tile.

    The (batch x tile rows x tile columns) output tiles are numbered in one range and split into
    ``len(acc_ws)`` contiguous chunks, one per worker, so a batch of small products parallelises
    as well as one large product.  Worker ``w`` owns ``acc_ws[w]`` (an mb x nb accumulator) and
    ``panel_ws[w]`` (a kb x nb copy of the current B panel, contiguous whatever B's strides are);
    the kernel allocates nothing itself.  For each tile, K is walked in steps of kb: the B panel
    is packed, then every A element is broadcast along a contiguous row of the panel into the
    accumulator row (the loop over j vectorises), four k at a time to cut the accumulator
    loads and stores per multiply-add.  Each output element is summed in k order by exactly one
    worker, so the result does not depend on the thread count or the schedule: reproducible.
    """
    batch, m, k = a.shape
    n = b.shape[2]
    tiles_m = (m + mb - 1) // mb
    tiles_n = (n + nb - 1) // nb
    per_batch = tiles_m * tiles_n
    tiles = batch * per_batch
    workers = acc_ws.shape[0]
    for w in prange(workers):
        acc = acc_ws[w]
        panel = panel_ws[w]
        for t in range(w * tiles // workers, (w + 1) * tiles // workers):
            p = t // per_batch
            ti = (t - p * per_batch) // tiles_n
            tj = t - p * per_batch - ti * tiles_n
            i0 = ti * mb
            j0 = tj * nb
            ml = min(mb, m - i0)
            nl = min(nb, n - j0)
            for ii in range(ml):
                for jj in range(nl):
                    acc[ii, jj] = 0
            for k0 in range(0, k, kb):
                kl = min(kb, k - k0)
                for kk in range(kl):
                    for jj in range(nl):
                        panel[kk, jj] = b[p, k0 + kk, j0 + jj]
                k4 = kl - kl % 4
                for ii in range(ml):
                    row = i0 + ii
                    for kk in range(0, k4, 4):
                        a0 = a[p, row, k0 + kk]
                        a1 = a[p, row, k0 + kk + 1]
                        a2 = a[p, row, k0 + kk + 2]
                        a3 = a[p, row, k0 + kk + 3]
                        for jj in range(nl):
                            # Parenthesised left to right: the same rounding as one k at a time.
                            acc[ii, jj] = (((acc[ii, jj] + a0 * panel[kk, jj])
                                            + a1 * panel[kk + 1, jj])
                                           + a2 * panel[kk + 2, jj]) + a3 * panel[kk + 3, jj]
                    for kk in range(k4, kl):
                        aik = a[p, row, k0 + kk]
                        for jj in range(nl):
                            acc[ii, jj] += aik * panel[kk, jj]
            for ii in range(ml):
                for jj in range(nl):
                    out[p, i0 + ii, j0 + jj] = acc[ii, jj]


@functools.cache
def _compiled(dtype: np.dtype) -> Callable[..., None]:
    """The kernel for one dtype, compiled (or loaded from numba's cache) on first use; lazily,
    so that loading the plugin stays cheap and only the dtypes in use are compiled."""
    workspace = types.Array(numba_dtype(dtype), 3, "C")
    signature = kernel_signature(dtype, types.intp, types.intp, types.intp, workspace, workspace)
    return numba.njit(signature, parallel=True, cache=CACHE)(_blocked_kernel)


class BlockedMatmul(Algorithm):
    """Cache-blocked, multi-threaded numba matmul with one fixed (mb, nb, kb) tile.

    ``param``: ``{"mb": rows of an output tile, "nb": its columns, "kb": depth of one K step}``.
    """

    operator = "matmul"
    name = "blocked"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        for key in ("mb", "nb", "kb"):
            value = self.param.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"blocked matmul needs a positive integer {key!r} in its parameters "
                    f"(mb, nb, kb), got {self.param!r}"
                )
        self.mb: int = self.param["mb"]
        self.nb: int = self.param["nb"]
        self.kb: int = self.param["kb"]

    def tile(self, layout: MatmulLayout) -> tuple[int, int, int]:
        """(mb, nb, kb) clamped to the problem: a tile never exceeds the output or K, so a
        small product neither allocates nor zeroes buffers it cannot fill."""
        return (max(1, min(self.mb, layout.m)), max(1, min(self.nb, layout.n)),
                max(1, min(self.kb, layout.k)))

    def tiles(self, layout: MatmulLayout) -> int:
        """Number of output tiles: the units of parallel work."""
        mb, nb, _ = self.tile(layout)
        return layout.batch * -(-layout.m // mb) * -(-layout.n // nb)

    def workers(self, layout: MatmulLayout) -> int:
        """Workers the kernel runs: one per numba thread, but never more than there are tiles
        (a worker without a tile would only hold an unused buffer)."""
        return min(thread_count(), self.tiles(layout))

    def workspace_bytes(self, problem: Problem) -> int:
        """Bytes of the per-worker buffers :meth:`run` allocates: each of
        ``min(numba threads, tiles)`` workers gets an mb x nb accumulator and a kb x nb packed
        B panel of the problem's dtype (the tile clamped to the problem, see :meth:`tile`).
        These are allocated once per call with numpy, before the kernel starts (the kernel
        itself allocates nothing), so this is the exact peak."""
        layout = layout_of(problem)
        mb, nb, kb = self.tile(layout)
        per_worker = (mb * nb + kb * nb) * np.dtype(problem.dtypes[0]).itemsize
        return self.workers(layout) * per_worker

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        layout = layout_of(problem)
        a3, b3 = layout.to_3d(inputs[0], inputs[1])
        dtype = a3.dtype
        out = np.empty(layout.out3_shape, dtype=dtype)
        workers = self.workers(layout)
        mb, nb, kb = self.tile(layout)
        acc_ws = np.empty((workers, mb, nb), dtype=dtype)
        panel_ws = np.empty((workers, kb, nb), dtype=dtype)
        _compiled(dtype)(a3, b3, out, mb, nb, kb, acc_ws, panel_ws)
        return layout.from_3d(out)

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        fit, area = heuristic.tile_fit(layout_of(problem), self.param, thread_count())
        return (2, -fit, -area)  # rule 5

