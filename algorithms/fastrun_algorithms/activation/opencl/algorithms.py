"""OpenCL activation algorithms: ``cl_unary`` (every unary activation and math function, GELU
included), ``cl_softmax``, ``cl_layer_norm`` and ``cl_batch_norm``.

They run on an OpenCL device (``device_kind = "opencl"``): inputs are ``pyopencl.array.Array``
values on ``ctx.device`` (C-contiguous; views with an offset are fine) and the output is one
too.  pyopencl is imported only when they run.  None allocates anything besides its output,
and none uses atomics: all are REPRODUCIBLE with no workspace.
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
from fastrun_algorithms.activation.opencl import _kernels
from fastrun_algorithms.activation.operator import ClipOperator, HardSigmoidOperator

#: Work-items per softmax row: 1 (a work-item per row) or a work-group of that many per row.
SOFTMAX_PER_ROW = (1, 32, 256)
#: Work-items per LayerNormalization row: a work-group of that many.
LAYER_NORM_PER_ROW = (32, 256)


def _fp64_define(dtypes: Sequence[Any]) -> int:
    return int(any(np.dtype(d) == np.float64 for d in dtypes))


class _OpenCLActivation(common.OpenCLAlgorithm):
    """What the OpenCL activation algorithms share: the device kind, attributes and the
    float64 check (:class:`~fastrun_algorithms._opencl_common.OpenCLAlgorithm`)."""


class OpenCLUnary(_OpenCLActivation):
    """A unary activation or math function (``_kernels.UNARY_CODES``), one element per
    work-item; the activation is a
    ``-D OP`` switch of one source.  clip takes every integer dtype the operator does."""

    name = "cl_unary"

    def __init__(self, operator: str):
        self.operator = operator  # before super().__init__, which builds the identity from it
        super().__init__()
        #: (device, problem key) -> (kernel, scalars): built once, so a model's many small
        #: activations pay only the launch
        self._plans: dict[tuple[int, str], tuple[Any, tuple[Any, Any]]] = {}

    def _scalars(self, problem: Problem, dtype: np.dtype) -> tuple[Any, Any]:
        """The kernel's p0, p1 in X's dtype (see the source)."""
        if self.operator == "leaky_relu":
            return dtype.type(problem.param("alpha")), dtype.type(0)
        if self.operator == "clip":
            return ClipOperator.bounds(problem)
        if self.operator == "hard_sigmoid":
            return HardSigmoidOperator.coefficients(problem)
        if self.operator == "gelu":
            return dtype.type(problem.param("approximate") == "tanh"), dtype.type(0)
        return dtype.type(0), dtype.type(0)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        x = inputs[0]
        out = device.empty(tuple(problem.shapes[0]), dtype)
        total = math.prod(problem.shapes[0])
        if total == 0:
            return out
        xb, x_off = common.buffer(x, "X")
        ob, o_off = common.buffer(out, "output")
        plan = self._plans.get((id(device), problem.key))
        if plan is None:
            kernel = device.kernel(_kernels.UNARY, "unary", common.options(
                REAL=common.CL_TYPES[dtype.name], FP64=_fp64_define([dtype]),
                OP=_kernels.UNARY_CODES.index(self.operator)))
            plan = self._plans[(id(device), problem.key)] = (kernel,
                                                             self._scalars(problem, dtype))
        kernel, scalars = plan
        common.launch(device, kernel, total, [np.int64(total), xb, x_off, ob, o_off, *scalars])
        return out


def softmax_rows(problem: Problem) -> tuple[int, int, int]:
    """(rows, row length L, inner): the input viewed as (outer, L, inner) around the axis."""
    shape = problem.shapes[0]
    axis = problem.param("axis")
    length = shape[axis]
    inner = math.prod(shape[axis + 1:])
    rows = math.prod(shape) // length if length else 0
    return rows, length, inner


class _PerRow(_OpenCLActivation):
    """An algorithm configured with ``per_row`` work-items per row (a work-group of that many
    when more than one): refused where the group is wider than the row needs
    (:func:`common.group_per_extent_reason`) or than the device allows."""

    attributes = _OpenCLActivation.attributes | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.per_row = int(self.param["per_row"])

    @staticmethod
    def row_length(problem: Problem) -> int:
        raise NotImplementedError

    def unusable_reason(self, problem: Problem) -> str | None:
        return common.group_per_extent_reason(self.per_row, self.row_length(problem), "row",
                                              "row length")

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        return (common.work_group_reason(device, self.per_row)
                or super().device_unusable_reason(device, problem))


class OpenCLSoftmax(_PerRow):
    """Max-subtracted softmax along the axis, ``per_row`` work-items per row.

    ``per_row=1``: one work-item per row, neighbouring work-items on neighbouring rows; reads
    are coalesced when the axis is not the last (inner > 1), and short rows waste nothing.
    ``per_row=32`` or ``256``: a work-group per row, its work-items striding over the row and
    combining their partial max and sum by a tree in local memory; for long rows along the
    last axis, where one work-item per row would leave a GPU mostly idle.  A group larger
    than ``max(32, next power of two of L)`` is refused (it would idle most of its items).
    """

    operator = "softmax"
    name = "cl_softmax"

    @staticmethod
    def row_length(problem: Problem) -> int:
        return softmax_rows(problem)[1]

    def unusable_reason(self, problem: Problem) -> str | None:
        if problem.param("scale", 1.0) != 1.0:
            return "computes the softmax of its input as it is (no scale)"
        return super().unusable_reason(problem)

    def heuristic_rank(self, problem: Problem) -> tuple[int, int]:
        return softmax_rank(problem, self)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        out = device.empty(tuple(problem.shapes[0]), dtype)
        rows, length, inner = softmax_rows(problem)
        if rows == 0 or length == 0:
            return out
        xb, x_off = common.buffer(inputs[0], "X")
        ob, o_off = common.buffer(out, "output")
        build = common.options(REAL=common.CL_TYPES[dtype.name], FP64=_fp64_define([dtype]))
        if self.per_row == 1:
            kernel = device.kernel(_kernels.SOFTMAX, "softmax_item", build)
            common.launch(device, kernel, rows, [np.int64(rows), np.int64(length),
                                                 np.int64(inner), xb, x_off, ob, o_off])
        else:
            kernel = device.kernel(_kernels.SOFTMAX, "softmax_group", build)
            common.launch_groups(device, kernel, rows, self.per_row, [
                np.int64(length), np.int64(inner), xb, x_off, ob, o_off,
                common.local_memory(self.per_row * dtype.itemsize)])
        return out


def layer_norm_rows(problem: Problem) -> tuple[int, int]:
    """(rows, row length): X as a matrix whose rows are normalised."""
    shape, axis = problem.shapes[0], problem.param("axis")
    return math.prod(shape[:axis]), math.prod(shape[axis:])


class OpenCLLayerNorm(_PerRow):
    """LayerNormalization, a work-group of ``per_row`` work-items per row (32 or 256): they
    stride over the row for its mean and then its squared deviations, each combined by a tree
    in local memory, then write the row.  A transformer's rows are a token's features (192 to
    1024), many of them, so a group per row keeps a GPU busy where a work-item per row would
    read with a stride of a whole row."""

    operator = "layer_norm"
    name = "cl_layer_norm"

    @staticmethod
    def row_length(problem: Problem) -> int:
        return layer_norm_rows(problem)[1]

    def heuristic_rank(self, problem: Problem) -> tuple[int, int]:
        """256 work-items per row from 1024 elements on, 32 below."""
        preferred = 256 if self.row_length(problem) >= 1024 else 32
        return (0 if self.per_row == preferred else 1, self.per_row)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        out = device.empty(tuple(problem.shapes[0]), dtype)
        rows, length = layer_norm_rows(problem)
        if rows == 0 or length == 0:
            return out
        args: list[Any] = [np.int64(length)]
        for value, label in zip(inputs, ("X", "scale", "bias"), strict=True):
            args.extend(common.buffer(value, label))
        args.extend([*common.buffer(out, "output"), dtype.type(problem.param("epsilon")),
                     common.local_memory(self.per_row * dtype.itemsize)])
        kernel = device.kernel(_kernels.LAYER_NORM, "layer_norm", common.options(
            REAL=common.CL_TYPES[dtype.name], FP64=_fp64_define([dtype])))
        common.launch_groups(device, kernel, rows, self.per_row, args)
        return out


class OpenCLBatchNorm(_OpenCLActivation):
    """Inference batch norm, one element per work-item: ``(x - mean) * scale / sqrt(var +
    epsilon) + B``, the per-channel vectors read in their own dtype and converted to X's (as
    the numpy algorithm does).  The per-channel factor is recomputed per element rather than
    precomputed into a buffer: a division and a square root cost less than the workspace and
    the extra launch on any device where this is memory bound."""

    operator = "batch_norm"
    name = "cl_batch_norm"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        shape = tuple(problem.shapes[0])
        out = device.empty(shape, dtype)
        total = math.prod(shape)
        if total == 0:
            return out
        types = [common.CL_TYPES[np.dtype(d).name] for d in problem.dtypes[1:]]
        kernel = device.kernel(_kernels.BATCH_NORM, "batch_norm", common.options(
            REAL=common.CL_TYPES[dtype.name], FP64=_fp64_define(problem.dtypes),
            TS=types[0], TB=types[1], TM=types[2], TV=types[3],
            RELU=int(problem.param("activation") == "relu")))
        args: list[Any] = [np.int64(total), np.int64(shape[1]), np.int64(math.prod(shape[2:]))]
        for value, label in zip(inputs, ("X", "scale", "B", "mean", "var"), strict=True):
            args.extend(common.buffer(value, label))
        args.extend([*common.buffer(out, "output"), dtype.type(problem.param("epsilon"))])
        common.launch(device, kernel, total, args)
        return out


def softmax_rank(problem: Problem, algorithm: Algorithm) -> tuple[int, int]:
    """Heuristic rank of one ``cl_softmax`` configuration (smaller first): a work-item per row
    when the axis is not the last (its reads are then coalesced) or the rows are short; a
    work-group per row for long last-axis rows, 256 from 1024 elements on."""
    _, length, inner = softmax_rows(problem)
    per_row = int(dict(algorithm.desc.param).get("per_row", 1))
    preferred = 1 if inner > 1 or length < 128 else 256 if length >= 1024 else 32
    return (0 if per_row == preferred else 1, per_row)


def opencl_algorithms() -> list[Algorithm]:
    """``cl_unary`` per unary activation, the ``cl_softmax`` and ``cl_layer_norm``
    configurations, ``cl_batch_norm``."""
    algorithms: list[Algorithm] = [OpenCLUnary(name) for name in _kernels.UNARY_CODES]
    algorithms += [OpenCLSoftmax({"per_row": n}) for n in SOFTMAX_PER_ROW]
    algorithms += [OpenCLLayerNorm({"per_row": n}) for n in LAYER_NORM_PER_ROW]
    algorithms.append(OpenCLBatchNorm())
    return algorithms
