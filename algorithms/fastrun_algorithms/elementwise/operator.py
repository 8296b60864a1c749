"""Binary elementwise operators with numpy's broadcasting and type promotion.

One :class:`ElementwiseOperator` is registered per operation (``add``, ``sub``, ``mul``,
``div``, the comparisons ``equal``, ``less``, ``greater``, ``less_equal``, ``greater_equal``,
``max``, ``min``, and ``add_relu``, which the ONNX runtime fuses a residual connection's
``Add -> Relu`` into) rather than one ``elementwise`` operator with an
``op`` parameter, because:

* ``fastrun.call("add", a, b)`` names the operation the way numpy and ONNX do;
* each operation gets its own cache category (``...|add@1|...``), so its entries are listed,
  compared and invalidated on their own, and the cache key is only the operands' shapes and
  dtypes, with no parameter that every key would have to repeat;
* the operations share everything else (shape rules, dtypes, algorithms), so the per-op part is
  one :class:`BinaryOp` row in :data:`OPS`.

Semantics are numpy's: ``max`` and ``min`` are ``np.maximum`` and ``np.minimum`` (elementwise,
NaN-propagating), ``div`` is true division (``np.true_divide``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrun.operator import Operator, Problem, Shape
from fastrun_algorithms._common import error_with_special_values, parallel_pays
from fastrun_algorithms.elementwise._layout import BroadcastLayout, broadcast_layout

SUPPORTED_DTYPES = ("float32", "float64", "int32", "int64")

#: From this many output bytes on, ``parallel`` goes first in the rule of thumb
#: (:meth:`ElementwiseOperator.parallel_pays`), taken from measurement, not a law
#: (``benchmarks/bench_elementwise_threshold.py``, same-shape ``add``, on the 2-core development
#: VM).  With fastrun's default passive OpenMP waits every parallel call first wakes the sleeping
#: worker (~10 us here), and ``parallel`` beat both ``serial`` and ``numpy`` from 4 MiB on in the
#: quietest runs, later (8-64 MiB) or nowhere while other processes kept a core busy; with spinning
#: workers (OMP_WAIT_POLICY=active, measured in isolation) from 512 KiB - 1 MiB.  The threshold is
#: in bytes, not elements, because the loop is memory bound.  With profiling (``fast-run``) the
#: crossover is measured per problem instead.
PARALLEL_MIN_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BinaryOp:
    """One elementwise operation: its name, numpy's ufunc for it and its typing rule."""

    name: str
    #: numpy's ufunc for it (for ``add_relu``, :func:`add_relu`): the ``numpy`` algorithm and
    #: the reference
    ufunc: Callable[[Any, Any], Any]
    #: "arithmetic": computed and returned in numpy's result_type of the operands;
    #: "division": like arithmetic, but integer results are float64 (true division);
    #: "comparison": computed in the result_type, returned as bool.
    kind: str
    summary: str

    def compute_dtype(self, a: Any, b: Any) -> np.dtype:
        """The dtype both operands are converted to before the operation, as numpy does."""
        common = np.result_type(a, b)
        if self.kind == "division" and common.kind != "f":
            return np.dtype(np.float64)
        return common

    def result_dtype(self, a: Any, b: Any) -> np.dtype:
        if self.kind == "comparison":
            return np.dtype(np.bool_)
        return self.compute_dtype(a, b)


def add_relu(a: Any, b: Any) -> Any:
    """``np.maximum(a + b, 0)`` with numpy's result dtype, in place on the sum (one output
    array, two passes): the ``numpy`` algorithm of ``add_relu`` and its reference."""
    out = np.add(a, b)
    if type(out) is np.ndarray:
        return np.maximum(out, 0, out=out)
    return np.maximum(out, out.dtype.type(0))  # 0-d operands: a numpy scalar


OPS: dict[str, BinaryOp] = {op.name: op for op in (
    BinaryOp("add", np.add, "arithmetic", "a + b"),
    BinaryOp("sub", np.subtract, "arithmetic", "a - b"),
    BinaryOp("mul", np.multiply, "arithmetic", "a * b"),
    BinaryOp("div", np.true_divide, "division",
             "a / b, true division: integers give float64, x/0 gives inf or nan as in numpy"),
    BinaryOp("greater_equal", np.greater_equal, "comparison", "a >= b, a bool array"),
    BinaryOp("max", np.maximum, "arithmetic", "np.maximum(a, b): NaN if either is NaN"),
    BinaryOp("min", np.minimum, "arithmetic", "np.minimum(a, b): NaN if either is NaN"),
    BinaryOp("add_relu", add_relu, "arithmetic",
             "np.maximum(a + b, 0): a residual Add and the Relu after it, in one pass"),
    BinaryOp("equal", np.equal, "comparison", "a == b, a bool array"),
    BinaryOp("less", np.less, "comparison", "a < b, a bool array"),
    BinaryOp("greater", np.greater, "comparison", "a > b, a bool array"),
    BinaryOp("less_equal", np.less_equal, "comparison", "a <= b, a bool array"),
)}


class ElementwiseOperator(Operator):
    """``out = op(a, b)`` elementwise, with numpy's broadcasting and result dtype.

    Operands: two arrays (0-d included) of float32, float64, int32 or int64, in any
    combination; the result has numpy's ``result_type`` of the two (bool for the comparisons,
    float64 for ``div`` of integers).  Integer overflow wraps around as in
    numpy.  Integer division by zero gives inf (or nan for 0/0), exactly like numpy's true
    division, which converts both operands to float64 first.
    """

    version = 1

    def __init__(self, op: BinaryOp):
        self.op = op
        self.name = op.name

    # -- shape and dtype rules -----------------------------------------------------------------
    def validate(self, problem: Problem) -> None:
        if problem.operator != self.name:
            raise ValueError(f"{self.name} cannot validate a {problem.operator!r} problem")
        if len(problem.shapes) != 2:
            raise ValueError(
                f"{self.name} takes exactly 2 inputs (a, b), got {len(problem.shapes)} with "
                f"shapes {list(problem.shapes)}"
            )
        unsupported = [d for d in problem.dtypes if d not in SUPPORTED_DTYPES]
        if unsupported:
            raise ValueError(
                f"{self.name} supports dtypes {', '.join(SUPPORTED_DTYPES)}, got "
                f"{', '.join(unsupported)} (a {problem.dtypes[0]}, b {problem.dtypes[1]}); "
                "cast the operands first"
            )
        try:
            broadcast_layout(*problem.shapes)
        except ValueError as error:
            raise ValueError(f"{self.name}: {error}") from None

    def layout(self, problem: Problem) -> BroadcastLayout:
        """The broadcast output shape and the merged form the numba kernels loop over."""
        return broadcast_layout(*problem.shapes)

    def output_shape(self, problem: Problem) -> Shape:
        return broadcast_layout(*problem.shapes).out_shape

    def output_dtype(self, problem: Problem) -> np.dtype:
        return self.op.result_dtype(*problem.dtypes)

    def output_bytes(self, problem: Problem) -> int:
        return broadcast_layout(*problem.shapes).size * self.output_dtype(problem).itemsize

    # -- checking ------------------------------------------------------------------------------
    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """numpy's ufunc: elementwise results are exactly rounded, so numpy in the result dtype
        is the exact answer, not an approximation to improve on in float64."""
        with np.errstate(all="ignore"):
            return np.asarray(self.op.ufunc(inputs[0], inputs[1]))

    def random_inputs(self, problem: Problem, rng: np.random.Generator) -> list[np.ndarray]:
        """Floats in [-1, 1], integers in [-100, 100]; for ``div`` the divisor is kept away
        from zero (magnitude >= 0.5, or a nonzero integer), so that profiling times ordinary
        division and the numerical check compares finite numbers."""
        inputs = []
        for index, (shape, dtype) in enumerate(zip(problem.shapes, problem.dtypes,
                                                   strict=True)):
            divisor = self.op.kind == "division" and index == 1
            if np.dtype(dtype).kind == "f":
                low = 0.5 if divisor else 0.0
                x = rng.uniform(low, 1.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
            else:
                x = rng.integers(1 if divisor else 0, 101, size=shape) * rng.choice([-1, 1],
                                                                                   size=shape)
            inputs.append(np.asarray(x, dtype=dtype))
        return inputs

    def error(self, problem: Problem, output: Any, reference: np.ndarray) -> float:
        """The base class's relative max difference over the finite elements; non-finite
        elements and the dtype must match exactly (see :func:`error_with_special_values`)."""
        return error_with_special_values(problem, output, reference, super().error)

    def tolerance(self, problem: Problem) -> float:
        """Exact for integer and bool results; a few units in the last place for floats (the
        registered algorithms are exact, as every operation here is correctly rounded in IEEE
        arithmetic, but an algorithm that divides by multiplying with a reciprocal would be
        within a few ulp, and acceptable)."""
        dtype = self.output_dtype(problem)
        if dtype.kind != "f":
            return 0.0
        return float(4 * np.finfo(dtype).eps)

    # -- rule of thumb -------------------------------------------------------------------------
    def parallel_pays(self, problem: Problem) -> bool:
        """Whether the parallel loop goes first: from :data:`PARALLEL_MIN_BYTES` of output on
        more than one numba thread; below, numpy's call, then the serial loop, are cheapest
        (the algorithms' ranks read it, see :func:`fastrun_algorithms._common.parallel_rank`)."""
        return parallel_pays(self.output_bytes(problem), PARALLEL_MIN_BYTES)
