"""The ``reduce`` operator: ONNX's Reduce{Sum,Mean,Max,Min,Prod,L1,L2,SumSquare} as one
operator whose ``mode`` names the reduction.  max and min take bool too, and over an empty
set give their identity (-inf and +inf, an integer type's extremes, False and True).

One operator rather than eight: they share their shapes, parameters and algorithms (a pass
that combines a run of values), and a new mode is a line in each kernel.  Parameters in
canonical form: ``mode``, ``axes`` (sorted, non-negative, never empty: an empty ONNX axes list
means every axis, unless ``noop_with_empty_axes``, which the runtime turns into a copy before
it reaches this operator) and ``keepdims`` (a bool).

Float inputs reduce in float64 and round once: a float32 mean of a 56x56 plane summed in
float32 loses about 12 bits, which is not what onnxruntime's result holds.  Integer inputs
(sum, max, min, prod) reduce in their own type, wrapping as numpy's do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.operator import Problem, Shape
from fastrun_algorithms._common import (
    CanonicalOperator,
    check_known_params,
    error_with_special_values,
    parallel_pays,
)

#: the reductions, in kernel-code order
MODES = ("sum", "mean", "max", "min", "prod", "l1", "l2", "sum_square")
FLOAT_DTYPES = ("float32", "float64")
#: modes that integer inputs may take (their results stay integers, as ONNX says)
INTEGER_MODES = ("sum", "max", "min", "prod")
INTEGER_DTYPES = ("int32", "int64")
#: From this many bytes of input on, the parallel algorithm goes first in the rule of thumb:
#: the same memory-bound pass as relu's (``activation.operator.PARALLEL_MIN_BYTES``).
PARALLEL_MIN_BYTES = 2 * 1024 * 1024


class ReduceOperator(CanonicalOperator):
    """``mode`` of X over ``axes``; the reduced axes kept as 1s with ``keepdims``."""

    name = "reduce"
    version = 1

    def canonical_params(self, shapes, dtypes, params):
        check_known_params("reduce", params, ("mode", "axes", "keepdims"))
        if len(shapes) != 1:
            raise ValueError(f"reduce takes one input, got {len(shapes)}")
        mode = params.get("mode")
        if mode not in MODES:
            raise ValueError(f"reduce mode must be one of {', '.join(MODES)}, got {mode!r}")
        dtype = dtypes[0]
        allowed = (FLOAT_DTYPES + (INTEGER_DTYPES if mode in INTEGER_MODES else ())
                   + (("bool",) if mode in ("max", "min") else ()))
        if dtype not in allowed:
            raise ValueError(f"reduce {mode} supports dtypes {', '.join(allowed)}, got {dtype}")
        rank = len(shapes[0])
        axes = params.get("axes")
        if axes is None or len(tuple(axes)) == 0:
            axes = tuple(range(rank))
        canonical = set()
        for axis in axes:
            if int(axis) != axis or not -rank <= int(axis) < rank:
                raise ValueError(f"reduce axis {axis!r} is out of range for an input of rank "
                                 f"{rank}")
            canonical.add(int(axis) % rank)
        if len(canonical) != len(tuple(axes)):
            raise ValueError(f"reduce axes {tuple(axes)} repeat an axis")
        return {"mode": mode, "axes": tuple(sorted(canonical)),
                "keepdims": bool(params.get("keepdims", True))}

    def output_shape(self, problem: Problem) -> Shape:
        return output_shape(problem)

    def output_dtype(self, problem: Problem) -> np.dtype:
        return np.dtype(problem.dtypes[0])

    def output_bytes(self, problem: Problem) -> int:
        return math.prod(self.output_shape(problem)) * self.output_dtype(problem).itemsize

    def input_bytes(self, problem: Problem) -> int:
        return math.prod(problem.shapes[0]) * np.dtype(problem.dtypes[0]).itemsize

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs[0])
        dtype = x.dtype
        if dtype.kind == "f":
            x = x.astype(np.float64)
        axes, keep = problem.param("axes"), problem.param("keepdims")
        mode = problem.param("mode")
        if mode == "mean":
            y = np.mean(x, axis=axes, keepdims=keep)
        elif mode == "l1":
            y = np.sum(np.abs(x), axis=axes, keepdims=keep)
        elif mode == "l2":
            y = np.sqrt(np.sum(x * x, axis=axes, keepdims=keep))
        elif mode == "sum_square":
            y = np.sum(x * x, axis=axes, keepdims=keep)
        elif mode in ("max", "min"):
            y = np.full(self.output_shape(problem), empty_value(mode, dtype), x.dtype)
            if x.size:  # an empty reduction gives the identity, as ONNX says
                y = (np.max if mode == "max" else np.min)(x, axis=axes, keepdims=keep)
        else:
            y = (np.sum if mode == "sum" else np.prod)(x, axis=axes, keepdims=keep)
        return np.asarray(y).astype(dtype)

    def error(self, problem: Problem, output: Any, reference: np.ndarray) -> float:
        """Over the finite elements; an overflow to inf (a prod of many values) must match by
        position and sign (:func:`error_with_special_values`)."""
        return error_with_special_values(problem, output, reference, super().error)

    def tolerance(self, problem: Problem) -> float:
        dtype = self.output_dtype(problem)
        return float(64 * np.finfo(dtype).eps) if dtype.kind == "f" else 0.0

    def parallel_pays(self, problem: Problem) -> bool:
        return parallel_pays(self.input_bytes(problem), PARALLEL_MIN_BYTES)


def blocks(problem: Problem) -> tuple[int, int, int] | None:
    """(outer, reduced, inner): X viewed so that the reduction runs over the middle axis, when
    the reduced axes are adjacent (the cases models have: the spatial axes of a pool, the last
    axis of a norm, the channels); None otherwise."""
    shape, axes = problem.shapes[0], problem.param("axes")
    if axes != tuple(range(axes[0], axes[-1] + 1)):
        return None
    return (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]),
            math.prod(shape[axes[-1] + 1:]))


def adjacent_float_reason(problem: Problem, algorithm: str) -> str | None:
    """Why ``algorithm``, which reduces float inputs over the (outer, reduced, inner) view of
    :func:`blocks`, cannot take ``problem``; None when it can."""
    if np.dtype(problem.dtypes[0]).kind != "f":
        return f"{algorithm} reduces float inputs only"
    if blocks(problem) is None:
        return (f"{algorithm} needs adjacent reduced axes, got {problem.param('axes')} of a "
                f"rank-{len(problem.shapes[0])} input")
    return None


def empty_value(mode: str, dtype: np.dtype) -> Any:
    """What max or min of no values is: the identity of the reduction."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return mode == "min"
    if dtype.kind == "f":
        return -np.inf if mode == "max" else np.inf
    info = np.iinfo(dtype)
    return info.min if mode == "max" else info.max


def kept_shape(problem: Problem) -> tuple[int, ...]:
    """X's shape with the reduced axes as 1s: the output's shape under keepdims."""
    axes = problem.param("axes")
    return tuple(1 if i in axes else d for i, d in enumerate(problem.shapes[0]))


def output_shape(problem: Problem) -> tuple[int, ...]:
    """The output's shape: :func:`kept_shape`, or without the reduced axes."""
    if problem.param("keepdims"):
        return kept_shape(problem)
    axes = problem.param("axes")
    return tuple(d for i, d in enumerate(problem.shapes[0]) if i not in axes)

