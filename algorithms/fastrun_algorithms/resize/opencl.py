"""The ``resize`` operator on an OpenCL device: ``cl_resize``, one work-item per output element.

Every mode is a sum of weighted taps per axis (:func:`~fastrun_algorithms.resize.operator.
axis_table`: one tap for nearest, two for linear, four for cubic, more antialiased, with
``exclude_outside``'s renormalised weights and the crop box's outside marks), and models
resize the last two axes (a segmentation head's upsampling, an FPN's).  So the host builds
the H and W tables once per problem and device, as the CPU algorithms build theirs, and the
kernel is the same for every mode and coordinate transform: output (p, oh, ow) sums, over the
row taps, the row weight times the column-weighted sum of that input row's taps, or takes the
extrapolation value where the row or the column is outside the crop box.

Float inputs whose leading axes are copied as they are (the CPU's ``numpy`` takes the rest).
REPRODUCIBLE: each output is summed by one work-item in tap order; the tables are uploaded
once and kept (a few values per output row and column).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms.activation.opencl._kernels import PRELUDE
from fastrun_algorithms.resize.algorithms import tables

RESIZE = PRELUDE + r"""
/* out (planes, OH, OW) from x (planes, H, W).  ir, wr: tr taps per output row (input row,
   weight); ic, wc: tc taps per output column; outr, outc: 1 where the row or column lies
   outside the crop box. */
__kernel void resize2d(const long total, const long out_h, const long out_w,
                       const long in_h, const long in_w, const int tr, const int tc,
                       __global const int* ir, __global const real* wr,
                       __global const uchar* outr,
                       __global const int* ic, __global const real* wc,
                       __global const uchar* outc,
                       __global const real* x, const long x_off,
                       __global real* out, const long o_off, const real extrapolation) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long ow = i % out_w;
    const long rest = i / out_w;
    const long oh = rest % out_h;
    const long p = rest / out_h;
    if (outr[oh] || outc[ow]) {
        out[o_off + i] = extrapolation;
        return;
    }
    __global const real* plane = x + x_off + p * in_h * in_w;
    real acc = (real)0;
    for (int a = 0; a < tr; ++a) {
        __global const real* row = plane + (long)ir[oh * tr + a] * in_w;
        real s = (real)0;
        for (int b = 0; b < tc; ++b) s += wc[ow * tc + b] * row[ic[ow * tc + b]];
        acc += wr[oh * tr + a] * s;
    }
    out[o_off + i] = acc;
}
"""


class OpenCLResize(common.OpenCLAlgorithm):
    """Taps from per-axis tables, for the last two axes, float inputs (see the module
    docstring)."""

    operator = "resize"
    name = "cl_resize"
    attributes = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def __init__(self) -> None:
        super().__init__()
        #: (device, problem key) -> the device tables of H and W
        self._tables: dict[tuple[int, str], tuple[Any, ...]] = {}

    def unusable_reason(self, problem: Problem) -> str | None:
        if np.dtype(problem.dtypes[0]).kind != "f":
            return "cl_resize resizes float inputs only"
        if len(problem.shapes[0]) < 2:
            return "cl_resize resizes the last two axes of an input of rank >= 2"
        if not all(t.identity for t in tables(problem)[:-2]):
            return "cl_resize resizes the last two axes only: a leading axis changes"
        if not math.prod(problem.shapes[0]):
            return "cl_resize needs a non-empty input"
        return None

    def _device_tables(self, device: Any, problem: Problem, dtype: np.dtype) -> tuple[Any, ...]:
        key = (id(device), problem.key)
        if key not in self._tables:
            uploaded = []
            for table in tables(problem)[-2:]:
                outside = (np.zeros(table.index.shape[0], np.uint8) if table.outside is None
                           else table.outside.astype(np.uint8))
                uploaded += [np.int32(table.index.shape[1]),
                             device.to_device(np.ascontiguousarray(table.index, np.int32)),
                             device.to_device(np.ascontiguousarray(table.weight, dtype)),
                             device.to_device(outside)]
            self._tables[key] = tuple(uploaded)
        return self._tables[key]

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        sizes = problem.param("sizes")
        out = device.empty(tuple(sizes), dtype)
        total = math.prod(sizes)
        if total == 0:
            return out
        tr, ir, wr, outr, tc, ic, wc, outc = self._device_tables(device, problem, dtype)
        in_h, in_w = problem.shapes[0][-2:]
        kernel = device.kernel(RESIZE, "resize2d", common.options(
            REAL=common.CL_TYPES[dtype.name], FP64=int(dtype == np.float64)))
        common.launch(device, kernel, total, [
            np.int64(total), np.int64(sizes[-2]), np.int64(sizes[-1]), np.int64(in_h),
            np.int64(in_w), tr, tc, ir.data, wr.data, outr.data, ic.data, wc.data, outc.data,
            *common.buffer(inputs[0], "X"), *common.buffer(out, "output"),
            dtype.type(problem.param("extrapolation_value"))])
        return out


def algorithms() -> list[Algorithm]:
    return [OpenCLResize()]
