"""The tensor (data movement) operators: ONNX semantics, one canonical parameter form per call.

The ONNX runtime lowers nodes onto these operators by name: ``transpose`` (perm), ``concat``
(axis), ``slice`` (starts, ends, axes, steps), ``pad`` (pads, mode, value, axes) and ``gather``
(axis).  ONNX gives several of these as constant inputs in newer opsets; here they are
parameters, so they are part of the problem and its cache key.

Why canonical parameters: the key is the cache key, so equal operations spelled differently
(a negative axis, a default left out, a slice bound past the end, Pad's ``axes``) must give one
key.  Each operator's :meth:`TensorOperator.canonical_params` resolves them to one explicit
form, and the algorithms read only that form.

Outputs are always new C-contiguous arrays, never views of an input: the kernels that consume
them assume contiguous data, and a view would let a later in-place write reach the input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.operator import Problem, Shape
from fastrun_algorithms._common import CanonicalOperator, check_known_params, parallel_pays

SUPPORTED_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                    "uint64", "float16", "float32", "float64")
INDEX_DTYPES = ("int32", "int64")
PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _int(name: str, param: str, value: Any) -> int:
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "iuf" or \
            not float(array.reshape(-1)[0]).is_integer():
        raise ValueError(f"{name} {param} must be an integer, got {value!r}")
    return int(array.reshape(-1)[0])


def _ints(name: str, param: str, value: Any) -> tuple[int, ...]:
    """A list of integers; ONNX gives them as attributes (lists) or 1-D int64 tensors."""
    array = np.asarray(value)
    if array.ndim > 1 or (array.size and array.dtype.kind not in "iu"
                          and not (array.dtype.kind == "f"
                                   and np.all(np.mod(array, 1) == 0))):
        raise ValueError(f"{name} {param} must be a list of integers, got {value!r}")
    return tuple(int(v) for v in array.reshape(-1))


def _axis(name: str, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{name} {what} {axis} is out of range for rank {rank} (allowed "
                         f"{-rank} to {rank - 1})")
    return axis % rank


def _axes(name: str, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    normalised = tuple(_axis(name, a, rank, "axes value") for a in axes)
    if len(set(normalised)) != len(normalised):
        raise ValueError(f"{name} axes must not repeat an axis, got {list(axes)} (rank {rank})")
    return normalised


def _scalar_of(name: str, param: str, value: Any, dtype: np.dtype) -> Any:
    """``value`` as a Python scalar of ``dtype``'s kind, refused where the dtype cannot hold it
    (a fraction or out-of-range number for an integer dtype); floats are rounded to the dtype,
    so spellings that round alike share a key."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise ValueError(f"{name} {param} must be a number, got {value!r}")
    number = array.reshape(-1)[0].item()
    if dtype.kind == "f":
        return float(dtype.type(number))
    if dtype.kind == "b":
        if number not in (0, 1):
            raise ValueError(f"{name} {param} must be 0 or 1 (False or True) for bool data, "
                             f"got {value!r}")
        return bool(number)
    info = np.iinfo(dtype)
    if not float(number).is_integer() or not info.min <= number <= info.max:
        raise ValueError(f"{name} {param} must be a {dtype.name} value, got {value!r}")
    return int(number)


class TensorOperator(CanonicalOperator):
    """Shared by the tensor operators: canonical problems, the dtype rules, exact checking."""

    version = 1

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        shapes = [tuple(int(d) for d in shape) for shape in shapes]
        dtypes = [np.dtype(d).name for d in dtypes]
        if not shapes:
            raise ValueError(f"{self.name} needs at least one input")
        if dtypes[0] not in SUPPORTED_DTYPES:  # concat checks that the others are the same
            raise ValueError(f"{self.name} supports dtypes {', '.join(SUPPORTED_DTYPES)}, got "
                             f"{dtypes[0]}")
        return super().problem(shapes, dtypes, **params)

    def _one_input(self, shapes: Sequence[Shape]) -> None:
        if len(shapes) != 1:
            raise ValueError(f"{self.name} takes exactly 1 input, got {len(shapes)} with "
                             f"shapes {list(shapes)}")

    def output_dtype(self, problem: Problem) -> np.dtype:
        return np.dtype(problem.dtypes[0])

    def random_inputs(self, problem: Problem, rng: np.random.Generator) -> list[np.ndarray]:
        """Values that differ from element to element in every dtype (the base class's
        [-1, 1] floats would make integer data all zeros)."""
        return [_random(shape, dtype, rng)
                for shape, dtype in zip(problem.shapes, problem.dtypes, strict=True)]

    def error(self, problem: Problem, output: Any, reference: np.ndarray) -> float:
        """0 for an exact copy of the reference (NaN matching NaN), else infinite: moving data
        must not change it."""
        output = np.asarray(output)
        if output.shape != reference.shape or output.dtype != reference.dtype:
            return float("inf")
        equal_nan = reference.dtype.kind == "f"
        return 0.0 if np.array_equal(output, reference, equal_nan=equal_nan) else float("inf")

    def tolerance(self, problem: Problem) -> float:
        return 0.0

    def parallel_pays(self, problem: Problem) -> bool:
        """Whether a parallel copy (concat's, transpose's) goes first: from
        :data:`PARALLEL_MIN_BYTES` of output on more than one numba thread (a copy is as
        memory-bound as relu, whose crossover that is); numpy's below (see
        :func:`fastrun_algorithms._common.parallel_rank`)."""
        from fastrun_algorithms.activation.operator import PARALLEL_MIN_BYTES

        size = math.prod(self.output_shape(problem)) * np.dtype(problem.dtypes[0]).itemsize
        return parallel_pays(size, PARALLEL_MIN_BYTES)


def _random(shape: Shape, dtype: str, rng: np.random.Generator) -> np.ndarray:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind == "f":
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    low = 0 if kind == "u" else -100
    return rng.integers(low, 101, size=shape).astype(dtype)


# -- transpose -----------------------------------------------------------------------------------

class TransposeOperator(TensorOperator):
    """ONNX Transpose: output axis i is input axis ``perm[i]``; perm defaults to the axes
    reversed."""

    name = "transpose"

    def canonical_params(self, shapes, dtypes, params):
        self._one_input(shapes)
        check_known_params(self.name, params, ("perm",))
        rank = len(shapes[0])
        perm = params.get("perm")
        if perm is None:
            return {"perm": tuple(range(rank - 1, -1, -1))}
        perm = _ints(self.name, "perm", perm)
        if len(perm) != rank or sorted(p % rank if -rank <= p < rank else p
                                       for p in perm) != list(range(rank)):
            raise ValueError(f"{self.name} perm must be a permutation of the {rank} axes "
                             f"0..{rank - 1}, got {list(perm)} for shape {shapes[0]}")
        return {"perm": tuple(p % rank for p in perm)}

    def output_shape(self, problem):
        return tuple(problem.shapes[0][p] for p in problem.param("perm"))

    def reference(self, problem, inputs):
        return np.array(np.transpose(np.asarray(inputs[0]), problem.param("perm")), order="C")


# -- concat --------------------------------------------------------------------------------------

class ConcatOperator(TensorOperator):
    """ONNX Concat: one or more inputs of one dtype and rank, equal in every dimension but
    ``axis`` (required), joined along it."""

    name = "concat"

    def canonical_params(self, shapes, dtypes, params):
        check_known_params(self.name, params, ("axis",))
        if params.get("axis") is None:
            raise ValueError(f"{self.name} needs the parameter axis")
        if len(set(dtypes)) != 1:
            raise ValueError(f"{self.name} inputs must all have one dtype, got "
                             f"{', '.join(dtypes)}")
        first = shapes[0]
        rank = len(first)
        if rank == 0:
            raise ValueError(f"{self.name} inputs must have rank >= 1, got 0-d inputs")
        axis = _axis(self.name, _int(self.name, "axis", params["axis"]), rank)
        for index, shape in enumerate(shapes[1:], start=1):
            if len(shape) != rank:
                raise ValueError(f"{self.name} inputs must have one rank: input 0 has shape "
                                 f"{first}, input {index} {shape}")
            for dim, (a, b) in enumerate(zip(first, shape, strict=True)):
                if dim != axis and a != b:
                    raise ValueError(f"{self.name} along axis {axis}: input {index} (shape "
                                     f"{shape}) differs from input 0 (shape {first}) in "
                                     f"dimension {dim}")
        return {"axis": axis}

    def output_shape(self, problem):
        axis = problem.param("axis")
        shape = list(problem.shapes[0])
        shape[axis] = sum(s[axis] for s in problem.shapes)
        return tuple(shape)

    def reference(self, problem, inputs):
        axis = problem.param("axis")
        out = np.empty(self.output_shape(problem), problem.dtypes[0])
        offset = 0
        for x in inputs:
            index = [slice(None)] * out.ndim
            index[axis] = slice(offset, offset + x.shape[axis])
            out[tuple(index)] = x
            offset += x.shape[axis]
        return out


# -- slice ---------------------------------------------------------------------------------------

def clamp_slice(start: int, end: int, step: int, dim: int) -> tuple[int, int, int]:
    """One axis of an ONNX Slice in canonical form.

    ONNX's rules: a negative start or end counts from the end (``+ dim``); then, stepping
    forward, both are clamped to [0, dim]; stepping backward, start to [0, dim - 1] and end to
    [-1, dim - 1] (so INT64_MIN reaches the first element).  The canonical triple picks the same
    elements with the smallest bounds: (0, 0, 1) when none, ``(i, i + 1, 1)`` for one, and
    otherwise ``end`` one step-direction past the last element (-1 when a backward slice ends
    at element 0).  So slices that pick the same elements share one key.
    """
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return _canonical(start, len(range(start, end, step)), step)


def _canonical(start: int, count: int, step: int) -> tuple[int, int, int]:
    if count == 0:
        return (0, 0, 1)
    if count == 1:
        return (start, start + 1, 1)
    return (start, start + (count - 1) * step + (1 if step > 0 else -1), step)


def slice_count(triple: Sequence[int]) -> int:
    """Elements a canonical triple picks (``end`` -1 of a backward slice is before 0, as in
    ``range``, not the last element, as in slicing)."""
    start, end, step = triple
    return len(range(start, end, step))


def is_canonical(triple: tuple[int, int, int], dim: int) -> bool:
    """Whether ``triple`` is :func:`clamp_slice`'s form for an axis of ``dim`` elements."""
    start, end, step = triple
    if step == 0:
        return False
    count = len(range(start, end, step))
    last = start + (count - 1) * step
    inside = count == 0 or (0 <= start < dim and 0 <= last < dim)
    return inside and _canonical(start, count, step) == triple


class SliceOperator(TensorOperator):
    """ONNX Slice (opset 10+): ``starts``, ``ends`` (required), ``axes`` (default the leading
    axes, one per start), ``steps`` (default 1; negative steps slice backward); negative
    values and out-of-range ones (INT64_MAX, INT64_MIN) as the specification says (see
    :func:`clamp_slice`).

    Canonical form: one parameter ``slices``, a (start, end, step) triple per axis of the data,
    (0, dim, 1) for axes not sliced.  A problem can also be built from ``slices`` directly; the
    triples must then already be canonical.
    """

    name = "slice"

    def canonical_params(self, shapes, dtypes, params):
        self._one_input(shapes)
        check_known_params(self.name, params, ("starts", "ends", "axes", "steps", "slices"))
        shape = shapes[0]
        rank = len(shape)
        if params.get("slices") is not None:
            if any(params.get(k) is not None for k in ("starts", "ends", "axes", "steps")):
                raise ValueError(f"{self.name} takes either slices or starts/ends/axes/steps, "
                                 "not both")
            return {"slices": self._canonical_slices(params["slices"], shape)}
        if params.get("starts") is None or params.get("ends") is None:
            raise ValueError(f"{self.name} needs the parameters starts and ends")
        starts = _ints(self.name, "starts", params["starts"])
        ends = _ints(self.name, "ends", params["ends"])
        axes = params.get("axes")
        axes = tuple(range(len(starts))) if axes is None else _ints(self.name, "axes", axes)
        steps = params.get("steps")
        steps = (1,) * len(starts) if steps is None else _ints(self.name, "steps", steps)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise ValueError(f"{self.name} starts, ends, axes and steps must have one length, "
                             f"got {len(starts)}, {len(ends)}, {len(axes)}, {len(steps)}")
        if len(starts) > rank:
            raise ValueError(f"{self.name} has {len(starts)} starts for data of rank {rank}")
        axes = _axes(self.name, axes, rank)
        if 0 in steps:
            raise ValueError(f"{self.name} steps must not be 0, got {list(steps)}")
        slices = [(0, dim, 1) if dim else (0, 0, 1) for dim in shape]
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            slices[axis] = clamp_slice(start, end, step, shape[axis])
        return {"slices": tuple(slices)}

    def _canonical_slices(self, slices: Any, shape: Shape) -> tuple:
        try:
            triples = tuple(tuple(int(v) for v in t) for t in slices)
            if any(len(t) != 3 for t in triples):
                raise TypeError
        except (TypeError, ValueError):
            raise ValueError(f"{self.name} slices must be (start, end, step) triples, got "
                             f"{slices!r}") from None
        if len(triples) != len(shape):
            raise ValueError(f"{self.name} slices needs one triple per axis ({len(shape)}), "
                             f"got {len(triples)}")
        for triple, dim in zip(triples, shape, strict=True):
            if not is_canonical(triple, dim):
                raise ValueError(f"{self.name} slice {triple} is not canonical for an axis of "
                                 f"size {dim}; pass starts/ends/axes/steps instead")
        return triples

    def output_shape(self, problem):
        return tuple(slice_count(t) for t in problem.param("slices"))

    def reference(self, problem, inputs):
        """Element indices from ``np.arange`` per axis, taken one axis at a time: a different
        route from the algorithm's basic slicing."""
        out = np.asarray(inputs[0])
        for axis, (start, end, step) in enumerate(problem.param("slices")):
            out = np.take(out, np.arange(start, end, step), axis=axis)
        return np.array(out, order="C")


# -- pad -----------------------------------------------------------------------------------------

class PadOperator(TensorOperator):
    """ONNX Pad: ``pads`` (begins then ends, one each per axis; a negative pad removes
    elements), ``mode`` (constant, reflect, edge, wrap), ``value`` (constant mode's fill,
    default 0) and, from opset 18, ``axes`` (the axes the pads apply to).

    Negative pads crop first, then positive pads extend what is left, reflecting, repeating or
    wrapping the cropped data (ONNX Runtime's order).  Canonical form: ``pads`` for every axis
    (``axes`` resolved away), ``mode`` in lower case, ``value`` in the data's dtype and only in
    constant mode; when no pad is positive nothing is added, so the mode is ``constant`` and
    ``value`` left out.
    """

    name = "pad"

    def canonical_params(self, shapes, dtypes, params):
        self._one_input(shapes)
        check_known_params(self.name, params, ("pads", "mode", "value", "axes"))
        shape = shapes[0]
        rank = len(shape)
        if params.get("pads") is None:
            raise ValueError(f"{self.name} needs the parameter pads")
        pads = _ints(self.name, "pads", params["pads"])
        axes = params.get("axes")
        axes = tuple(range(rank)) if axes is None else _axes(
            self.name, _ints(self.name, "axes", axes), rank)
        if len(pads) != 2 * len(axes):
            raise ValueError(f"{self.name} pads needs {2 * len(axes)} values (begins then ends "
                             f"for {len(axes)} axes), got {list(pads)}")
        begins, ends = [0] * rank, [0] * rank
        for i, axis in enumerate(axes):
            begins[axis], ends[axis] = pads[i], pads[len(axes) + i]
        mode = params.get("mode")
        mode = "constant" if mode is None else mode
        mode = (mode.decode() if isinstance(mode, bytes) else str(mode)).lower()
        if mode not in PAD_MODES:
            raise ValueError(f"{self.name} mode must be one of {', '.join(PAD_MODES)}, got "
                             f"{params.get('mode')!r}")
        for axis, (dim, begin, end) in enumerate(zip(shape, begins, ends, strict=True)):
            kept = dim + min(begin, 0) + min(end, 0)
            if kept < 0:
                raise ValueError(f"{self.name} pads ({begin}, {end}) remove more than the "
                                 f"{dim} elements of axis {axis} (shape {shape})")
            if mode != "constant" and kept == 0 and max(begin, end) > 0:
                raise ValueError(f"{self.name} mode {mode} cannot extend axis {axis}: it has "
                                 f"no elements left to {mode} from (shape {shape}, pads "
                                 f"({begin}, {end}))")
        result: dict[str, Any] = {"pads": (*begins, *ends)}
        if not any(p > 0 for p in result["pads"]):
            mode = "constant"
        result["mode"] = mode
        if mode == "constant" and any(p > 0 for p in result["pads"]):
            value = params.get("value")
            result["value"] = _scalar_of(self.name, "value", 0 if value is None else value,
                                         np.dtype(dtypes[0]))
        return result

    def output_shape(self, problem):
        pads = problem.param("pads")
        rank = len(problem.shapes[0])
        return tuple(d + pads[i] + pads[rank + i] for i, d in enumerate(problem.shapes[0]))

    def reference(self, problem, inputs):
        """Each output element's source index computed per axis (clamped for edge, mirrored
        for reflect, modulo for wrap), a different route from ``np.pad``."""
        x = np.asarray(inputs[0])
        pads = problem.param("pads")
        rank = x.ndim
        kept = x[tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[rank + i], 0))
                       for i in range(rank))]
        out_shape = self.output_shape(problem)
        mode = problem.param("mode")
        if mode == "constant":
            out = np.full(out_shape, problem.param("value", 0), dtype=x.dtype)
            out[tuple(slice(max(pads[i], 0), max(pads[i], 0) + kept.shape[i])
                      for i in range(rank))] = kept
            return out
        maps = []
        for axis in range(rank):
            n = kept.shape[axis]
            j = np.arange(out_shape[axis]) - max(pads[axis], 0)
            if mode == "edge":
                j = np.clip(j, 0, n - 1)
            elif mode == "wrap":
                j = np.mod(j, n)
            else:  # reflect: mirror about the first and last element, period 2 (n - 1)
                period = 2 * (n - 1)
                j = np.mod(j, period) if period else np.zeros_like(j)
                j = np.where(j >= n, period - j, j)
            maps.append(j)
        return np.array(kept[np.ix_(*maps)], order="C")


# -- gather --------------------------------------------------------------------------------------

class GatherOperator(TensorOperator):
    """ONNX Gather: inputs data (rank >= 1) and indices (int32 or int64, any shape, negative
    values count from the end), parameter axis (default 0).  Output shape
    ``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``.  An index out of range is an
    IndexError when the operator runs (the values are not part of the problem)."""

    name = "gather"

    def canonical_params(self, shapes, dtypes, params):
        check_known_params(self.name, params, ("axis",))
        if len(shapes) != 2:
            raise ValueError(f"{self.name} takes exactly 2 inputs (data, indices), got "
                             f"{len(shapes)} with shapes {list(shapes)}")
        if dtypes[1] not in INDEX_DTYPES:
            raise ValueError(f"{self.name} indices must be int32 or int64, got {dtypes[1]}")
        data, indices = shapes
        if not data:
            raise ValueError(f"{self.name} data must have rank >= 1, got a 0-d input")
        axis = params.get("axis")
        axis = _axis(self.name, 0 if axis is None else _int(self.name, "axis", axis), len(data))
        if data[axis] == 0 and math.prod(indices):
            raise ValueError(f"{self.name} axis {axis} of data (shape {data}) is empty, so "
                             f"none of the indices (shape {indices}) can be in range")
        return {"axis": axis}

    def output_shape(self, problem):
        data, indices = problem.shapes
        axis = problem.param("axis")
        return (*data[:axis], *indices, *data[axis + 1:])

    def reference(self, problem, inputs):
        data, indices = (np.asarray(a) for a in inputs)
        axis = problem.param("axis")
        index = positive_indices(indices, data.shape, axis)
        return np.array(data[(slice(None),) * axis + (index,)], order="C")

    def random_inputs(self, problem, rng):
        """Indices in [-n, n): valid, negative ones included."""
        data = _random(problem.shapes[0], problem.dtypes[0], rng)
        n = problem.shapes[0][problem.param("axis")]
        indices = rng.integers(-n, max(n, 1), size=problem.shapes[1]).astype(problem.dtypes[1])
        return [data, indices]


class GatherElementsOperator(GatherOperator):
    """ONNX GatherElements: ``out[..., i, ...] = data[..., indices[..., i, ...], ...]`` along
    ``axis``; indices (int32 or int64, negative values count from the end) have data's rank
    and at most its size on every other axis, and the output their shape.  What TopK's values
    are made of: X gathered by the indices of the ``topk`` operator."""

    name = "gather_elements"

    def canonical_params(self, shapes, dtypes, params):
        if len(shapes) == 2 and (not shapes[0] or len(shapes[1]) != len(shapes[0])):
            raise ValueError(f"{self.name} needs data of rank >= 1 and indices of the same "
                             f"rank, got shapes {shapes[0]} and {shapes[1]}")
        canonical = super().canonical_params(shapes, dtypes, params)  # inputs, dtypes, axis
        data, indices, axis = shapes[0], shapes[1], canonical["axis"]
        if any(i > d for a, (i, d) in enumerate(zip(indices, data, strict=True)) if a != axis):
            raise ValueError(f"{self.name} indices {indices} exceed data {data} on an axis "
                             f"other than {axis}")
        return canonical

    def output_shape(self, problem):
        return tuple(problem.shapes[1])

    def reference(self, problem, inputs):
        data, indices = (np.asarray(a) for a in inputs)
        axis = problem.param("axis")
        index = positive_indices(indices, data.shape, axis)
        out = np.empty(index.shape, data.dtype)
        for position in np.ndindex(*index.shape):
            source = list(position)
            source[axis] = index[position]
            out[position] = data[tuple(source)]
        return out


#: ScatterND's ways of combining an update with what is there
SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


class ScatterNDOperator(TensorOperator):
    """ONNX ScatterND: a copy of ``data`` with ``updates`` written at the index tuples of
    ``indices`` (int64, shape ``(..., q)``: each row addresses data's first q axes; negative
    values count from the end), or combined with what is there by ``reduction`` (add, mul,
    max, min; ``none`` replaces).  updates has shape ``indices.shape[:-1] + data.shape[q:]``.
    Rows are applied in order, so with ``none`` a repeated index keeps its last update (ONNX
    leaves that case undefined).  What a model's slice assignment (``x[i] = y``) exports to."""

    name = "scatter_nd"

    def canonical_params(self, shapes, dtypes, params):
        check_known_params(self.name, params, ("reduction",))
        if len(shapes) != 3:
            raise ValueError(f"{self.name} takes exactly 3 inputs (data, indices, updates), got "
                             f"{len(shapes)}")
        if dtypes[1] not in INDEX_DTYPES:
            raise ValueError(f"{self.name} indices must be int32 or int64, got {dtypes[1]}")
        if dtypes[2] != dtypes[0]:
            raise ValueError(f"{self.name} updates must be {dtypes[0]} like data, got "
                             f"{dtypes[2]}")
        data, indices, updates = (tuple(s) for s in shapes)
        if not data or not indices or not 1 <= indices[-1] <= len(data):
            raise ValueError(f"{self.name} needs data of rank >= 1 and indices whose last axis "
                             f"is 1..{len(data)} long, got shapes {data} and {indices}")
        expected = indices[:-1] + data[indices[-1]:]
        if updates != expected:
            raise ValueError(f"{self.name} updates must have shape {expected} (indices' "
                             f"{indices[:-1]} then data's {data[indices[-1]:]}), got {updates}")
        reduction = params.get("reduction") or "none"
        if isinstance(reduction, bytes):
            reduction = reduction.decode()
        if reduction not in SCATTER_REDUCTIONS:
            raise ValueError(f"{self.name} reduction must be one of "
                             f"{', '.join(SCATTER_REDUCTIONS)}, got {reduction!r}")
        return {"reduction": reduction}

    def output_shape(self, problem):
        return tuple(problem.shapes[0])

    def reference(self, problem, inputs):
        data, indices, updates = (np.asarray(a) for a in inputs)
        out = np.array(data, order="C")
        rows = scatter_rows(indices, data.shape)
        scatter_in_order(out, rows, updates.reshape(len(rows), *data.shape[indices.shape[-1]:]),
                         problem.param("reduction"))
        return out

    def random_inputs(self, problem, rng):
        """Index rows drawn without repeats where there are enough (a repeat's result with
        ``none`` is the last update's, which ONNX leaves open), negative ones included."""
        data_shape, indices_shape = problem.shapes[0], problem.shapes[1]
        q = indices_shape[-1]
        count = math.prod(indices_shape[:-1])
        space = math.prod(data_shape[:q])
        flat = rng.permutation(space)[:count] if count <= space else rng.integers(0, space, count)
        rows = np.stack(np.unravel_index(flat, data_shape[:q]), axis=-1) if count else \
            np.zeros((0, q), np.int64)
        negative = rng.random(rows.shape) < 0.3
        rows = np.where(negative, rows - np.array(data_shape[:q]), rows)
        indices = rows.reshape(indices_shape).astype(problem.dtypes[1])
        return [_random(data_shape, problem.dtypes[0], rng), indices,
                _random(problem.shapes[2], problem.dtypes[2], rng)]


#: How ScatterND combines an update with what is there, per reduction
SCATTER_COMBINE = {"none": lambda old, new: new, "add": np.add, "mul": np.multiply,
                   "max": np.maximum, "min": np.minimum}


def scatter_in_order(out: np.ndarray, rows: list[tuple[int, ...]], blocks: np.ndarray,
                     reduction: str) -> None:
    """ScatterND's definition: each row's block combined into ``out`` by ``reduction``, the
    rows one after another."""
    combine = SCATTER_COMBINE[reduction]
    for row, block in zip(rows, blocks, strict=True):
        out[row] = combine(out[row], block)


def scatter_rows(indices: np.ndarray, shape: Shape) -> list[tuple[int, ...]]:
    """ScatterND's index rows as tuples of non-negative indices, each checked to be inside
    data (an IndexError naming the row otherwise)."""
    q = indices.shape[-1]
    rows = []
    for row in indices.reshape(-1, q).astype(np.int64):
        fixed = []
        for axis, (i, n) in enumerate(zip(row, shape[:q], strict=True)):
            if not -n <= i < n:
                raise IndexError(f"scatter_nd index {list(map(int, row))} is out of range for "
                                 f"axis {axis} of size {n} (data shape {tuple(shape)})")
            fixed.append(int(i) + n if i < 0 else int(i))
        rows.append(tuple(fixed))
    return rows


def positive_indices(indices: np.ndarray, shape: Shape, axis: int) -> np.ndarray:
    """``indices`` as int64 in [0, n) along ``axis`` (negative ones count from the end), after
    :func:`check_indices`."""
    check_indices(indices, shape, axis)
    index = indices.astype(np.int64)
    return np.where(index < 0, index + shape[axis], index)


def check_indices(indices: np.ndarray, shape: Shape, axis: int) -> None:
    """Raise IndexError naming the first index outside [-n, n) of axis ``axis``."""
    n = shape[axis]
    if indices.size == 0:
        return
    bad = (indices < -n) | (indices >= n)
    if np.any(bad):
        first = indices[bad].reshape(-1)[0]
        raise IndexError(f"gather index {int(first)} is out of range for axis {axis} of size "
                         f"{n} (data shape {tuple(shape)}); indices must be in [{-n}, {n - 1}]")


class WhereOperator(TensorOperator):
    """ONNX Where: ``x`` where ``condition`` holds, else ``y``, the three broadcast together
    as numpy does.  Inputs condition (bool), x and y (one dtype, any of the supported ones).
    No parameters.  A selection, not arithmetic: the output is exact."""

    name = "where"

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        # the base class checks the first input's dtype; here that is the condition
        shapes = [tuple(int(d) for d in shape) for shape in shapes]
        dtypes = [np.dtype(d).name for d in dtypes]
        return CanonicalOperator.problem(self, shapes, dtypes, **params)

    def canonical_params(self, shapes, dtypes, params):
        check_known_params(self.name, params, ())
        if len(shapes) != 3:
            raise ValueError(f"{self.name} takes exactly 3 inputs (condition, x, y), got "
                             f"{len(shapes)}")
        if dtypes[0] != "bool":
            raise ValueError(f"{self.name} condition must be bool, got {dtypes[0]}")
        if dtypes[1] != dtypes[2] or dtypes[1] not in SUPPORTED_DTYPES:
            raise ValueError(f"{self.name} x and y must have one supported dtype, got "
                             f"{dtypes[1]} and {dtypes[2]}")
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            raise ValueError(f"{self.name} shapes {list(shapes)} do not broadcast") from None
        return {}

    def output_shape(self, problem):
        return tuple(np.broadcast_shapes(*problem.shapes))

    def output_dtype(self, problem):
        return np.dtype(problem.dtypes[1])

    def reference(self, problem, inputs):
        condition, x, y = (np.asarray(a) for a in inputs)
        return np.array(np.where(condition, x, y), dtype=problem.dtypes[1], order="C")


class ExpandOperator(TensorOperator):
    """ONNX Expand: X broadcast with ``shape`` (numpy's rule in both directions: a 1 in
    ``shape`` keeps X's size, and X's shape may be shorter).  One input; parameter ``shape``
    (a tuple of non-negative ints), kept as the broadcast output shape in canonical form."""

    name = "expand"

    def canonical_params(self, shapes, dtypes, params):
        check_known_params(self.name, params, ("shape",))
        self._one_input(shapes)
        wanted = params.get("shape")
        if wanted is None:
            raise ValueError(f"{self.name} needs a shape")
        wanted = tuple(_int(self.name, "shape", d) for d in wanted)
        if any(d < 0 for d in wanted):
            raise ValueError(f"{self.name} shape {wanted} has a negative size")
        try:
            out = tuple(np.broadcast_shapes(shapes[0], wanted))
        except ValueError:
            raise ValueError(f"{self.name}: X of shape {shapes[0]} does not broadcast with "
                             f"{wanted}") from None
        return {"shape": out}

    def output_shape(self, problem):
        return problem.param("shape")

    def reference(self, problem, inputs):
        return np.array(np.broadcast_to(np.asarray(inputs[0]), problem.param("shape")),
                        order="C")


OPERATORS = (TransposeOperator, ConcatOperator, SliceOperator, PadOperator, GatherOperator,
             WhereOperator, ExpandOperator)
