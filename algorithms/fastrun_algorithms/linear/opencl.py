"""The ``linear`` operator on an OpenCL device: ``cl_linear``.

The product goes through the ``matmul`` sub-problem, so the OpenCL matmul search picks (and
caches) the GEMM for its shape, as the GEMM-based OpenCL convolutions do; then one kernel adds
the bias and the residual and applies the activation in place, a work-item per element. Two
launches instead of a GEMM with the epilogue inside: the epilogue pass reads and writes the
output once, which on a GPU costs a few microseconds against the product's, and every GEMM
configuration the matmul search knows stays a candidate.

pyopencl is imported only when it runs (through the device).  REPRODUCIBLE as its GEMM is; no
workspace: the product is the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import RunContext
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms.activation.opencl._kernels import GELU_EXACT, PRELUDE
from fastrun_algorithms.conv._gemm_common import matmul_problem
from fastrun_algorithms.linear.operator import CODES, operands

EPILOGUE = PRELUDE + GELU_EXACT + r"""
/* y (rows, cols) = act(y + bias + z) in place, one element per work-item; the bias is read per
   column, the residual z element by element.  ACT: 0 none, 1 relu (a NaN stays NaN), 2 the
   exact GELU. */
__kernel void linear_epilogue(const long total, const long cols,
                              __global real* y, const long y_off,
                              __global const real* bias, const long b_off, const int has_bias,
                              __global const real* z, const long z_off, const int has_z) {
    const long i = get_global_id(0);
    if (i >= total) return;
    real v = y[y_off + i];
    if (has_bias) v += bias[b_off + i % cols];
    if (has_z) v += z[z_off + i];
#if ACT == 1
    v = v < (real)0 ? (real)0 : v;
#elif ACT == 2
    v = gelu_exact(v);
#endif
    y[y_off + i] = v;
}
"""


class OpenCLLinear(common.OpenCLAlgorithm):
    """The product through the matmul sub-problem, then the bias and activation kernel (see
    the module docstring)."""

    operator = "linear"
    name = "cl_linear"
    sub_operators = ("matmul",)

    @staticmethod
    def _product(problem: Problem) -> Problem:
        return matmul_problem(problem.shapes[0], problem.shapes[1], problem.dtypes[0])

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        return [self._product(problem)]

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        x, w, bias, z = operands(problem, inputs)
        out = ctx.call(self._product(problem), x, w)
        activation = CODES[problem.param("activation")]  # the epilogue's ``-D ACT``
        total = problem.shapes[0][0] * problem.shapes[1][1]
        if total == 0 or not (bias is not None or z is not None or activation):
            return out
        y_buf, y_off = common.buffer(out, "output")
        # an absent bias or residual: the output's buffer stands in for it (never read)
        b_buf, b_off = common.buffer(bias, "bias") if bias is not None else (y_buf, y_off)
        z_buf, z_off = common.buffer(z, "residual") if z is not None else (y_buf, y_off)
        kernel = device.kernel(EPILOGUE, "linear_epilogue", common.options(
            REAL=common.CL_TYPES[dtype.name], FP64=int(dtype == np.float64), ACT=activation))
        common.launch(device, kernel, total, [np.int64(total), np.int64(problem.shapes[1][1]),
                                              y_buf, y_off, b_buf, b_off,
                                              np.int32(bias is not None), z_buf, z_off,
                                              np.int32(z is not None)])
        return out
