"""The matmul operator: numpy ``matmul`` semantics for float32 and float64."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from fastrun.operator import Operator, Problem, Shape
from fastrun_algorithms.matmul._batch import MatmulLayout, layout_of, matmul_layout

if TYPE_CHECKING:
    from fastrun.algorithm import Algorithm

SUPPORTED_DTYPES = ("float32", "float64")

#: Strassen goes right after BLAS from this size of the smallest of M, K and N on.  One level
#: saves 1/8 of the multiply-adds but adds 18 memory-bound quadrant additions.  Measured here
#: (2 cores, OpenBLAS products, square float32/float64): from 256 on it is ahead of every
#: blocked tile and within 2x of BLAS (1.1x at 2048); at 128 it only ties the best tile.
STRASSEN_MIN_SIZE = 256

#: ``register_tiled`` goes before BLAS for batched products up to this K.  Beyond it the
#: kernel's K x 16 column panel of B no longer stays in the L2 cache while its row tiles pass,
#: and OpenBLAS (which packs) caught up or won in every case measured (K 2304 and 4608).
TILED_MAX_K = 1024
#: ... and from this many multiply-adds on (64 products of 32 x 31 x 31 took 160 us against
#: OpenBLAS's 95 us: waking the second thread is not paid back).
TILED_MIN_MACS = 1 << 21

#: ``blas_split`` goes before ``blas`` (one thread, fastrun/_threads.py) from this many
#: multiply-adds on, when numba has more than one thread: a 1 x 512 @ 512 x 1000 product (2^19)
#: took 21 us split over two workers against 33 us on one.
SPLIT_MIN_MACS = 1 << 19

#: ``gemv`` goes first for products of one row of A from this many bytes of B (per product)
#: on, when numba has more than one thread.  On 2 threads (AMD EPYC, B hot in cache): 1 x 512 @
#: 512 x 512 (1 MiB) 7.6 us against OpenBLAS's 10.3, 1 x 256 @ 256 x 512 6.0 against 5.2;
#: 1 x 1280 @ 1280 x 1000, MobileNetV2's classifier, 40 against 57.  On the 16-core host
#: that classifier took 200-250 us in the model on OpenBLAS's one thread.
GEMV_MIN_BYTES = 1 << 20


class MatmulOperator(Operator):
    """``C = A @ B`` exactly as ``np.matmul`` defines it: 2-D products, batches with broadcast
    batch dimensions, and 1-D operands promoted to a row (A) or a column (B) whose dimension is
    dropped from the result.  Both operands float32 or both float64.

    The error measure and tolerance are the base class's (max abs difference relative to the
    largest reference magnitude; 1e-3 for float32, 1e-9 for float64): they fit matmul well, as
    its rounding error grows with K times the operands' magnitude, which is what the reference
    magnitude scales with for the [-1, 1] profiling inputs.
    """

    name = "matmul"
    parameters: frozenset[str] = frozenset()  # matmul takes none

    def validate(self, problem: Problem) -> None:
        if problem.operator != self.name:
            raise ValueError(f"matmul cannot validate a {problem.operator!r} problem")
        if len(problem.shapes) != 2:
            raise ValueError(
                f"matmul takes exactly 2 inputs (A, B), got {len(problem.shapes)} with shapes "
                f"{list(problem.shapes)}"
            )
        unsupported = [d for d in problem.dtypes if d not in SUPPORTED_DTYPES]
        if unsupported:
            raise ValueError(
                f"matmul supports dtypes {' and '.join(SUPPORTED_DTYPES)}, got "
                f"{', '.join(unsupported)} (A {problem.dtypes[0]}, B {problem.dtypes[1]}); "
                "cast the operands first"
            )
        if problem.dtypes[0] != problem.dtypes[1]:
            raise ValueError(
                f"matmul needs both operands of the same dtype, got A {problem.dtypes[0]} and "
                f"B {problem.dtypes[1]}; cast one of them"
            )
        matmul_layout(*problem.shapes)  # raises ValueError for shapes numpy would refuse

    def layout(self, problem: Problem) -> MatmulLayout:
        """Batch shape, M, K, N and the mapping onto the batched 3-D form the kernels use."""
        return layout_of(problem)

    def output_shape(self, problem: Problem) -> Shape:
        return layout_of(problem).out_shape

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """``np.matmul`` in float64, so float32 candidates are checked against a result with
        far less rounding error than their own."""
        a = np.asarray(inputs[0], dtype=np.float64)
        b = np.asarray(inputs[1], dtype=np.float64)
        return np.asarray(np.matmul(a, b))

    def heuristic_order(self, problem: Problem,
                        candidates: Sequence[Algorithm]) -> list[Algorithm]:
        """Candidates best-first by rule of thumb (every candidate is returned):

        0. ``gemv`` first for products of one row of A with at least ``GEMV_MIN_BYTES`` of B
           on more than one thread (a classifier layer at batch 1: one thread streaming B
           leaves the others idle); otherwise after the numba kernels.
        1. ``register_tiled`` first for batches of products where both operands have their
           own batch, with at least 8 rows, 16 columns, K <= ``TILED_MAX_K`` and
           ``TILED_MIN_MACS`` multiply-adds in all (Winograd's products): 15-40% less time than
           OpenBLAS there (``benchmarks/probe_matmul_tiles.py``).  Smaller batches do not pay
           for its parallel region, and numpy runs a batch against one shared matrix well.
        2. ``blas_split`` when numba has more than one thread and the product has at least
           ``SPLIT_MIN_MACS`` multiply-adds: OpenBLAS runs on one thread
           (``fastrun/_threads.py``), and this spreads its calls over numba's workers.
        3. ``blas``: OpenBLAS beats or ties the numba kernels everywhere else measured here.
           Even for tiny products numpy's call (~1.0 us for 1 x 1 to 16 x 16) is cheaper than
           the naive kernel's run() (~1.8 us, mostly dispatch), so there is no tiny-problem
           rule.  ``register_tiled`` follows it (after an early ``strassen``), then
           ``blas_split`` where rule 2 did not place it.
        4. ``strassen``, when usable and min(M, K, N) >= ``STRASSEN_MIN_SIZE``.
        5. ``blocked`` configurations, the best fitting tile first: a tile fits well when
           little of it hangs over the edges of the M x N output (edge tiles run short loops
           and reuse less) and when there are enough tiles to keep every numba thread busy;
           ties go to the larger tile (more reuse per loaded element), then to registration
           order.
        6. ``strassen`` for other shapes, then algorithms this rule does not know.
        7. ``naive`` last.

        OpenCL algorithms (only ever candidates on an OpenCL device) are ordered by
        :func:`fastrun_algorithms.matmul.opencl.heuristic.opencl_rank`.
        """
        # Imported here: the opencl package imports this package's modules.
        from fastrun_algorithms.matmul.opencl.heuristic import opencl_rank

        layout = layout_of(problem)
        threads = numba.get_num_threads()
        strassen_early = min(layout.m, layout.k, layout.n) >= STRASSEN_MIN_SIZE
        macs = layout.batch * layout.m * layout.n * layout.k
        tiled_first = (all(math.prod(shape[:-2]) > 1 for shape in (layout.a_shape,
                                                                    layout.b_shape))
                       and layout.m >= 8 and layout.n >= 16 and layout.k <= TILED_MAX_K
                       and macs >= TILED_MIN_MACS)
        split_first = threads > 1 and macs >= SPLIT_MIN_MACS
        b_bytes = layout.k * layout.n * np.dtype(problem.dtypes[1]).itemsize
        gemv_first = threads > 1 and layout.m == 1 and b_bytes >= GEMV_MIN_BYTES

        def rank(algorithm: Algorithm) -> tuple[float, ...]:
            if algorithm.device_kind == "opencl":
                return (6, *opencl_rank(layout, algorithm))
            name = algorithm.desc.name
            if name == "register_tiled":
                return (-1,) if tiled_first else (1, 1)
            if name == "gemv":
                return (-2,) if gemv_first else (1, 3)
            if name == "blas_split":
                return (0, -1) if split_first else (1, 2)
            if name == "blas":
                return (0, 0)
            if name == "strassen" and strassen_early and algorithm.usable(problem):
                return (1,)
            if name == "blocked" and {"mb", "nb", "kb"} <= algorithm.param.keys():
                fit, area = _tile_fit(layout, algorithm.param, threads)
                return (2, -fit, -area)
            if name == "strassen":
                return (3,)
            if name == "naive":
                return (5,)
            return (4,)

        return sorted(candidates, key=rank)


def _tile_fit(layout: MatmulLayout, param: dict[str, Any], threads: int) -> tuple[float, int]:
    """(fit in [0, 1], tile area) of a blocked tile for this shape.

    fit = the fraction of the tiles' M x N area the output covers (edge tiles that hang over
    run short, poorly vectorised loops) x the fraction of the threads the tiles keep busy.  K
    does not enter: a K step shorter than kb merely leaves part of the panel buffer unused.
    """
    mb, nb = int(param["mb"]), int(param["nb"])
    m, n = max(layout.m, 1), max(layout.n, 1)
    tiles_m, tiles_n = -(-m // mb), -(-n // nb)
    covered = (m * n) / (tiles_m * mb * tiles_n * nb)
    busy = min(1.0, max(layout.batch, 1) * tiles_m * tiles_n / max(threads, 1))
    return covered * busy, mb * nb
