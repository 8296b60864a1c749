"""The conv operator and its CPU algorithms."""

from __future__ import annotations

from fastrun_algorithms.conv.operator import ConvOperator


def register(registry) -> None:
    """Add the conv operator and every conv algorithm (naive last in registration order)."""
    from fastrun_algorithms.conv import conv1x1, depthwise, direct, im2col, naive, winograd

    registry.register_operator(ConvOperator())
    for module in (direct, depthwise, im2col, conv1x1, winograd, naive):
        for algorithm in module.algorithms():
            registry.register_algorithm(algorithm)


__all__ = ["ConvOperator", "register"]
