"""The ``topk`` operator (the indices of ONNX's TopK) and its numpy algorithm.

The indices of the ``k`` largest (``largest``) or smallest values along ``axis``, as int64,
ordered from the most extreme, equal values by their index (the lower first: ONNX's rule).  A
NaN counts as larger than every number, as numpy's sort orders it, and so comes first among
the largest and last among the smallest.  The runtime lowers a TopK node to this operator and
a ``gather_elements`` of X by its indices (the values), so neither needs two outputs.

Parameters in canonical form: ``k`` (0 <= k <= the axis' length), ``axis`` (non-negative),
``largest`` (a bool).  ONNX's ``sorted=0`` lets the order be anything; the output is sorted
either way, which is one of the orders it allows.
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
from fastrun_algorithms.reduce.arg import IndexOutput

TOPK_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
               "uint16", "uint32", "uint64")


class TopKOperator(IndexOutput, CanonicalOperator):
    """int64 indices of the ``k`` most extreme values of X along ``axis`` (see the module
    docstring)."""

    name = "topk"
    version = 1

    def canonical_params(self, shapes, dtypes, params):
        check_known_params("topk", params, ("k", "axis", "largest"))
        if len(shapes) != 1:
            raise ValueError(f"topk takes one input, got {len(shapes)}")
        if dtypes[0] not in TOPK_DTYPES:
            raise ValueError(f"topk supports dtypes {', '.join(TOPK_DTYPES)}, got {dtypes[0]}")
        rank = len(shapes[0])
        axis = params.get("axis", -1)
        if rank == 0 or int(axis) != axis or not -rank <= int(axis) < rank:
            raise ValueError(f"topk axis {axis!r} is out of range for an input of rank {rank}")
        axis = int(axis) % rank
        k = params.get("k")
        if k is None or int(k) != k or not 0 <= int(k) <= shapes[0][axis]:
            raise ValueError(f"topk k must be an integer in 0..{shapes[0][axis]} (the length of "
                             f"axis {axis}), got {k!r}")
        return {"k": int(k), "axis": axis, "largest": bool(params.get("largest", True))}

    def output_shape(self, problem: Problem) -> Shape:
        shape = list(problem.shapes[0])
        shape[problem.param("axis")] = problem.param("k")
        return tuple(shape)

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """Every run sorted by (value, index) with Python's sort, NaN above every number."""
        x = np.moveaxis(np.asarray(inputs[0]), problem.param("axis"), -1)
        runs = x.reshape(-1, x.shape[-1]) if x.size else np.zeros((0, x.shape[-1]), x.dtype)
        largest, k = problem.param("largest"), problem.param("k")

        def order(run: np.ndarray) -> list[int]:
            def key(i: int) -> tuple:
                v = run[i]
                nan = bool(isinstance(v, float | np.floating) and np.isnan(v))
                rank = (1, 0.0) if nan else (0, float(v) if run.dtype.kind == "f" else int(v))
                return ((-rank[0], -rank[1]) if largest else rank), i
            return sorted(range(len(run)), key=key)[:k]

        out = np.array([order(run) for run in runs], np.int64).reshape(*x.shape[:-1], k)
        return np.ascontiguousarray(np.moveaxis(out, -1, problem.param("axis")))


class NumpyTopK(NumpyRanked, Algorithm):
    """numpy's stable sorts: ascending for the smallest (NaN sorts last); for the largest, by
    NaN first, then by the value descending (``-x`` for floats, ``~x`` for integers, which
    reverses their order without overflow).  REPRODUCIBLE."""

    name = "numpy"
    operator = "topk"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """The full sort's indices (int64 per element of X), and for the largest the keys
        (the descending key and, for floats, the NaN mask)."""
        count = math.prod(problem.shapes[0])
        item = np.dtype(problem.dtypes[0]).itemsize
        keys = count * (item + 1) if problem.param("largest") else 0
        return count * 8 + keys

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.asarray(inputs[0])
        axis, k = problem.param("axis"), problem.param("k")
        if not problem.param("largest"):
            order = np.argsort(x, axis=axis, kind="stable")
        elif x.dtype.kind == "f":
            nan = np.isnan(x)
            descending = np.where(nan, 0, -x)
            order = np.lexsort((descending, ~nan), axis=axis)  # stable: ties by index
        else:
            order = np.argsort(~x, axis=axis, kind="stable")
        return np.ascontiguousarray(np.take(order, np.arange(k), axis=axis), dtype=np.int64)
