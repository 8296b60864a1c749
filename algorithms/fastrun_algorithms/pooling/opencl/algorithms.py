"""OpenCL pooling algorithms: ``cl_pool`` (maxpool, avgpool), ``cl_global_pool``
(global_maxpool, global_avgpool), ``cl_lrn`` and ``cl_pool_linear`` (pool_linear).

They run on an OpenCL device (``device_kind = "opencl"``): X is a ``pyopencl.array.Array`` on
``ctx.device`` (C-contiguous; a view with an offset is fine) and the output is one too.
pyopencl is imported only when they run.  None allocates anything besides its output and none
uses atomics: all are REPRODUCIBLE with no workspace.  ``cl_pool`` takes its window geometry
from :func:`~fastrun_algorithms.pooling.geometry.pool_geometry`, the CPU operator's own, so
the output size (ceil_mode) and the average's divisor (count_include_pad) cannot drift apart
from it.
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
from fastrun_algorithms.pooling.geometry import pool_geometry
from fastrun_algorithms.pooling.opencl import _kernels
from fastrun_algorithms.pooling.operator import lrn_window

#: Work-items per plane of ``cl_global_pool``: 1 (a work-item per plane) or a work-group.
GLOBAL_PER_PLANE = (1, 32, 256)


def _build(dtype: np.dtype) -> list[str]:
    return common.options(REAL=common.CL_TYPES[dtype.name], FP64=int(dtype == np.float64))


class _OpenCLPooling(Algorithm):
    """What the OpenCL pooling algorithms share: the device kind, attributes and the float64
    check."""

    device_kind = "opencl"
    attributes = AlgoAttribute.REPRODUCIBLE

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        return common.fp64_reason(device, problem.dtypes)


class OpenCLPool(_OpenCLPooling):
    """maxpool or avgpool over 1, 2 or 3 spatial axes, one output per work-item, every
    parameter set: the window loops skip taps outside the input (no padded copy), and the
    average counts its divisor per axis as the CPU geometry defines it."""

    name = "cl_pool"

    def __init__(self, operator: str):
        self.operator = operator  # before super().__init__, which builds the identity from it
        super().__init__()

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        geo = pool_geometry(problem)
        dtype = np.dtype(geo.dtype)
        out = device.empty(geo.out_shape, dtype)
        lead = 3 - geo.spatial  # 1-D and 2-D as 3-D with leading axes of one

        def axes(values: tuple[int, ...], fill: int) -> list[np.int32]:
            return [np.int32(v) for v in (fill,) * lead + tuple(values)]

        if geo.average:
            mode = _kernels.AVERAGE_WITH_PAD if geo.count_include_pad else _kernels.AVERAGE
        else:
            mode = _kernels.MAX
        total = math.prod(geo.out_shape)
        kernel = device.kernel(_kernels.POOL, "pool", _build(dtype))
        common.launch(device, kernel, total, [
            np.int64(total), np.int32(mode), *axes(geo.sizes, 1), *axes(geo.out, 1),
            *axes(geo.kernel, 1), *axes(geo.strides, 1), *axes(geo.dilations, 1),
            *axes(geo.begins, 0), *axes(geo.ends, 0),
            *common.buffer(inputs[0], "X"), *common.buffer(out, "output")])
        return out


class OpenCLGlobalPool(_OpenCLPooling):
    """global_maxpool or global_avgpool, ``per_plane`` work-items per (image, channel) plane.

    ``per_plane=1``: a work-item reads its whole plane in order (many small planes);
    ``per_plane=32`` or ``256``: a work-group strides over the plane and combines its partial
    results by a tree in local memory (large planes, and reads coalesced across the group).
    A group larger than ``max(32, next power of two of the plane size)`` is refused.
    """

    name = "cl_global_pool"
    attributes = _OpenCLPooling.attributes | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def __init__(self, operator: str, param: dict[str, Any] | None = None):
        self.operator = operator  # before super().__init__, which builds the identity from it
        super().__init__(param)
        self.per_plane = int(self.param["per_plane"])

    def unusable_reason(self, problem: Problem) -> str | None:
        return common.group_per_extent_reason(self.per_plane, math.prod(problem.shapes[0][2:]),
                                              "plane", "plane size")

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        return (common.work_group_reason(device, self.per_plane)
                or super().device_unusable_reason(device, problem))

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        shape = tuple(problem.shapes[0])
        out = device.empty((shape[0], shape[1], *(1 for _ in shape[2:])), dtype)
        planes, size = shape[0] * shape[1], math.prod(shape[2:])
        mode = np.int32(0 if self.operator == "global_maxpool" else 1)
        x = common.buffer(inputs[0], "X")
        o = common.buffer(out, "output")
        if self.per_plane == 1:
            kernel = device.kernel(_kernels.GLOBAL_POOL, "global_pool_item", _build(dtype))
            common.launch(device, kernel, planes,
                          [np.int64(planes), np.int64(size), mode, *x, *o])
        else:
            kernel = device.kernel(_kernels.GLOBAL_POOL, "global_pool_group", _build(dtype))
            common.launch_groups(device, kernel, planes, self.per_plane, [
                np.int64(size), mode, *x, *o,
                common.local_memory(self.per_plane * dtype.itemsize)])
        return out

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return global_pool_rank(problem, self)


class OpenCLLRN(_OpenCLPooling):
    """LRN, one element per work-item summing the squares of its channel window (a few
    channels in ONNX models, so recomputing each window beats a prefix-sum pass, which would
    also lose small terms in float32)."""

    operator = "lrn"
    name = "cl_lrn"

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        shape = tuple(problem.shapes[0])
        out = device.empty(shape, dtype)
        total = math.prod(shape)
        size = problem.param("size")
        before, after = lrn_window(size)
        real = dtype.type
        kernel = device.kernel(_kernels.LRN, "lrn", _build(dtype))
        common.launch(device, kernel, total, [
            np.int64(total), np.int32(shape[1]), np.int64(math.prod(shape[2:])),
            np.int32(before), np.int32(after), real(problem.param("alpha") / size),
            real(problem.param("bias")), real(problem.param("beta")),
            *common.buffer(inputs[0], "X"), *common.buffer(out, "output")])
        return out


def global_pool_rank(problem: Problem, algorithm: Algorithm) -> tuple[int, int]:
    """Heuristic rank of one ``cl_global_pool`` configuration (smaller first): a work-item per
    plane below 32 elements per plane, a work-group of 256 from 4096 on, 32 between."""
    size = math.prod(problem.shapes[0][2:])
    per_plane = int(dict(algorithm.desc.param).get("per_plane", 1))
    preferred = 1 if size < 32 else 256 if size >= 4096 else 32
    return (0 if per_plane == preferred else 1, per_plane)


class OpenCLPoolLinear(_OpenCLPooling):
    """pool_linear in one launch: each work-group pools one image's channels into local
    memory, then computes ``local`` outputs from them (see ``_kernels.POOL_LINEAR``).  The
    channels must fit the device's local memory (half of it, for the driver's own use)."""

    name = "cl_pool_linear"
    operator = "pool_linear"
    attributes = _OpenCLPooling.attributes | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def unusable_reason(self, problem: Problem) -> str | None:
        return common.group_per_extent_reason(self.local, problem.shapes[1][1], "output",
                                              "output count")

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.local = int(self.param["local"])

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        pooled = problem.shapes[0][1] * np.dtype(problem.dtypes[0]).itemsize
        if pooled > device.local_mem_size // 2:
            return (f"{problem.shapes[0][1]} channels need {pooled} B of local memory, over "
                    f"half the device's {device.local_mem_size} B")
        return (common.work_group_reason(device, self.local)
                or super().device_unusable_reason(device, problem))

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        x_shape, (channels, outputs) = problem.shapes[0], problem.shapes[1]
        images = x_shape[0]
        out = device.empty((images, outputs), dtype)
        o = common.buffer(out, "output")
        if len(inputs) == 3:
            bias = (*common.buffer(inputs[2], "B"), np.int32(1))
        else:  # never read: the output stands in
            bias = (o[0], np.int64(0), np.int32(0))
        kernel = device.kernel(_kernels.POOL_LINEAR, "pool_linear", _build(dtype))
        groups = -(-outputs // self.local)
        device.launch(kernel, [np.int32(channels), np.int64(math.prod(x_shape[2:])),
                               np.int32(outputs), *common.buffer(inputs[0], "X"),
                               *common.buffer(inputs[1], "W"), *bias, *o,
                               common.local_memory(channels * dtype.itemsize)],
                      (groups * self.local, images), (self.local, 1))
        return out


#: Work-items (outputs) per work-group of ``cl_pool_linear``.
POOL_LINEAR_LOCAL = (32, 128)


def opencl_algorithms() -> list[Algorithm]:
    """``cl_pool`` for maxpool and avgpool, the ``cl_global_pool`` configurations of both
    global pools, ``cl_lrn``, and the ``cl_pool_linear`` configurations."""
    algorithms: list[Algorithm] = [OpenCLPool("maxpool"), OpenCLPool("avgpool")]
    for operator in ("global_maxpool", "global_avgpool"):
        algorithms += [OpenCLGlobalPool(operator, {"per_plane": n}) for n in GLOBAL_PER_PLANE]
    algorithms.append(OpenCLLRN())
    algorithms += [OpenCLPoolLinear({"local": local}) for local in POOL_LINEAR_LOCAL]
    return algorithms
