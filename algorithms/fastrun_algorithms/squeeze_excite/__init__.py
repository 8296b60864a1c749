"""The squeeze_excite operator (a squeeze-and-excitation block as one step) and its CPU
algorithm, ``fused``.  The runtime forms these steps from a model's GlobalAveragePool, 1x1
Conv, activation, 1x1 Conv, gate and Mul only where the device has an algorithm for them
(``fastrun/runtime/fusion.py``), so the OpenCL device keeps the separate steps."""

from __future__ import annotations

from fastrun_algorithms.squeeze_excite.operator import SqueezeExciteOperator


def register(registry) -> None:
    """Add the operator and its algorithm."""
    from fastrun_algorithms.squeeze_excite import fused

    registry.register_operator(SqueezeExciteOperator())
    for algorithm in fused.algorithms():
        registry.register_algorithm(algorithm)


__all__ = ["SqueezeExciteOperator", "register"]
