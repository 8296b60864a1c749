"""The ``conv_transpose`` operator on an OpenCL device: ``cl_direct``, one work-item per output.

Each output (n, k, oh, ow) gathers what the input pixels spread onto it: for every input
channel of k's group and every kernel tap (r, s), the input row ``(oh + top - r * dh) / sh``
and column ``(ow + left - s * dw) / sw`` where those divide exactly and fall inside the input
(:func:`~fastrun_algorithms.conv_transpose.operator.geometry`'s 2-D view: a 1-D problem has a
height of 1; a negative pad, from an ``output_shape`` beyond the result, just finds no input
and leaves the bias).  Gathering instead of scattering needs no atomics and no zeroed
workspace, so it is REPRODUCIBLE: each output is summed by one work-item, channels then taps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms.activation.opencl._kernels import PRELUDE
from fastrun_algorithms.conv_transpose.operator import geometry, output_shape

CONV_TRANSPOSE = PRELUDE + r"""
/* geo: N, C, H, W, K, kh, kw, group, sh, sw, dh, dw, top, left, out_h, out_w.  X (N, C, H, W),
   W (C, K/group, kh, kw), out (N, K, out_h, out_w). */
__kernel void conv_transpose(const long total, __global const long* geo,
                             __global const real* x, const long x_off,
                             __global const real* w, const long w_off,
                             __global const real* bias, const long b_off, const int has_bias,
                             __global real* out, const long o_off) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long C = geo[1], H = geo[2], W = geo[3], K = geo[4], kh = geo[5], kw = geo[6];
    const long group = geo[7], sh = geo[8], sw = geo[9], dh = geo[10], dw = geo[11];
    const long top = geo[12], left = geo[13], out_h = geo[14], out_w = geo[15];
    const long ow = i % out_w;
    long rest = i / out_w;
    const long oh = rest % out_h;
    rest /= out_h;
    const long k = rest % K;
    const long n = rest / K;
    const long per_in = C / group, per_out = K / group;
    const long g = k / per_out, kk = k - g * per_out;
    real acc = has_bias ? bias[b_off + k] : (real)0;
    for (long c = g * per_in; c < (g + 1) * per_in; ++c) {
        __global const real* plane = x + x_off + (n * C + c) * H * W;
        __global const real* taps = w + w_off + (c * per_out + kk) * kh * kw;
        for (long r = 0; r < kh; ++r) {
            const long y = oh + top - r * dh;
            if (y < 0 || y % sh) continue;
            const long ih = y / sh;
            if (ih >= H) continue;
            for (long s = 0; s < kw; ++s) {
                const long z = ow + left - s * dw;
                if (z < 0 || z % sw) continue;
                const long iw = z / sw;
                if (iw >= W) continue;
                acc += plane[ih * W + iw] * taps[r * kw + s];
            }
        }
    }
    out[o_off + i] = acc;
}
"""


class OpenCLConvTranspose(common.OpenCLAlgorithm):
    """The gather formulation, a work-item per output (see the module docstring)."""

    operator = "conv_transpose"
    name = "cl_direct"

    def __init__(self) -> None:
        super().__init__()
        #: (device, problem key) -> the geometry as a device array, uploaded once
        self._geometry: dict[tuple[int, str], Any] = {}

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        geo = geometry(problem)
        out = device.empty(output_shape(problem), dtype)
        total = math.prod(output_shape(problem))
        if total == 0:
            return out
        key = (id(device), problem.key)
        if key not in self._geometry:
            self._geometry[key] = device.to_device(np.array(
                [geo.batch, geo.channels, geo.height, geo.width, geo.out_channels, geo.kh,
                 geo.kw, geo.group, geo.sh, geo.sw, geo.dh, geo.dw, geo.top, geo.left,
                 geo.out_h, geo.out_w], np.int64))
        x_buf, x_off = common.buffer(inputs[0], "X")
        # without a bias the input's buffer stands in for it (never read)
        b_buf, b_off = common.buffer(inputs[2], "B") if geo.has_bias else (x_buf, x_off)
        kernel = device.kernel(CONV_TRANSPOSE, "conv_transpose", common.options(
            REAL=common.CL_TYPES[dtype.name], FP64=int(dtype == np.float64)))
        common.launch(device, kernel, total, [
            np.int64(total), self._geometry[key].data, x_buf, x_off,
            *common.buffer(inputs[1], "W"), b_buf, b_off, np.int32(geo.has_bias),
            *common.buffer(out, "output")])
        return out


def algorithms() -> list[Algorithm]:
    return [OpenCLConvTranspose()]
