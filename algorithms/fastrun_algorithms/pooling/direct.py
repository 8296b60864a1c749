"""maxpool and avgpool in parallel numba, each plane on whichever thread is free.

Made for the pooling layers of CNNs (3x3 stride 2 after the first convolution), where the
numpy algorithm first copies X into a padded buffer.  Each worker stages an input plane's
rows split into their column phases (the phase split of the conv kernels,
``conv._kernels_common.stage_row``) in its own buffer, whose padding columns hold the pad
value (-inf for max, 0 for the sums); then each output row is its own accumulator and every
kernel tap inside the input rows combines one *contiguous* staged run into it (a long,
vectorised loop; a per-output window loop is bound by the latency of its one accumulator, and
reading a stride-2 tap straight from the row was 1.7 times slower on ResNet's stem maxpool:
0.72 against 0.42 ms on two cores; 0.35 ms with contiguous inputs compiled apart).  Rows in
the top and bottom padding are skipped, and avgpool's divisors count only the taps they
should.  A 3x3 maxpool (ResNet's stem, GoogLeNet's and SqueezeNet's pools) takes each output
row in one pass instead: the nine taps' runs are combined in registers and the row is written
once (rows outside the input read a staged row that holds only -inf), where the general path
reads and writes the output row back for every tap, several times the memory traffic
(``benchmarks.probe_layers_vs_ort`` shows the step against onnxruntime's).  A 2x2 average
whose windows in a row are all whole (DenseNet's transitions) takes its row in one pass the
same way, summing the four taps in kernel order and dividing once: 0.50-0.63 of the general
path's time on DenseNet's 56x56 and 28x28 transitions at one thread on the 2-core VM, the same
bits; other rows of whole windows divide by one count in a vector loop.

One kernel covers max and both averages, 1-D (as 2-D with a height of 1) and 2-D, any input
layout, compiled once per dtype.  Each output is combined by one worker in kernel-row-major
order, whatever the thread count: reproducible.
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
from fastrun_algorithms._common import CACHE, ScratchPool, U, floor_div, thread_count
from fastrun_algorithms.conv._kernels_common import stage_row
from fastrun_algorithms.pooling import heuristic
from fastrun_algorithms.pooling.geometry import pool_geometry

#: ``mode`` argument of the kernel
MAX, AVERAGE, AVERAGE_WITH_PAD = 0, 1, 2

#: The per-thread staging buffers of the problems run so far, their padding written once (see
#: :class:`ScratchPool`): filling sixteen threads' buffers of ResNet's stem maxpool (51 KB
#: each) on every call cost more than a thread's share of the pooling itself.
_SCRATCH = ScratchPool()


@numba.njit(cache=CACHE, inline="always")
def _tap_range(start, kernel, dilation, limit):
    """The taps ``j`` in ``[first, end)`` with ``0 <= start + j * dilation < limit``."""
    first = 0 if start >= 0 else floor_div(dilation - 1 - start, dilation)
    if limit - start >= 1 + (kernel - 1) * dilation:
        end = kernel
    elif limit - 1 - start < 0:
        end = 0
    else:
        end = floor_div(limit - 1 - start, dilation) + 1
    return first, max(first, end)


@numba.njit(cache=CACHE, inline="always")
def _combine_row(out, n, c, oh, count, staged, s0, is_max):
    """``out[n, c, oh, :count]`` combined elementwise with ``staged[s0:s0 + count]``, by max
    (a NaN wins and stays, as with np.maximum) or sum: contiguous on both sides, so the loop
    vectorises.  Indices are unsigned (never negative here), which spares numba's
    negative-index wraparound test."""
    if is_max:
        for t in range(count):
            v = staged[U(s0) + U(t)]
            a = out[n, c, oh, U(t)]
            out[n, c, oh, U(t)] = v if v > a or v != v else a
    else:
        for t in range(count):
            out[n, c, oh, U(t)] += staged[U(s0) + U(t)]


@numba.njit(cache=CACHE, inline="always")
def _staged_row(ih, height, sw, wq, pad_row):
    """Where input row ``ih`` starts in the staged plane: the pad value's row outside it."""
    return ih * sw * wq if 0 <= ih < height else pad_row


@numba.njit(cache=CACHE, inline="always")
def _max_row3x3(out, n, c, oh, count, staged, rows, dw, sw, wq):
    """Output row ``oh`` of a 3x3 maxpool in one pass: each output is the max of its nine
    staged taps (rows outside the input read the pad value's row), combined in kernel
    row-major order as the general path does, written once instead of read and written
    back per tap."""
    t0, t1, t2 = 0, dw, 2 * dw
    o0 = (t0 % sw) * wq + t0 // sw
    o1 = (t1 % sw) * wq + t1 // sw
    o2 = (t2 % sw) * wq + t2 // sw
    r0, r1, r2 = rows
    for t in range(count):
        a = staged[U(r0 + o0) + U(t)]
        a = nan_max(a, staged[U(r0 + o1) + U(t)])
        a = nan_max(a, staged[U(r0 + o2) + U(t)])
        a = nan_max(a, staged[U(r1 + o0) + U(t)])
        a = nan_max(a, staged[U(r1 + o1) + U(t)])
        a = nan_max(a, staged[U(r1 + o2) + U(t)])
        a = nan_max(a, staged[U(r2 + o0) + U(t)])
        a = nan_max(a, staged[U(r2 + o1) + U(t)])
        out[n, c, oh, U(t)] = nan_max(a, staged[U(r2 + o2) + U(t)])


@numba.njit(cache=CACHE, inline="always")
def _mean_row2x2(out, n, c, oh, count, staged, r0, r1, dw, sw, wq, divisor):
    """Output row ``oh`` of a 2x2 average pool whose windows are all whole (DenseNet's
    transitions) in one pass: the four taps' staged runs summed in kernel row-major order, as
    the general path sums them, and divided once, written once instead of read and written
    back per tap."""
    o0 = 0
    o1 = (dw % sw) * wq + dw // sw
    for t in range(count):
        a = staged[U(r0 + o0) + U(t)] + staged[U(r0 + o1) + U(t)]
        a = a + staged[U(r1 + o0) + U(t)]
        out[n, c, oh, U(t)] = (a + staged[U(r1 + o1) + U(t)]) / divisor


@numba.njit(cache=CACHE, inline="always")
def nan_max(a, v):
    """max(a, v) where a NaN wins and stays, as with np.maximum."""
    return v if v > a or v != v else a


@numba.njit(cache=CACHE)
def _pool_plane(x, out, plane, staged, wq, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, mode):
    """Pool plane ``plane`` (image ``plane // C``, channel ``plane % C``) of ``x`` into
    ``out``.  Each input row is first staged split into its ``sw`` column phases (``staged``
    row r, phase q at ``(r*sw + q)*wq``; the padding columns hold the pad value, written when
    the buffer was made), so that a kernel tap reads the outputs' inputs of a row as one contiguous
    run: tap j of output ow is phase (j*dw) % sw at index ow + (j*dw) // sw.  Then each output
    row is its own accumulator, combined with one staged run per tap inside the input rows.
    A plain function called from the parallel loop: numba's parallel passes then see a
    one-line loop, which keeps compilation fast.  No views are made (a view costs an atomic
    reference count update, which threads contend for)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    out_h, out_w = out.shape[2], out.shape[3]
    n, c = plane // channels, plane % channels
    is_max = mode == MAX
    start = out.dtype.type(-np.inf) if is_max else out.dtype.type(0)
    for ih in range(height):
        stage_row(staged, ih * sw * wq, wq, x, n, c, ih, pl, sw, wq)
    # interior columns: every tap inside the input (their divisor along W is kw)
    col_first = min(out_w, floor_div(pl + sw - 1, sw))
    last_start = width - 1 - (kw - 1) * dw + pl
    col_end = max(col_first, min(out_w, floor_div(last_start, sw) + 1 if last_start >= 0
                                 else 0))
    three_by_three = is_max and kh == 3 and kw == 3
    pad_row = height * sw * wq  # the staged row past the input: the pad value throughout
    for oh in range(out_h):
        h0 = oh * sh - pt
        if three_by_three:
            rows = (_staged_row(h0, height, sw, wq, pad_row),
                    _staged_row(h0 + dh, height, sw, wq, pad_row),
                    _staged_row(h0 + 2 * dh, height, sw, wq, pad_row))
            _max_row3x3(out, n, c, oh, out_w, staged, rows, dw, sw, wq)
            continue
        i0, i1 = _tap_range(h0, kh, dh, height)
        whole = i1 - i0 == kh and col_first == 0 and col_end == out_w
        if not is_max and whole and kh == 2 and kw == 2:
            _mean_row2x2(out, n, c, oh, out_w, staged, h0 * sw * wq, (h0 + dh) * sw * wq, dw,
                         sw, wq, out.dtype.type(4))
            continue
        for ow in range(out_w):
            out[n, c, oh, ow] = start
        for i in range(i0, i1):
            row = (h0 + i * dh) * sw * wq
            for j in range(kw):
                tap = j * dw
                _combine_row(out, n, c, oh, out_w, staged,
                             row + (tap % sw) * wq + tap // sw, is_max)
        if is_max:
            continue
        if whole:
            # Every window of the row is whole (pools without padding): one divisor, a vector
            # loop rather than a test per output.
            divisor = out.dtype.type(kh * kw)
            for ow in range(out_w):
                out[n, c, oh, U(ow)] /= divisor
            continue
        if mode == AVERAGE_WITH_PAD:  # taps inside the explicitly padded rows
            rows = _tap_range(h0 + pt, kh, dh, height + pt + pb)[1]
        else:
            rows = i1 - i0
        for ow in range(out_w):
            if col_first <= ow < col_end:
                cols = kw
            elif mode == AVERAGE_WITH_PAD:
                cols = _tap_range(ow * sw, kw, dw, width + pl + pr)[1]
            else:
                j0, j1 = _tap_range(ow * sw - pl, kw, dw, width)
                cols = j1 - j0
            out[n, c, oh, ow] /= rows * cols


def _pool_kernel(x, out, staged, wq, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, mode):
    """out = pool(x): each (image, channel) plane on whichever thread is free (a fixed share
    per thread waits for its slowest thread), thread ``t`` staging into ``staged[t]``, whose
    padding already holds the pad value (-inf for max, 0 for the sums, whose divisors count
    only the real taps): see :meth:`DirectPool.run`."""
    for plane in prange(out.shape[0] * out.shape[1]):
        _pool_plane(x, out, plane, staged[numba.get_thread_id()], wq, kh, kw, sh, sw, dh, dw,
                    pt, pl, pb, pr, mode)


@functools.cache
def _compiled(dtype: np.dtype, layout: str) -> Callable[..., None]:
    """The kernel for one dtype and X layout, compiled (or loaded from numba's cache) on first
    use: "C" for contiguous inputs, whose staging copies LLVM vectorises (staging ResNet's
    stem maxpool input took 2.5 times longer through the any-layout version), "A" for strided
    ones, read in place."""
    item = numba.from_dtype(dtype)
    signature = types.void(types.Array(item, 4, layout, readonly=True),
                           types.Array(item, 4, "C"), types.Array(item, 2, "C"),
                           *[types.intp] * 12)
    return numba.njit(signature, parallel=True, cache=CACHE)(_pool_kernel)


def as_2d(geo: Any) -> tuple[tuple[int, ...], ...]:
    """(kernel, strides, dilations, begins, ends, input H x W) of the pooling as 2-D (1-D as
    2-D with a height of 1)."""
    if geo.spatial == 1:
        return ((1, *geo.kernel), (1, *geo.strides), (1, *geo.dilations), (0, *geo.begins),
                (0, *geo.ends), (1, geo.sizes[0]))
    return (geo.kernel, geo.strides, geo.dilations, geo.begins, geo.ends, geo.sizes)


def _phase_length(geo: Any) -> int:
    """wq: staged columns per phase, enough for every output and the furthest tap."""
    (_, kw), (_, sw), (_, dw) = as_2d(geo)[:3]
    return geo.out_shape[-1] + ((kw - 1) * dw) // sw


class DirectPool(Algorithm):
    """maxpool or avgpool by the parallel numba kernel; 1-D and 2-D only.

    Workspace: one staging buffer per numba thread, the input plane's rows split into column
    phases (see :func:`_pool_plane`), kept for the next call of the same problem.
    """

    name = "direct"
    # usability is decided by kernel_shape's length alone, not by the sizes
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: whole 2x2 average windows in one pass per row
    version = 2
    #: where its per-thread buffers are kept between calls
    scratch = _SCRATCH

    def __init__(self, operator: str):
        self.operator = operator
        super().__init__()

    def unusable_reason(self, problem: Problem) -> str | None:
        spatial = len(problem.shapes[0]) - 2
        if spatial > 2:
            return f"direct pools 1-D and 2-D inputs only, X is {spatial}-D"
        return None

    def _staging_shape(self, geo: Any) -> tuple[int, int]:
        """One plane's staged rows per numba thread, and one row more that holds only the pad
        value (what 3x3 maxpools read above and below the input)."""
        (_, sw), (height, _) = as_2d(geo)[1], as_2d(geo)[5]
        return thread_count(), (height + 1) * sw * _phase_length(geo)

    def workspace_bytes(self, problem: Problem) -> int:
        geo = pool_geometry(problem)
        workers, elements = self._staging_shape(geo)
        return workers * elements * np.dtype(geo.dtype).itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = pool_geometry(problem)
        x = inputs[0]
        out = np.empty(geo.out_shape, dtype=geo.dtype)
        if geo.spatial == 1:  # as 2-D with a height of 1
            x4, out4 = x[:, :, None, :], out[:, :, None, :]
        else:
            x4, out4 = x, out
        (kh, kw), (sh, sw), (dh, dw), (pt, pl), (pb, pr), _ = as_2d(geo)
        mode = (AVERAGE_WITH_PAD if geo.count_include_pad else AVERAGE) if geo.average else MAX
        # the operator too: maxpool's buffers are padded with -inf, avgpool's with 0
        key = (problem.operator, problem.key, thread_count())
        pad = -np.inf if mode == MAX else 0
        staged = _SCRATCH.take(key, lambda: (np.full(self._staging_shape(geo), pad,
                                                     dtype=geo.dtype),))
        layout = "C" if x4.flags.c_contiguous else "A"
        _compiled(np.dtype(geo.dtype), layout)(x4, out4, staged[0], _phase_length(geo), kh, kw,
                                               sh, sw, dh, dw, pt, pl, pb, pr, mode)
        _SCRATCH.give(key, staged)
        return out

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (0,) if heuristic.direct_first(problem) else (1,)


def algorithms() -> list[Algorithm]:
    return [DirectPool("maxpool"), DirectPool("avgpool")]
