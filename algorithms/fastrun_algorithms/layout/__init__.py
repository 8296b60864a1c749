"""Tensor layouts: the channel-blocked ``nchw16c`` layout that vector-over-channel kernels
read and write, and the ``reorder`` operator that converts to and from NCHW."""

from __future__ import annotations

from fastrun.registry import Registry
from fastrun_algorithms.layout.operator import ReorderOperator


def register(registry: Registry) -> None:
    """Add the ``reorder`` operator and its CPU algorithms."""
    from fastrun_algorithms.layout import algorithms

    operator = registry.register_operator(ReorderOperator())
    for algorithm in algorithms.algorithms(operator.parallel_pays):
        registry.register_algorithm(algorithm)


__all__ = ["ReorderOperator", "register"]
