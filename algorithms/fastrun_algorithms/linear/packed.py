"""``packed``: a fully connected layer whose weights are packed once, each output tile summed
and finished in vector registers.

Why it exists.  ``blas`` and ``blas_split`` hand the product to OpenBLAS, which copies ("packs")
its panels of W, and of X, inside every call.  A transformer's projections are products of
few rows (128 tokens, 197 patches) by a large constant weight (768 x 768 to 768 x 3072), so
those copies are a large share of the call, and with ``blas_split`` every worker packs all of
X again.  Here W is packed once, when the model is prepared (``weight_preprocess``), into
panels of 64 columns (32 on AVX2) laid out k-major, so that a tile's weights for one k are a
few consecutive vectors and a panel is read as one stream; X is read where it lies.

How.  A job computes ``ROWS`` rows x one panel: for every k it broadcasts ``ROWS`` values of
X and multiplies them with the panel's ``PANEL_BLOCKS`` 16-wide vectors, accumulating into
``ROWS * PANEL_BLOCKS`` vectors of 16 lanes held in registers (a stack buffer,
:func:`fastrun_algorithms._common.stack_buffer`).  With AVX-512's 32 registers that is 6 rows
x 4 blocks: 24 accumulators, 4 weight vectors and a broadcast, as ``conv``'s
``blocked_direct`` tile; with AVX2's 16 registers of 8 lanes, 3 rows x 2 blocks (12
accumulators of 8 lanes: the weights are read as the multiply-adds' memory operands).  Jobs
are numbered panel by panel, so the contiguous share of jobs each worker gets reads one or
two panels, which stay in its cache.  The bias, the residual and the activation are applied
as the tile is stored.  Each k step also prefetches the panel's weights :data:`AHEAD` steps on
(:func:`fastrun_algorithms._common.prefetch`).  Measured with ``benchmarks/bench_linear.py``;
the figures are in ``docs/performance.md``.

Edges.  The last row tile is shifted back to end at the last row, overlapping the one before
it (computed twice, identically); fewer rows than a tile repeat the last row.  Columns past N
have zero weights in the packed panel and are not stored.

Float32 only: in float64 the tile would not fit the registers; ``blas`` serves float64.

REPRODUCIBLE: every output value is summed in k order by one job, with FMA contraction only,
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
from fastrun_algorithms._common import (
    CACHE,
    FASTMATH,
    RunsThroughBind,
    U,
    prefetch,
    stack_buffer,
    vector_registers,
)
from fastrun_algorithms.linear.algorithms import finish_value
from fastrun_algorithms.linear.operator import CODES, operands

#: Lanes of one weight block: the vector of a float32 AVX-512 register (two AVX2 ones).
LANES = 16


def _tile(registers: int, lanes: int) -> tuple[int, int]:
    """(rows, 16-lane blocks) of one job's tile for vector registers of ``lanes`` float32
    lanes: 6 x 4 where a block is one register and there are 32, else 3 x 2 (see the module
    docstring)."""
    if registers >= 32 and lanes >= LANES:
        return 6, 4
    return 3, 2


ROWS, PANEL_BLOCKS = _tile(*vector_registers())
#: Columns of one packed panel.
PANEL = PANEL_BLOCKS * LANES
#: Elements of the accumulator tile: a global, so that numba sees the literal it needs.
TILE = ROWS * PANEL
#: How many k steps ahead of its multiply-adds a tile prefetches its panel's weights: 16
#: (4 KB on AVX-512, the next page, where the hardware's own prefetcher stops).  A model's
#: weights arrive from memory, the layers before having pushed them out of every cache: in
#: BERT-base's runs at 16 threads on the Xeon (three rounds of processes from one cache) the
#: 72 projections took 27.3-28.5 ms without prefetching, 25.7-27.3 ms 16 steps ahead and
#: 26.3-27.8 at 4 and 8.
AHEAD = 16


@numba.njit(inline="always")
def _fma_rows(acc, b, t, x0, x1, x2, x3, x4, x5, w):
    """Lane ``t`` of block ``b``: ``acc[b, r, t] += x_r * w`` for the tile's rows (``ROWS``
    is a constant: the tests compile away)."""
    acc[b, 0, t] += x0 * w
    acc[b, 1, t] += x1 * w
    acc[b, 2, t] += x2 * w
    if ROWS == 6:
        acc[b, 3, t] += x3 * w
        acc[b, 4, t] += x4 * w
        acc[b, 5, t] += x5 * w


@numba.njit(inline="always")
def _accumulate(acc, x, packed, panel, m0, ahead):
    """The tile of rows m0.. (repeating the last row where there are fewer) and ``panel``,
    from zero, summed over k in order, prefetching the weights ``ahead`` k steps on (none at
    0)."""
    for b in range(PANEL_BLOCKS):
        for r in range(ROWS):
            for t in range(LANES):
                acc[b, r, t] = 0
    last = x.shape[0] - 1
    r0, r1, r2 = min(m0, last), min(m0 + 1, last), min(m0 + 2, last)
    r3, r4, r5 = min(m0 + 3, last), min(m0 + 4, last), min(m0 + 5, last)
    start = panel * x.shape[1]
    for k in range(x.shape[1]):
        if ahead > 0:
            at = (start + k + ahead) * PANEL
            for line in range(0, PANEL, LANES):
                prefetch(packed, at + line)
        x0, x1, x2 = x[r0, k], x[r1, k], x[r2, k]
        x3, x4, x5 = x2, x2, x2
        if ROWS == 6:
            x3, x4, x5 = x[r3, k], x[r4, k], x[r5, k]
        for t in range(LANES):
            _fma_rows(acc, 0, t, x0, x1, x2, x3, x4, x5, packed[panel, k, U(t)])
            _fma_rows(acc, 1, t, x0, x1, x2, x3, x4, x5, packed[panel, k, U(LANES + t)])
            if PANEL_BLOCKS == 4:
                _fma_rows(acc, 2, t, x0, x1, x2, x3, x4, x5, packed[panel, k, U(2 * LANES + t)])
                _fma_rows(acc, 3, t, x0, x1, x2, x3, x4, x5, packed[panel, k, U(3 * LANES + t)])


def _kernel(x: np.ndarray, packed: np.ndarray, bias: np.ndarray, has_bias: bool,
            z: np.ndarray, has_residual: bool, code: int, ahead: int, out: np.ndarray) -> None:
    """``out = act(x @ W + bias + z)`` with W packed by :func:`pack` (``z`` laid out as
    ``out``, read only with ``has_residual``); jobs numbered panel by panel, then row tile;
    ``ahead``: see :data:`AHEAD`."""
    m, n = out.shape
    tiles = (m + ROWS - 1) // ROWS
    zero = out.dtype.type(0)
    for job in prange(packed.shape[0] * tiles):
        panel = job // tiles
        m0 = min((job - panel * tiles) * ROWS, max(m - ROWS, 0))
        acc = numba.carray(stack_buffer(TILE, out.dtype), (PANEL_BLOCKS, ROWS, LANES))
        _accumulate(acc, x, packed, panel, m0, ahead)
        c0 = panel * PANEL
        rows = min(ROWS, m - m0)
        if rows == ROWS and c0 + PANEL <= n:  # a whole tile: constant trip counts
            for r in range(ROWS):
                for b in range(PANEL_BLOCKS):
                    for t in range(LANES):
                        c = c0 + b * LANES + t
                        out[m0 + r, U(c)] = finish_value(acc[b, r, t], bias, z, m0 + r, c,
                                                         has_bias, has_residual, code, zero)
        else:
            for r in range(rows):
                for b in range(PANEL_BLOCKS):
                    for t in range(min(LANES, n - c0 - b * LANES)):
                        c = c0 + b * LANES + t
                        out[m0 + r, U(c)] = finish_value(acc[b, r, t], bias, z, m0 + r, c,
                                                         has_bias, has_residual, code, zero)


@functools.cache
def _compiled() -> Callable[..., None]:
    """The float32 kernel, compiled (or loaded from numba's cache) on first use; X C-contiguous,
    so that LLVM knows its row stride."""
    f32 = types.float32
    readonly = functools.partial(types.Array, f32, layout="C", readonly=True)
    return numba.njit(
        types.void(readonly(ndim=2), readonly(ndim=3), readonly(ndim=1), types.boolean,
                   readonly(ndim=2), types.boolean, types.intp, types.intp,
                   types.Array(f32, 2, "C")),
        parallel=True, cache=CACHE, fastmath=FASTMATH, error_model="numpy")(_kernel)


def packed_shape(k: int, n: int) -> tuple[int, int, int]:
    """(panels, K, PANEL): W (K, N) in panels of :data:`PANEL` columns, zero past N."""
    return (-(-n // PANEL), k, PANEL)


def pack(w: np.ndarray) -> np.ndarray:
    """``packed[p, k, j] = w[k, p * PANEL + j]``, zero past N; read-only."""
    k, n = w.shape
    panels = packed_shape(k, n)[0]
    wide = np.zeros((k, panels * PANEL), np.float32)
    wide[:, :n] = w
    packed = np.ascontiguousarray(wide.reshape(k, panels, PANEL).transpose(1, 0, 2))
    packed.flags.writeable = False
    return packed


class PackedLinear(RunsThroughBind, Algorithm):
    """Weights packed once into column panels, register tiles of ROWS x PANEL (see the module
    docstring); float32."""

    operator = "linear"
    name = "packed"
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem: Problem) -> str | None:
        if problem.dtypes[0] != "float32":
            return (f"packed computes float32 only (got {problem.dtypes[0]}): its tile of "
                    f"16-lane blocks would not fit the vector registers in float64")
        if 0 in (*problem.shapes[0], problem.shapes[1][1]):
            return "packed needs a product with rows, columns and a depth (K) to tile"
        return None

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        """First where the weights are packed once and the tile is AVX-512's (the projections
        of ``benchmarks/bench_linear.py`` at 16 threads); after ``blas_split`` otherwise."""
        return (-1.0,) if problem.weight_preprocess and ROWS == 6 else (0.5,)

    def workspace_bytes(self, problem: Problem) -> int:
        """The packed weights, when they are packed in the call rather than once."""
        if problem.weight_preprocess:
            return 0
        return 4 * int(np.prod(packed_shape(*problem.shapes[1])))

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> np.ndarray:
        return pack(np.asarray(inputs[1], np.float32))

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        kernel = _compiled()
        code = CODES[problem.param("activation")]
        m, n = problem.shapes[0][0], problem.shapes[1][1]
        no_bias, no_residual = np.zeros(1, np.float32), np.zeros((1, 1), np.float32)

        def call(*inputs: Any) -> np.ndarray:
            x, w, bias, z = operands(problem, inputs)
            out = np.empty((m, n), np.float32)
            kernel(np.ascontiguousarray(x), pack(w) if prepared is None else prepared,
                   no_bias if bias is None else np.ascontiguousarray(bias), bias is not None,
                   no_residual if z is None else np.ascontiguousarray(z).reshape(m, n),
                   z is not None,
                   code, AHEAD, out)
            return out
        return call


def algorithms() -> list[Algorithm]:
    return [PackedLinear()]
