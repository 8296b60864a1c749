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
from fastrun_algorithms.conv._gemm_common import (
    buffer,
    epilogue_in_place,
    matmul_problem,
    operands,
    readonly,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry


def _unfold_kernel(x: np.ndarray, n: int, r: int, s: int, sh: int, sw: int, dh: int, dw: int,
                   pt: int, pl: int, oh: int, ow: int, cols: np.ndarray) -> None:
    """``cols[(c*R + i)*S + j, y*OW + z] = x[n, c, y*sh + i*dh - pt, z*sw + j*dw - pl]``, zero
    where that falls into the padding.

    One row of ``cols`` (one channel and tap) per parallel task.  The columns inside the input
    are found once per row rather than tested per element, so the copy loop has no branch and,
    for stride 1, reads and writes contiguously.
    """
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    taps = r * s
    for row in prange(channels * taps):
        c = row // taps
        i = (row - c * taps) // s
        j = row - c * taps - i * s
        start = j * dw - pl  # input column of output column 0
        z_lo = min(ow, max(0, -(start // sw)))
        z_hi = max(z_lo, min(ow, (width - 1 - start) // sw + 1))
        for y in range(oh):
            h = y * sh + i * dh - pt
            dst = cols[row, y * ow:(y + 1) * ow]
            if h < 0 or h >= height:
                for z in range(ow):
                    dst[z] = 0
                continue
            for z in range(z_lo):
                dst[z] = 0
            src = x[n, c, h, z_lo * sw + start:]
            if sw == 1:  # contiguous: a loop LLVM vectorises
                for z in range(z_hi - z_lo):
                    dst[z_lo + z] = src[z]
            else:
                for z in range(z_hi - z_lo):
                    dst[z_lo + z] = src[z * sw]
            for z in range(z_hi, ow):
                dst[z] = 0


@functools.cache
def _compiled_unfold(dtype: np.dtype) -> Callable[..., None]:
    """The unfold kernel for one dtype, compiled (or loaded from numba's cache) on first use."""
    signature = types.void(readonly(dtype, 4), *[types.intp] * 11, buffer(dtype, 2))
    return numba.njit(signature, parallel=True, cache=True)(_unfold_kernel)


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


class Im2colConv(Algorithm):
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

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        """One product per image, all of the same shape."""
        return [_product(problem)] * geometry(problem).n

    def workspace_bytes(self, problem: Problem) -> int:
        """The unfold buffer, plus (with more than one image) the product of one image, which is
        held until it has been copied into the output and dropped before the next is made."""
        geo = geometry(problem)
        _, cols_shape = _shapes(geo)
        elements = math.prod(cols_shape)
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
        unfold = _compiled_unfold(dtype)
        cols2 = cols.reshape(-1, geo.oh * geo.ow)
        for n in range(geo.n):
            unfold(x, n, geo.r, geo.s, geo.stride_h, geo.stride_w, geo.dil_h, geo.dil_w,
                   geo.pad_top, geo.pad_left, geo.oh, geo.ow, cols2)
            result = ctx.call(product, weights, cols)
            if out is None:
                out = np.ascontiguousarray(result).reshape(1, geo.k, geo.oh, geo.ow)
                epilogue_in_place(out, bias, geo)
            else:
                np.copyto(out[n], result.reshape(geo.k, geo.oh, geo.ow))
                del result  # before the next product is allocated: one alive at a time
                epilogue_in_place(out[n:n + 1], bias, geo)
        return geo.output_view(out)


def algorithms() -> list[Algorithm]:
    return [Im2colConv()]
