"""The ``arg_reduce`` operator (ONNX's ArgMax and ArgMin) and its numpy algorithm.

The index of the largest (``mode="max"``) or smallest (``"min"``) value along ``axis``, as
int64; with ``select_last_index`` the last of equal extremes, else the first.  A NaN counts as
the extreme (numpy's rule, which ONNX's reference follows).  Parameters in canonical form:
``mode``, ``axis`` (non-negative), ``keepdims`` and ``select_last_index`` (bools).

One algorithm: a segmentation head's or a classifier's final argmax is one pass over a small
tensor, so there is nothing yet for a search to choose between.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem, Shape
from fastrun_algorithms._common import CanonicalOperator, NumpyRanked, check_known_params

ARG_DTYPES = ("float32", "float64", "int32", "int64", "uint8", "int8")
KNOWN = ("mode", "axis", "keepdims", "select_last_index")


class IndexOutput:
    """Mixin of the operators whose output is int64 indices: exact, 8 bytes each."""

    def output_dtype(self, problem: Problem) -> np.dtype:
        return np.dtype(np.int64)

    def output_bytes(self, problem: Problem) -> int:
        return math.prod(self.output_shape(problem)) * 8

    def tolerance(self, problem: Problem) -> float:
        return 0.0  # indices: exact


class ArgReduceOperator(IndexOutput, CanonicalOperator):
    """int64 index of the extreme of X along ``axis`` (see the module docstring)."""

    name = "arg_reduce"
    version = 1

    def canonical_params(self, shapes, dtypes, params):
        check_known_params("arg_reduce", params, KNOWN)
        if len(shapes) != 1:
            raise ValueError(f"arg_reduce takes one input, got {len(shapes)}")
        mode = params.get("mode")
        if mode not in ("max", "min"):
            raise ValueError(f"arg_reduce mode must be max or min, got {mode!r}")
        if dtypes[0] not in ARG_DTYPES:
            raise ValueError(f"arg_reduce supports dtypes {', '.join(ARG_DTYPES)}, got "
                             f"{dtypes[0]}")
        rank = len(shapes[0])
        axis = params.get("axis", 0)
        if rank == 0 or int(axis) != axis or not -rank <= int(axis) < rank:
            raise ValueError(f"arg_reduce axis {axis!r} is out of range for an input of rank "
                             f"{rank}")
        axis = int(axis) % rank
        if shapes[0][axis] == 0:
            raise ValueError(f"arg_reduce over axis {axis} of X {list(shapes[0])}, which is "
                             "empty: there is no extreme")
        return {"mode": mode, "axis": axis, "keepdims": bool(params.get("keepdims", True)),
                "select_last_index": bool(params.get("select_last_index", False))}

    def output_shape(self, problem: Problem) -> Shape:
        shape, axis = list(problem.shapes[0]), problem.param("axis")
        if problem.param("keepdims"):
            shape[axis] = 1
        else:
            del shape[axis]
        return tuple(shape)

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """Where each run equals its extreme (a NaN is the extreme of a run that holds one),
        the first or last such place."""
        x = np.moveaxis(np.asarray(inputs[0]), problem.param("axis"), -1)
        extreme = (np.max if problem.param("mode") == "max" else np.min)(x, axis=-1,
                                                                          keepdims=True)
        hits = x == extreme
        if x.dtype.kind == "f":
            hits |= np.isnan(x) & np.isnan(extreme)
        if problem.param("select_last_index"):
            index = x.shape[-1] - 1 - np.argmax(hits[..., ::-1], axis=-1)
        else:
            index = np.argmax(hits, axis=-1)
        return index.astype(np.int64).reshape(self.output_shape(problem))


def arg_extreme(problem: Problem, x: np.ndarray) -> np.ndarray:
    """numpy's argmax or argmin along the problem's axis; the last of equal extremes by
    searching the reversed axis."""
    axis = problem.param("axis")
    find = np.argmax if problem.param("mode") == "max" else np.argmin
    if problem.param("select_last_index"):
        index = x.shape[axis] - 1 - find(np.flip(x, axis=axis), axis=axis)
    else:
        index = find(x, axis=axis)
    return np.ascontiguousarray(index, dtype=np.int64).reshape(
        ArgReduceOperator().output_shape(problem))


class NumpyArgReduce(NumpyRanked, Algorithm):
    """numpy's argmax and argmin.  REPRODUCIBLE."""

    name = "numpy"
    operator = "arg_reduce"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """None: numpy's index result is the output (a reversed axis is a view)."""
        return 0

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        return arg_extreme(problem, np.asarray(inputs[0]))
