"""global_maxpool and global_avgpool as one numpy reduction over the spatial axes.

A global pool reads each input once and writes N*C values: a single reduction into the output
is already as fast as memory allows, so there is nothing for a second algorithm to win.  numpy
reduces in an order fixed by the shapes and strides alone: reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem


class NumpyGlobalPool(Algorithm):
    """A max or sum reduction over axes 2.. straight into the output (no workspace)."""

    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, operator: str):
        self.operator = operator
        super().__init__()

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = inputs[0]
        shape = problem.shapes[0]
        out = np.empty((shape[0], shape[1], *(1 for _ in shape[2:])), dtype=problem.dtypes[0])
        axes = tuple(range(2, len(shape)))
        if self.operator == "global_maxpool":
            np.maximum.reduce(x, axis=axes, keepdims=True, out=out)
        else:
            # a sum then one division: np.mean gives float32 a hidden buffer on large inputs
            np.add.reduce(x, axis=axes, keepdims=True, out=out)
            out /= int(np.prod(shape[2:]))
        return out


def algorithms() -> list[Algorithm]:
    return [NumpyGlobalPool("global_maxpool"), NumpyGlobalPool("global_avgpool")]
