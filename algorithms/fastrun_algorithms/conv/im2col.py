"""im2col: unfold the input patches into a matrix and hand the product to a matmul sub-problem.

Per image, the patches of every output position are copied into ``cols`` (C*R*S rows, one per
input channel and kernel tap; OH*OW columns, one per output position), and the weights, viewed
as (K, C*R*S), multiply it.  That orientation makes the product's rows the output channels and
its columns the output pixels, which is exactly the NCHW layout of one output image, so the
product needs no transpose.  With groups, the weights are viewed as (G, K/G, C/G*R*S) and
``cols`` as (G, C/G*R*S, OH*OW): one batched product covers all groups.
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
from fastrun_algorithms._common import CACHE, PARTS_PER_THREAD, ScratchPool, U, thread_count
from fastrun_algorithms.conv._gemm_common import (
    buffer,
    epilogue_in_place,
    item_type,
    matmul_problem,
    operands,
)
from fastrun_algorithms.conv._kernels_common import stage_row
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import residual_operand
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry


def _unfold_kernel(x: np.ndarray, n: int, r: int, s: int, sh: int, sw: int, dh: int, dw: int,
                   pt: int, pl: int, oh: int, ow: int, cols: np.ndarray,
                   staged: np.ndarray) -> None:
    """``cols[(c*R + i)*S + j, y*OW + z] = x[n, c, y*sh + i*dh - pt, z*sw + j*dw - pl]``, zero
    where that falls into the padding.

    Tasks are (channel, kernel row i), dealt in parts (:data:`PARTS_PER_THREAD`) to whichever
    thread is free.  For a task, thread ``t`` first stages the OH input rows that kernel row i
    reads into ``staged[t]``, padded and split into
    ``sw`` column phases (:func:`stage_row`: phase p holds padded columns ``m*sw + p``), so that
    tap (i, j) reads phase ``(j*dw) % sw`` from position ``(j*dw) // sw`` on: every row of
    ``cols`` is then filled by plain contiguous copies of OW values, one per output row, with
    no strided reads and no padding tests.  Staging costs one pass over the rows (R/sh times
    the input in all), and pays for itself many times at stride 2, where copying straight from
    the input meant a strided read per value; it pays at stride 1 too (measured 3x on a 3x3
    layer), because each row is then a branch-free copy.  The padding columns are the same for
    every row, so the buffers are zeroed once, when they are made (they are kept from one call
    of the problem to the next, see :class:`ScratchPool`), and stage_row only ever writes input
    values; output rows whose input row lies in the padding are zero-filled in ``cols``
    directly.
    """
    channels, height = x.shape[1], x.shape[2]
    wq = staged.shape[1] // (sw * oh)  # positions per phase row
    pitch = oh * wq  # values per phase
    tasks = channels * r
    parts = min(tasks, PARTS_PER_THREAD * staged.shape[0])
    pixels = oh * ow
    flat = cols.reshape(cols.size)
    for part in prange(parts):
        buf = staged[numba.get_thread_id()]
        for task in range(part * tasks // parts, (part + 1) * tasks // parts):
            c = task // r
            i = task - c * r
            for y in range(oh):
                h = y * sh + i * dh - pt
                if 0 <= h < height:
                    stage_row(buf, y * wq, pitch, x, n, c, h, pl, sw, wq)
            for j in range(s):
                column = j * dw
                first = (column % sw) * pitch + column // sw  # tap (i, j) in staged row 0
                row = (task * s + j) * pixels
                for y in range(oh):
                    h = y * sh + i * dh - pt
                    dst = row + y * ow
                    if 0 <= h < height:
                        src = first + y * wq
                        for z in range(ow):
                            flat[U(dst + z)] = buf[U(src + z)]
                    else:
                        for z in range(ow):
                            flat[U(dst + z)] = 0


@functools.cache
def _compiled_unfold(dtype: np.dtype, layout: str) -> Callable[..., None]:
    """The unfold kernel for one dtype and input layout ("C" contiguous, the fast case, or "A"
    for strided views), compiled (or loaded from numba's cache) on first use."""
    item = item_type(dtype)
    signature = types.void(types.Array(item, 4, layout, readonly=True), *[types.intp] * 11,
                           buffer(dtype, 2), buffer(dtype, 2))
    return numba.njit(signature, parallel=True, cache=CACHE)(_unfold_kernel)


def _staged_shape(geo: ConvGeometry) -> tuple[int, int]:
    """One staging buffer per numba thread (any thread may run any task): ``sw`` column phases
    of OH rows, each wide enough for every tap of every output column."""
    wq = geo.ow + (geo.s - 1) * geo.dil_w // geo.stride_w
    return thread_count(), geo.stride_w * geo.oh * wq


def _shapes(geo: ConvGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the weight matrix and of ``cols`` as the sub-problem takes them: plain 2-D
    without groups, batched over the groups otherwise."""
    rows = geo.cg * geo.r * geo.s
    pixels = geo.oh * geo.ow
    if geo.group == 1:
        return (geo.k, rows), (rows, pixels)
    return (geo.group, geo.kg, rows), (geo.group, rows, pixels)


@functools.lru_cache(maxsize=1024)
def _product(problem: Problem) -> Problem:
    geo = geometry(problem)
    a_shape, b_shape = _shapes(geo)
    return matmul_problem(a_shape, b_shape, geo.dtype)


#: The per-thread staging buffers of the problems run so far, zeroed once (ScratchPool).
_SCRATCH = ScratchPool()


class Im2colConv(ConvAlgorithm):
    """Unfold + one matmul sub-problem per image; usable for every parameter set.

    The unfold buffer is reused by all images.  With one image the product *is* the output (its
    (K, OH*OW) layout is one NCHW image), so nothing is copied and the epilogue runs on it right
    after it returns.  With more, each image's product is copied into its slot of the output
    and the epilogue applied to that slot while it is still in cache; per-image products keep
    the unfold buffer at one image's size, where one product for the whole batch would need N
    of them.

    REPRODUCIBLE as far as its matmul sub-problem is: the unfold is a copy, the epilogue is
    elementwise.
    """

    operator = "conv"
    name = "im2col"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the epilogue's HardSwish, sigmoid and SiLU in a vector loop of their own
    #: (``epilogue.finish_span``), 1.1-2.7x faster on 1x1 HardSwish layers
    version = 2
    sub_operators = ("matmul",)
    #: where the unfold's per-thread staging buffers are kept between calls
    scratch = _SCRATCH

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        """One product per image, all of the same shape."""
        return [_product(problem)] * geometry(problem).n

    def workspace_bytes(self, problem: Problem) -> int:
        """The unfold buffer and the unfold kernel's staging buffers, plus (with more than one
        image) the product of one image, which is held until it has been copied into the output
        and dropped before the next is made."""
        geo = geometry(problem)
        _, cols_shape = _shapes(geo)
        elements = math.prod(cols_shape) + math.prod(_staged_shape(geo))
        if geo.n > 1:
            elements += geo.k * geo.oh * geo.ow
        return elements * geo.itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        x, w, bias = operands(geo, inputs)
        product = _product(problem)
        a_shape, cols_shape = _shapes(geo)
        weights = w.reshape(a_shape)
        dtype = x.dtype
        out = None if geo.n == 1 else np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=dtype)
        cols = np.empty(cols_shape, dtype=dtype)
        key = (problem.key, thread_count())
        staged = _SCRATCH.take(key, lambda: np.zeros(_staged_shape(geo), dtype=dtype))
        unfold = _compiled_unfold(dtype, "C" if x.flags.c_contiguous else "A")
        cols2 = cols.reshape(-1, geo.oh * geo.ow)
        z = residual_operand(geo, inputs)
        for n in range(geo.n):
            unfold(x, n, geo.r, geo.s, geo.stride_h, geo.stride_w, geo.dil_h, geo.dil_w,
                   geo.pad_top, geo.pad_left, geo.oh, geo.ow, cols2, staged)
            result = ctx.call(product, weights, cols)
            if out is None:
                out = np.ascontiguousarray(result).reshape(1, geo.k, geo.oh, geo.ow)
                epilogue_in_place(out, bias, geo, z)
            else:
                np.copyto(out[n], result.reshape(geo.k, geo.oh, geo.ow))
                del result  # before the next product is allocated: one alive at a time
                epilogue_in_place(out[n:n + 1], bias, geo, z[n:n + 1] if geo.has_residual else z)
        _SCRATCH.give(key, staged)
        return geo.output_view(out)

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (3, 0)


def algorithms() -> list[Algorithm]:
    return [Im2colConv()]
