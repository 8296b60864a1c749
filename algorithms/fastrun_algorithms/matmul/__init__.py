"""The matmul operator, its CPU algorithms and its OpenCL algorithms.

``register(registry)`` adds the operator and every algorithm: ``naive``, ``blas``,
``blas_split``, ``register_tiled``, ``gemv``, ``strassen`` and one ``blocked`` algorithm per tile
configuration in :data:`BLOCKED_TILES`; and, where pyopencl is installed, the OpenCL
configurations of :mod:`fastrun_algorithms.matmul.opencl`.
"""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms._opencl_common import installed as opencl_installed
from fastrun_algorithms.matmul._batch import MatmulLayout, layout_of, matmul_layout
from fastrun_algorithms.matmul.blas import BlasMatmul
from fastrun_algorithms.matmul.blas_split import SplitBlasMatmul
from fastrun_algorithms.matmul.blocked import BlockedMatmul
from fastrun_algorithms.matmul.gemv import GemvMatmul
from fastrun_algorithms.matmul.naive import NaiveMatmul
from fastrun_algorithms.matmul.operator import MatmulOperator
from fastrun_algorithms.matmul.register_tiled import RegisterTiledMatmul
from fastrun_algorithms.matmul.strassen import StrassenMatmul

#: (mb, nb, kb) of the registered blocked algorithms.  They differ in shape, not just size: a
#: deep-K small tile for small or batched products, tall-thin and short-wide tiles for
#: skinny outputs, a balanced one, and a large square one for big products.  Changing this list
#: changes the algorithm set: bump ``MatmulOperator.version``.
BLOCKED_TILES: tuple[tuple[int, int, int], ...] = (
    (32, 32, 256),
    (32, 128, 128),
    (64, 64, 128),
    (64, 256, 64),
    (128, 128, 64),
)

__all__ = [
    "BLOCKED_TILES",
    "BlasMatmul",
    "BlockedMatmul",
    "GemvMatmul",
    "MatmulLayout",
    "MatmulOperator",
    "NaiveMatmul",
    "RegisterTiledMatmul",
    "SplitBlasMatmul",
    "StrassenMatmul",
    "layout_of",
    "matmul_layout",
    "register",
]


def register(registry: Registry) -> None:
    """Add the matmul operator and all its algorithms to ``registry``."""
    registry.register_operator(MatmulOperator())
    registry.register_algorithm(NaiveMatmul())
    registry.register_algorithm(BlasMatmul())
    registry.register_algorithm(SplitBlasMatmul())
    registry.register_algorithm(RegisterTiledMatmul())
    registry.register_algorithm(GemvMatmul())
    for mb, nb, kb in BLOCKED_TILES:
        registry.register_algorithm(BlockedMatmul({"mb": mb, "nb": nb, "kb": kb}))
    registry.register_algorithm(StrassenMatmul())
    if opencl_installed():
        from fastrun_algorithms.matmul import opencl

        opencl.register(registry)
