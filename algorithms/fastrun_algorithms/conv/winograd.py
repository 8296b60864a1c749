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
* output transform ``A^T M A``, with the epilogue (bias, activation) applied to each chunk of
  tiles while it is in cache, just before it is merged into the output rows.

How the transforms vectorise.  The product wants V and M element-major (value (a, b) of every
tile in one contiguous row), while a tile's input values lie in rows of the image, its tile
rows m apart and overlapping.  The transforms work on chunks of :data:`CHUNK` consecutive
tiles (crossing tile rows, channels and images alike, so that loops stay long even for 7x7
images) in a small per-thread buffer, kept from one call to the next:

* input: each tile row of each tile (alpha contiguous values) is copied into the chunk, still
  tile by tile (a vectorised copy; gathering element-major instead costs one scalar store per
  value and was the slowest step); B^T along the tile columns is then one contiguous
  elementwise loop, and B along the tile rows reads each tile's alpha values as an
  interleaved group (vector loads and permutes) and writes V element-major;
* output: A^T along the tile columns reads M's rows (contiguous), A along the tile rows and
  the epilogue run in place on the chunk, and each output row is written by interleaving the
  m tile columns (vector stores).

The 1-D transforms are written out with their shared terms (:func:`_bt4`, :func:`_at4`),
their constants of the data's type.  Every value is computed by one worker with the same
operations, whatever chunk it falls in, so results do not depend on the thread count.

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
from fastrun_algorithms._common import (
    CACHE,
    FASTMATH,
    PARTS_PER_THREAD,
    ScratchPool,
    U,
    thread_count,
)
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._gemm_common import (
    buffer,
    item_type,
    matmul_problem,
    no_bias,
    operands,
    readonly,
    worker_count,
)
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    activate,
    epilogue_args,
    epilogue_value,
    residual_operand,
)
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


def unusable_reason(name: str, geo: ConvGeometry) -> str | None:
    """Why Winograd F(m x m, 3 x 3) (the CPU's or OpenCL's, called ``name``) cannot compute
    ``geo``: it needs a 3x3 kernel, stride 1, dilation 1 and one group."""
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
        return f"{name} needs " + ", ".join(problems)
    return None


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


# The one-dimensional transforms, written out with their shared terms: the input transforms
# B^T of TRANSFORMS (applied once along the tile's columns and once along its rows) and the
# output transforms A^T.  The constants come in as arguments of the data's own type (numba
# would compute ``4 * x`` in float64 for a float32 x); the test suite checks every function
# against its matrix in TRANSFORMS.

@numba.njit(inline="always", fastmath=FASTMATH)
def _bt4(d0, d1, d2, d3, d4, d5, two, four, five):
    """B^T d of F(4, 3): six values from six."""
    t1 = d4 - four * d2
    t2 = d3 - four * d1
    t3 = d4 - d2
    t4 = two * (d3 - d1)
    return ((four * d0 + d4) - five * d2, t1 + t2, t1 - t2, t3 + t4, t3 - t4,
            (four * d1 + d5) - five * d3)


@numba.njit(inline="always", fastmath=FASTMATH)
def _bt2(d0, d1, d2, d3):
    """B^T d of F(2, 3): four values from four."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@numba.njit(inline="always", fastmath=FASTMATH)
def _at4(m0, m1, m2, m3, m4, m5, two, four, eight):
    """A^T m of F(4, 3): four values from six."""
    s12 = m1 + m2
    d12 = m1 - m2
    s34 = m3 + m4
    d34 = m3 - m4
    return (m0 + s12) + s34, d12 + two * d34, s12 + four * s34, (d12 + eight * d34) + m5


@numba.njit(inline="always", fastmath=FASTMATH)
def _at2(m0, m1, m2, m3):
    """A^T m of F(2, 3): two values from four."""
    return (m0 + m1) + m2, (m1 - m2) - m3


# Input transform.  A chunk holds up to CHUNK tiles "row-major per tile row i": value (i, j)
# of chunk tile u at ``chunk[(i*alpha)*CHUNK + u*alpha + j]``, i.e. alpha regions (one per
# tile row i) in which each tile's alpha values of that row lie next to each other.

@numba.njit(inline="always")
def _gather6(chunk, s, pad, offsets, t0, count, pw):
    """Tiles t0 .. t0+count-1 of the staged plane into chunk tiles s, s+1, ...: each tile row
    is six contiguous values of the plane, copied to six contiguous values of its region.  All
    six loads come before the six stores, so that LLVM may merge them into vector moves (it
    cannot move a load past a store to another array it is not told is distinct): measured 3.6
    times faster than a copy value by value."""
    for tt in range(count):
        o = offsets[U(t0 + tt)]
        u = (s + tt) * 6
        for i in range(6):
            a = U(o + i * pw)
            b = U(i * 6 * CHUNK + u)
            d0, d1, d2 = pad[a], pad[a + U(1)], pad[a + U(2)]
            d3, d4, d5 = pad[a + U(3)], pad[a + U(4)], pad[a + U(5)]
            chunk[b] = d0
            chunk[b + U(1)] = d1
            chunk[b + U(2)] = d2
            chunk[b + U(3)] = d3
            chunk[b + U(4)] = d4
            chunk[b + U(5)] = d5


@numba.njit(inline="always")
def _gather4(chunk, s, pad, offsets, t0, count, pw):
    """:func:`_gather6` for four-value tile rows."""
    for tt in range(count):
        o = offsets[U(t0 + tt)]
        u = (s + tt) * 4
        for i in range(4):
            a = U(o + i * pw)
            b = U(i * 4 * CHUNK + u)
            d0, d1, d2, d3 = pad[a], pad[a + U(1)], pad[a + U(2)], pad[a + U(3)]
            chunk[b] = d0
            chunk[b + U(1)] = d1
            chunk[b + U(2)] = d2
            chunk[b + U(3)] = d3


@numba.njit(inline="always", fastmath=FASTMATH)
def _columns6(chunk, count):
    """B^T from the left, in place: region i -> region a.  Value (i, j) of every tile sits at
    the same position x of region i, so this is one contiguous, elementwise loop over the
    ``6*count`` positions of the six regions."""
    two, four, five = chunk.dtype.type(2), chunk.dtype.type(4), chunk.dtype.type(5)
    r = 6 * CHUNK
    for x in range(6 * count):
        e0, e1, e2, e3, e4, e5 = _bt4(chunk[U(x)], chunk[U(r + x)], chunk[U(2 * r + x)],
                                      chunk[U(3 * r + x)], chunk[U(4 * r + x)],
                                      chunk[U(5 * r + x)], two, four, five)
        chunk[U(x)] = e0
        chunk[U(r + x)] = e1
        chunk[U(2 * r + x)] = e2
        chunk[U(3 * r + x)] = e3
        chunk[U(4 * r + x)] = e4
        chunk[U(5 * r + x)] = e5


@numba.njit(inline="always", fastmath=FASTMATH)
def _columns4(chunk, count):
    """:func:`_columns6` for F(2, 3)."""
    r = 4 * CHUNK
    for x in range(4 * count):
        e0, e1, e2, e3 = _bt2(chunk[U(x)], chunk[U(r + x)], chunk[U(2 * r + x)],
                              chunk[U(3 * r + x)])
        chunk[U(x)] = e0
        chunk[U(r + x)] = e1
        chunk[U(2 * r + x)] = e2
        chunk[U(3 * r + x)] = e3


@numba.njit(inline="always", fastmath=FASTMATH)
def _rows6(chunk, count, v, pitch, f0):
    """B from the right, into V: for each region a, the six values of each tile (a stride-6
    group that LLVM loads as whole vectors and permutes) give V rows a*6 .. a*6+5 at
    positions f0 .. f0+count-1 (V rows are ``pitch`` apart in the flat ``v``)."""
    two, four, five = chunk.dtype.type(2), chunk.dtype.type(4), chunk.dtype.type(5)
    for a in range(6):
        src = a * 6 * CHUNK
        dst = a * 6 * pitch + f0
        for u in range(count):
            q = src + 6 * u
            e0, e1, e2, e3, e4, e5 = _bt4(chunk[U(q)], chunk[U(q + 1)], chunk[U(q + 2)],
                                          chunk[U(q + 3)], chunk[U(q + 4)], chunk[U(q + 5)],
                                          two, four, five)
            v[U(dst + u)] = e0
            v[U(dst + pitch + u)] = e1
            v[U(dst + 2 * pitch + u)] = e2
            v[U(dst + 3 * pitch + u)] = e3
            v[U(dst + 4 * pitch + u)] = e4
            v[U(dst + 5 * pitch + u)] = e5


@numba.njit(inline="always", fastmath=FASTMATH)
def _rows4(chunk, count, v, pitch, f0):
    """:func:`_rows6` for F(2, 3)."""
    for a in range(4):
        src = a * 4 * CHUNK
        dst = a * 4 * pitch + f0
        for u in range(count):
            q = src + 4 * u
            e0, e1, e2, e3 = _bt2(chunk[U(q)], chunk[U(q + 1)], chunk[U(q + 2)], chunk[U(q + 3)])
            v[U(dst + u)] = e0
            v[U(dst + pitch + u)] = e1
            v[U(dst + 2 * pitch + u)] = e2
            v[U(dst + 3 * pitch + u)] = e3


@numba.njit(inline="always")
def _parts(planes, tiles, threads):
    """Parts of a transform: :data:`PARTS_PER_THREAD` per thread, but no more than there are
    full chunks of tiles (a part's chunks do not cross into the next part, and a part of two
    7x7 planes would transform 32 tiles at a time instead of :data:`CHUNK`)."""
    return max(1, min(planes, PARTS_PER_THREAD * threads, planes * tiles // CHUNK))


def _input_kernel(x: np.ndarray, m: int, pt: int, pl: int, tiles_h: int, tiles_w: int,
                  v: np.ndarray, padded: np.ndarray, chunks: np.ndarray,
                  offsets: np.ndarray) -> None:
    """``v[a*alpha + b, c, n*tiles + tile] = (B^T d B)[a, b]`` for the input tile ``d`` of every
    tile (row-major) of every image n and channel c.

    Parallel over planes (channel, image) in V's order, dealt in contiguous ranges (parts, see
    :data:`PARTS_PER_THREAD`) to whichever thread is free, so that each part writes one
    contiguous stretch of every V row.  For each plane, thread ``t``

    1. copies it into its zero-padded plane ``padded[t]`` (the padding was zeroed when the
       buffer was made: every plane writes the same interior positions);
    2. gathers its tiles into the chunk ``chunks[t]`` (:func:`_gather6`), tile rows as
       contiguous runs, starting each tile at ``offsets[tile]`` (computed once per call);

    and whenever the chunk is full (and after the part's last plane) it applies B^T along the tile
    columns (:func:`_columns6`, contiguous) and B along the tile rows, writing V
    (:func:`_rows6`).  A chunk of CHUNK tiles stays in the L1 cache with the plane, and its
    loops are long even for 7x7 images, whose planes hold only 16 tiles.  Each value is
    computed by the same operations whatever the chunk it falls in, so results do not depend
    on the thread count.
    """
    n_images, channels, height, width = x.shape
    alpha = m + 2
    tiles = tiles_h * tiles_w
    pw = (tiles_w - 1) * m + alpha
    ph = (tiles_h - 1) * m + alpha
    pitch = channels * n_images * tiles
    flat_v = v.reshape(v.size)
    for t in range(tiles):
        th = t // tiles_w
        offsets[t] = th * m * pw + (t - th * tiles_w) * m
    planes = channels * n_images
    parts = _parts(planes, tiles, padded.shape[0])
    rows_inside = min(height, ph - pt)  # input rows that land in the padded plane
    cols_inside = min(width, pw - pl)
    for part in prange(parts):
        thread = numba.get_thread_id()
        pad, chunk = padded[thread], chunks[thread]
        first, last = part * planes // parts, (part + 1) * planes // parts
        s = 0  # tiles in the chunk
        f0 = first * tiles  # V position of the chunk's first tile
        for p in range(first, last):
            c = p // n_images
            n = p - c * n_images
            for h in range(rows_inside):
                row = (h + pt) * pw + pl
                for w in range(cols_inside):
                    pad[U(row + w)] = x[n, c, h, U(w)]
            t = 0
            while t < tiles:
                take = min(tiles - t, CHUNK - s)
                if m == 4:
                    _gather6(chunk, s, pad, offsets, t, take, pw)
                else:
                    _gather4(chunk, s, pad, offsets, t, take, pw)
                s += take
                t += take
                if s == CHUNK or (t == tiles and p == last - 1):
                    if m == 4:
                        _columns6(chunk, s)
                        _rows6(chunk, s, flat_v, pitch, f0)
                    else:
                        _columns4(chunk, s)
                        _rows4(chunk, s, flat_v, pitch, f0)
                    f0 += s
                    s = 0


# Output transform.  A chunk holds m*alpha rows of CHUNK values, row p*alpha + b for the
# product's column b after A^T from the left (p < m); the last m values of each p's group are
# overwritten by the m outputs q of A from the right.

@numba.njit(inline="always", fastmath=FASTMATH)
def _left6(chunk, mm, pitch, f0, count):
    """A^T from the left: product rows a*6 + b (a = 0..5, ``pitch`` apart in the flat ``mm``)
    -> chunk rows p*6 + b, for positions f0 .. f0+count-1.  One column b at a time, so that
    only six product rows are read at once: their pitch is often a power of two (K times 16
    tiles), and 36 rows read together would evict each other from the L1 cache."""
    two, four, eight = chunk.dtype.type(2), chunk.dtype.type(4), chunk.dtype.type(8)
    for b in range(6):
        src = b * pitch + f0
        for u in range(count):
            q = src + u
            e0, e1, e2, e3 = _at4(mm[U(q)], mm[U(q + 6 * pitch)], mm[U(q + 12 * pitch)],
                                  mm[U(q + 18 * pitch)], mm[U(q + 24 * pitch)],
                                  mm[U(q + 30 * pitch)], two, four, eight)
            chunk[U(b * CHUNK + u)] = e0
            chunk[U((6 + b) * CHUNK + u)] = e1
            chunk[U((12 + b) * CHUNK + u)] = e2
            chunk[U((18 + b) * CHUNK + u)] = e3


@numba.njit(inline="always", fastmath=FASTMATH)
def _left4(chunk, mm, pitch, f0, count):
    """:func:`_left6` for F(2, 3)."""
    for b in range(4):
        src = b * pitch + f0
        for u in range(count):
            q = src + u
            e0, e1 = _at2(mm[U(q)], mm[U(q + 4 * pitch)], mm[U(q + 8 * pitch)],
                          mm[U(q + 12 * pitch)])
            chunk[U(b * CHUNK + u)] = e0
            chunk[U((4 + b) * CHUNK + u)] = e1


@numba.njit(inline="always", fastmath=FASTMATH)
def _right6(chunk, bias, count, code, low, high):
    """A from the right and the epilogue, in place: chunk rows p*6 + b -> p*6 + q, with
    ``bias[u]`` the bias of tile u's output channel."""
    two, four, eight = chunk.dtype.type(2), chunk.dtype.type(4), chunk.dtype.type(8)
    for u in range(count):
        bias_u = bias[U(u)]
        for p in range(4):
            r = p * 6 * CHUNK + u
            e0, e1, e2, e3 = _at4(chunk[U(r)], chunk[U(r + CHUNK)], chunk[U(r + 2 * CHUNK)],
                                  chunk[U(r + 3 * CHUNK)], chunk[U(r + 4 * CHUNK)],
                                  chunk[U(r + 5 * CHUNK)], two, four, eight)
            chunk[U(r)] = epilogue_value(e0, bias_u, code, low, high)
            chunk[U(r + CHUNK)] = epilogue_value(e1, bias_u, code, low, high)
            chunk[U(r + 2 * CHUNK)] = epilogue_value(e2, bias_u, code, low, high)
            chunk[U(r + 3 * CHUNK)] = epilogue_value(e3, bias_u, code, low, high)


@numba.njit(inline="always", fastmath=FASTMATH)
def _right4(chunk, bias, count, code, low, high):
    """:func:`_right6` for F(2, 3)."""
    for u in range(count):
        bias_u = bias[U(u)]
        for p in range(2):
            r = p * 4 * CHUNK + u
            e0, e1 = _at2(chunk[U(r)], chunk[U(r + CHUNK)], chunk[U(r + 2 * CHUNK)],
                          chunk[U(r + 3 * CHUNK)])
            chunk[U(r)] = epilogue_value(e0, bias_u, code, low, high)
            chunk[U(r + CHUNK)] = epilogue_value(e1, bias_u, code, low, high)


@numba.njit(inline="always")
def _residual_tiles(out, o, full, m, chunk, r, z, code, low, high):
    """The ``full`` whole tiles of an output row with a residual: ``out[o + m*tw + q] =
    act(chunk[r + q*CHUNK + tw] + z[o + m*tw + q])``."""
    for tw in range(full):
        for q in range(m):
            i = U(o + m * tw + q)
            out[i] = activate(chunk[U(r + q * CHUNK + tw)] + z[i], code, low, high)


@numba.njit(inline="always")
def _merge4(out, o, width, count, chunk, r, z, has_residual, code, low, high):
    """One output row of ``count`` tiles from chunk rows r .. r+3 (one per tile column q):
    ``out[o + 4*tw + q] = chunk[r + q*CHUNK + tw]``, cut at the row's ``width`` values.  The
    four stores of a tile are one interleaved group, which LLVM writes as whole vectors.  With
    a residual, ``act(chunk + z)`` is stored instead (``z`` flat like ``out``; the chunk then
    holds values before the activation)."""
    full = min(count, width // 4)  # tiles that lie wholly inside the row
    if has_residual:
        _residual_tiles(out, o, full, 4, chunk, r, z, code, low, high)
    else:
        for tw in range(full):
            out[U(o + 4 * tw)] = chunk[U(r + tw)]
            out[U(o + 4 * tw + 1)] = chunk[U(r + CHUNK + tw)]
            out[U(o + 4 * tw + 2)] = chunk[U(r + 2 * CHUNK + tw)]
            out[U(o + 4 * tw + 3)] = chunk[U(r + 3 * CHUNK + tw)]
    for x in range(4 * full, min(width, 4 * count)):
        value = chunk[U(r + (x % 4) * CHUNK + x // 4)]
        out[U(o + x)] = activate(value + z[U(o + x)], code, low, high) if has_residual else value


@numba.njit(inline="always")
def _merge2(out, o, width, count, chunk, r, z, has_residual, code, low, high):
    """:func:`_merge4` for F(2, 3)."""
    full = min(count, width // 2)
    if has_residual:
        _residual_tiles(out, o, full, 2, chunk, r, z, code, low, high)
    else:
        for tw in range(full):
            out[U(o + 2 * tw)] = chunk[U(r + tw)]
            out[U(o + 2 * tw + 1)] = chunk[U(r + CHUNK + tw)]
    if full < count and 2 * full < width:
        value = chunk[U(r + full)]
        i = U(o + 2 * full)
        out[i] = activate(value + z[i], code, low, high) if has_residual else value


def _output_kernel(mm: np.ndarray, m: int, bias: np.ndarray, has_bias: bool, code: int,
                   low: float, high: float, tiles_h: int, tiles_w: int, out: np.ndarray,
                   chunks: np.ndarray, biases: np.ndarray, z: np.ndarray,
                   has_residual: bool) -> None:
    """``out[n, k, th*m + p, tw*m + q] = epilogue((A^T M A)[p, q])`` for every tile, with
    ``M[a, b] = mm[a*alpha + b, k, n*tiles + tile]``; tile pixels beyond the output are
    dropped.  With a residual, the chunk gets the bias only and the merge adds ``z`` and
    applies the activation.

    Parallel over planes (output channel, image), dealt in contiguous ranges (parts) to
    whichever thread is free: the product's columns for a range are contiguous in every row.
    Thread ``t`` takes a part's tiles CHUNK at a time into ``chunks[t]``: it writes each
    tile's bias into ``biases[t]``, applies A^T along
    the tile columns (:func:`_left6`), then A along the tile rows with the epilogue
    (:func:`_right6`, in place: long contiguous loops whatever the image size), and finally
    merges the m tile columns of each tile row into the output rows (:func:`_merge4`).  The
    biases are a separate array, not a row of the chunk: numba marks distinct arrays of a
    parallel loop as not overlapping, and with the biases inside the chunk LLVM's overlap
    checks made the transform 1.5 times slower.
    """
    n_images, out_channels, out_h, out_w = out.shape
    alpha = m + 2
    tiles = tiles_h * tiles_w
    pitch = out_channels * n_images * tiles
    flat_mm = mm.reshape(mm.size)
    flat_out = out.reshape(out.size)
    flat_z = z.reshape(z.size)
    planes = out_channels * n_images
    parts = _parts(planes, tiles, chunks.shape[0])
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    chunk_code = 0 if has_residual else code  # the activation waits for the residual
    for part in prange(parts):
        thread = numba.get_thread_id()
        chunk, bias_row = chunks[thread], biases[thread]
        f = part * planes // parts * tiles
        end = (part + 1) * planes // parts * tiles
        while f < end:
            count = min(CHUNK, end - f)
            g = f
            while g < f + count:  # the bias of each plane's tiles
                k = g // tiles // n_images
                stop = min(f + count, (g // tiles + 1) * tiles)
                bias_k = bias[k] if has_bias else bias[0] - bias[0]
                for u in range(g - f, stop - f):
                    bias_row[U(u)] = bias_k
                g = stop
            if m == 4:
                _left6(chunk, flat_mm, pitch, f, count)
                _right6(chunk, bias_row, count, chunk_code, low_v, high_v)
            else:
                _left4(chunk, flat_mm, pitch, f, count)
                _right4(chunk, bias_row, count, chunk_code, low_v, high_v)
            g = f
            while g < f + count:  # tile rows, or the part of one in the chunk
                plane = g // tiles
                t = g - plane * tiles
                th = t // tiles_w
                tw0 = t - th * tiles_w
                run = min(f + count - g, tiles_w - tw0)
                k = plane // n_images
                first_row = ((plane - k * n_images) * out_channels + k) * out_h + th * m
                for p in range(min(m, out_h - th * m)):
                    o = (first_row + p) * out_w + tw0 * m
                    r = p * alpha * CHUNK + g - f
                    if m == 4:
                        _merge4(flat_out, o, out_w - tw0 * m, run, chunk, r, flat_z,
                                has_residual, code, low_v, high_v)
                    else:
                        _merge2(flat_out, o, out_w - tw0 * m, run, chunk, r, flat_z,
                                has_residual, code, low_v, high_v)
                g += run
            f += count


@functools.cache
def _compiled(dtype: np.dtype) -> tuple[Callable[..., None], Callable[..., None]]:
    """(filter, output) kernels for one dtype, compiled (or loaded from numba's cache) on first
    use, so that loading the plugin compiles nothing."""
    intp = types.intp
    filter_kernel = numba.njit(
        types.void(readonly(dtype, 4), readonly(dtype, 2), buffer(dtype, 3), buffer(dtype, 3)),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_filter_kernel)
    output_kernel = numba.njit(
        types.void(types.Array(item_type(dtype), 3, "C", readonly=True), intp,
                   readonly(dtype, 1), types.boolean, intp, types.float64, types.float64,
                   intp, intp, buffer(dtype, 4), buffer(dtype, 2), buffer(dtype, 2),
                   types.Array(item_type(dtype), 4, "C", readonly=True), types.boolean),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_output_kernel)
    return filter_kernel, output_kernel


@functools.cache
def _compiled_input(dtype: np.dtype, layout: str) -> Callable[..., None]:
    """The input kernel for one dtype and layout of X: "C" (contiguous, the fast case, what a
    runtime passes) or "A" (any strided view), each compiled on first use."""
    intp = types.intp
    return numba.njit(
        types.void(types.Array(item_type(dtype), 4, layout, readonly=True), intp, intp, intp,
                   intp, intp, buffer(dtype, 3), buffer(dtype, 2), buffer(dtype, 2),
                   types.Array(types.uint32, 1, "C")),
        parallel=True, cache=CACHE, fastmath=FASTMATH)(_input_kernel)


# -- sizes -----------------------------------------------------------------------------------

#: Tiles per chunk of the input and output transforms.  Large enough for long vector loops,
#: small enough that a chunk (36 rows of CHUNK values for F(4,3): 20 KB of float32) stays in
#: the L1 cache beside the padded plane.  A multiple of 16 (whole AVX-512 vectors of float32)
#: that is not a power of two: rows a power of two apart map to the same cache sets, and at
#: 256 the input transform ran three times slower.
CHUNK = 144


class _Plan:
    """Tile counts and the shape of every buffer for one problem and tile size m."""

    def __init__(self, geo: ConvGeometry, m: int):
        self.m = m
        self.alpha = alpha = m + 2
        self.tiles_h = -(-geo.oh // m)
        self.tiles_w = -(-geo.ow // m)
        per_plane = self.tiles_h * self.tiles_w
        self.tiles = geo.n * per_plane  # over all images
        points = alpha * alpha
        self.u_shape = (points, geo.k, geo.c)
        self.v_shape = (points, geo.c, self.tiles)
        self.m_shape = (points, geo.k, self.tiles)
        self.filter_workers = worker_count(geo.k)
        self.filter_scratch = (self.filter_workers, 12, geo.c)
        # the transforms deal their parts to any thread: one set of buffers per numba thread
        threads = thread_count()
        plane = ((self.tiles_h - 1) * m + alpha) * ((self.tiles_w - 1) * m + alpha)
        self.input_padded = (threads, plane)
        self.input_chunks = (threads, points * CHUNK)
        # uint32 positions in a padded plane: a plane would need 4 G elements to overflow them
        self.input_offsets = (per_plane,)
        self.output_chunks = (threads, m * alpha * CHUNK)
        self.output_biases = (threads, CHUNK)


def _plan(problem: Problem, m: int) -> _Plan:
    """The plan for the current numba thread count (its worker counts follow it)."""
    return _cached_plan(problem, m, thread_count())


@functools.lru_cache(maxsize=1024)
def _cached_plan(problem: Problem, m: int, threads: int) -> _Plan:
    return _Plan(geometry(problem), m)


#: The transforms' per-thread buffers of the problems run so far (see :class:`ScratchPool`).
_SCRATCH = ScratchPool()


def _make_scratch(plan: _Plan, dtype: np.dtype) -> tuple[np.ndarray, ...]:
    """The transforms' per-thread buffers: the padded planes (zeroed here, once: every plane
    writes the same interior positions), the input chunks, the tile offsets, the output chunks
    and biases."""
    return (np.zeros(plan.input_padded, dtype=dtype), np.empty(plan.input_chunks, dtype=dtype),
            np.empty(plan.input_offsets, dtype=np.uint32),
            np.empty(plan.output_chunks, dtype=dtype), np.empty(plan.output_biases, dtype=dtype))


class _Winograd(ConvAlgorithm):
    """Winograd F(m x m, 3 x 3) with the elementwise products as one batched matmul
    sub-problem.  Subclasses set the tile size ``m``.

    Usable for 3x3 kernels with stride 1, dilation 1 and one group, any padding, any number of
    images (tiles of all images go into one product).  REPRODUCIBLE as far as its matmul
    sub-problem is: every transformed value is computed by one worker in an order fixed by the
    loops, whatever the thread count.
    """

    operator = "conv"
    attributes = AlgoAttribute.REPRODUCIBLE
    sub_operators = ("matmul",)
    m = 0
    #: where the transforms' per-thread buffers are kept between calls
    scratch = _SCRATCH

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        return unusable_reason(self.name, geometry(problem))

    def work(self, problem: Problem) -> float:
        """Whole tiles: the transforms and the product grow with the tile count, so 5x5
        pixels cost F(4,3) as much as 7x7 (4 tiles each)."""
        geo = geometry(problem)
        return float(geo.n * -(-geo.oh // self.m) * -(-geo.ow // self.m) * geo.c * geo.k)

    def _product(self, problem: Problem) -> Problem:
        plan = _plan(problem, self.m)
        return matmul_problem(plan.u_shape, plan.v_shape, problem.dtypes[0])

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        return [self._product(problem)]

    def workspace_bytes(self, problem: Problem) -> int:
        """The peak of what :meth:`run` holds besides the output, phase by phase: the
        transformed filters U (only when not preprocessed) with the filter transform's scratch,
        then U and the transformed input V, then U, V and the product M, then M (U and V are
        dropped once M exists); the transforms' per-thread buffers throughout (made on the
        first call of the problem and kept for the next, see :class:`ScratchPool`)."""
        plan = _plan(problem, self.m)
        size = math.prod
        u = 0 if problem.weight_preprocess else size(plan.u_shape)
        filter_scratch = size(plan.filter_scratch) if u else 0
        v, product = size(plan.v_shape), size(plan.m_shape)
        itemsize = np.dtype(problem.dtypes[0]).itemsize
        scratch = ((size(plan.input_padded) + size(plan.input_chunks) + size(plan.output_chunks)
                    + size(plan.output_biases)) * itemsize + size(plan.input_offsets) * 4)
        phases = (
            (u + filter_scratch) * itemsize,
            (u + v) * itemsize,
            (u + v + product) * itemsize,
            product * itemsize,
        )
        return max(phases) + scratch

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
        input_kernel = _compiled_input(dtype, "C" if x.flags.c_contiguous else "A")
        output_kernel = _compiled(dtype)[1]
        out = np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=dtype)

        u = self._filter_transform(problem, w) if prepared is None else prepared
        v = np.empty(plan.v_shape, dtype=dtype)
        key = (self.name, problem.key, thread_count())
        scratch = _SCRATCH.take(key, lambda: _make_scratch(plan, dtype))
        padded, input_chunks, offsets, output_chunks, output_biases = scratch
        input_kernel(x, self.m, geo.pad_top, geo.pad_left, plan.tiles_h, plan.tiles_w, v,
                     padded, input_chunks, offsets)
        product = ctx.call(self._product(problem), u, v)
        del u, v  # only the product is needed from here on
        output_kernel(np.ascontiguousarray(product), self.m,
                      no_bias(dtype) if bias is None else bias, bias is not None,
                      *epilogue_args(geo),
                      plan.tiles_h, plan.tiles_w, out, output_chunks, output_biases,
                      residual_operand(geo, inputs), geo.has_residual)
        _SCRATCH.give(key, scratch)
        return geo.output_view(out)


class WinogradF2x3(_Winograd):
    """F(2x2, 3x3): 4x4 input tiles, 16 products per 4 outputs (2.25x fewer than direct)."""

    name = "winograd_f2x3"
    m = 2

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (1, 1) if min(geo.cg, geo.kg) >= heuristic.WINOGRAD_MIN_CHANNELS else (5, 1)


class WinogradF4x3(_Winograd):
    """F(4x4, 3x3): 6x6 input tiles, 36 products per 16 outputs (4x fewer than direct), with
    larger transforms and rounding error."""

    name = "winograd_f4x3"
    m = 4

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        channels_ok = min(geo.cg, geo.kg) >= heuristic.WINOGRAD_MIN_CHANNELS
        big = geo.n * geo.oh * geo.ow >= heuristic.WINOGRAD_F4_MIN_PIXELS
        return (1, 0) if channels_ok and big else (5, 0)


def algorithms() -> list[Algorithm]:
    return [WinogradF2x3(), WinogradF4x3()]
