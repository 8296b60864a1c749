"""The naive conv: one dot product per output value, straight from the definition.

It is the library's own reference: every parameter set (groups, strides, dilations, asymmetric
pads, 1-D) goes through the same few lines, so when a fast algorithm and this one disagree the
fast one is the suspect.  Out-of-range taps are skipped (they read the zero padding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE
from fastrun_algorithms.conv._kernels_common import kernel_signature, operands, scalar_args
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import epilogue_residual, epilogue_value
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry


def _naive_kernel(x, w, bias, out, sh, sw, dh, dw, pt, pl, group, has_bias, code, low, high,
                  z, has_residual):
    """out[n, k, oh, ow] = act(bias[k] + sum over (c, i, j) of w[k, c, i, j] * x[n, g*cg + c,
    oh*sh - pt + i*dh, ow*sw - pl + j*dw] [+ z[n, k, oh, ow]]), summed in (c, i, j) order in the
    dtype of the operands, taps outside the input skipped."""
    batch, channels_out, out_h, out_w = out.shape
    cg, kernel_h, kernel_w = w.shape[1], w.shape[2], w.shape[3]
    height, width = x.shape[2], x.shape[3]
    kg = channels_out // group
    zero = out.dtype.type(0)
    for n in range(batch):
        for k in range(channels_out):
            c0 = (k // kg) * cg
            bias_k = bias[k] if has_bias else zero
            for oh in range(out_h):
                for ow in range(out_w):
                    acc = zero
                    for c in range(cg):
                        for i in range(kernel_h):
                            ih = oh * sh - pt + i * dh
                            if ih < 0 or ih >= height:
                                continue
                            for j in range(kernel_w):
                                iw = ow * sw - pl + j * dw
                                if 0 <= iw < width:
                                    acc += w[k, c, i, j] * x[n, c0 + c, ih, iw]
                    if has_residual:
                        out[n, k, oh, ow] = epilogue_residual(acc, bias_k, z[n, k, oh, ow],
                                                              code, low, high)
                    else:
                        out[n, k, oh, ow] = epilogue_value(acc, bias_k, code, low, high)


@functools.cache
def _compiled(dtype: np.dtype) -> Callable[..., None]:
    """The kernel for one dtype, compiled (or loaded from numba's cache) on first use.

    One signature with operands of any layout ("A"): the naive kernel is not about speed, and
    one compilation per dtype covers contiguous inputs and strided views alike.
    """
    return numba.njit(kernel_signature(dtype, "A"), cache=CACHE)(_naive_kernel)


class NaiveConv(ConvAlgorithm):
    """Direct nested loops, single-threaded: slow, usable for every conv problem, and the
    baseline that the fast algorithms' numbers and results are easiest to check against."""

    operator = "conv"
    name = "naive"
    attributes = AlgoAttribute.NAIVE | AlgoAttribute.REPRODUCIBLE

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        x, w, bias = operands(geo, inputs)
        out = np.empty((geo.n, geo.k, geo.oh, geo.ow), dtype=geo.dtype)
        _compiled(np.dtype(geo.dtype))(x, w, bias, out, *scalar_args(geo, inputs))
        return geo.output_view(out)

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (9, 0)  # last: the reference loops


def algorithms() -> list[Algorithm]:
    return [NaiveConv()]
