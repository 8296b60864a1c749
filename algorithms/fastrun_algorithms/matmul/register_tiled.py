"""Register-tiled matmul in numba: an 8 x 16 output tile (4 x 16 on AVX2) held in vector registers.

Why it exists.  The products that convolutions hand down are rarely BLAS's favourite shape:
Winograd's are batches of small products with few columns (16 to 200 tiles), im2col's have few
columns at deep layers.  On this machine's two cores OpenBLAS runs Winograd's products at
105-145 GFLOP/s and this kernel at 125-195, because every output tile is finished in registers
with no packing step and the whole batch is one parallel region; on im2col's products the two
tie (``benchmarks/probe_matmul_tiles.py``).

How.  Each job computes an 8 x 16 tile of C: for every k it broadcasts eight values of A (one
per tile row) and multiplies them with one 16-wide (NR) row segment of B, accumulating into eight
vector registers; a tile of float32 is exactly eight AVX-512 registers.  With AVX2's 16 registers
the tile is 4 rows of two vectors (:func:`fastrun_algorithms._common.register_tile`): two loads
and four broadcasts per eight multiply-adds, where 8 rows of one vector took one load and eight
(0.82-0.91 of that tile's time on Winograd's and im2col's products on the 2-core AVX2 VM).
Three details decide whether LLVM produces that loop (each was worth 1.6x to 30x in the probes):

* the accumulator lives in a stack buffer (:func:`fastrun_algorithms._common.stack_buffer`),
  which LLVM can prove private, so it never stores it inside the loop;
* B's column index is unsigned (:data:`fastrun_algorithms._common.U`), so numba emits no
  negative-index check and the 16 loads become one vector load;
* the operands are compiled as C-contiguous when they are (a strided operand gets its own,
  slower variant): with unknown strides the eight row pointers of A each need a register of
  their own and the loop spills.

Edges.  The last column tile is shifted left to end at column N, overlapping the one before it;
the overlap is computed twice, identically, so no narrow remainder loop is needed.  Rows past
M repeat row M-1 and are not stored.  Products narrower than a tile take a plain loop.

REPRODUCIBLE: every output element is summed in k order by one job, with FMA contraction only
(no reassociation), whatever the thread count or the tile it falls in.
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
from fastrun_algorithms._common import (
    CACHE,
    FASTMATH,
    U,
    register_tile,
    stack_buffer,
    tile_fma4,
    tile_fma8,
    tile_rows8,
)
from fastrun_algorithms.matmul import heuristic
from fastrun_algorithms.matmul._batch import (
    layout_of,
    materialised_bytes,
    numba_dtype,
    run_3d,
)

#: Rows and columns of the output tile one job computes.  MR broadcasts and one NR-wide load
#: feed MR vector multiply-adds per k, which keeps the multiply-add units busy; the tile of
#: float32 fills eight AVX-512 (or AVX2) registers, leaving room for the operands.
MR, NR = register_tile(16)
#: Elements of the tile: a global, so that numba sees the literal the stack buffer needs.
TILE = MR * NR


def _register_tiled_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[p] = a[p or 0] @ b[p or 0]: an operand with a batch of one is shared by every
    product (numpy's broadcasting of a 2-D operand against a batch), without a copy.

    Jobs are numbered batch-major, then by column tile, then by row tile, so that consecutive
    jobs (and one worker's share of them) reuse the same K x NR column panel of B from cache.
    """
    batch, m, n = out.shape
    k = a.shape[2]
    a_step = 1 if a.shape[0] > 1 else 0
    b_step = 1 if b.shape[0] > 1 else 0
    row_tiles = (m + MR - 1) // MR
    col_tiles = (n + NR - 1) // NR
    per_product = row_tiles * col_tiles
    for job in prange(batch * per_product):
        p = job // per_product
        rest = job - p * per_product
        tj = rest // row_tiles
        i0 = (rest - tj * row_tiles) * MR
        pa = p * a_step
        pb = p * b_step
        rows = min(MR, m - i0)
        acc = numba.carray(stack_buffer(TILE, out.dtype), (MR, NR))
        for r in range(MR):
            for t in range(NR):
                acc[r, t] = 0
        if n >= NR:
            j0 = U(min(tj * NR, n - NR))  # the last tile overlaps the one before it
            i_0, r1, r2, r3, r4, r5, r6, r7 = tile_rows8(i0, m - 1)
            for c in range(k):
                w0, w1, w2, w3 = a[pa, i_0, c], a[pa, r1, c], a[pa, r2, c], a[pa, r3, c]
                if MR == 8:
                    w4, w5, w6, w7 = a[pa, r4, c], a[pa, r5, c], a[pa, r6, c], a[pa, r7, c]
                    for t in range(NR):
                        tile_fma8(acc, t, b[pb, c, j0 + U(t)], w0, w1, w2, w3, w4, w5, w6, w7)
                else:
                    for t in range(NR):
                        tile_fma4(acc, t, b[pb, c, j0 + U(t)], w0, w1, w2, w3)
            for r in range(rows):
                for t in range(NR):
                    out[p, i0 + r, j0 + U(t)] = acc[r, t]
        else:  # fewer columns than one tile
            for c in range(k):
                for r in range(rows):
                    w = a[pa, i0 + r, c]
                    for t in range(n):
                        acc[r, t] += w * b[pb, c, t]
            for r in range(rows):
                for t in range(n):
                    out[p, i0 + r, t] = acc[r, t]


@functools.cache
def _compiled(dtype: np.dtype, a_layout: str, b_layout: str) -> Callable[..., None]:
    """The kernel for one dtype and one pair of operand layouts ("C" contiguous, the fast and
    usual case, or "A" any strides), compiled (or loaded from numba's cache) on first use."""
    item = numba_dtype(dtype)
    signature = types.void(types.Array(item, 3, a_layout, readonly=True),
                           types.Array(item, 3, b_layout, readonly=True),
                           types.Array(item, 3, "C"))
    return numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(
        _register_tiled_kernel)


class RegisterTiledMatmul(Algorithm):
    """8 x 16 register tiles, one parallel job each, for float32 and float64 (see the module
    docstring for why it is fast where it is)."""

    operator = "matmul"
    name = "register_tiled"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the 4 x 16 tile on 16 registers
    version = 2

    def workspace_bytes(self, problem: Problem) -> int:
        """Operands materialised at the full batch (:func:`materialised_bytes`); the kernel
        itself allocates nothing (its tile is on the stack)."""
        return materialised_bytes(problem)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        return run_3d(problem, inputs, _compiled)

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (-1,) if heuristic.tiled_first(layout_of(problem)) else (1, 1)  # rule 1

