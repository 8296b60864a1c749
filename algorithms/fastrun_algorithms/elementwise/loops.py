"""The numba algorithms: ``serial`` (one thread) and ``parallel`` (blocks spread over threads).

Both run the same loop nest (see ``_kernels``) over the merged broadcast geometry (see
``_layout``); they differ only in how the flat output range is split.  Which one is faster
depends on the output size, the dtype and the machine: the thread hand-off costs a few
microseconds, so ``parallel`` pays only once the loop takes clearly longer than that.  That
crossover is what profiling measures instead of a hard-coded threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import SERIAL_RANK, ParallelRanked
from fastrun_algorithms.elementwise import _kernels
from fastrun_algorithms.elementwise._layout import Shape, broadcast_layout, flat
from fastrun_algorithms.elementwise.operator import BinaryOp

#: Plans kept per algorithm; a network has far fewer distinct elementwise problems.  When full
#: the table is simply cleared (rebuilding a plan costs microseconds; the kernels stay cached).
MAX_PLANS = 4096


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a call needs besides the inputs, looked up once per problem."""

    out_shape: Shape
    out_dtype: np.dtype
    size: int
    geometry: np.ndarray
    kernel: Callable[..., None]


class NumbaElementwise(Algorithm):
    """Base of ``serial`` and ``parallel``: the plan lookup and the call.

    Inputs that are not C-contiguous are copied to contiguous arrays first (the kernels take
    flat arrays; see ``_layout.flat``); contiguous inputs, broadcast or not, are never copied.
    """

    attributes = AlgoAttribute.REPRODUCIBLE
    #: index of this algorithm's kernel in ``_kernels.kernels(...)``: 0 serial, 1 parallel
    kernel_index = 0

    def __init__(self, op: BinaryOp):
        self.operator = op.name  # before super().__init__, which builds the identity from it
        super().__init__()
        self.op = op
        self._plans: dict[str, Plan] = {}

    def plan(self, problem: Problem) -> Plan:
        """The plan of a (validated) problem; compiles or loads the kernel on first use."""
        plan = self._plans.get(problem.key)
        if plan is None:
            layout = broadcast_layout(*problem.shapes)
            a_dtype, b_dtype = (np.dtype(d) for d in problem.dtypes)
            out_dtype = self.op.result_dtype(a_dtype, b_dtype)
            kernel = _kernels.kernels(self.op.name, a_dtype, b_dtype,
                                      self.op.compute_dtype(a_dtype, b_dtype),
                                      out_dtype)[self.kernel_index]
            plan = Plan(layout.out_shape, out_dtype, layout.size, layout.geometry, kernel)
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[problem.key] = plan
        return plan

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        plan = self._plans.get(problem.key) or self.plan(problem)
        out = np.empty(plan.size, dtype=plan.out_dtype)
        if plan.size:
            plan.kernel(flat(inputs[0]), flat(inputs[1]), out, plan.geometry)
        return out if len(plan.out_shape) == 1 else out.reshape(plan.out_shape)


class SerialElementwise(NumbaElementwise):
    """One thread, no parallel runtime involved: the cheapest numba call, for small and medium
    outputs and for broadcast patterns numpy's iterator handles poorly.  REPRODUCIBLE."""

    name = "serial"
    kernel_index = 0

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return SERIAL_RANK


class ParallelElementwise(ParallelRanked, NumbaElementwise):
    """numba ``prange`` over fixed blocks of the output (``_kernels.BLOCK`` elements), which
    numba's scheduler hands out to the threads as equal contiguous runs.  Pays off once the
    loop outlasts the thread hand-off; where that is, profiling measures.  REPRODUCIBLE: an
    element's value does not depend on the thread that computes it."""

    name = "parallel"
    kernel_index = 1

    def __init__(self, op: BinaryOp, pays: Callable[[Problem], bool]):
        super().__init__(pays, op)

