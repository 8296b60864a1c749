"""Winograd minimal filtering F(m x m, 3 x 3) for 3x3 convolutions with stride and dilation 1.

Each output tile of m x m pixels is computed from an (m+2) x (m+2) input tile ``d`` as
``A^T [(G g G^T) * (B^T d B)] A``: the products of the direct method become one elementwise
product per transform point, (m+2)^2 of them instead of 9 m^2 multiply-adds.  Summed over the
input channels, the elementwise products at transform point ``xi`` form one matrix product for
all tiles, U[xi] (K x C) @ V[xi] (C x tiles), so the heavy lifting is a single batched matmul
sub-problem (alpha^2, K, C) @ (alpha^2, C, tiles), alpha = m + 2, which the framework searches
first and dispatches to its best matmul algorithm.  The transforms around it are memory bound
and run as parallel numba kernels:

* filter transform ``U = G g G^T``: the weight preprocessing step (:meth:`preprocess`), or part
  of the timed call when preprocessing is off;
* input transform ``V = B^T d B`` for every tile and channel;
* output transform ``A^T M A``, with the epilogue (bias, activation) applied to each block of
  output channels while it is in cache, just before it is written into the output.

How the transforms vectorise.  numba vectorises a loop well when it touches a few contiguous
arrays, so every transform step is a pass ``dst (+)= c0*s0 + ... + c3*s3`` over long
contiguous rows (:func:`_comb`), one per nonzero-term group of a transform matrix row.  To
make the rows long, each worker handles a block of channels (all images) at once: the product's
rows for a block of channels are contiguous in U, V and M alike.  The input tiles, which overlap
and whose elements lie m apart, are first gathered element-major (element (i, j) of every tile
of the block in one row, one long loop per element); the output transform ends with the
reverse, merging the m tile columns back into output rows.  Each value is computed by one
worker in an order fixed by the loops, so results do not depend on the thread count.

Accuracy.  F(2,3)'s transforms use only 0, +-1 and 1/2; F(4,3)'s use the points 0, +-1, +-2 and
infinity, with coefficients up to 8 and fractions 1/6, 1/12, 1/24, which cost about one decimal
digit: still within the conv operator's float32 tolerance (measured in the tests).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange, types

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms.conv._gemm_common import (
    FASTMATH,
    buffer,
    item_type,
    matmul_problem,
    no_bias,
    operands,
    readonly,
    worker_count,
)
from fastrun_algorithms.conv.epilogue import NONE, activation_code, epilogue_value
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry

#: Transform matrices (B^T, G, A^T) of F(m x m, 3 x 3) by output tile size m.
TRANSFORMS: dict[int, tuple[tuple[tuple[float, ...], ...], ...]] = {
    2: (
        ((1, 0, -1, 0),
         (0, 1, 1, 0),
         (0, -1, 1, 0),
         (0, 1, 0, -1)),
        ((1, 0, 0),
         (1 / 2, 1 / 2, 1 / 2),
         (1 / 2, -1 / 2, 1 / 2),
         (0, 0, 1)),
        ((1, 1, 1, 0),
         (0, 1, -1, -1)),
    ),
    4: (  # Lavin & Gray's points 0, 1, -1, 2, -2 and infinity
        ((4, 0, -5, 0, 1, 0),
         (0, -4, -4, 1, 1, 0),
         (0, 4, -4, -1, 1, 0),
         (0, -2, -1, 2, 1, 0),
         (0, 2, -1, -2, 1, 0),
         (0, 4, 0, -5, 0, 1)),
        ((1 / 4, 0, 0),
         (-1 / 6, -1 / 6, -1 / 6),
         (-1 / 6, 1 / 6, -1 / 6),
         (1 / 24, 1 / 12, 1 / 6),
         (1 / 24, -1 / 12, 1 / 6),
         (0, 0, 1)),
        ((1, 1, 1, 1, 1, 0),
         (0, 1, -1, 2, -2, 0),
         (0, 1, 1, 4, 4, 0),
         (0, 1, -1, 8, -8, 1)),
    ),
}


@functools.cache
def transform_matrices(m: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T, G, A^T) of F(m, 3) as read-only arrays of ``dtype``."""
    matrices = tuple(np.array(t, dtype=dtype) for t in TRANSFORMS[m])
    for matrix in matrices:
        matrix.flags.writeable = False
    return matrices  # type: ignore[return-value]


# -- kernels ---------------------------------------------------------------------------------

def _filter_kernel(w: np.ndarray, g: np.ndarray, u: np.ndarray, scratch: np.ndarray) -> None:
    """``u[a*alpha + b, k, c] = (G w[k, c] G^T)[a, b]`` for every filter.

    Parallel over output channels.  Each worker first transposes the 3x3 taps of its output
    channel into ``scratch[w, :9]`` (tap-major, so every later step reads contiguously along
    the input channels), then applies G from the left into ``scratch[w, 9:12]`` and G^T from
    the right straight into U.
    """
    out_channels, channels = w.shape[0], w.shape[1]
    alpha = g.shape[0]
    workers = scratch.shape[0]
    for wk in prange(workers):
        taps = scratch[wk]
        for k in range(wk * out_channels // workers, (wk + 1) * out_channels // workers):
            for c in range(channels):
                for t in range(9):
                    taps[t, c] = w[k, c, t // 3, t % 3]
            for a in range(alpha):
                for j in range(3):
                    row = taps[9 + j]
                    g0, g1, g2 = g[a, 0], g[a, 1], g[a, 2]
                    for c in range(channels):
                        row[c] = (g0 * taps[j, c] + g1 * taps[3 + j, c]) + g2 * taps[6 + j, c]
                for b in range(alpha):
                    dst = u[a * alpha + b, k]
                    g0, g1, g2 = g[b, 0], g[b, 1], g[b, 2]
                    for c in range(channels):
                        dst[c] = (g0 * taps[9, c] + g1 * taps[10, c]) + g2 * taps[11, c]


@numba.njit(cache=True, fastmath=FASTMATH)
def _comb(dst: np.ndarray, accumulate: bool, terms: int, c0: float, s0: np.ndarray, c1: float,
          s1: np.ndarray, c2: float, s2: np.ndarray, c3: float, s3: np.ndarray) -> None:
    """``dst (+)= c0*s0 + ... `` over the first ``terms`` (1 to 4) terms, in one pass.

    The transforms are built from these passes over long contiguous slices: one loop with at
    most five arrays is what LLVM vectorises (more arrays need more runtime overlap checks
    than it will emit), and four terms per pass cut the loads and stores of the destination
    that one pass per term would cost.  Slices, not offset positions, keep the indices provably
    non-negative (numba would otherwise add a wraparound test that stops vectorisation).
    """
    n = dst.shape[0]
    zero = c0 * 0
    if terms == 1:
        for f in range(n):
            dst[f] = (dst[f] if accumulate else zero) + c0 * s0[f]
    elif terms == 2:
        for f in range(n):
            dst[f] = (dst[f] if accumulate else zero) + (c0 * s0[f] + c1 * s1[f])
    elif terms == 3:
        for f in range(n):
            dst[f] = (dst[f] if accumulate else zero) + ((c0 * s0[f] + c1 * s1[f]) + c2 * s2[f])
    else:
        for f in range(n):
            dst[f] = (dst[f] if accumulate else zero) + (((c0 * s0[f] + c1 * s1[f])
                                                          + c2 * s2[f]) + c3 * s3[f])


@numba.njit(cache=True)
def _fill_zero(dst: np.ndarray) -> None:
    for f in range(dst.shape[0]):
        dst[f] = 0


def _input_kernel(x: np.ndarray, coef: np.ndarray, index: np.ndarray, count: np.ndarray,
                  m: int, pt: int, pl: int, tiles_h: int, tiles_w: int, v: np.ndarray,
                  padded: np.ndarray, offsets: np.ndarray, gathered: np.ndarray,
                  sums: np.ndarray) -> None:
    """``v[a*alpha + b, c, n*tiles + tile] = (B^T d B)[a, b]`` for the input tile ``d`` of every
    tile (row-major) of every image n and channel c.

    ``coef``/``index``/``count`` hold B^T as passes of up to four nonzero terms (see
    :func:`_passes`).  Parallel over blocks of channels, all images of each: V's rows for a
    block are contiguous, so every pass runs over the whole block at once, long enough to
    amortise the loop set-up even for small images.  For a block, a worker

    1. copies each (channel, image) plane into its zero-padded slot of ``padded[w]`` (the
       padding is zeroed once: every block writes the same interior positions);
    2. gathers element (i, j) of every tile of the block into row i*alpha + j of
       ``gathered[w]``: one loop per element over all tiles, reading at ``offsets[w]`` (each
       tile's first pixel, computed once) plus the element's offset.  Tiles overlap and their
       elements lie m apart, so this is a gather, done as one long loop rather than many
       short, strided ones;
    3. applies B^T along the tile rows: ``sums[w, a*alpha + j] = sum_i B^T[a, i] d[i, j]``, and
       B along the tile columns straight into V.
    """
    n_images, channels, height, width = x.shape
    alpha = coef.shape[0]
    tiles = tiles_h * tiles_w
    per_channel = n_images * tiles
    padded_w = (tiles_w - 1) * m + alpha
    plane = ((tiles_h - 1) * m + alpha) * padded_w
    block = gathered.shape[2] // per_channel  # channels per work item
    blocks = (channels + block - 1) // block
    workers = gathered.shape[0]
    v2 = v.reshape(alpha * alpha, channels * per_channel)
    rows_inside = min(height, plane // padded_w - pt)  # input rows that land in a slot
    cols_inside = min(width, padded_w - pl)
    for wk in prange(workers):
        pad, offs, elements, acc = padded[wk], offsets[wk], gathered[wk], sums[wk]
        _fill_zero(pad)
        f = 0
        for p in range(block * n_images):
            for th in range(tiles_h):
                for tw in range(tiles_w):
                    offs[f] = p * plane + th * m * padded_w + tw * m
                    f += 1
        for item in range(wk * blocks // workers, (wk + 1) * blocks // workers):
            c0 = item * block
            nc = min(block, channels - c0)
            lo, span = c0 * per_channel, nc * per_channel
            for p in range(nc * n_images):
                c, n = c0 + p // n_images, p % n_images
                for h in range(rows_inside):
                    start = p * plane + (h + pt) * padded_w + pl
                    _copy(pad[start:start + cols_inside], x[n, c, h, :])
            for i in range(alpha):
                for j in range(alpha):
                    _gather(elements[i * alpha + j, :span], pad[i * padded_w + j:], offs)
            for a in range(alpha):  # B^T from the left: rows i -> a
                for j in range(alpha):
                    _apply(acc[a * alpha + j, :span], coef, index, count, a, elements, j,
                           alpha, 0)
            for a in range(alpha):  # B from the right: columns j -> b, into V
                for b in range(alpha):
                    _apply(v2[a * alpha + b, lo:lo + span], coef, index, count, b, acc,
                           a * alpha, 1, 0)


@numba.njit(cache=True)
def _gather(dst: np.ndarray, src: np.ndarray, offsets: np.ndarray) -> None:
    """``dst[f] = src[offsets[f]]``; unsigned offsets spare numba's negative-index test."""
    for f in range(dst.shape[0]):
        dst[f] = src[offsets[f]]


@numba.njit(cache=True)
def _apply(dst: np.ndarray, coef: np.ndarray, index: np.ndarray, count: np.ndarray, r: int,
           src: np.ndarray, first: int, step: int, lo: int) -> None:
    """``dst = sum_t M[r, t] * src[first + t*step, lo:lo + len(dst)]``: row r of a transform
    matrix M, given as passes (:func:`_passes`), applied to rows of ``src``; only the nonzero
    terms, up to four per :func:`_comb`."""
    hi = lo + dst.shape[0]
    for ch in range(count.shape[1]):
        terms = count[r, ch]
        if terms == 0:
            break
        _comb(dst, ch > 0, terms,
              coef[r, ch, 0], src[first + index[r, ch, 0] * step, lo:hi],
              coef[r, ch, 1], src[first + index[r, ch, 1] * step, lo:hi],
              coef[r, ch, 2], src[first + index[r, ch, 2] * step, lo:hi],
              coef[r, ch, 3], src[first + index[r, ch, 3] * step, lo:hi])


@numba.njit(cache=True)
def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src[:len(dst)]`` as a plain loop (numba's slice assignment is slower)."""
    for f in range(dst.shape[0]):
        dst[f] = src[f]


def _output_kernel(mm: np.ndarray, coef: np.ndarray, index: np.ndarray, count: np.ndarray,
                   bias: np.ndarray, has_bias: bool, code: int, low: float, high: float,
                   tiles_h: int, tiles_w: int, out: np.ndarray, sums: np.ndarray) -> None:
    """``out[n, k, th*m + p, tw*m + q] = epilogue((A^T M A)[p, q])`` for every tile, with
    ``M[a, b] = mm[a*alpha + b, k, n*tiles + tile]``; tile pixels beyond the output are
    dropped.

    ``coef``/``index``/``count`` hold A^T as passes (see :func:`_passes`).  Parallel over
    blocks of output channels: the product's rows for a block are contiguous (all images),
    so each pass runs over the whole block.  A worker applies A^T along the tile rows into
    ``sums[w, p*alpha + b]`` and A along the tile columns into ``sums[w, m*alpha + p*m + q]``,
    applies the epilogue to each channel's values there, while they are in cache, and merges
    the m tile columns into the output rows (:func:`_merge`).
    """
    n_images, out_channels, out_h = out.shape[0], out.shape[1], out.shape[2]
    m = coef.shape[0]
    alpha = m + 2
    tiles = tiles_h * tiles_w
    per_channel = n_images * tiles
    block = sums.shape[2] // per_channel
    blocks = (out_channels + block - 1) // block
    workers = sums.shape[0]
    second = m * alpha  # first row of the second step's results
    mm2 = mm.reshape(alpha * alpha, out_channels * per_channel)
    for wk in prange(workers):
        acc = sums[wk]
        for item in range(wk * blocks // workers, (wk + 1) * blocks // workers):
            k0 = item * block
            nk = min(block, out_channels - k0)
            lo, length = k0 * per_channel, nk * per_channel
            for p in range(m):  # A^T from the left: rows a -> p
                for b in range(alpha):
                    _apply(acc[p * alpha + b, :length], coef, index, count, p, mm2, b, alpha,
                           lo)
            for p in range(m):  # A from the right: columns b -> q
                for q in range(m):
                    _apply(acc[second + p * m + q, :length], coef, index, count, q, acc,
                           p * alpha, 1, 0)
            for kk in range(nk):
                k = k0 + kk
                seg = kk * per_channel
                if has_bias or code != NONE:
                    bias_k = bias[k] if has_bias else bias[0] * 0
                    for r in range(m * m):
                        _epilogue(acc[second + r, seg:seg + per_channel], bias_k, code, low,
                                  high)
                for n in range(n_images):
                    for th in range(tiles_h):
                        first = seg + n * tiles + th * tiles_w
                        for p in range(min(m, out_h - th * m)):
                            _merge(out[n, k, th * m + p], acc, second + p * m, first,
                                   tiles_w, m)


@numba.njit(cache=True, fastmath=FASTMATH)
def _epilogue(row: np.ndarray, bias: float, code: int, low: float, high: float) -> None:
    """Bias and activation over a contiguous run of one output channel's values."""
    for f in range(row.shape[0]):
        row[f] = epilogue_value(row[f], bias, code, low, high)


@numba.njit(cache=True)
def _merge(dst: np.ndarray, acc: np.ndarray, row: int, first: int, count: int, m: int) -> None:
    """One output row from the m tile columns q: ``dst[tw*m + q] = acc[row + q, first + tw]``,
    the last tile cut at the row's end.  The tile sizes the algorithms use are written out so
    that the stride is a compile-time constant."""
    full = min(count, dst.shape[0] // m)  # tiles that lie wholly inside the row
    if m == 4:
        s0, s1 = acc[row, first:first + count], acc[row + 1, first:first + count]
        s2, s3 = acc[row + 2, first:first + count], acc[row + 3, first:first + count]
        for tw in range(full):
            dst[4 * tw] = s0[tw]
            dst[4 * tw + 1] = s1[tw]
            dst[4 * tw + 2] = s2[tw]
            dst[4 * tw + 3] = s3[tw]
    elif m == 2:
        s0, s1 = acc[row, first:first + count], acc[row + 1, first:first + count]
        for tw in range(full):
            dst[2 * tw] = s0[tw]
            dst[2 * tw + 1] = s1[tw]
    else:
        full = 0
    for ox in range(full * m, dst.shape[0]):
        tw = ox // m
        dst[ox] = acc[row + ox - tw * m, first + tw]


def _passes(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A transform matrix as passes of :func:`_comb`: for each row, its nonzero entries in
    column order, four per pass.  Returns (coef, index, count) of shapes (rows, passes, 4),
    (rows, passes, 4) and (rows, passes); unused slots have coefficient 0 and index 0, and a
    pass with count 0 ends the row."""
    nonzero = [[(float(v), j) for j, v in enumerate(row) if v != 0] for row in matrix]
    passes = max(-(-len(terms) // 4) for terms in nonzero)
    coef = np.zeros((len(matrix), passes, 4), dtype=matrix.dtype)
    index = np.zeros((len(matrix), passes, 4), dtype=np.intp)
    count = np.zeros((len(matrix), passes), dtype=np.intp)
    for r, terms in enumerate(nonzero):
        for t, (value, column) in enumerate(terms):
            coef[r, t // 4, t % 4] = value
            index[r, t // 4, t % 4] = column
            count[r, t // 4] += 1
    for table in (coef, index, count):
        table.flags.writeable = False
    return coef, index, count


@functools.cache
def _transform_passes(m: int, dtype: np.dtype) -> tuple[tuple[np.ndarray, ...], ...]:
    """(B^T passes, A^T passes) of F(m, 3) for one dtype."""
    bt, _, at = transform_matrices(m, dtype)
    return _passes(bt), _passes(at)


@functools.cache
def _compiled(dtype: np.dtype) -> tuple[Callable[..., None], ...]:
    """(filter, input, output) kernels for one dtype, compiled (or loaded from numba's cache)
    on first use, so that loading the plugin compiles nothing."""
    intp = types.intp
    matrix = readonly(dtype, 2)
    coef = types.Array(item_type(dtype), 3, "C", readonly=True)
    index = types.Array(intp, 3, "C", readonly=True)
    count = types.Array(intp, 2, "C", readonly=True)
    filter_kernel = numba.njit(
        types.void(readonly(dtype, 4), matrix, buffer(dtype, 3), buffer(dtype, 3)),
        parallel=True, cache=True, fastmath=FASTMATH)(_filter_kernel)
    input_kernel = numba.njit(
        types.void(readonly(dtype, 4), coef, index, count, intp, intp, intp, intp, intp,
                   buffer(dtype, 3), buffer(dtype, 2), types.Array(types.uint32, 2, "C"),
                   buffer(dtype, 3), buffer(dtype, 3)),
        parallel=True, cache=True, fastmath=FASTMATH)(_input_kernel)
    output_kernel = numba.njit(
        types.void(types.Array(item_type(dtype), 3, "C", readonly=True), coef, index, count,
                   readonly(dtype, 1), types.boolean, intp, types.float64, types.float64,
                   intp, intp, buffer(dtype, 4), buffer(dtype, 3)),
        parallel=True, cache=True, fastmath=FASTMATH)(_output_kernel)
    return filter_kernel, input_kernel, output_kernel


# -- sizes -----------------------------------------------------------------------------------

#: Elements each pass of the transforms should run over: blocks of channels are sized to reach
#: it, so that small images still give loops long enough to amortise their set-up, while the
#: block's buffers stay within the L2 cache.
PASS_LENGTH = 1024


def _block(per_channel: int, channels: int) -> int:
    """Channels per work item: enough for :data:`PASS_LENGTH`, but no fewer work items than
    threads."""
    wanted = -(-PASS_LENGTH // per_channel)
    return max(1, min(wanted, -(-channels // numba.get_num_threads())))


class _Plan:
    """Tile counts and the shape of every buffer for one problem and tile size m."""

    def __init__(self, geo: ConvGeometry, m: int):
        self.m = m
        self.alpha = alpha = m + 2
        self.tiles_h = -(-geo.oh // m)
        self.tiles_w = -(-geo.ow // m)
        self.tiles = geo.n * self.tiles_h * self.tiles_w  # over all images
        points = alpha * alpha
        self.u_shape = (points, geo.k, geo.c)
        self.v_shape = (points, geo.c, self.tiles)
        self.m_shape = (points, geo.k, self.tiles)
        self.filter_workers = worker_count(geo.k)
        self.filter_scratch = (self.filter_workers, 12, geo.c)
        block = _block(self.tiles, geo.c)
        workers = worker_count(-(-geo.c // block))
        plane = ((self.tiles_h - 1) * m + alpha) * ((self.tiles_w - 1) * m + alpha)
        self.input_padded = (workers, block * geo.n * plane)
        # uint32 positions in input_padded: a block would need 4 G elements to overflow them
        self.input_offsets = (workers, block * self.tiles)
        self.input_tiles = (workers, points, block * self.tiles)
        self.input_sums = (workers, points, block * self.tiles)
        block = _block(self.tiles, geo.k)
        workers = worker_count(-(-geo.k // block))
        self.output_sums = (workers, m * alpha + m * m, block * self.tiles)


def _plan(problem: Problem, m: int) -> _Plan:
    return _Plan(geometry(problem), m)


class _Winograd(Algorithm):
    """Winograd F(m x m, 3 x 3) with the elementwise products as one batched matmul
    sub-problem.  Subclasses set the tile size ``m``.

    Usable for 3x3 kernels with stride 1, dilation 1 and one group, any padding, any number of
    images (tiles of all images go into one product).  REPRODUCIBLE as far as its matmul
    sub-problem is: every transformed value is computed by one worker in an order fixed by the
    loops, whatever the thread count.
    """

    operator = "conv"
    attributes = AlgoAttribute.REPRODUCIBLE
    m = 0

    def unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        problems = []
        if (geo.r, geo.s) != (3, 3):
            problems.append(f"a 3x3 kernel (got {geo.r}x{geo.s})")
        if (geo.stride_h, geo.stride_w) != (1, 1):
            problems.append(f"stride 1 (got {geo.stride_h}x{geo.stride_w})")
        if (geo.dil_h, geo.dil_w) != (1, 1):
            problems.append(f"dilation 1 (got {geo.dil_h}x{geo.dil_w})")
        if geo.group != 1:
            problems.append(f"group 1 (got {geo.group})")
        if problems:
            return f"{self.name} needs " + ", ".join(problems)
        return None

    def _product(self, problem: Problem) -> Problem:
        plan = _plan(problem, self.m)
        return matmul_problem(plan.u_shape, plan.v_shape, problem.dtypes[0])

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        return [self._product(problem)]

    def workspace_bytes(self, problem: Problem) -> int:
        """The peak of what :meth:`run` holds besides the output, phase by phase: the
        transformed filters U (only when not preprocessed) with the filter transform's scratch,
        then U, the transformed input V and the input transform's scratch, then U, V and the
        product M, then M and the output transform's scratch (U and V are dropped once M
        exists)."""
        plan = _plan(problem, self.m)
        size = math.prod
        u = 0 if problem.weight_preprocess else size(plan.u_shape)
        filter_scratch = size(plan.filter_scratch) if u else 0
        v, product = size(plan.v_shape), size(plan.m_shape)
        itemsize = np.dtype(problem.dtypes[0]).itemsize
        input_scratch = (size(plan.input_padded) + size(plan.input_tiles)
                         + size(plan.input_sums)) * itemsize + size(plan.input_offsets) * 4
        phases = (
            (u + filter_scratch) * itemsize,
            (u + v) * itemsize + input_scratch,
            (u + v + product) * itemsize,
            (product + size(plan.output_sums)) * itemsize,
        )
        return max(phases)

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> np.ndarray:
        """The transformed filters U (alpha^2, K, C) for the given weights."""
        geo = geometry(problem)
        _, w, _ = operands(geo, inputs)
        return self._filter_transform(problem, w)

    def _filter_transform(self, problem: Problem, w: np.ndarray) -> np.ndarray:
        plan = _plan(problem, self.m)
        _, g, _ = transform_matrices(self.m, w.dtype)
        u = np.empty(plan.u_shape, dtype=w.dtype)
        scratch = np.empty(plan.filter_scratch, dtype=w.dtype)
        _compiled(w.dtype)[0](w, g, u, scratch)
        return u

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        plan = _plan(problem, self.m)
        x, w, bias = operands(geo, inputs)
        dtype = x.dtype
        bt_passes, at_passes = _transform_passes(self.m, dtype)
        _, input_kernel, output_kernel = _compiled(dtype)
        out = np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=dtype)

        u = self._filter_transform(problem, w) if prepared is None else prepared
        v = np.empty(plan.v_shape, dtype=dtype)
        input_kernel(x, *bt_passes, self.m, geo.pad_top, geo.pad_left, plan.tiles_h,
                     plan.tiles_w, v, np.empty(plan.input_padded, dtype=dtype),
                     np.empty(plan.input_offsets, dtype=np.uint32),
                     np.empty(plan.input_tiles, dtype=dtype),
                     np.empty(plan.input_sums, dtype=dtype))
        product = ctx.call(self._product(problem), u, v)
        del u, v  # only the product is needed from here on
        output_kernel(np.ascontiguousarray(product), *at_passes,
                      no_bias(dtype) if bias is None else bias, bias is not None,
                      activation_code(geo), float(geo.clip_min), float(geo.clip_max),
                      plan.tiles_h, plan.tiles_w, out, np.empty(plan.output_sums, dtype=dtype))
        return geo.output_view(out)


class WinogradF2x3(_Winograd):
    """F(2x2, 3x3): 4x4 input tiles, 16 products per 4 outputs (2.25x fewer than direct)."""

    name = "winograd_f2x3"
    m = 2


class WinogradF4x3(_Winograd):
    """F(4x4, 3x3): 6x6 input tiles, 36 products per 16 outputs (4x fewer than direct), with
    larger transforms and rounding error."""

    name = "winograd_f4x3"
    m = 4


def algorithms() -> list[Algorithm]:
    return [WinogradF2x3(), WinogradF4x3()]
