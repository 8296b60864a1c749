"""1x1 convolutions as one matmul sub-problem, with no unfold at all in the common case.

A 1x1 kernel with stride 1 and no padding makes im2col's patch matrix the input itself: image
``n`` viewed as (C, H*W) *is* the right operand, so the weights (K, C) multiply the input where
it lies.  All images go into one product, (K, C) @ (N, C, H*W) -> (N, K, H*W), which is already
the NCHW output: no copy on either side.  Groups batch the same way, (G, K/G, C/G) @
(N, G, C/G, H*W).  Strides and padding need a gather of the sampled pixels into a buffer
(zeros where the kernel sits on padding) first; dilation means nothing for a 1x1 kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import RunsThroughBind
from fastrun_algorithms.conv._gemm_common import epilogue_in_place, matmul_problem, operands
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import residual_operand
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry


def reads_input_in_place(geo: ConvGeometry) -> bool:
    """Whether the input is the product's operand as it is (stride 1, no padding)."""
    return (geo.stride_h == geo.stride_w == 1
            and geo.pad_top == geo.pad_left == geo.pad_bottom == geo.pad_right == 0)


def _shapes(geo: ConvGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Operand shapes of the one product: group and image dimensions only where they are > 1,
    so the common case is a plain 2-D product."""
    pixels = geo.oh * geo.ow
    a_shape: tuple[int, ...] = (geo.k, geo.c)
    b_shape: tuple[int, ...] = (geo.c, pixels)
    if geo.group > 1:
        a_shape = (geo.group, geo.kg, geo.cg)
        b_shape = (geo.group, geo.cg, pixels)
    if geo.n > 1:
        b_shape = (geo.n, *b_shape)
    return a_shape, b_shape


@functools.lru_cache(maxsize=1024)
def _product(problem: Problem) -> Problem:
    geo = geometry(problem)
    a_shape, b_shape = _shapes(geo)
    return matmul_problem(a_shape, b_shape, geo.dtype)


def _gather(x: np.ndarray, geo: ConvGeometry) -> np.ndarray:
    """The pixels a strided or padded 1x1 kernel reads, as a contiguous (N, C, OH, OW) buffer:
    ``x[n, c, y*sh - pt, z*sw - pl]``, zero where that lies in the padding."""
    def inside(pad: int, stride: int, size: int, count: int) -> tuple[int, int]:
        # output indices o with 0 <= o*stride - pad < size
        lo = min(count, -(-pad // stride))
        hi = max(lo, min(count, (size - 1 + pad) // stride + 1))
        return lo, hi

    y_lo, y_hi = inside(geo.pad_top, geo.stride_h, geo.h, geo.oh)
    z_lo, z_hi = inside(geo.pad_left, geo.stride_w, geo.w, geo.ow)
    padded = (y_lo, z_lo, y_hi, z_hi) != (0, 0, geo.oh, geo.ow)
    gathered = (np.zeros if padded else np.empty)((geo.n, geo.c, geo.oh, geo.ow), x.dtype)
    if y_lo == y_hi or z_lo == z_hi:  # every sampled pixel lies in the padding
        return gathered
    h0, w0 = y_lo * geo.stride_h - geo.pad_top, z_lo * geo.stride_w - geo.pad_left
    np.copyto(gathered[:, :, y_lo:y_hi, z_lo:z_hi],
              x[:, :, h0:h0 + (y_hi - y_lo - 1) * geo.stride_h + 1:geo.stride_h,
                w0:w0 + (z_hi - z_lo - 1) * geo.stride_w + 1:geo.stride_w])
    return gathered


class Conv1x1(RunsThroughBind, ConvAlgorithm):
    """1x1 kernels as one matmul sub-problem over all images and groups.

    With stride 1 and no padding it allocates nothing but what the product returns, which is
    the output itself; otherwise the gathered input is its workspace.  The whole output comes
    out of one product, so the epilogue runs once over it right after the product returns
    (splitting the product to apply it in smaller pieces would cost a copy of the output).
    REPRODUCIBLE as far as its matmul sub-problem is.
    """

    operator = "conv"
    name = "conv1x1"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: the epilogue's HardSwish, sigmoid and SiLU in a vector loop of their own
    #: (``epilogue.finish_span``), 1.1-2.7x faster on 1x1 HardSwish layers
    version = 2
    sub_operators = ("matmul",)

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if geo.r != 1 or geo.s != 1:
            return f"conv1x1 needs a 1x1 kernel, got {geo.r}x{geo.s}"
        return None

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        return [_product(problem)]

    def workspace_bytes(self, problem: Problem) -> int:
        """The gathered input when stride or padding make one necessary, else nothing."""
        geo = geometry(problem)
        if reads_input_in_place(geo):
            return 0
        return geo.n * geo.c * geo.oh * geo.ow * geo.itemsize

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        geo = geometry(problem)
        a_shape, b_shape = _shapes(geo)
        in_place = reads_input_in_place(geo)
        product = _product(problem)
        out_shape = (geo.n, geo.k, geo.oh, geo.ow)

        def call(*inputs: Any) -> np.ndarray:
            x, w, bias = operands(geo, inputs)
            pixels = x if in_place else _gather(x, geo)
            result = ctx.call(product, w.reshape(a_shape), pixels.reshape(b_shape))
            del pixels  # the gathered buffer is not needed once the product exists
            out = np.ascontiguousarray(result).reshape(out_shape)
            epilogue_in_place(out, bias, geo, residual_operand(geo, inputs))
            return geo.output_view(out)
        return call

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (0, 2)


def algorithms() -> list[Algorithm]:
    return [Conv1x1()]
