"""GELU's algorithms: one numba pass over the tensor, serial or split over the threads.

Both forms are computed from ``1 - erf`` or ``exp`` of a non-positive number
(:mod:`fastrun_algorithms._fastmath`), which vectorise in float32:

* exact: ``x >= 0``: ``x/2 (2 - erfc(z))``; ``x < 0``: ``x/2 erfc(|z|)``, with z = x / sqrt(2);
  the negative side never forms ``1 + erf(z)``, which cancels to nothing for large |z|;
* tanh: ``x/2 (1 + tanh(u))``, u = sqrt(2/pi) (x + 0.044715 x^3), with tanh(|u|) as
  ``(1 - e) / (1 + e)``, e = exp(-2|u|), and u's sign put back.

On the 2-core development VM, one thread did the exact form in 1.5 ns per float32 element, where
the five steps GELU lowers to took 5.4 ms on ViT-B/16's (197, 3072) activation at two threads,
2.3 ms of it the scalar libm erf.  ``parallel`` splits the flat tensor into blocks of
:data:`BLOCK` elements; which of the two wins at a size is measured (the rule of thumb below
says parallel from the activations' :data:`PARALLEL_MIN_BYTES`).

REPRODUCIBLE: an element's value does not depend on the thread that computes it.
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
from fastrun_algorithms._common import CACHE, SERIAL_RANK, ParallelRanked
from fastrun_algorithms._fastmath import erfc_ge0, exp_le0

#: Elements per parallel block (16 to 32 KiB): small enough to spread a transformer's
#: activation over many threads, large enough that a block's setup is negligible.
BLOCK = 4096
#: forms, as the kernels take them
EXACT, TANH = 0, 1


@numba.njit(inline="always", error_model="numpy")
def gelu_exact(v):
    """GELU's exact form of one value (see the module docstring); also the ``linear``
    operator's epilogue."""
    dtype = type(v)
    e = erfc_ge0(abs(v) * dtype(1 / math.sqrt(2)))
    return dtype(0.5) * v * (dtype(2.0) - e if v >= 0 else e)


@numba.njit(inline="always", error_model="numpy")
def _gelu_span(x, out, start, stop, form):
    dtype = x.dtype.type
    half, one, two = dtype(0.5), dtype(1.0), dtype(2.0)
    if form == EXACT:
        for i in range(start, stop):
            out[i] = gelu_exact(x[i])
    else:
        scale, cubic = dtype(math.sqrt(2 / math.pi)), dtype(0.044715)
        for i in range(start, stop):
            v = x[i]
            u = scale * (v + cubic * v * v * v)
            e = exp_le0(-two * abs(u))
            t = (one - e) / (one + e)
            out[i] = half * v * (one + (t if u >= 0 else -t))


@numba.njit(cache=CACHE, error_model="numpy")
def gelu_serial_kernel(x, out, form):
    _gelu_span(x, out, 0, x.size, form)


@numba.njit(parallel=True, cache=CACHE, error_model="numpy")
def gelu_parallel_kernel(x, out, form):
    size = x.size
    for block in prange((size + BLOCK - 1) // BLOCK):
        _gelu_span(x, out, block * BLOCK, min(size, (block + 1) * BLOCK), form)


class _GeluLoop(Algorithm):
    operator = "gelu"
    attributes = AlgoAttribute.REPRODUCIBLE
    kernel: Any = None

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.ascontiguousarray(inputs[0])
        out = np.empty(problem.shapes[0], x.dtype)
        if out.size:
            form = TANH if problem.param("approximate") == "tanh" else EXACT
            type(self).kernel(x.reshape(-1), out.reshape(-1), form)
        return out


class SerialGelu(_GeluLoop):
    """One thread: small tensors, and wherever waking the pool costs more than it saves."""

    name = "serial"
    kernel = gelu_serial_kernel

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return SERIAL_RANK


class ParallelGelu(ParallelRanked, _GeluLoop):
    """Blocks of :data:`BLOCK` elements over numba's threads."""

    name = "parallel"
    kernel = gelu_parallel_kernel
