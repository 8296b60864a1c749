"""The conv operator, its CPU algorithms and (where pyopencl is installed) its OpenCL ones."""

from __future__ import annotations

from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.conv.operator import ConvOperator


def register(registry) -> None:
    """Add the conv operator and every conv algorithm: the CPU ones (naive last), then the
    OpenCL ones where pyopencl is installed."""
    from fastrun_algorithms.conv import (
        blocked_1x1,
        blocked_depthwise,
        blocked_direct,
        conv1x1,
        depthwise,
        depthwise_lanes,
        direct,
        grouped_lanes,
        im2col,
        implicit_gemm,
        matvec,
        naive,
        pointwise,
        tapwise,
        tiled_1x1,
        via_nchw,
        winograd,
    )

    registry.register_operator(ConvOperator())
    for module in (direct, blocked_direct, blocked_1x1, depthwise, depthwise_lanes,
                   blocked_depthwise, grouped_lanes, im2col, implicit_gemm, conv1x1, pointwise,
                   tiled_1x1, matvec, tapwise, winograd, via_nchw, naive):
        for algorithm in module.algorithms():
            registry.register_algorithm(algorithm)
    if opencl_installed():
        from fastrun_algorithms.conv import opencl

        opencl.register(registry)


__all__ = ["ConvOperator", "register"]
