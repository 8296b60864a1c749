"""conv_transpose's CPU algorithms.

``per_tap``: one BLAS product per kernel tap (and group), each added to the full result on the
tap's strided grid, then cropped (:func:`~.operator.spread_taps`).  kh * kw products of
(K, C) by (C, H*W) and as many strided passes over the output: good for a 2x2 stride-2
upsampling (four taps, each writing a disjoint quarter of the output), worse as the kernel
grows, since every tap makes a pass over the output.

``col2im``: one BLAS product for all taps, ``cols = W' (K*kh*kw, C) @ X (C, H*W)``, then a
numba pass that computes every output pixel once, in parallel over (image, output channel), by
gathering the taps that land on it: output row ``o`` takes input row ``(o + top - r*dh) / sh``
of tap row r where that divides exactly.  No output element is written twice, so there is no
race and no zeroing pass; the bias is added in the same pass.  Its workspace is ``cols``.

Both sum a pixel's contributions in a fixed order for a given shape: reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE
from fastrun_algorithms.conv_transpose.operator import (
    as_2d,
    geometry,
    output_shape,
    spread_taps,
)


class PerTapConvTranspose(Algorithm):
    """One BLAS product per kernel tap (see the module docstring)."""

    operator = "conv_transpose"
    name = "per_tap"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        geo = geometry(problem)
        item = np.dtype(problem.dtypes[0]).itemsize
        full = geo.batch * geo.out_channels * geo.full_h * geo.full_w
        product = geo.batch * geo.out_channels // geo.group * geo.height * geo.width
        return (full + product) * item

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        geo = geometry(problem)
        return (0.0,) if geo.kh * geo.kw <= 4 else (1.0,)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        bias = np.asarray(inputs[2]) if geo.has_bias else None
        out = spread_taps(geo, np.asarray(inputs[0]), np.asarray(inputs[1]), bias)
        return out.reshape(output_shape(problem))


@numba.njit(parallel=True, cache=CACHE)
def _gather_taps(cols, bias, out, per_out, height, width, kh, kw, sh, sw, dh, dw, top, left,
                 has_bias):
    """out[n, k] from cols[n, g, (k % per_out) * kh * kw + r * kw + s, ih, iw]."""
    batch, channels, out_h, out_w = out.shape
    for job in prange(batch * channels):
        n = job // channels
        k = job - n * channels
        g = k // per_out
        row0 = (k - g * per_out) * kh * kw
        start = bias[k] if has_bias else out.dtype.type(0)
        for oh in range(out_h):
            for ow in range(out_w):
                out[n, k, oh, ow] = start
            for r in range(kh):
                y = oh + top - r * dh
                if y < 0 or y % sh:
                    continue
                ih = y // sh
                if ih >= height:
                    continue
                for s in range(kw):
                    tap = row0 + r * kw + s
                    for ow in range(out_w):
                        x = ow + left - s * dw
                        if x >= 0 and x % sw == 0 and x // sw < width:
                            out[n, k, oh, ow] += cols[n, g, tap, ih, x // sw]


class Col2imConvTranspose(Algorithm):
    """One BLAS product for every tap, then a parallel gather (see the module docstring)."""

    operator = "conv_transpose"
    name = "col2im"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        geo = geometry(problem)
        item = np.dtype(problem.dtypes[0]).itemsize
        return geo.batch * geo.out_channels * geo.kh * geo.kw * geo.height * geo.width * item

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        geo = geometry(problem)
        return (1.0,) if geo.kh * geo.kw <= 4 else (0.0,)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        x, w = as_2d(geo, np.asarray(inputs[0]), np.asarray(inputs[1]))
        per_in, per_out = geo.channels // geo.group, geo.out_channels // geo.group
        taps = per_out * geo.kh * geo.kw
        # (group, K/group * kh * kw, C/group): each group's weights with taps as rows
        weights = w.reshape(geo.group, per_in, taps).transpose(0, 2, 1)
        images = x.reshape(geo.batch, geo.group, per_in, geo.height * geo.width)
        cols = np.matmul(weights[None], images)  # (N, group, taps, H*W)
        cols = cols.reshape(geo.batch, geo.group, taps, geo.height, geo.width)
        out = np.empty((geo.batch, geo.out_channels, geo.out_h, geo.out_w), x.dtype)
        bias = (np.ascontiguousarray(inputs[2], x.dtype) if geo.has_bias
                else np.zeros(1, x.dtype))
        _gather_taps(cols, bias, out, per_out, geo.height, geo.width, geo.kh, geo.kw, geo.sh,
                     geo.sw, geo.dh, geo.dw, geo.top, geo.left, geo.has_bias)
        return out.reshape(output_shape(problem))
