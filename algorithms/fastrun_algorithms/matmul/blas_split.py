"""matmul as one single-threaded OpenBLAS call per block of the output, on numba's workers.

Why it exists.  fastrun keeps OpenBLAS on the calling thread
(``fastrun/devices/cpu/threads.py``): two
thread pools that both stay awake between calls fight over the cores, and numba's pool is the
one the kernels need awake.  ``blas`` then runs a product on one core.  This algorithm gives
the products that pay for more threads both: numba's (already spinning) workers each make one
BLAS call on their own block of output rows, or of columns when the output has few rows.
Measured on the 2-core development VM against ``np.matmul`` on one thread: 512^3 2923 ->
1406 us, 256x1152 @ 1152x196 1250 -> 708 us, 128x64 @ 64x784 140 -> 86 us, 1x512 @ 512x1000
33 -> 21 us (split by columns).

How.  The gemm entry points of the OpenBLAS that numpy's wheels ship (``scipy_cblas_sgemm64_``
and ``scipy_cblas_dgemm64_``, 64-bit integers) are loaded with ctypes and called from a numba
parallel loop with pointers into the operands, so no block is copied.  Where numpy was built
against another BLAS the algorithm is not usable, and says what it looked for.

REPRODUCIBLE for the reason ``blas`` is: every output element is summed over K by one gemm
call in an order fixed by OpenBLAS's blocking, and the blocks depend only on the shapes and
the thread count, which is part of the CPU device's cache category.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.devices.cpu import openblas
from fastrun.operator import Problem
from fastrun_algorithms._common import thread_count
from fastrun_algorithms.matmul import heuristic
from fastrun_algorithms.matmul._batch import layout_of, materialised_bytes, operand_3d

#: CBLAS constants (row-major storage, operands not transposed).
ROW_MAJOR, NO_TRANS = 101, 111
#: gemm symbols per dtype in numpy's OpenBLAS (scipy-openblas, ILP64 interface).
SYMBOLS = {"float32": "scipy_cblas_sgemm64_", "float64": "scipy_cblas_dgemm64_"}
#: Fewest output rows per block for a split by rows; with fewer the output is split by columns
#: (a 1 x 512 @ 512 x 1000 product: 38 us by rows, 21 by columns, 33 unsplit).
MIN_ROWS_PER_BLOCK = 16
#: Column blocks start on multiples of this many values (a 64-byte line of float32).
COLUMN_ALIGN = 16


@functools.cache
def _gemm_functions() -> tuple[dict[str, Any], str]:
    """(dtype name -> ctypes gemm function, reason when there are none)."""
    folders = openblas.library_folders()
    paths = [path for path, _ in openblas.libraries()]
    if not paths:
        return {}, ("numpy ships no OpenBLAS library (looked in "
                    + " and ".join(os.path.normpath(f) for f in folders) + ")")
    functions: dict[str, Any] = {}
    for dtype, symbol in SYMBOLS.items():
        function = openblas.function(symbol)
        if function is None:
            continue
        scalar = ctypes.c_float if dtype == "float32" else ctypes.c_double
        # Addresses as signed 64-bit integers, as the kernel computes them (numba turns a mix
        # of unsigned and signed 64-bit integers into a float).
        index = address = ctypes.c_int64
        function.restype = None
        function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, index, index, index,
                             scalar, address, index, address, index, scalar, address, index]
        functions[dtype] = function
    if not functions:
        return {}, (f"numpy's OpenBLAS ({', '.join(os.path.basename(p) for p in paths)}) "
                    f"exports none of {', '.join(SYMBOLS.values())}")
    return functions, ""


def gemm_unusable_reason(dtype: str) -> str | None:
    """Why no gemm of numpy's OpenBLAS can be called for ``dtype`` from a numba kernel, or
    None (the algorithms built on it share the answer)."""
    functions, reason = _gemm_functions()
    if dtype not in functions:
        return reason or f"numpy's OpenBLAS exports no {SYMBOLS[dtype]}"
    return None


@numba.njit(inline="always")
def no_finish(out, p, r0, r1, c0, c1, extra):
    """The block finisher of a plain product: nothing."""


def _split_kernel(gemm: Callable[..., None], finish: Callable[..., None]) -> Callable[..., None]:
    """The parallel loop over (product, block) jobs for one gemm function: the output of each
    product is cut into ``row_parts`` x ``col_parts`` blocks, and each job makes one gemm
    call, then ``finish(out, product, rows r0:r1, columns c0:c1, extra)`` on its block while
    it is in cache (the ``linear`` operator's bias and activation; :func:`no_finish` for a
    plain product).  Column cuts fall on multiples of :data:`COLUMN_ALIGN` so that every
    block but the last starts on a cache line.  Built per dtype at run time: the function's
    address is only known once its library is loaded, so numba cannot cache the compiled
    loop on disk (about 1 s to compile, once per process)."""

    def kernel(a, b, out, row_parts, col_parts, extra):
        batch, m, n = out.shape
        k = a.shape[2]
        item = out.itemsize
        lda, ldb, ldc = a.strides[1] // item, b.strides[1] // item, n
        a_step = a.strides[0] if a.shape[0] > 1 else 0
        b_step = b.strides[0] if b.shape[0] > 1 else 0
        a0, b0 = np.int64(a.ctypes.data), np.int64(b.ctypes.data)
        c0 = np.int64(out.ctypes.data)
        blocks = row_parts * col_parts
        for job in prange(batch * blocks):
            p = job // blocks
            block = job - p * blocks
            r = block // col_parts
            c = block - r * col_parts
            pa, pb, pc = a0 + p * a_step, b0 + p * b_step, c0 + p * m * n * item
            first_row, end_row = m * r // row_parts, m * (r + 1) // row_parts
            first_col = _column_cut(n, c, col_parts)
            end_col = _column_cut(n, c + 1, col_parts)
            if end_row > first_row and end_col > first_col:
                gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, end_row - first_row, end_col - first_col,
                     k, 1.0, pa + first_row * lda * item, lda, pb + first_col * item, ldb,
                     0.0, pc + (first_row * ldc + first_col) * item, ldc)
                finish(out, p, first_row, end_row, first_col, end_col, extra)

    return numba.njit(parallel=True, error_model="numpy")(kernel)


@numba.njit(inline="always")
def _column_cut(n, c, col_parts):
    """Where column block ``c`` of ``col_parts`` starts: an even share, rounded down to
    :data:`COLUMN_ALIGN` where every block gets at least that many columns (a narrower output
    is cut evenly, so that no block is left empty), and ``n`` for ``c == col_parts``."""
    if c >= col_parts:
        return n
    cut = n * c // col_parts
    if n >= COLUMN_ALIGN * col_parts:
        cut = cut // COLUMN_ALIGN * COLUMN_ALIGN
    return cut


@functools.cache
def split_kernel(dtype: str, finish: Callable[..., None] = no_finish) -> Callable[..., None]:
    """``kernel(a, b, out, row_parts, col_parts, extra)`` for ``dtype``'s gemm, each block
    finished by ``finish`` (compiled once per process and finisher)."""
    return _split_kernel(_gemm_functions()[0][dtype], finish)


def split_plan(batch: int, m: int, n: int, threads: int) -> tuple[int, int]:
    """(row blocks, column blocks) per product: enough jobs for every thread, whole products
    when the batch alone keeps the threads busy; by rows where every block keeps
    :data:`MIN_ROWS_PER_BLOCK` rows, else by columns.  The kernel takes any grid of both;
    on BERT's and ViT's projections at 16 threads no grid beat this cut by more than 4%
    (``benchmarks/probe_linear_grid.py``, docs/performance.md)."""
    parts = max(1, -(-threads // max(batch, 1)))
    return (parts, 1) if m >= MIN_ROWS_PER_BLOCK * parts else (1, parts)


def _blas_ready(x: np.ndarray) -> np.ndarray:
    """``x`` (3-D) as gemm can read it in place: rows contiguous and a row stride of at least
    a row.  Otherwise a contiguous copy (as numpy's own matmul makes for such operands)."""
    item = x.itemsize
    if x.strides[2] == item and x.strides[1] % item == 0 and x.strides[1] // item >= x.shape[2]:
        return x
    return np.ascontiguousarray(x)


class SplitBlasMatmul(Algorithm):
    """One single-threaded gemm per block of output rows (or columns) on each numba worker
    (see the module docstring)."""

    operator = "matmul"
    name = "blas_split"
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem: Problem) -> str | None:
        return gemm_unusable_reason(problem.dtypes[0])

    def workspace_bytes(self, problem: Problem) -> int:
        """Operands materialised at the full batch (a partial broadcast), as in
        ``register_tiled``; the blocks are pointers into the operands and the output."""
        return materialised_bytes(problem)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        layout = layout_of(problem)
        if 0 in (layout.batch, layout.m, layout.n, layout.k):  # nothing to split: zeros
            return np.zeros(layout.out_shape, dtype=problem.dtypes[0])
        a = _blas_ready(operand_3d(np.asarray(inputs[0]), layout.a3_shape, layout))
        b = _blas_ready(operand_3d(np.asarray(inputs[1]), layout.b3_shape, layout))
        out = np.empty(layout.out3_shape, dtype=a.dtype)
        row_parts, col_parts = split_plan(layout.batch, layout.m, layout.n,
                                          thread_count())
        split_kernel(problem.dtypes[0])(a, b, out, row_parts, col_parts, ())
        return layout.from_3d(out)

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (0, -1) if heuristic.split_first(layout_of(problem)) else (1, 2)  # rule 2

