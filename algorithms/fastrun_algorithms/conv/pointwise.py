"""Pointwise (1x1, stride 1, no padding, one group) convolutions as blocks of single-threaded
OpenBLAS products on numba's workers, each block finished by the epilogue while it is in cache.

Why it exists.  ``conv1x1`` computes the whole output with one matmul sub-problem and then runs
the epilogue (bias, residual, activation) as a second parallel pass over it.  The 1x1 layers of
MobileNetV2 have few input channels (24 to 320) for their output (up to 1.8 MB at 56x56), so
they are bound by memory more than by arithmetic, and the second pass over an output that has
left the cache costs about as much as the product.  Here each task computes one block of
output channels x pixels with one ``sgemm`` call and applies the epilogue to that block right
away, so the output is written once; and it takes one parallel region instead of two.

How.  Image ``n`` viewed as (C, H*W) is the right operand where it lies, and the weights (K, C)
the left one, so a block (k0:k1, p0:p1) of the output is ``W[k0:k1] @ X[n][:, p0:p1]`` with row
strides C, H*W and H*W: pointers into the operands, no copies.  Blocks are small enough to give
every thread several (:func:`plan`), and workers take them one at a time from a shared counter
(``_common.next_task``), so a worker that falls behind holds nothing up.  The gemm is the one
``blas_split`` calls (numpy's OpenBLAS, on the calling thread: ``fastrun/devices/cpu/threads.py``).

REPRODUCIBLE: each output value is summed over C by one gemm call, whichever worker makes it,
and the blocks depend only on the problem and the thread count, which is part of the CPU
device's cache category.  Between thread counts the last bits may differ (OpenBLAS's kernels for
a block's edges follow the block shape), as with ``blas_split``.
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
from fastrun_algorithms._common import FASTMATH, next_task, thread_count
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._gemm_common import (
    buffer,
    epilogue_in_place,
    item_type,
    no_bias,
    operands,
    readonly,
    worker_count,
)
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.conv1x1 import reads_input_in_place
from fastrun_algorithms.conv.epilogue import (
    epilogue_args,
    finish_span,
    residual_operand,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.matmul.blas_split import (
    NO_TRANS,
    ROW_MAJOR,
    _gemm_functions,
    gemm_unusable_reason,
)

#: Tasks per thread the plan aims for: enough for the counter to even out a slow worker.
TASKS_PER_THREAD = 4
#: Fewest pixels per block (a multiple of 16 floats: whole 512-bit vectors for OpenBLAS).
MIN_PIXELS = 64
#: Fewest output channels per block when the channels are split too.
MIN_CHANNELS = 16


def plan(images: int, channels: int, pixels: int, threads: int) -> tuple[int, int]:
    """(output channels, pixels) per block.  Pixels are split first, since a block of all the
    output channels packs each input column once; channels only when the pixels alone make
    too few blocks (the 7x7 layers)."""
    wanted = max(1, TASKS_PER_THREAD * threads)
    per_image = -(-wanted // max(images, 1))
    pixel_blocks = max(1, min(per_image, pixels // MIN_PIXELS))
    pb = -(-pixels // pixel_blocks)
    pb = min(pixels, -(-pb // 16) * 16)
    channel_blocks = max(1, min(-(-per_image // pixel_blocks), channels // MIN_CHANNELS))
    kb = -(-channels // channel_blocks)
    return kb, pb


def _pointwise_kernel(gemm: Callable[..., None]) -> Callable[..., None]:
    """The parallel loop for one gemm function (built at run time, as in ``blas_split``: the
    function's address is only known once numpy's OpenBLAS is loaded)."""

    def kernel(x, w, bias, out, has_bias, code, low, high, z, has_residual, kb, pb, workers,
               counter):
        images, channels, pixels = out.shape
        inputs = x.shape[1]
        item = out.itemsize
        kblocks = (channels + kb - 1) // kb
        pblocks = (pixels + pb - 1) // pb
        per_image = kblocks * pblocks
        tasks = images * per_image
        x0, w0, o0 = np.int64(x.ctypes.data), np.int64(w.ctypes.data), np.int64(out.ctypes.data)
        finish = has_bias or has_residual or code != 0
        low_v, high_v = out.dtype.type(low), out.dtype.type(high)
        counter[0] = 0
        for _ in prange(workers):
            while True:
                task = next_task(counter)
                if task >= tasks:
                    break
                n = task // per_image
                rest = task - n * per_image
                k0 = (rest // pblocks) * kb
                p0 = (rest % pblocks) * pb
                rows = min(kb, channels - k0)
                cols = min(pb, pixels - p0)
                gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, rows, cols, inputs, 1.0,
                     w0 + k0 * inputs * item, inputs,
                     x0 + (n * inputs * pixels + p0) * item, pixels, 0.0,
                     o0 + ((n * channels + k0) * pixels + p0) * item, pixels)
                if not finish:
                    continue
                for k in range(k0, k0 + rows):
                    b = bias[k] if has_bias else bias[0] - bias[0]
                    z_row = z[n, k] if has_residual else z[0, 0]
                    finish_span(out[n, k], p0, cols, b, z_row, has_residual, code, low_v,
                                high_v)

    return kernel


@functools.cache
def _compiled(dtype: str) -> Callable[..., None]:
    signature = types.void(
        readonly(dtype, 3), readonly(dtype, 2), readonly(dtype, 1), buffer(dtype, 3),
        types.boolean, types.intp, types.float64, types.float64,
        types.Array(item_type(dtype), 3, "C", readonly=True), types.boolean, types.intp,
        types.intp, types.intp, types.Array(types.int64, 1, "C"))
    kernel = _pointwise_kernel(_gemm_functions()[0][dtype])
    return numba.njit(signature, parallel=True, fastmath=FASTMATH)(kernel)


class PointwiseConv(ConvAlgorithm):
    """1x1 stride-1 unpadded single-group conv as epilogue-finished gemm blocks on numba's
    workers (see the module docstring)."""

    operator = "conv"
    name = "pointwise"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the epilogue in vector loops (``epilogue.finish_span``)
    version = 2

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if geo.r != 1 or geo.s != 1:
            return f"pointwise needs a 1x1 kernel, got {geo.r}x{geo.s}"
        if not reads_input_in_place(geo):
            return "pointwise needs stride 1 and no padding (conv1x1 gathers the pixels)"
        if geo.group != 1:
            return f"pointwise takes one group, got {geo.group}"
        return gemm_unusable_reason(geo.dtype)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        x, w, bias = operands(geo, inputs)
        pixels = geo.oh * geo.ow
        out = np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=geo.dtype)
        if out.size == 0 or geo.c == 0:
            return _empty_product(out, bias, geo, inputs)
        x3 = np.ascontiguousarray(x).reshape(geo.n, geo.c, pixels)
        w2 = np.ascontiguousarray(w.reshape(geo.k, geo.c))
        z = residual_operand(geo, inputs)
        z3 = z.reshape(geo.n, geo.k, pixels) if geo.has_residual else z.reshape(1, 1, 1)
        kb, pb = plan(geo.n, geo.k, pixels, thread_count())
        tasks = geo.n * -(-geo.k // kb) * -(-pixels // pb)
        _compiled(geo.dtype)(
            x3, w2, bias if bias is not None else no_bias(np.dtype(geo.dtype)),
            out.reshape(geo.n, geo.k, pixels), bias is not None, *epilogue_args(geo), z3,
            geo.has_residual, kb, pb, worker_count(tasks), np.zeros(1, dtype=np.int64))
        return geo.output_view(out)

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        many = geo.n == 1 and thread_count() >= heuristic.POINTWISE_MIN_THREADS
        return (0, 1) if many else (0, 3)


def _empty_product(out: np.ndarray, bias: np.ndarray | None, geo: ConvGeometry,
                   inputs: Sequence[Any]) -> np.ndarray:
    """No input channels: every output value is the epilogue of a zero sum."""
    out[...] = 0
    if out.size:
        epilogue_in_place(out, bias, geo, residual_operand(geo, inputs))
    return geo.output_view(out)


def algorithms() -> list[Algorithm]:
    return [PointwiseConv()]
