"""``cl_elementwise``: every binary elementwise operation on an OpenCL device.

It runs on an OpenCL device (``device_kind = "opencl"``): a and b are ``pyopencl.array.Array``
values on ``ctx.device`` and the result is one too.  pyopencl is imported only when it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms.elementwise._layout import broadcast_layout
from fastrun_algorithms.elementwise.opencl._kernels import MAX_RANK, OP_CODES, SOURCE
from fastrun_algorithms.elementwise.operator import OPS, BinaryOp

#: Below this many output elements the index is split with 32-bit arithmetic.
INDEX32_LIMIT = 2**31 - common.LOCAL_SIZE


def _correctly_rounded_division(device: Any) -> bool:
    """Whether the device can build float32 division correctly rounded (OpenCL's default
    allows 2.5 ulp; numpy's division, which the operator calls exact, is correctly rounded)."""
    import pyopencl as cl

    flag = cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT
    return bool(device.cl_device.single_fp_config & flag)


class OpenCLElementwise(Algorithm):
    """``out = op(a, b)`` with numpy's broadcasting and type promotion, one output element per
    work-item.

    Operands of any of the operator's dtypes, mixed included: each is read in its own type and
    converted in the kernel to numpy's common type (float64 for integer division), so no
    operand is copied first.  Broadcasting is the merged geometry of
    :func:`~fastrun_algorithms.elementwise._layout.broadcast_layout` passed as arguments (up to
    6 merged dimensions; the usual cases merge to 1-3).  Operands must be C-contiguous device
    arrays (views with an offset are fine).

    REPRODUCIBLE (each element is one operation); no workspace.  Results are exact: integer
    arithmetic wraps as numpy's, max and min return NaN as numpy does, float32 division is
    built correctly rounded where the device supports it (within a few ulp otherwise, inside
    the operator's tolerance).
    """

    name = "cl_elementwise"
    device_kind = "opencl"
    attributes = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def __init__(self, op: BinaryOp):
        self.operator = op.name  # before super().__init__, which builds the identity from it
        super().__init__()
        self.op = op
        #: (device, problem key) -> what every call of that problem needs: the work-item
        #: count is all that a call adds, so a model's many small adds pay no Python set-up
        self._plans: dict[tuple[int, str], tuple[Any, ...]] = {}

    def unusable_reason(self, problem: Problem) -> str | None:
        rank = broadcast_layout(*problem.shapes).rank
        if rank > MAX_RANK:
            return (f"the operands broadcast to {rank} merged dimensions, over the kernel's "
                    f"{MAX_RANK}")
        return None

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        compute = self.op.compute_dtype(*problem.dtypes)
        return common.fp64_reason(device, [*problem.dtypes, compute])

    def _options(self, device: Any, problem: Problem) -> list[str]:
        a_dtype, b_dtype = (np.dtype(d) for d in problem.dtypes)
        compute = self.op.compute_dtype(a_dtype, b_dtype)
        result = self.op.result_dtype(a_dtype, b_dtype)
        defines: dict[str, Any] = {
            "TA": common.CL_TYPES[a_dtype.name], "TB": common.CL_TYPES[b_dtype.name],
            "TC": common.CL_TYPES[compute.name], "TO": common.CL_TYPES[result.name],
            "OP": OP_CODES.index(self.op.name),
            "FP64": int(np.dtype(np.float64) in (a_dtype, b_dtype, compute)),
            "TC_INT": int(compute.kind == "i"),
        }
        if compute.kind == "i":
            defines["UTC"] = "u" + common.CL_TYPES[compute.name]
            defines["AS_TC"] = "as_" + common.CL_TYPES[compute.name]
        built = common.options(**defines)
        if self.op.kind == "division" and compute == np.float32 and \
                _correctly_rounded_division(device):
            built.append("-cl-fp32-correctly-rounded-divide-sqrt")
        return built

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        plan = self._plans.get((id(device), problem.key))
        if plan is None:
            plan = self._plans[(id(device), problem.key)] = self._plan(device, problem)
        kernel, out_shape, result, size, geometry = plan
        out = device.empty(out_shape, result)
        if size == 0:
            return out
        a, a_off = common.buffer(inputs[0], "a")
        b, b_off = common.buffer(inputs[1], "b")
        o, o_off = common.buffer(out, "output")
        common.launch(device, kernel, size, [*geometry, a, a_off, b, b_off, o, o_off])
        return out

    def _plan(self, device: Any, problem: Problem) -> tuple[Any, ...]:
        """(kernel, output shape, output dtype, size, the kernel's geometry arguments)."""
        layout = broadcast_layout(*problem.shapes)
        result = self.op.result_dtype(*problem.dtypes)
        # innermost first, padded to MAX_RANK with dimensions of one element
        sizes, strides_a, strides_b = (
            [int(v) for v in row[::-1]] + [fill] * (MAX_RANK - layout.rank)
            for row, fill in zip(layout.geometry, (1, 0, 0), strict=True))
        name = "binary32" if layout.size < INDEX32_LIMIT else "binary64"
        kernel = device.kernel(SOURCE, name, self._options(device, problem))
        geometry = [np.int64(layout.size), np.int32(layout.rank),
                    *(np.int64(v) for v in (*sizes, *strides_a, *strides_b))]
        return kernel, layout.out_shape, result, layout.size, geometry


def opencl_algorithms() -> list[Algorithm]:
    """One ``cl_elementwise`` per operation."""
    return [OpenCLElementwise(op) for op in OPS.values()]
