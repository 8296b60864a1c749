"""The matmul algorithms' rules of thumb: each algorithm states its own rank
(``heuristic_rank`` on its class, smaller first), from the conditions and thresholds here.

The order, best first:

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
   (``fastrun/devices/cpu/threads.py``), and this spreads its calls over numba's workers.
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
6. ``strassen`` for other shapes.
7. ``naive``.

OpenCL algorithms (only ever candidates on an OpenCL device) rank themselves
(``family_rank``, with the rules of :mod:`fastrun_algorithms.matmul.opencl.heuristic`).

Algorithms without a rule (a plugin's, say) come after all of these, in registration order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastrun.operator import Problem
from fastrun_algorithms._common import thread_count
from fastrun_algorithms.matmul._batch import MatmulLayout, layout_of

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

#: ``blas_split`` goes before ``blas`` (one thread, fastrun/devices/cpu/threads.py) from this many
#: multiply-adds on, when numba has more than one thread: a 1 x 512 @ 512 x 1000 product (2^19)
#: took 21 us split over two workers against 33 us on one.
SPLIT_MIN_MACS = 1 << 19

#: ``gemv`` goes first for products of one row of A from this many bytes of B (per product)
#: on, when numba has more than one thread.  On 2 threads (AMD EPYC, B hot in cache): 1 x 512 @
#: 512 x 512 (1 MiB) 7.6 us against OpenBLAS's 10.3, 1 x 256 @ 256 x 512 6.0 against 5.2;
#: 1 x 1280 @ 1280 x 1000, MobileNetV2's classifier, 40 against 57.  On the 16-core host
#: that classifier took 200-250 us in the model on OpenBLAS's one thread.
GEMV_MIN_BYTES = 1 << 20


def macs(layout: MatmulLayout) -> int:
    return layout.batch * layout.m * layout.n * layout.k


def tiled_first(layout: MatmulLayout) -> bool:
    """Rule 1: ``register_tiled`` before BLAS."""
    own_batches = all(math.prod(shape[:-2]) > 1 for shape in (layout.a_shape, layout.b_shape))
    return (own_batches and layout.m >= 8 and layout.n >= 16 and layout.k <= TILED_MAX_K
            and macs(layout) >= TILED_MIN_MACS)


def split_first(layout: MatmulLayout) -> bool:
    """Rule 2: ``blas_split`` before ``blas``."""
    return thread_count() > 1 and macs(layout) >= SPLIT_MIN_MACS


def gemv_first(problem: Problem) -> bool:
    """Rule 0: ``gemv`` first."""
    layout = layout_of(problem)
    b_bytes = layout.k * layout.n * np.dtype(problem.dtypes[1]).itemsize
    return thread_count() > 1 and layout.m == 1 and b_bytes >= GEMV_MIN_BYTES


def strassen_early(layout: MatmulLayout) -> bool:
    """Rule 4: ``strassen`` right after BLAS."""
    return min(layout.m, layout.k, layout.n) >= STRASSEN_MIN_SIZE


def tile_fit(layout: MatmulLayout, param: dict[str, Any], threads: int) -> tuple[float, int]:
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
