"""What the numba conv kernels (naive, direct, depthwise) share: one calling convention, the staging
of input rows, and the passes that do the arithmetic.

Calling convention. Every kernel is ``kernel(x, w, bias, out, sh, sw, dh, dw, pt, pl, group,
has_bias, code, low, high, z, has_residual, *extra)`` on the 4-D views of
:meth:`ConvGeometry.as_4d`: X (N, C, H, W) and W (K, C/group, R, S) read-only, ``out`` (N, K, OH,
OW) C-contiguous, then strides, dilations, the top and left pads, the group, the epilogue (see
:mod:`.epilogue`) and the residual Z (N, K, OH, OW). A problem without bias or residual passes a
shared one-element zero array, so no call allocates one. Kernels are compiled per dtype
and per operand layout: "C" for contiguous operands (the fast case, and what the runtime passes),
"A" for any strided view, compiled only when one turns up; so a kernel never copies an input, and
``workspace_bytes`` stays exact whatever the caller passes.

Staged blocks. The fast kernels compute a block of ``ob`` consecutive output rows of one channel
plane at a time. They first copy the input rows that block reads into a small per-worker buffer
(:func:`stage_block`), padded, and for strides > 1 split into phases (padded row ``a*sh + ph``,
column ``m*sw + pw`` goes to phase plane ``(ph, pw)``, position ``(a, m)``; every phase plane has
``hb`` rows of ``wq`` positions). Then output ``(t, o)`` of the block, at flat position ``t*wq +
o``, reads tap ``(i, j)`` at flat position ``t*wq + o + tap_offset(i, j)``: one contiguous,
unit-stride, always-in-bounds stream per tap, whatever the strides, dilations and padding, with no
bounds checks left in the inner loop. The ``wq - OW`` positions at the end of each output row are
junk, computed and never stored; for a 3x3 stride-1 layer that is 2 of every OW + 2. The padding
columns are the same for every row, so a worker zeroes its buffer once and from then on only copies
input values (:func:`stage_row`).

Passes. One pass adds up to four taps, taken in row-major order (so a pass may span two kernel
rows), to four accumulator rows (four output channels) over the whole flat block: ``acc[u] =
(((acc[u] + w0*x[u+d0]) + w1*x[u+d1]) + w2*x[u+d2]) + w3*x[u+d3]``. The loop over ``u`` is long,
contiguous and vectorises; one load/store of an accumulator serves several multiply-adds and each
input load serves four output channels, so a long pass runs near the core's peak (about 55 G
float32 multiply-adds per second on one AVX-512 core of the development machine, measured in
isolation). Each pass still pays ~70 cycles of setup, mostly LLVM's runtime checks that the
accumulator rows and the staged input do not overlap (numba cannot tell it that arrays are
distinct), hence long blocks. Details that each cost 15-50% when missed: indices are cast to
unsigned (numba then emits no negative-index wraparound, which keeps LLVM from vectorising);
accumulator lengths are a multiple of 16 and rows are aligned (:data:`LANES`, :data:`ALIGN`); the
four rows of a pass live in four separate sub-buffers (``acc[0..3, group]``: LLVM hoists its
aliasing check out of the loop over row groups, and rows of one buffer would then look
overlapping); arrays are indexed in full, never sliced in a loop (a slice costs numba two atomic
reference-count updates); helpers are inlined into the kernels.

Numba's on-disk cache keys a kernel on its own file only: after editing this module, clear the
``__pycache__`` entries of the kernels that use it (direct, depthwise), or they keep running the
old helpers.

Reproducibility. Every output value is computed by exactly one task, adding its products in an
order fixed by the loop structure alone (input channel, then taps in row-major order), never by the
thread count, the schedule or the block it falls in; padding contributes its zero products in the
same place every time. The parenthesised sums above round exactly as one product at a time would.
The fast kernels are compiled with ``fastmath={"contract"}`` and nothing else: LLVM may then fuse
``a + w*x`` into one fused multiply-add (one rounding instead of two), in the vector loop and its
scalar remainder alike. Which instructions are fused is decided at compile time, so a compiled
kernel gives bit-identical results on every run and every thread count; no reassociation is
allowed, so the summation order stays as written.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import types

from fastrun_algorithms._common import (
    CACHE,
    FASTMATH,
    PARTS_PER_THREAD,
    U,
    ceil_div,
    floor_div,
    round_up,
    stack_buffer,
    thread_count,
)
from fastrun_algorithms.conv.epilogue import (
    bounds,
    clamp,
    epilogue_args,
    finish_span,
    residual_operand,
)
from fastrun_algorithms.conv.geometry import ConvGeometry


@functools.cache
def _no_bias(dtype: np.dtype) -> np.ndarray:
    zero = np.zeros(1, dtype=dtype)
    zero.flags.writeable = False
    return zero


def operands(geo: ConvGeometry, inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X and W as 4-D views and the bias (or the shared zero placeholder), without copies."""
    x, w = geo.as_4d(np.asarray(inputs[0]), np.asarray(inputs[1]))
    bias = np.asarray(inputs[2]) if geo.has_bias else _no_bias(np.dtype(geo.dtype))
    return x, w, bias


def layout(x: np.ndarray, w: np.ndarray) -> str:
    """'C' when both operands are C-contiguous (the fast compiled variant), else 'A'."""
    return "C" if x.flags.c_contiguous and w.flags.c_contiguous else "A"


def scalar_args(geo: ConvGeometry, inputs) -> tuple:
    """The kernels' arguments after ``out``, in the order of :func:`kernel_signature`."""
    return (geo.stride_h, geo.stride_w, geo.dil_h, geo.dil_w, geo.pad_top, geo.pad_left,
            geo.group, geo.has_bias, *epilogue_args(geo), residual_operand(geo, inputs),
            geo.has_residual)


def kernel_signature(dtype: np.dtype, array_layout: str, *extra: types.Type) -> types.Signature:
    """``void(x, w, bias, out, sh, sw, dh, dw, pt, pl, group, has_bias, code, low, high, z,
    has_residual, *extra)`` with X and W of the given layout, read-only (writable arrays
    convert), and Z C-contiguous."""
    item = numba.from_dtype(np.dtype(dtype))
    operand = types.Array(item, 4, array_layout, readonly=True)
    bias = types.Array(item, 1, "A", readonly=True)
    ints = [types.intp] * 7
    return types.void(operand, operand, bias, types.Array(item, 4, "C"), *ints, types.boolean,
                      types.intp, types.float64, types.float64,
                      types.Array(item, 4, "C", readonly=True), types.boolean, *extra)


# -- index arithmetic ------------------------------------------------------------------------
# Divisions take tens of cycles; strides 1 and 2 (nearly every layer) get branches that the
# compiler turns into nothing or a shift.

@numba.njit(cache=CACHE, inline="always")
def first_inside(offset, stride):
    """Smallest index m >= 0 with ``m * stride + offset >= 0``."""
    return max(0, -floor_div(offset, stride))


@numba.njit(cache=CACHE, inline="always")
def end_inside(offset, stride, size, count):
    """One past the largest index m < count with ``m * stride + offset < size``, in
    ``[0, count]``."""
    return min(count, max(0, floor_div(size - 1 - offset, stride) + 1))


@numba.njit(cache=CACHE, inline="always")
def tap_offset(i, j, dh, dw, sh, sw, hb, wq):
    """Flat offset at which tap (i, j) reads a staged block, for output (0, 0) of the block."""
    row, column = i * dh, j * dw
    a, m = floor_div(row, sh), floor_div(column, sw)
    phase = (row - a * sh) * sw + (column - m * sw)
    return (phase * hb + a) * wq + m


# -- staging ---------------------------------------------------------------------------------

#: Accumulator lengths are rounded up to a multiple of this many values (a 64-byte vector of
#: float32), so that the vector loop of a pass has no scalar remainder; the staged block gets as
#: many values of slack so that the extra positions still read inside it.
LANES = 16
#: Alignment in bytes of the accumulators: with row lengths a multiple of LANES, every vector
#: load and store of a row stays within one cache line (worth 15-20% on a pass).
ALIGN = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty(shape)`` whose data starts on an :data:`ALIGN`-byte boundary (a view of a
    slightly larger buffer: :func:`aligned_nbytes` bytes)."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)  # not np.prod: a few microseconds a call, on every call
    raw = np.empty(count + ALIGN // dtype.itemsize, dtype=dtype)
    skip = (-raw.ctypes.data % ALIGN) // dtype.itemsize
    return raw[skip:skip + count].reshape(shape)


def aligned_nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes :func:`aligned_empty` allocates for ``shape``."""
    dtype = np.dtype(dtype)
    return (math.prod(shape) + ALIGN // dtype.itemsize) * dtype.itemsize


def aligned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """:func:`aligned_empty`, zeroed."""
    out = aligned_empty(shape, dtype)
    out.fill(0)
    return out


def block_rows(geo: ConvGeometry, ob: int) -> int:
    """Rows of each phase plane of a block of ``ob`` output rows (``hb``)."""
    return ob + (geo.r - 1) * geo.dil_h // geo.stride_h


def block_width(geo: ConvGeometry) -> int:
    """Positions per row of each phase plane (``wq``): enough for every tap of every output
    column."""
    return geo.ow + (geo.s - 1) * geo.dil_w // geo.stride_w


def staged_size(geo: ConvGeometry, ob: int) -> int:
    """Values in one staged block of ``ob`` output rows, plus :data:`LANES` of slack."""
    return geo.stride_h * geo.stride_w * block_rows(geo, ob) * block_width(geo) + LANES


def input_and_output(geo: ConvGeometry, inputs) -> tuple[np.ndarray, np.ndarray]:
    """X as a C-contiguous 4-D array and an empty NCHW output of the problem's dtype, for
    the kernels that index both flat."""
    x, _ = geo.as_4d(np.asarray(inputs[0]), np.asarray(inputs[1]))
    return (np.ascontiguousarray(x),
            np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=np.dtype(geo.dtype)))


def task_rows(geo: ConvGeometry, per_rows: int, max_outputs: int) -> int:
    """Output rows per task of the kernels whose tasks stage the input rows they read
    (``depthwise_lanes``, ``grouped_lanes``): at most ``max_outputs`` outputs, so that the
    staged rows stay in L2, and few enough rows that every thread gets
    :data:`~fastrun_algorithms._common.PARTS_PER_THREAD` tasks where an image has few row
    blocks' worth of them (``per_rows``: tasks per block of rows, all images together)."""
    rows = max(1, min(geo.oh, max_outputs // geo.ow))
    wanted = PARTS_PER_THREAD * thread_count()
    if per_rows * ceil_div(geo.oh, rows) < wanted:
        rows = max(1, min(rows, ceil_div(geo.oh * per_rows, wanted)))
    return rows


def per_thread_count(make: Callable[[], Any]) -> Callable[[], tuple[int, Any]]:
    """For a bound call (``Algorithm.bind``) of the kernels whose tasks follow
    :func:`task_rows`: a function giving the current thread count and ``make()``'s value for
    it, made once per thread count.  The rows per task depend on the thread count, which a
    shared CPU may change between calls, so a bound call can only remember them per count."""
    made: dict[int, Any] = {}

    def current() -> tuple[int, Any]:
        threads = thread_count()
        value = made.get(threads)
        if value is None:
            value = made[threads] = make()
        return threads, value
    return current


def staged_columns(geo: ConvGeometry) -> int:
    """Columns of an unsplit staged row: every input column an output row reads, padding
    included."""
    return (geo.ow - 1) * geo.stride_w + (geo.s - 1) * geo.dil_w + 1


def staged_rows(geo: ConvGeometry, rows: int) -> int:
    """Input rows, padding included, that ``rows`` output rows read."""
    return (rows - 1) * geo.stride_h + (geo.r - 1) * geo.dil_h + 1


def block_positions(geo: ConvGeometry, ob: int) -> int:
    """Accumulator positions of a block of ``ob`` output rows, rounded up to :data:`LANES`."""
    return round_up((ob - 1) * block_width(geo) + geo.ow, LANES)


@numba.njit(cache=CACHE, inline="always")
def stage_row(dst, d0, pitch, x, n, c, ih, pl, sw, wq):
    """Write input row ``x[n, c, ih]``, split into ``sw`` column phases, into a staged row
    whose left ``pl`` columns (and the columns past the row's end) are padding: phase p at
    ``dst[d0 + p*pitch:][:wq]`` holds padded columns ``m*sw + p``.

    Only the input's own columns are written.  The padding columns are the same for every row,
    so the kernels zero the whole staging buffer once, when a worker starts, and never write
    there again (a row that falls into the top or bottom padding is zeroed whole); this saves
    two short loops per row, which is what staging a small plane costs most.
    """
    width = x.shape[3]
    if sw == 1:
        for m in range(min(pl, wq), min(wq, pl + width)):
            dst[U(d0 + m)] = x[n, c, ih, U(m - pl)]
        return
    lo0, hi0 = first_inside(-pl, sw), end_inside(-pl, sw, width, wq)
    if sw == 2:
        # Both phases in one loop where both are inside the row: LLVM turns the pair of
        # stride-2 reads into wide loads and shuffles instead of gathers.  The two phases'
        # ranges differ by at most one column at each end.
        lo1, hi1 = first_inside(1 - pl, 2), end_inside(1 - pl, 2, width, wq)
        lo, hi = max(lo0, lo1), min(hi0, hi1)
        # The leftovers first, with ifs rather than loops (a loop's vector preamble would cost
        # more than the one value it copies), and the vector loop last: with the ifs after
        # it, a row of 16 planes of 112x112 took 1.6x as long to stage.
        top = max(lo, hi)
        if lo0 < min(lo, hi0):
            dst[U(d0 + lo0)] = x[n, c, ih, U(2 * lo0 - pl)]
        if max(top, lo0) < hi0:
            dst[U(d0 + hi0 - 1)] = x[n, c, ih, U(2 * (hi0 - 1) - pl)]
        if lo1 < min(lo, hi1):
            dst[U(d0 + pitch + lo1)] = x[n, c, ih, U(2 * lo1 + 1 - pl)]
        if max(top, lo1) < hi1:
            dst[U(d0 + pitch + hi1 - 1)] = x[n, c, ih, U(2 * (hi1 - 1) + 1 - pl)]
        for m in range(lo, hi):
            dst[U(d0 + m)] = x[n, c, ih, U(2 * m - pl)]
            dst[U(d0 + pitch + m)] = x[n, c, ih, U(2 * m + 1 - pl)]
        return
    for p in range(sw):
        for m in range(first_inside(p - pl, sw), end_inside(p - pl, sw, width, wq)):
            dst[U(d0 + p * pitch + m)] = x[n, c, ih, U(m * sw + p - pl)]


@numba.njit(cache=CACHE, inline="always")
def stage_block(dst, x, n, c, row0, hb, wq, sh, sw, pt, pl):
    """Stage the rows of input plane ``x[n, c]`` that a block of output rows reads (see the
    module docstring): phase plane (ph, pw), row a holds padded input row
    ``row0 + a*sh + ph``; rows in the padding are zero."""
    height = x.shape[2]
    pitch = hb * wq
    zero = dst.dtype.type(0)
    for ph in range(sh):
        for a in range(hb):
            d0 = (ph * sw * hb + a) * wq
            ih = row0 + a * sh + ph - pt
            if 0 <= ih < height:
                stage_row(dst, d0, pitch, x, n, c, ih, pl, sw, wq)
            else:
                for pw in range(sw):
                    for m in range(wq):
                        dst[d0 + pw * pitch + m] = zero


# -- passes ----------------------------------------------------------------------------------
# Arrays are indexed in full rather than sliced into rows: a slice in a hot loop costs numba a
# pair of atomic reference-count updates, more than a short pass itself.
# acc: accumulators (4, groups, positions), g: the group of four rows; w: the weights, ks: the
# four weight rows (output channels), c: the input channel (of the group); ij: (i, j) of up to
# four taps, flattened; xs: the staged block; d: the taps' offsets (tap_offset); n: positions.

@numba.njit(cache=CACHE, inline="always")
def next_tap(i, j, kernel_w):
    """The tap after (i, j) in row-major order."""
    return (i, j + 1) if j + 1 < kernel_w else (i + 1, 0)


@numba.njit(cache=CACHE, inline="always")
def tap_after_pass(taps, i1, j1, i2, j2, i3, j3, kernel_w):
    """Where the next pass starts after a pass over ``taps`` taps (one to four) whose second,
    third and fourth taps are (i1, j1), (i2, j2), (i3, j3)."""
    if taps == 1:
        return i1, j1
    if taps == 2:
        return i2, j2
    if taps == 3:
        return i3, j3
    return next_tap(i3, j3, kernel_w)


@numba.njit(cache=CACHE, inline="always")
def chunk_taps(remaining):
    """Taps in the next pass: three or four, never a single tap left over where that can be
    helped (a pass of one or two taps is bound by the accumulator's loads and stores, not by
    arithmetic): 9 -> 3+3+3 (measured 3-8% faster than 4+3+2), 49 -> 4*10+3+3+3, 7 -> 3+4,
    5 -> 3+2."""
    if remaining % 3 == 0 and remaining <= 9:
        return 3
    if remaining >= 8 or remaining == 4:
        return 4
    if remaining >= 5:
        return 3
    return remaining


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def rows4_taps4(acc, g, w, ks, c, ij, xs, d, n):
    """Four accumulator rows ``acc[0..3, g]``, four taps."""
    i0, j0, i1, j1, i2, j2, i3, j3 = ij
    d0, d1, d2, d3 = d
    k0, k1, k2, k3 = ks
    a0, b0, c0, e0 = w[k0, c, i0, j0], w[k0, c, i1, j1], w[k0, c, i2, j2], w[k0, c, i3, j3]
    a1, b1, c1, e1 = w[k1, c, i0, j0], w[k1, c, i1, j1], w[k1, c, i2, j2], w[k1, c, i3, j3]
    a2, b2, c2, e2 = w[k2, c, i0, j0], w[k2, c, i1, j1], w[k2, c, i2, j2], w[k2, c, i3, j3]
    a3, b3, c3, e3 = w[k3, c, i0, j0], w[k3, c, i1, j1], w[k3, c, i2, j2], w[k3, c, i3, j3]
    for o in range(n):
        x0, x1, x2, x3 = xs[U(o + d0)], xs[U(o + d1)], xs[U(o + d2)], xs[U(o + d3)]
        u = U(o)
        acc[0, g, u] = (((acc[0, g, u] + a0 * x0) + b0 * x1) + c0 * x2) + e0 * x3
        acc[1, g, u] = (((acc[1, g, u] + a1 * x0) + b1 * x1) + c1 * x2) + e1 * x3
        acc[2, g, u] = (((acc[2, g, u] + a2 * x0) + b2 * x1) + c2 * x2) + e2 * x3
        acc[3, g, u] = (((acc[3, g, u] + a3 * x0) + b3 * x1) + c3 * x2) + e3 * x3


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def rows4_taps3(acc, g, w, ks, c, ij, xs, d, n):
    i0, j0, i1, j1, i2, j2, _, _ = ij
    d0, d1, d2, _ = d
    k0, k1, k2, k3 = ks
    a0, b0, c0 = w[k0, c, i0, j0], w[k0, c, i1, j1], w[k0, c, i2, j2]
    a1, b1, c1 = w[k1, c, i0, j0], w[k1, c, i1, j1], w[k1, c, i2, j2]
    a2, b2, c2 = w[k2, c, i0, j0], w[k2, c, i1, j1], w[k2, c, i2, j2]
    a3, b3, c3 = w[k3, c, i0, j0], w[k3, c, i1, j1], w[k3, c, i2, j2]
    for o in range(n):
        x0, x1, x2 = xs[U(o + d0)], xs[U(o + d1)], xs[U(o + d2)]
        u = U(o)
        acc[0, g, u] = ((acc[0, g, u] + a0 * x0) + b0 * x1) + c0 * x2
        acc[1, g, u] = ((acc[1, g, u] + a1 * x0) + b1 * x1) + c1 * x2
        acc[2, g, u] = ((acc[2, g, u] + a2 * x0) + b2 * x1) + c2 * x2
        acc[3, g, u] = ((acc[3, g, u] + a3 * x0) + b3 * x1) + c3 * x2


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def rows4_taps2(acc, g, w, ks, c, ij, xs, d, n):
    i0, j0, i1, j1, _, _, _, _ = ij
    d0, d1, _, _ = d
    k0, k1, k2, k3 = ks
    a0, b0 = w[k0, c, i0, j0], w[k0, c, i1, j1]
    a1, b1 = w[k1, c, i0, j0], w[k1, c, i1, j1]
    a2, b2 = w[k2, c, i0, j0], w[k2, c, i1, j1]
    a3, b3 = w[k3, c, i0, j0], w[k3, c, i1, j1]
    for o in range(n):
        x0, x1 = xs[U(o + d0)], xs[U(o + d1)]
        u = U(o)
        acc[0, g, u] = (acc[0, g, u] + a0 * x0) + b0 * x1
        acc[1, g, u] = (acc[1, g, u] + a1 * x0) + b1 * x1
        acc[2, g, u] = (acc[2, g, u] + a2 * x0) + b2 * x1
        acc[3, g, u] = (acc[3, g, u] + a3 * x0) + b3 * x1


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def rows4_taps1(acc, g, w, ks, c, ij, xs, d, n):
    i0, j0, _, _, _, _, _, _ = ij
    d0, _, _, _ = d
    k0, k1, k2, k3 = ks
    a0, a1, a2, a3 = w[k0, c, i0, j0], w[k1, c, i0, j0], w[k2, c, i0, j0], w[k3, c, i0, j0]
    for o in range(n):
        x0 = xs[U(o + d0)]
        u = U(o)
        acc[0, g, u] += a0 * x0
        acc[1, g, u] += a1 * x0
        acc[2, g, u] += a2 * x0
        acc[3, g, u] += a3 * x0


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def row_taps(acc, wv, xs, d, taps, n):
    """One accumulator row ``acc[0, 0]``, ``taps`` (1 to 4) taps with weights ``wv``."""
    a, b, c, e = wv
    d0, d1, d2, d3 = d
    if taps == 4:
        for o in range(n):
            u = U(o)
            acc[0, 0, u] = ((((acc[0, 0, u] + a * xs[U(o + d0)]) + b * xs[U(o + d1)])
                             + c * xs[U(o + d2)]) + e * xs[U(o + d3)])
    elif taps == 3:
        for o in range(n):
            u = U(o)
            acc[0, 0, u] = (((acc[0, 0, u] + a * xs[U(o + d0)]) + b * xs[U(o + d1)])
                            + c * xs[U(o + d2)])
    elif taps == 2:
        for o in range(n):
            u = U(o)
            acc[0, 0, u] = (acc[0, 0, u] + a * xs[U(o + d0)]) + b * xs[U(o + d1)]
    else:
        for o in range(n):
            acc[0, 0, U(o)] += a * xs[U(o + d0)]


# -- epilogue --------------------------------------------------------------------------------

@numba.njit(cache=CACHE, inline="always")
def store_rows(out, n, k, oh0, rows, acc, t, g, wq, bias_k, code, low, high, z, has_residual):
    """``out[n, k, oh0 + r, :] = epilogue(acc[t, g, r*wq:][:OW])`` for ``rows`` output rows,
    the residual ``z[n, k, oh0 + r, :]`` added before the activation when ``has_residual``.

    None, relu and clip are applied as clamps (:func:`~.epilogue.bounds`), so that the row
    loop stays a vector loop: through :func:`~.epilogue.activate`'s test of the code, a
    depthwise 5x5 layer with a Relu took twice as long as without one.  The other activations
    store the raw sums and finish the row with :func:`~.epilogue.finish_span`, a vector loop
    per activation.  The bounds are rounded to the output dtype first: for a value already of
    that dtype, clipping to the rounded bounds gives exactly the rounded result of clipping to
    the exact ones, and the loop then stays in one precision.
    """
    low_v = out.dtype.type(low)
    high_v = out.dtype.type(high)
    bounded, floor, ceiling = bounds(code, low, high, out)
    out_w = out.shape[3]
    for r in range(rows):
        base = r * wq
        if has_residual and bounded:
            for o in range(out_w):
                out[n, k, oh0 + r, U(o)] = clamp(
                    (acc[t, g, U(base + o)] + bias_k) + z[n, k, oh0 + r, U(o)], floor, ceiling)
        elif bounded:
            for o in range(out_w):
                out[n, k, oh0 + r, U(o)] = clamp(acc[t, g, U(base + o)] + bias_k, floor,
                                                 ceiling)
        else:  # the raw sums, then the epilogue in vector loops (finish_span)
            row = out[n, k, oh0 + r]
            for o in range(out_w):
                row[U(o)] = acc[t, g, U(base + o)]
            z_row = z[n, k, oh0 + r] if has_residual else z[0, 0, 0]
            finish_span(row, 0, out_w, bias_k, z_row, has_residual, code, low_v, high_v)


#: Staged positions :func:`store_taps3x3` sums before it stores them (a stack buffer of 4 KB
#: for float32, in L1 while it is stored).
SUM_CHUNK = 1024


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def sum_taps3x3(dst, xs, w, k, i, d, p0, count):
    """``dst[u] = sum of the nine taps`` at staged position ``p0 + u`` for ``u < count``: taps
    (i..i+2, 0..2) of weight plane ``w[k, 0]`` in row-major order, tap (i+a, b) reading at
    offset ``d[3*a + b]``.  One loop with no call and no store but ``dst``'s, which LLVM
    vectorises; flat mode (:mod:`.depthwise`) runs it over a whole block at once."""
    w00, w01, w02 = w[k, 0, i, 0], w[k, 0, i, 1], w[k, 0, i, 2]
    w10, w11, w12 = w[k, 0, i + 1, 0], w[k, 0, i + 1, 1], w[k, 0, i + 1, 2]
    w20, w21, w22 = w[k, 0, i + 2, 0], w[k, 0, i + 2, 1], w[k, 0, i + 2, 2]
    d00, d01, d02, d10, d11, d12, d20, d21, d22 = d
    for u in range(count):
        p = p0 + u
        s = (w00 * xs[U(p + d00)] + w01 * xs[U(p + d01)]) + w02 * xs[U(p + d02)]
        s = ((s + w10 * xs[U(p + d10)]) + w11 * xs[U(p + d11)]) + w12 * xs[U(p + d12)]
        dst[U(u)] = ((s + w20 * xs[U(p + d20)]) + w21 * xs[U(p + d21)]) + w22 * xs[U(p + d22)]


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def sum_taps5x5(dst, xs, w, k, d, count):
    """``dst[u] = sum of the 25 taps`` at staged position ``u`` for ``u < count``: weight plane
    ``w[k, 0]`` in row-major order, tap (a, b) reading at offset ``d[5*a + b]``.  One pass
    where the general path zeroes an accumulator and makes seven passes over it (four taps
    each): MobileNetV3's and EfficientNet's 5x5 layers.  The taps are summed a kernel row at
    a time, in row-major order."""
    e0, e1, e2, e3, e4, e5, e6, e7, e8, e9 = d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], \
        d[8], d[9]
    f0, f1, f2, f3, f4, f5, f6, f7, f8, f9 = d[10], d[11], d[12], d[13], d[14], d[15], d[16], \
        d[17], d[18], d[19]
    g0, g1, g2, g3, g4 = d[20], d[21], d[22], d[23], d[24]
    a0, a1, a2, a3, a4 = w[k, 0, 0, 0], w[k, 0, 0, 1], w[k, 0, 0, 2], w[k, 0, 0, 3], w[k, 0, 0, 4]
    b0, b1, b2, b3, b4 = w[k, 0, 1, 0], w[k, 0, 1, 1], w[k, 0, 1, 2], w[k, 0, 1, 3], w[k, 0, 1, 4]
    c0, c1, c2, c3, c4 = w[k, 0, 2, 0], w[k, 0, 2, 1], w[k, 0, 2, 2], w[k, 0, 2, 3], w[k, 0, 2, 4]
    h0, h1, h2, h3, h4 = w[k, 0, 3, 0], w[k, 0, 3, 1], w[k, 0, 3, 2], w[k, 0, 3, 3], w[k, 0, 3, 4]
    i0, i1, i2, i3, i4 = w[k, 0, 4, 0], w[k, 0, 4, 1], w[k, 0, 4, 2], w[k, 0, 4, 3], w[k, 0, 4, 4]
    for u in range(count):
        s = (((a0 * xs[U(u + e0)] + a1 * xs[U(u + e1)]) + a2 * xs[U(u + e2)])
             + a3 * xs[U(u + e3)]) + a4 * xs[U(u + e4)]
        s = ((((s + b0 * xs[U(u + e5)]) + b1 * xs[U(u + e6)]) + b2 * xs[U(u + e7)])
             + b3 * xs[U(u + e8)]) + b4 * xs[U(u + e9)]
        s = ((((s + c0 * xs[U(u + f0)]) + c1 * xs[U(u + f1)]) + c2 * xs[U(u + f2)])
             + c3 * xs[U(u + f3)]) + c4 * xs[U(u + f4)]
        s = ((((s + h0 * xs[U(u + f5)]) + h1 * xs[U(u + f6)]) + h2 * xs[U(u + f7)])
             + h3 * xs[U(u + f8)]) + h4 * xs[U(u + f9)]
        dst[U(u)] = ((((s + i0 * xs[U(u + g0)]) + i1 * xs[U(u + g1)]) + i2 * xs[U(u + g2)])
                     + i3 * xs[U(u + g3)]) + i4 * xs[U(u + g4)]


@numba.njit(cache=CACHE, fastmath=FASTMATH, inline="always")
def store_taps3x3(out, n, k, oh0, rows, w, i, xs, d, wq, bias_k, code, low, high):
    """For a 3x3 kernel in one pass: ``out[n, k, oh0 + r, o] = epilogue(sum of the nine taps)``
    (:func:`sum_taps3x3`).  As many whole rows as fit in :data:`SUM_CHUNK` positions (their
    junk columns included) are summed by one flat loop into a stack buffer, then stored through
    the epilogue.  Why: with the epilogue (whose sigmoid and silu call exp) in the summing loop,
    LLVM left the nine taps scalar; and a loop per row of 28 or 56 outputs spends a third or
    more of them in the vector loop's scalar remainder (LLVM unrolls it to 32 or 64 values).
    ``benchmarks/bench_conv_layers.py --suite mobilenet_v2`` times such layers."""
    low_v = out.dtype.type(low)
    high_v = out.dtype.type(high)
    bounded, floor, ceiling = bounds(code, low, high, out)
    out_w = out.shape[3]
    sums = numba.carray(stack_buffer(SUM_CHUNK, out.dtype), SUM_CHUNK)
    # Whole rows per chunk; a row wider than the buffer (wq > SUM_CHUNK) is one chunk per
    # SUM_CHUNK columns, otherwise the column loop runs once.
    per_chunk = max(1, SUM_CHUNK // wq)
    for r0 in range(0, rows, per_chunk):
        chunk_rows = min(per_chunk, rows - r0)
        for o0 in range(0, out_w, SUM_CHUNK):
            width = min(SUM_CHUNK, out_w - o0)
            summed = (chunk_rows - 1) * wq + width
            sum_taps3x3(sums, xs, w, k, i, d, r0 * wq + o0, summed)
            if not bounded:
                # The epilogue over the whole chunk, junk columns included: one long vector
                # loop per activation (finish_span); per row of 56 it took 1.5-3.5x longer.
                finish_span(sums, 0, summed, bias_k, sums, False, code, low_v, high_v)
            for r in range(chunk_rows):
                if bounded:  # a vector loop (see store_rows)
                    for o in range(width):
                        out[n, k, oh0 + r0 + r, U(o0 + o)] = clamp(
                            sums[U(r * wq + o)] + bias_k, floor, ceiling)
                else:
                    for o in range(width):
                        out[n, k, oh0 + r0 + r, U(o0 + o)] = sums[U(r * wq + o)]
