"""OpenCL matmul algorithms (``cl_naive``, ``cl_tiled``, ``cl_direct``, ``cl_gemm``).

Importing this package does not import pyopencl: the algorithms import it when they run, so
the plugin loads (and lists these algorithms) on machines without OpenCL, where the chooser
never offers them because no OpenCL device exists.  See docs/opencl-matmul.md.
"""

from __future__ import annotations

from fastrun.algorithm import Algorithm
from fastrun.registry import Registry
from fastrun_algorithms.matmul.opencl.algorithms import (
    DirectCLMatmul,
    GemmCLMatmul,
    NaiveCLMatmul,
    OpenCLMatmul,
    TiledCLMatmul,
)
from fastrun_algorithms.matmul.opencl.space import (
    DIRECT_LOCAL,
    DIRECT_WORK,
    TILED_SIZES,
    gemm_configurations,
)

__all__ = [
    "DirectCLMatmul",
    "GemmCLMatmul",
    "NaiveCLMatmul",
    "OpenCLMatmul",
    "TiledCLMatmul",
    "opencl_algorithms",
    "register",
]


def opencl_algorithms() -> list[Algorithm]:
    """One algorithm per registered configuration: naive, tiled, direct, then gemm."""
    algorithms: list[Algorithm] = [NaiveCLMatmul()]
    algorithms += [TiledCLMatmul({"ts": ts}) for ts in TILED_SIZES]
    algorithms += [DirectCLMatmul({"wm": wm, "wn": wn, "lx": lx, "ly": ly})
                   for wm, wn in DIRECT_WORK for lx, ly in DIRECT_LOCAL]
    algorithms += [GemmCLMatmul(param) for param in gemm_configurations()]
    return algorithms


def register(registry: Registry) -> None:
    """Add every OpenCL matmul configuration to ``registry`` (the operator is registered by
    :func:`fastrun_algorithms.matmul.register`)."""
    for algorithm in opencl_algorithms():
        registry.register_algorithm(algorithm)
