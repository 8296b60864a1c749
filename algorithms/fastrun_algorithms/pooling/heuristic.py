"""The pooling algorithms' rules of thumb: each algorithm states its own rank
(``heuristic_rank`` on its class, smaller first) from the conditions here.

* maxpool and avgpool: the numba kernel (``direct``) first where numpy would have to make a
  padded copy or its windows overlap; ``numpy`` first where it reads X in place in disjoint
  windows.  The kernel is parallel over planes and numpy is not: on (1, 64, 112, 112) float32
  3x3 stride 2 pad 1 maxpool it took 0.7 ms against numpy's 1.2 ms on two idle cores, and on
  SqueezeNet's unpadded (8, 64, 111, 111) 3x3 stride 2 one 7-9 ms against 23-24 ms (numpy's
  strided view of overlapping windows reads each input value up to four times); on 2x2
  stride 2 without pads numpy wins (0.11 ms against 0.15-0.25 ms).
* the global pools: ``parallel`` first from the activations' ``PARALLEL_MIN_BYTES`` of input
  on more than one numba thread, ``numpy`` first below; the OpenCL configurations by
  :func:`~fastrun_algorithms.pooling.opencl.algorithms.global_pool_rank` (a work-item or a
  work-group per plane depending on the plane's size).

Rules of thumb only: profiling times every candidate.
"""

from __future__ import annotations

import math

import numpy as np

from fastrun.operator import Problem
from fastrun_algorithms._common import parallel_pays, thread_count
from fastrun_algorithms.pooling.geometry import pool_geometry


def direct_first(problem: Problem) -> bool:
    """Whether the numba kernel goes before numpy for a maxpool or avgpool."""
    geo = pool_geometry(problem)
    overlapping = any(k > s for k, s in zip(geo.kernel, geo.strides, strict=True))
    return geo.reads_outside or overlapping


#: Threads on which the global average's parallel kernel goes first at every size: its
#: vector sum, one plane per worker, took 0.29-0.83 of numpy's time on every plane measured on
#: 2 threads of the AVX2 VM (16 x 7x7: 4.5 against 5.4 us; 96 x 112x112: 104 against 357).
#: A wider team's fork and join was not measured with it: there the size rule holds.
AVGPOOL_ALWAYS_PARALLEL_THREADS = 2


def parallel_first(problem: Problem) -> bool:
    """Whether the parallel kernel goes before numpy for a global pool: for the average on
    :data:`AVGPOOL_ALWAYS_PARALLEL_THREADS` threads always, otherwise from the size where
    relu's parallel loop pays."""
    from fastrun_algorithms.activation.operator import PARALLEL_MIN_BYTES

    if (problem.operator == "global_avgpool"
            and thread_count() == AVGPOOL_ALWAYS_PARALLEL_THREADS):
        return True
    size = math.prod(problem.shapes[0]) * np.dtype(problem.dtypes[0]).itemsize
    return parallel_pays(size, PARALLEL_MIN_BYTES)
