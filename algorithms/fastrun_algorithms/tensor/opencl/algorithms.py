"""OpenCL algorithms of the tensor operators: ``cl_copy`` (transpose, slice, concat, expand),
``cl_pad``, ``cl_gather``, ``cl_gather_elements``, ``cl_scatter_nd`` and ``cl_where``.

They run on an OpenCL device (``device_kind = "opencl"``): inputs are ``pyopencl.array.Array``
values on ``ctx.device`` and the output is a new C-contiguous one, as the numpy algorithms'
outputs are new C-contiguous arrays.  pyopencl is imported only when they run, so registering
them costs nothing where OpenCL is missing.

Every dtype the operators take is moved as unsigned integers of its width (see
``_kernels``), so one program per (kernel, rank, width) serves them all.  Inputs are read
through their own strides and offset, so a view (a reshaped array, one that starts inside a
larger buffer) needs no copy first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms.tensor.opencl import _kernels
from fastrun_algorithms.tensor.operator import (
    SCATTER_REDUCTIONS,
    ConcatOperator,
    ExpandOperator,
    GatherElementsOperator,
    GatherOperator,
    PadOperator,
    ScatterNDOperator,
    SliceOperator,
    TransposeOperator,
    WhereOperator,
)

_SHAPES = {op.name: op for op in (TransposeOperator(), ConcatOperator(), SliceOperator(),
                                  PadOperator(), GatherOperator(), ExpandOperator(),
                                  WhereOperator(), GatherElementsOperator(),
                                  ScatterNDOperator())}


def _elements(x: Any) -> tuple[tuple[int, ...], int]:
    """(element strides, element offset) of a device array: the kernels index in elements."""
    size = x.dtype.itemsize
    return tuple(s // size for s in x.strides), x.offset // size


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def merge_axes(sizes: Sequence[int], *strides: Sequence[int]
               ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """The same iteration with fewer axes: size-1 axes dropped, and an axis folded into the
    next where every stride set steps over it exactly as one longer axis would.  A
    contiguous-to-contiguous copy becomes rank 1 and an NCHW -> NHWC transpose rank 3, so
    the kernels do a few div/mods per element instead of one per original axis."""
    axes = [(n, *(s[k] for s in strides)) for k, n in enumerate(sizes) if n != 1]
    merged: list[tuple[int, ...]] = []
    for axis in axes:
        if merged:
            last = merged[-1]
            if all(last[i] == axis[i] * axis[0] for i in range(1, len(axis))):
                merged[-1] = (last[0] * axis[0], *axis[1:])
                continue
        merged.append(axis)
    if not merged:
        merged = [(1, *(0 for _ in strides))]
    return (tuple(a[0] for a in merged),
            tuple(tuple(a[i] for a in merged) for i in range(1, len(strides) + 1)))


def require_contiguous(operator: str, **arrays: Any) -> None:
    """The kernels that index an operand flat need it C-contiguous: a ValueError naming the
    operand otherwise (a hidden copy would be workspace nobody declared)."""
    for which, array in arrays.items():
        if not array.flags.c_contiguous:
            raise ValueError(f"OpenCL {operator} needs contiguous {which}; got strides "
                             f"{array.strides}")


def _launch(device: Any, kernel: Any, count: int, args: Sequence[Any]) -> None:
    device.launch(kernel, args, (count,))


def _longs(values: Sequence[int]) -> list[np.int64]:
    return [np.int64(v) for v in values]


class OpenCLTensor(Algorithm):
    """Shared by the tensor OpenCL algorithms: kernels per rank and element width.

    REPRODUCIBLE: moving data is exact and done the same way every run.
    """

    device_kind = "opencl"
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem: Problem) -> str | None:
        rank = max(len(shape) for shape in problem.shapes)
        if rank > _kernels.MAX_RANK:
            return (f"rank {rank} is over the {_kernels.MAX_RANK} axes the kernels are "
                    "generated for")
        return None

    @staticmethod
    def kernel(device: Any, source: str, name: str, itemsize: int,
               extra: Sequence[str] = ()) -> Any:
        options = [f"-DT={_kernels.BIT_TYPES[itemsize]}", *extra]
        return device.kernel(source, name, options)

    @staticmethod
    def output(ctx: RunContext, problem: Problem) -> Any:
        shape = tuple(_SHAPES[problem.operator].output_shape(problem))
        return ctx.device.empty(shape, np.dtype(problem.dtypes[0]))

    def copy(self, device: Any, dst: Any, dst_base: int, dst_strides: Sequence[int],
             src: Any, src_base: int, src_strides: Sequence[int],
             sizes: Sequence[int]) -> None:
        """Enqueue ``strided_copy`` of the iteration ``sizes`` (nothing when it is empty)."""
        count = math.prod(sizes)
        if count == 0:
            return
        sizes, (dst_strides, src_strides) = merge_axes(sizes, dst_strides, src_strides)
        kernel = self.kernel(device, _kernels.strided_copy(len(sizes)), "strided_copy",
                             dst.dtype.itemsize)
        _launch(device, kernel, count,
                [dst.base_data, np.int64(dst_base), src.base_data, np.int64(src_base),
                 *_longs(sizes), *_longs(dst_strides), *_longs(src_strides)])


    def fill(self, device: Any, out: Any, src: Any, src_base: int,
             src_strides: Sequence[int]) -> None:
        """Enqueue the copy of all of ``out`` from ``src`` read at ``src_base`` through
        ``src_strides`` (one per axis of ``out``)."""
        out_strides, out_offset = _elements(out)
        self.copy(device, out, out_offset, out_strides, src, src_base, src_strides, out.shape)


class CLTranspose(OpenCLTensor):
    """One work-item per output element, reading the input through its permuted strides."""

    operator, name = "transpose", "cl_copy"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        x = inputs[0]
        out = self.output(ctx, problem)
        strides, offset = _elements(x)
        self.fill(ctx.device, out, x, offset, [strides[p] for p in problem.param("perm")])
        return out


class CLSlice(OpenCLTensor):
    """One work-item per output element: the source starts at the slice starts and steps by
    stride times step on each axis (negative steps included)."""

    operator, name = "slice", "cl_copy"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        x = inputs[0]
        out = self.output(ctx, problem)
        strides, offset = _elements(x)
        slices = problem.param("slices")
        if out.size:
            offset += sum(start * s for (start, _, _), s in zip(slices, strides, strict=True))
        self.fill(ctx.device, out, x, offset,
                  [step * s for (_, _, step), s in zip(slices, strides, strict=True)])
        return out


class CLConcat(OpenCLTensor):
    """One strided copy per input into its block of the output (empty inputs launch
    nothing)."""

    operator, name = "concat", "cl_copy"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        axis = problem.param("axis")
        out = self.output(ctx, problem)
        out_strides, out_offset = _elements(out)
        position = 0
        for x in inputs:
            strides, offset = _elements(x)
            self.copy(ctx.device, out, out_offset + position * out_strides[axis], out_strides,
                      x, offset, strides, x.shape)
            position += x.shape[axis]
        return out


_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}


class CLPad(OpenCLTensor):
    """One work-item per output element, mapping it to its source element per axis (the
    mode's rule for positions outside the kept input) or to the constant value.  Axes that no
    pad touches are merged like a copy's."""

    operator, name = "pad", "cl_pad"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        x = inputs[0]
        out = self.output(ctx, problem)
        if out.size == 0:
            return out
        pads = problem.param("pads")
        rank = x.ndim
        strides, offset = _elements(x)
        axes = []  # (n, b, m, s) per axis
        for k in range(rank):
            begin, end = pads[k], pads[rank + k]
            offset += max(-begin, 0) * strides[k] if x.size else 0
            kept = x.shape[k] - max(-begin, 0) - max(-end, 0)
            axes.append((out.shape[k], max(begin, 0), kept, strides[k]))
        merged: list[tuple[int, int, int, int]] = []
        for axis in axes:
            n, b, m, s = axis
            if n == 1 and b == 0 and m >= 1:
                continue  # coordinate 0, source position 0: contributes nothing
            if merged and b == 0 and n == m:
                ln, lb, lm, ls = merged[-1]
                if lb == 0 and ln == lm and ls == s * m:
                    merged[-1] = (ln * n, 0, ln * n, s)
                    continue
            merged.append(axis)
        merged = merged or [(1, 0, 1, 0)]
        dtype = np.dtype(problem.dtypes[0])
        bits = np.dtype(f"u{dtype.itemsize}")
        value = np.asarray(problem.param("value", 0), dtype=dtype).view(bits)[()]
        source = _kernels.pad(len(merged))
        kernel = self.kernel(ctx.device, source, "pad", dtype.itemsize,
                             [f"-DMODE={_PAD_MODES[problem.param('mode')]}"])
        source_buffer = x.base_data if x.size else out.base_data  # empty: never read
        columns = [v for column in zip(*merged, strict=True) for v in _longs(column)]
        _launch(ctx.device, kernel, out.size,
                [out.base_data, source_buffer, np.int64(offset), value, *columns])
        return out


class CLGather(OpenCLTensor):
    """One work-item per output element over data seen as (outer, n, inner).

    The kernel cannot raise: an index outside [-n, n) yields zero bits where numpy's
    algorithm raises IndexError.  ONNX leaves such a model's output undefined; checking the
    indices here would cost a device-to-host read per call.
    """

    operator, name = "gather", "cl_gather"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        data, indices = inputs
        out = self.output(ctx, problem)
        if out.size == 0:
            return out
        require_contiguous("gather", data=data, indices=indices)
        axis = problem.param("axis")
        shape = data.shape
        inner = math.prod(shape[axis + 1:])
        index_type = "int" if indices.dtype.itemsize == 4 else "long"
        kernel = self.kernel(ctx.device, _kernels.GATHER, "gather", data.dtype.itemsize,
                             [f"-DIDX={index_type}"])
        _launch(ctx.device, kernel, out.size,
                [out.base_data, data.base_data, np.int64(_elements(data)[1]),
                 indices.base_data, np.int64(_elements(indices)[1]),
                 np.int64(shape[axis]), np.int64(inner), np.int64(max(indices.size, 1))])
        return out


def broadcast_strides(x: Any, shape: Sequence[int]) -> list[int]:
    """``x``'s element strides as it is read over ``shape`` (numpy's broadcasting: axes
    aligned at the end, 0 where x has size 1 or no axis)."""
    strides, _ = _elements(x)
    pad = len(shape) - x.ndim
    return [0] * pad + [0 if x.shape[i] == 1 else strides[i] for i in range(x.ndim)]


class CLExpand(OpenCLTensor):
    """A strided copy whose source strides are 0 on the broadcast axes."""

    operator, name = "expand", "cl_copy"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        x = inputs[0]
        out = self.output(ctx, problem)
        self.fill(ctx.device, out, x, _elements(x)[1], broadcast_strides(x, out.shape))
        return out


class CLWhere(OpenCLTensor):
    """One output element per work-item, the condition, x and y each read through its own
    broadcast strides (no operand is expanded first)."""

    operator, name = "where", "cl_where"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        cond, x, y = inputs
        out = ctx.device.empty(tuple(_SHAPES["where"].output_shape(problem)),
                               np.dtype(problem.dtypes[1]))  # x's and y's type
        if out.size == 0:
            return out
        sizes, (_, *operand_strides) = merge_axes(
            out.shape, _contiguous_strides(out.shape),
            *(broadcast_strides(a, out.shape) for a in (cond, x, y)))
        kernel = self.kernel(ctx.device, _kernels.where(len(sizes)), "where",
                             out.dtype.itemsize)
        _launch(ctx.device, kernel, out.size,
                [out.base_data, cond.base_data, np.int64(_elements(cond)[1]),
                 x.base_data, np.int64(_elements(x)[1]), y.base_data,
                 np.int64(_elements(y)[1]), *_longs(sizes),
                 *(v for strides in operand_strides for v in _longs(strides))])
        return out


class CLGatherElements(OpenCLTensor):
    """One work-item per output element; as ``cl_gather``, an index out of range yields zero
    bits where numpy's algorithm raises (checking would cost a read-back per call)."""

    operator, name = "gather_elements", "cl_gather_elements"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        data, indices = inputs
        out = self.output(ctx, problem)
        if out.size == 0:
            return out
        require_contiguous("gather_elements", indices=indices)
        axis = problem.param("axis")
        strides, base = _elements(data)
        walk = [0 if k == axis else strides[k] for k in range(data.ndim)]
        index_type = "int" if indices.dtype.itemsize == 4 else "long"
        kernel = self.kernel(ctx.device, _kernels.gather_elements(data.ndim), "gather_elements",
                             data.dtype.itemsize, [f"-DIDX={index_type}"])
        _launch(ctx.device, kernel, out.size,
                [out.base_data, data.base_data, np.int64(base), indices.base_data,
                 np.int64(_elements(indices)[1]), np.int64(data.shape[axis]),
                 np.int64(strides[axis]), *_longs(indices.shape), *_longs(walk)])
        return out


class CLScatterND(OpenCLTensor):
    """A copy of data, then one work-item per element of an update block, walking the index
    rows in order (see ``_kernels.SCATTER_ND``): repeated rows need no atomics.  A row outside
    data is skipped where numpy's algorithm raises.  Data's sizes and strides go to the
    device once per problem."""

    operator, name = "scatter_nd", "cl_scatter_nd"

    def __init__(self) -> None:
        super().__init__()
        #: (device, problem key) -> data's first q sizes and strides on the device
        self._geometry: dict[tuple[int, str], Any] = {}

    def unusable_reason(self, problem: Problem) -> str | None:
        reason = common.any_type_reason("cl_scatter_nd", problem.dtypes[0])
        if reason is not None:
            return reason
        if problem.dtypes[0] == "bool" and problem.param("reduction") != "none":
            return "cl_scatter_nd combines bool values only by replacing them (reduction none)"
        return super().unusable_reason(problem)

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        return common.fp64_reason(device, problem.dtypes[:1])

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        data, indices, updates = inputs
        device = ctx.device
        out = self.output(ctx, problem)
        strides, base = _elements(data)
        self.fill(device, out, data, base, strides)
        q = indices.shape[-1]
        count = math.prod(indices.shape[:-1])
        block = math.prod(data.shape[q:])
        if count == 0 or block == 0:
            return out
        require_contiguous("scatter_nd", indices=indices, updates=updates)
        key = (id(device), problem.key)
        if key not in self._geometry:
            self._geometry[key] = device.to_device(np.array(
                [*data.shape[:q], *_contiguous_strides(data.shape)[:q]], np.int64))
        dtype = np.dtype(problem.dtypes[0])
        kernel = device.kernel(_kernels.SCATTER_ND, "scatter_nd", common.any_type_options(
            dtype, IDX="int" if indices.dtype.itemsize == 4 else "long",
            RED=SCATTER_REDUCTIONS.index(problem.param("reduction"))))
        _launch(device, kernel, block,
                [out.base_data, indices.base_data, np.int64(_elements(indices)[1]),
                 np.int64(q), self._geometry[key].base_data, updates.base_data,
                 np.int64(_elements(updates)[1]), np.int64(count), np.int64(block)])
        return out


def opencl_algorithms() -> list[Algorithm]:
    """One OpenCL algorithm per tensor operator."""
    return [CLTranspose(), CLSlice(), CLConcat(), CLPad(), CLGather(), CLExpand(), CLWhere(),
            CLGatherElements(), CLScatterND()]
