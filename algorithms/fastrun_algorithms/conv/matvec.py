"""Convolutions with one output pixel whose kernel covers the whole input: a matrix-vector
product per image, parallel over output channels, the epilogue applied as each value is stored.

Why it exists.  A squeeze-excitation block (MobileNetV3, EfficientNet, RegNetY) pools its
input to 1x1 and runs two 1x1 convolutions on that vector, e.g. 960 -> 240 -> 960 channels.
Each is a (K, C) @ (C,) product whose cost is reading the weights once (920 KB for 960 x 240).
``conv1x1`` makes it a matmul sub-problem that OpenBLAS runs on one thread, then applies the
epilogue in a second call; the layer took 75-150 us inside MobileNetV3-Large on the 2-core VM,
where onnxruntime's took 35-54 us.  Here one parallel loop reads each weight row once, on
every thread, and finishes each output where it is summed.  The same holds for any layer
whose kernel spans the input with no padding (a classifier written as a convolution): the
weights of output channel k, (C, R, S), and image n's input, (C, H, W), are then two
contiguous vectors of the same length.

How.  A task takes four output channels of one image and keeps, for each, ``2 x lanes``
partial sums on the stack (:func:`fastrun_algorithms._common.stack_buffer`): the sum steps
through the row two vectors at a time, so the loop is a vector loop with FMA contraction
alone (no reassociation).  With one vector per row LLVM left the loop scalar.  The partial sums
are then added in lane order.

REPRODUCIBLE: each output is summed in the same order by one task, whatever the thread count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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
    RunsThroughBind,
    U,
    stack_buffer,
    vector_registers,
)
from fastrun_algorithms.conv._gemm_common import buffer, item_type, no_bias, operands, readonly
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    epilogue_args,
    epilogue_residual,
    epilogue_value,
    residual_operand,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry

#: Output channels per task: four rows share each load of the input vector.
ROWS = 4
#: Partial sums per row: two vectors (see the module docstring).
LANES = 2 * vector_registers()[1]
_SUMS = ROWS * LANES


def _matvec_kernel(x, w, bias, has_bias, code, low, high, z, has_residual, out):
    """out[n, k] = epilogue(w[k] . x[n]); x (N, L), w (K, L), z (N, K) or a placeholder."""
    images, length = x.shape
    channels = w.shape[0]
    groups = (channels + ROWS - 1) // ROWS
    full = length - length % LANES
    last = channels - 1
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    for task in prange(groups * images):
        group = task // images
        n = task - group * images
        k0 = min(group * ROWS, max(0, channels - ROWS))
        w0, w1 = w[k0], w[min(k0 + 1, last)]
        w2, w3 = w[min(k0 + 2, last)], w[min(k0 + 3, last)]
        xn = x[n]
        acc = numba.carray(stack_buffer(_SUMS, out.dtype), (ROWS, LANES))
        for r in range(ROWS):
            for t in range(LANES):
                acc[r, t] = 0
        for c in range(0, full, LANES):
            for t in range(LANES):
                i = U(c) + U(t)
                v = xn[i]
                acc[0, t] += w0[i] * v
                acc[1, t] += w1[i] * v
                acc[2, t] += w2[i] * v
                acc[3, t] += w3[i] * v
        for c in range(full, length):
            t = c - full
            v = xn[c]
            acc[0, t] += w0[c] * v
            acc[1, t] += w1[c] * v
            acc[2, t] += w2[c] * v
            acc[3, t] += w3[c] * v
        for r in range(min(ROWS, channels)):
            total = acc[r, 0]
            for t in range(1, LANES):
                total += acc[r, t]
            k = k0 + r
            b = bias[k] if has_bias else total - total
            if has_residual:
                out[n, k] = epilogue_residual(total, b, z[n, k], code, low_v, high_v)
            else:
                out[n, k] = epilogue_value(total, b, code, low_v, high_v)


@functools.cache
def _compiled(dtype: str) -> Callable[..., None]:
    """The kernel for one dtype; X and W C-contiguous so that LLVM knows their strides."""
    c_in = functools.partial(types.Array, item_type(dtype), 2, "C", readonly=True)
    signature = types.void(c_in(), c_in(), readonly(dtype, 1), types.boolean, types.intp,
                           types.float64, types.float64, c_in(), types.boolean,
                           buffer(dtype, 2))
    return numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(_matvec_kernel)


def spans_input(geo: ConvGeometry) -> bool:
    """Whether every output is one whole-input dot product: one output pixel, the kernel the
    size of the unpadded input, one group."""
    return (geo.oh == geo.ow == 1 and (geo.r, geo.s) == (geo.h, geo.w) and geo.group == 1
            and not any((geo.pad_top, geo.pad_left, geo.pad_bottom, geo.pad_right)))


class MatvecConv(RunsThroughBind, ConvAlgorithm):
    """One matrix-vector product per image, parallel over output channels (see the module
    docstring)."""

    operator = "conv"
    name = "matvec"
    attributes = AlgoAttribute.REPRODUCIBLE

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if not spans_input(geo):
            return (f"matvec needs one group and an unpadded kernel the size of the input "
                    f"(got group {geo.group}, kernel {geo.r}x{geo.s} on {geo.h}x{geo.w}, "
                    f"output {geo.oh}x{geo.ow})")
        return None

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        geo = geometry(problem)
        kernel = _compiled(geo.dtype)
        epilogue = epilogue_args(geo)
        length = geo.c * geo.h * geo.w

        def call(*inputs: Any) -> np.ndarray:
            x, w, bias = operands(geo, inputs)
            out = np.empty((geo.n, geo.k), dtype=geo.dtype)
            z = residual_operand(geo, inputs)
            kernel(np.ascontiguousarray(x).reshape(geo.n, length),
                   np.ascontiguousarray(w).reshape(geo.k, length),
                   no_bias(out.dtype) if bias is None else bias, bias is not None, *epilogue,
                   z.reshape(z.shape[0], -1), geo.has_residual, out)
            return geo.output_view(out.reshape(geo.n, geo.k, 1, 1))
        return call

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (0, 0)


def algorithms() -> list[Algorithm]:
    return [MatvecConv()]
