"""The ``numpy`` algorithm of every tensor operator.

Each writes into a freshly allocated C-contiguous output (or returns one numpy made), never a
view of an input: the kernels downstream assume contiguous data, and an output that aliased an
input would let a later in-place write reach it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import NumpyRanked
from fastrun_algorithms.tensor.operator import (
    check_indices,
    positive_indices,
    scatter_in_order,
    scatter_rows,
)


class _Numpy(NumpyRanked, Algorithm):
    name = "numpy"
    #: moving data is exact and done the same way every run
    attributes = AlgoAttribute.REPRODUCIBLE


def _copy_of(view: np.ndarray) -> np.ndarray:
    """A new C-contiguous array equal to ``view`` (0-d included, unlike
    ``np.ascontiguousarray``, which makes 0-d arrays 1-d)."""
    out = np.empty(view.shape, view.dtype)
    np.copyto(out, view)
    return out


class NumpyTranspose(_Numpy):
    """numpy's strided copy of the transposed view."""

    operator = "transpose"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        return _copy_of(np.transpose(np.asarray(inputs[0]), problem.param("perm")))


class NumpyConcat(_Numpy):
    """``np.concatenate``: one block copy per input."""

    operator = "concat"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        return np.concatenate([np.asarray(x) for x in inputs], axis=problem.param("axis"))


class NumpySlice(_Numpy):
    """Basic slicing (a view, no index arrays) copied out."""

    operator = "slice"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        index = tuple(slice(start, end if end >= 0 else None, step)
                      for start, end, step in problem.param("slices"))
        return _copy_of(np.asarray(inputs[0])[index])


class NumpyPad(_Numpy):
    """Negative pads crop with a view, then ``np.pad`` adds the positive ones."""

    operator = "pad"

    def workspace_bytes(self, problem: Problem) -> int:
        """Constant mode fills the output directly.  The other modes make ``np.pad`` copy the
        slab it extends from before writing it out, one axis and side at a time: at most the
        widest pad times the output's other dimensions (measured 2.4 MB for (8, 64, 112, 112)
        float32 edge-padded by 2 on the last axes, against 2.6 MB estimated), plus numpy's
        iterator buffer."""
        if problem.param("mode") == "constant":
            return 0
        pads = problem.param("pads")
        rank = len(problem.shapes[0])
        out = [d + pads[i] + pads[rank + i] for i, d in enumerate(problem.shapes[0])]
        slab = max((max(pads[i], pads[rank + i], 0) * math.prod(out) // out[i]
                    for i in range(rank) if out[i]), default=0)
        return (slab + np.getbufsize()) * np.dtype(problem.dtypes[0]).itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.asarray(inputs[0])
        pads = problem.param("pads")
        rank = x.ndim
        begins, ends = pads[:rank], pads[rank:]
        if min(pads, default=0) < 0:
            x = x[tuple(slice(max(-b, 0), d - max(-e, 0))
                        for d, b, e in zip(x.shape, begins, ends, strict=True))]
        if max(pads, default=0) <= 0:
            return _copy_of(x)
        width = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends, strict=True)]
        mode = problem.param("mode")
        if mode == "constant":
            return np.pad(x, width, mode="constant",
                          constant_values=x.dtype.type(problem.param("value")))
        return np.pad(x, width, mode=mode)


class NumpyGather(_Numpy):
    """``np.take``, which accepts negative indices; an index out of range becomes an
    IndexError that names gather, the axis and the allowed range."""

    operator = "gather"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        data, indices = np.asarray(inputs[0]), np.asarray(inputs[1])
        axis = problem.param("axis")
        try:
            out = np.take(data, indices, axis=axis)
        except IndexError:
            check_indices(indices, data.shape, axis)
            raise
        return out if type(out) is np.ndarray else np.asarray(out)


class NumpyGatherElements(_Numpy):
    """``np.take_along_axis`` over the corner of data the indices cover, negative indices made
    positive; an index out of range is an IndexError that names the axis and the allowed
    range."""

    operator = "gather_elements"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        data, indices = np.asarray(inputs[0]), np.asarray(inputs[1])
        axis = problem.param("axis")
        index = positive_indices(indices, data.shape, axis)
        # indices may be shorter than data on the other axes: only that corner is read
        corner = tuple(slice(None) if a == axis else slice(0, size)
                       for a, size in enumerate(indices.shape))
        return np.ascontiguousarray(np.take_along_axis(data[corner], index.astype(np.intp),
                                                       axis=axis))


class NumpyScatterND(_Numpy):
    """A copy of data, then numpy's fancy assignment of every update at once where the
    reduction is none and no index row repeats, else the rows one after another."""

    operator = "scatter_nd"

    def workspace_bytes(self, problem: Problem) -> int:
        """The index rows, made non-negative (int64 per entry of indices)."""
        return math.prod(problem.shapes[1]) * 8

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        data, indices, updates = (np.asarray(a) for a in inputs)
        out = np.array(data, order="C")
        rows = scatter_rows(indices, data.shape)
        reduction = problem.param("reduction")
        q = indices.shape[-1]
        blocks = updates.reshape(len(rows), *data.shape[q:])
        if reduction == "none" and len(set(rows)) == len(rows):
            if rows:
                out[tuple(np.array(rows, np.int64).T)] = blocks
            return out
        scatter_in_order(out, rows, blocks, reduction)
        return out


class NumpyWhere(_Numpy):
    """``np.where`` into a C-contiguous output of x's dtype."""

    operator = "where"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        condition, x, y = (np.asarray(a) for a in inputs)
        out = np.empty(np.broadcast_shapes(condition.shape, x.shape, y.shape), x.dtype)
        np.copyto(out, y)
        np.copyto(out, x, where=condition)
        return out


class NumpyExpand(_Numpy):
    """One copy of the broadcast view into a C-contiguous output."""

    operator = "expand"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.asarray(inputs[0])
        out = np.empty(problem.param("shape"), x.dtype)
        np.copyto(out, x)
        return out

