"""The matmul operator: numpy ``matmul`` semantics for float32 and float64."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastrun.operator import Operator, Problem, Shape
from fastrun_algorithms.matmul._batch import MatmulLayout, layout_of, matmul_layout

SUPPORTED_DTYPES = ("float32", "float64")

class MatmulOperator(Operator):
    """``C = A @ B`` exactly as ``np.matmul`` defines it: 2-D products, batches with broadcast
    batch dimensions, and 1-D operands promoted to a row (A) or a column (B) whose dimension is
    dropped from the result.  Both operands float32 or both float64.

    The error measure and tolerance are the base class's (max abs difference relative to the
    largest reference magnitude; 1e-3 for float32, 1e-9 for float64): they fit matmul well, as
    its rounding error grows with K times the operands' magnitude, which is what the reference
    magnitude scales with for the [-1, 1] profiling inputs.
    """

    name = "matmul"
    parameters: frozenset[str] = frozenset()  # matmul takes none

    def validate(self, problem: Problem) -> None:
        if problem.operator != self.name:
            raise ValueError(f"matmul cannot validate a {problem.operator!r} problem")
        if len(problem.shapes) != 2:
            raise ValueError(
                f"matmul takes exactly 2 inputs (A, B), got {len(problem.shapes)} with shapes "
                f"{list(problem.shapes)}"
            )
        unsupported = [d for d in problem.dtypes if d not in SUPPORTED_DTYPES]
        if unsupported:
            raise ValueError(
                f"matmul supports dtypes {' and '.join(SUPPORTED_DTYPES)}, got "
                f"{', '.join(unsupported)} (A {problem.dtypes[0]}, B {problem.dtypes[1]}); "
                "cast the operands first"
            )
        if problem.dtypes[0] != problem.dtypes[1]:
            raise ValueError(
                f"matmul needs both operands of the same dtype, got A {problem.dtypes[0]} and "
                f"B {problem.dtypes[1]}; cast one of them"
            )
        matmul_layout(*problem.shapes)  # raises ValueError for shapes numpy would refuse

    def layout(self, problem: Problem) -> MatmulLayout:
        """Batch shape, M, K, N and the mapping onto the batched 3-D form the kernels use."""
        return layout_of(problem)

    def output_shape(self, problem: Problem) -> Shape:
        return layout_of(problem).out_shape

    def size_axes(self, shapes: Sequence[Shape]) -> tuple[int, ...]:
        """A's axes (batch, M, K) and B's N: B's K repeats A's."""
        return (*shapes[0], *shapes[1][-1:]) if len(shapes[1]) > 1 else tuple(shapes[0])

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """``np.matmul`` in float64, so float32 candidates are checked against a result with
        far less rounding error than their own."""
        a = np.asarray(inputs[0], dtype=np.float64)
        b = np.asarray(inputs[1], dtype=np.float64)
        return np.asarray(np.matmul(a, b))
