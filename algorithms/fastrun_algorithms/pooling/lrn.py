"""LRN in numpy: a windowed sum of the squares over channels, then one scale per element.

The window sum adds ``size`` shifted channel slices of the squares rather than differencing a
cumulative sum: the difference of two large prefix sums loses the small ones in float32, and
ONNX models use windows of a few channels, so the passes are few.  The additions run in a fixed
order: reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms.pooling.operator import lrn_window


class NumpyLRN(Algorithm):
    """The squares of X in a buffer (the workspace), their window sums accumulated in the
    output buffer, which then becomes ``X / (bias + alpha / size * sum)^beta`` in place.

    Every ufunc runs on contiguous operands of one shape (channel slices of one image are
    contiguous, so the window sums go image by image): numpy gives a ufunc with a strided
    operand an iteration buffer that ``workspace_bytes`` could not state exactly.
    """

    operator = "lrn"
    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """One array of X's shape and dtype: the squares, then X again."""
        return int(np.prod(problem.shapes[0])) * np.dtype(problem.dtypes[0]).itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = inputs[0]
        size = problem.param("size")
        before, after = lrn_window(size)
        channels = x.shape[1]
        buffer = np.empty(x.shape, dtype=problem.dtypes[0])
        np.copyto(buffer, x)
        np.square(buffer, out=buffer)
        out = np.zeros_like(buffer)
        # channel c adds the squares of c + shift, for the shifts that stay inside the channels
        for shift in range(-min(before, channels - 1), min(after, channels - 1) + 1):
            for image in range(x.shape[0]):
                if shift >= 0:
                    out[image, :channels - shift] += buffer[image, shift:]
                else:
                    out[image, -shift:] += buffer[image, :channels + shift]
        out *= problem.param("alpha") / size
        out += problem.param("bias")
        np.power(out, problem.param("beta"), out=out)
        np.copyto(buffer, x)
        np.divide(buffer, out, out=out)
        return out


def algorithms() -> list[Algorithm]:
    return [NumpyLRN()]
