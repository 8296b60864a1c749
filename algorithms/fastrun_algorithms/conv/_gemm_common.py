"""What the GEMM-based conv algorithms (im2col, conv1x1, winograd) share.

They all reduce a convolution to matmul sub-problems that the framework searches first and
dispatches to its own best matmul algorithm, so they share how a sub-problem is spelled, how
inputs are viewed without copies, and how the numba helpers are compiled: lazily, once per
dtype, against explicit signatures, so that loading the plugin compiles nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import prange, types

from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, FASTMATH
from fastrun_algorithms.conv.epilogue import epilogue_args, finish_span
from fastrun_algorithms.conv.geometry import ConvGeometry


def matmul_problem(a_shape: Sequence[int], b_shape: Sequence[int], dtype: str) -> Problem:
    """The matmul sub-problem ``A @ B`` for operands of exactly these shapes."""
    return _matmul_problem(tuple(a_shape), tuple(b_shape), str(dtype))


@functools.lru_cache(maxsize=4096)
def _matmul_problem(a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: str) -> Problem:
    """Built once per shape: every call of a GEMM-based conv asks for its sub-problem, and
    building one (its canonical key text) costs microseconds that a small layer on many cores
    cannot spare."""
    return Problem.create("matmul", (a_shape, b_shape), (dtype, dtype))


def operands(geo: ConvGeometry,
             inputs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """X as (N, C, H, W), W as (K, C/group, R, S) (views, never copies) and the bias or None."""
    x, w = geo.as_4d(np.asarray(inputs[0]), np.asarray(inputs[1]))
    bias = np.asarray(inputs[2]) if geo.has_bias else None
    return x, w, bias


@functools.cache
def no_bias(dtype: np.dtype) -> np.ndarray:
    """A shared, read-only one-element zero for kernels whose signature needs a bias array when
    the problem has none (so that no call allocates one)."""
    zero = np.zeros(1, dtype=dtype)
    zero.flags.writeable = False
    return zero


def item_type(dtype: Any) -> types.Type:
    """numba's scalar type for a numpy dtype."""
    return numba.from_dtype(np.dtype(dtype))


def readonly(dtype: Any, ndim: int) -> types.Array:
    """An input operand of any layout: one compiled variant serves contiguous arrays and strided
    views alike (writable arrays convert to it)."""
    return types.Array(item_type(dtype), ndim, "A", readonly=True)


def buffer(dtype: Any, ndim: int) -> types.Array:
    """A C-contiguous array the caller allocated for the kernel to write."""
    return types.Array(item_type(dtype), ndim, "C")


def worker_count(items: int) -> int:
    """Workers of a kernel that gives each worker its own scratch buffers: one per numba thread,
    but never more than there are work items (an idle worker would only hold memory)."""
    return max(1, min(numba.get_num_threads(), items))


def _epilogue_kernel(out: np.ndarray, bias: np.ndarray, has_bias: bool, code: int, low: float,
                     high: float, z: np.ndarray, has_residual: bool) -> None:
    """Bias, residual and activation in place on ``out`` (images, channels, pixels), one pass,
    parallel over the (image, channel) planes: on many cores a serial pass over a ResNet
    activation would cost as much as the product before it."""
    images, channels = out.shape[0], out.shape[1]
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    for plane in prange(images * channels):
        n = plane // channels
        k = plane - n * channels
        b = bias[k] if has_bias else bias[0] - bias[0]
        finish_span(out[n, k], 0, out.shape[2], b, z[n, k] if has_residual else z[0, 0],
                    has_residual, code, low_v, high_v)


@functools.cache
def _compiled_epilogue(dtype: np.dtype) -> Any:
    signature = types.void(buffer(dtype, 3), readonly(dtype, 1), types.boolean, types.intp,
                           types.float64, types.float64,
                           types.Array(item_type(dtype), 3, "C", readonly=True), types.boolean)
    return numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(_epilogue_kernel)


def epilogue_in_place(out: np.ndarray, bias: np.ndarray | None, geo: ConvGeometry,
                      residual: np.ndarray) -> None:
    """The fused epilogue on a block of output (images, channels, ...), C-contiguous, with
    ``residual`` (the matching block of :func:`.epilogue.residual_operand`: Z, or its
    placeholder when the problem has none) added before the activation.

    One pass instead of numpy's two or three (add, add, then maximum/clip), and without
    numpy's hidden memory: numpy adds a broadcast bias through an iteration buffer of up to
    ``np.getbufsize()`` elements when the output is small, which would make
    ``workspace_bytes`` untrue.  Nothing runs when there is neither bias, residual nor
    activation.
    """
    if bias is None and not geo.has_residual and geo.activation == "none":
        return
    kernel = _compiled_epilogue(out.dtype)
    kernel(out.reshape(out.shape[0], out.shape[1], -1),
           no_bias(out.dtype) if bias is None else bias, bias is not None, *epilogue_args(geo),
           residual.reshape(residual.shape[0], residual.shape[1], -1), geo.has_residual)
