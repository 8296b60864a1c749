"""The elementwise operations through numpy's ufuncs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import NumpyRanked
from fastrun_algorithms.elementwise.operator import BinaryOp


class UfuncElementwise(NumpyRanked, Algorithm):
    """``np.add`` and friends: single-threaded, SIMD loops, the cheapest call for small arrays
    (about half a microsecond), and what every other algorithm is checked against.

    REPRODUCIBLE: each element is one correctly rounded operation, computed the same way on
    every run.  Like numpy it warns on division by zero; the numba algorithms do not.
    """

    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, op: BinaryOp):
        self.operator = op.name  # before super().__init__, which builds the identity from it
        super().__init__()
        self.ufunc = op.ufunc

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        out = self.ufunc(inputs[0], inputs[1])
        # 0-d operands give a numpy scalar; the contract is an array of the output shape.
        return out if type(out) is np.ndarray else np.asarray(out)
