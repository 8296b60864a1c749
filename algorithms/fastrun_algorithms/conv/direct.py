"""Direct convolution in parallel numba: no unfolded copy of the input.

Made for layers where im2col's unfold is mostly copying and a GEMM has too little depth to pay
for it: few input channels on large images (the RGB first layer, 3->64 7x7 stride 2 on
224x224), grouped layers with small groups, odd strides and dilations.  It is usable for every
parameter set.

Work is split into tasks of (image, block of ``kb`` output channels of one group, block of
output rows), so that even batch 1 keeps every core busy.  For each input channel a task stages
the input rows its output rows read (padded and phase-split, see :mod:`._kernels_common`; a few
kilobytes, never the whole padded input), then adds the kernel taps to its accumulators in
passes of four output channels by up to four taps: the loop over the block's outputs is
innermost, long and contiguous.  Finally the accumulators go through the epilogue into the
output.  Summation order is fixed by the loops (input channel, then the taps in row-major
order), independent of the thread count: reproducible.
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
from fastrun_algorithms._common import CACHE, FASTMATH, thread_count
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._kernels_common import (
    LANES,
    aligned_empty,
    aligned_nbytes,
    block_positions,
    block_width,
    chunk_taps,
    kernel_signature,
    layout,
    next_tap,
    operands,
    rows4_taps1,
    rows4_taps2,
    rows4_taps3,
    rows4_taps4,
    scalar_args,
    stage_block,
    staged_size,
    store_rows,
    tap_after_pass,
    tap_offset,
)
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry

#: Output-channel block sizes of the registered configurations, in order of preference (the
#: heuristic keeps registration order among equals).  Larger blocks were faster on one core in
#: every layer measured (they share each staged input block among more channels): 32 by 5-25%
#: over 8 on ResNet-18 and MobileNetV2 layers.  8 keeps more tasks for two cores on small
#: outputs and wastes less on groups of a few channels.
BLOCKS = (32, 8)
#: Outputs (including each row's junk tail) a task aims to cover per pass.  A pass costs a fixed
#: ~70 cycles of setup (mostly LLVM's runtime aliasing checks between the four accumulator rows
#: and the staged input), so passes should be long; 1024 measured 5-25% faster than 256 on
#: ResNet and MobileNet layers, with the accumulators then in L2 rather than L1.
PASS_LENGTH = 1024


@numba.njit(cache=CACHE, fastmath=FASTMATH)
def _direct_worker(worker, workers, x, w, bias, out, sh, sw, dh, dw, pt, pl, group, has_bias,
                   code, low, high, z, has_residual, kb, ob, acc, xs):
    """Worker ``worker`` of ``workers``: its contiguous share of the tasks, with its own
    accumulators ``acc`` (4, row groups, positions) and staged block ``xs``.

    Output channel ``k0 + r`` of a task accumulates in ``acc[r % 4, r // 4]``.  Passes always
    cover four rows; when a task has fewer than a multiple of four channels, the missing rows
    repeat the last channel's weights and are never stored.  A plain function called from the
    parallel loop rather than the loop's body itself: numba's parallel passes then see a
    one-line loop, which keeps compilation several times faster.
    """
    batch, channels_out, out_h, out_w = out.shape
    cg, kernel_h, kernel_w = w.shape[1], w.shape[2], w.shape[3]
    kg = channels_out // group
    kblocks = (kg + kb - 1) // kb
    rblocks = (out_h + ob - 1) // ob
    per_image = group * kblocks * rblocks
    tasks = batch * per_image
    hb = ob + (kernel_h - 1) * dh // sh
    wq = out_w + (kernel_w - 1) * dw // sw
    for u in range(xs.shape[0]):
        xs[u] = 0  # the padding columns, once (see stage_row)
    for task in range(worker * tasks // workers, (worker + 1) * tasks // workers):
        n = task // per_image
        rest = task - n * per_image
        kblock = rest // rblocks
        oh0 = (rest - kblock * rblocks) * ob
        g = kblock // kblocks
        k0 = g * kg + (kblock - g * kblocks) * kb
        rows = min(kb, (g + 1) * kg - k0)
        last = k0 + rows - 1
        t_rows = min(ob, out_h - oh0)
        length = -(-((t_rows - 1) * wq + out_w) // LANES) * LANES
        for q in range(0, rows, 4):
            for r in range(4):
                for u in range(length):
                    acc[r, q // 4, u] = 0
        for cc in range(cg):
            stage_block(xs, x, n, g * cg + cc, oh0 * sh, hb, wq, sh, sw, pt, pl)
            i0, j0 = 0, 0
            remaining = kernel_h * kernel_w
            while remaining > 0:
                taps = chunk_taps(remaining)
                i1, j1 = next_tap(i0, j0, kernel_w)
                i2, j2 = next_tap(i1, j1, kernel_w)
                i3, j3 = next_tap(i2, j2, kernel_w)
                ij = (i0, j0, i1, j1, i2, j2, i3, j3)
                d = (tap_offset(i0, j0, dh, dw, sh, sw, hb, wq),
                     tap_offset(i1, j1, dh, dw, sh, sw, hb, wq),
                     tap_offset(i2, j2, dh, dw, sh, sw, hb, wq),
                     tap_offset(i3, j3, dh, dw, sh, sw, hb, wq))
                for q in range(0, rows, 4):
                    ks = (k0 + q, min(k0 + q + 1, last), min(k0 + q + 2, last),
                          min(k0 + q + 3, last))
                    if taps == 4:
                        rows4_taps4(acc, q // 4, w, ks, cc, ij, xs, d, length)
                    elif taps == 3:
                        rows4_taps3(acc, q // 4, w, ks, cc, ij, xs, d, length)
                    elif taps == 2:
                        rows4_taps2(acc, q // 4, w, ks, cc, ij, xs, d, length)
                    else:
                        rows4_taps1(acc, q // 4, w, ks, cc, ij, xs, d, length)
                i0, j0 = tap_after_pass(taps, i1, j1, i2, j2, i3, j3, kernel_w)
                remaining -= taps
        for r in range(rows):
            k = k0 + r
            bias_k = bias[k] if has_bias else acc.dtype.type(0)
            store_rows(out, n, k, oh0, t_rows, acc, r % 4, r // 4, wq, bias_k, code, low,
                       high, z, has_residual)


def _direct_kernel(x, w, bias, out, sh, sw, dh, dw, pt, pl, group, has_bias, code, low, high,
                   z, has_residual, kb, ob, acc_ws, stage_ws):
    """out = act(conv(x, w) + bias [+ z]), split over ``len(acc_ws)`` workers (see the module
    docstring); worker ``t`` uses ``acc_ws[t]`` and ``stage_ws[t]``, so the kernel allocates
    nothing itself."""
    workers = acc_ws.shape[0]
    for worker in prange(workers):
        _direct_worker(worker, workers, x, w, bias, out, sh, sw, dh, dw, pt, pl, group,
                       has_bias, code, low, high, z, has_residual, kb, ob, acc_ws[worker],
                       stage_ws[worker])


@functools.cache
def _compiled(dtype: np.dtype, array_layout: str) -> Callable[..., None]:
    """The kernel for one dtype and operand layout, compiled (or loaded from numba's cache) on
    first use, so that only the variants actually used are compiled."""
    item = numba.from_dtype(dtype)
    signature = kernel_signature(dtype, array_layout, types.intp, types.intp,
                                 types.Array(item, 4, "C"), types.Array(item, 2, "C"))
    return numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(_direct_kernel)


class DirectConv(ConvAlgorithm):
    """Parallel direct convolution with ``param = {"kb": output channels per task}``.

    A larger block shares each staged input block among more output channels and makes fewer
    tasks; a smaller one balances better on small outputs and wastes less when a group has
    only a few output channels.
    """

    operator = "conv"
    name = "direct"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: relu and clip stored as clamps, a vector loop (``store_rows``); 3: the other
    #: activations in vector loops (``epilogue.finish_span``)
    version = 3

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        kb = self.param.get("kb")
        if not isinstance(kb, int) or isinstance(kb, bool) or kb < 1:
            raise ValueError(f"direct conv needs a positive integer 'kb' (output channels per "
                             f"task) in its parameters, got {self.param!r}")
        self.kb: int = kb

    def block(self, geo: ConvGeometry) -> int:
        """Output channels per task, never more than a group has."""
        return min(self.kb, geo.kg)

    @staticmethod
    def row_block(geo: ConvGeometry) -> int:
        """Output rows per task: about :data:`PASS_LENGTH` outputs per pass."""
        return max(1, min(geo.oh, -(-PASS_LENGTH // block_width(geo))))

    def workers(self, geo: ConvGeometry) -> int:
        """One set of buffers per numba thread, but no more than there are tasks."""
        tasks = (geo.n * geo.group * -(-geo.kg // self.block(geo))
                 * -(-geo.oh // self.row_block(geo)))
        return min(thread_count(), tasks)

    def _buffer_shapes(self, geo: ConvGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
        ob = self.row_block(geo)
        workers = self.workers(geo)
        return ((workers, 4, -(-self.block(geo) // 4), block_positions(geo, ob)),
                (workers, staged_size(geo, ob)))

    def workspace_bytes(self, problem: Problem) -> int:
        """Per worker, the accumulators of a task (the block's channels rounded up to a
        multiple of four, each a row block's positions) and its staged input block, in the
        problem's dtype, each buffer aligned (see :func:`aligned_empty`); allocated once per
        call before the kernel starts (the kernel allocates nothing)."""
        geo = geometry(problem)
        return sum(aligned_nbytes(shape, geo.dtype) for shape in self._buffer_shapes(geo))

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        x, w, bias = operands(geo, inputs)
        dtype = np.dtype(geo.dtype)
        out = np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=dtype)
        acc_shape, stage_shape = self._buffer_shapes(geo)
        acc_ws = aligned_empty(acc_shape, dtype)
        stage_ws = aligned_empty(stage_shape, dtype)
        _compiled(dtype, layout(x, w))(x, w, bias, out, *scalar_args(geo, inputs),
                                       self.block(geo),
                                       self.row_block(geo), acc_ws, stage_ws)
        return geo.output_view(out)

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (1, 3) if heuristic.few_channels(geo) else (4, 0)


def algorithms() -> list[Algorithm]:
    return [DirectConv({"kb": kb}) for kb in BLOCKS]
