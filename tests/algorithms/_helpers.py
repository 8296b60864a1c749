"""What the algorithm tests share: checking an output against the reference, measuring what an
algorithm allocates, and running numba kernels on another thread count."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numba
import numpy as np

from fastrun.algorithm import Algorithm
from fastrun.operator import Operator, Problem
from fastrun.registry import Registry

#: Python objects (views, wrappers, frames) a run allocates besides its arrays: a few hundred
#: bytes each, far below any array the workspace tests allocate, so a missed buffer still fails.
TRACEMALLOC_SLACK = 8 * 1024


@contextmanager
def traced_peak() -> Iterator[list[int]]:
    """Peak bytes allocated (numpy reports its buffers to tracemalloc) inside the block, above
    what was allocated when it started; the figure is appended to the yielded list."""
    result: list[int] = []
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        yield result
        result.append(tracemalloc.get_traced_memory()[1] - start)
    finally:
        tracemalloc.stop()


@contextmanager
def numba_threads(count: int) -> Iterator[None]:
    """Run numba's parallel kernels on ``count`` threads inside the block."""
    previous = numba.get_num_threads()
    numba.set_num_threads(count)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def assert_matches_reference(operator: Operator, algorithm: Algorithm, problem: Problem,
                             inputs: Sequence[np.ndarray], output: Any) -> None:
    """``output`` is an array of the problem's output shape and dtype, within the operator's
    tolerance of its reference."""
    assert isinstance(output, np.ndarray)
    assert output.shape == operator.output_shape(problem)
    assert output.dtype == np.dtype(problem.dtypes[0])
    error = operator.error(problem, output, operator.reference(problem, inputs))
    assert error <= operator.tolerance(problem), f"{algorithm.desc} on {problem}: {error:.3g}"


def conv_registry() -> Registry:
    """The conv operator and its algorithms, with the matmul algorithms its sub-problems use
    (CPU and, where pyopencl is installed, OpenCL ones), and nothing else."""
    from fastrun_algorithms import conv, matmul

    registry = Registry(load_plugins=False)
    matmul.register(registry)
    conv.register(registry)
    return registry


def cpu_registry(*packages: Any) -> Registry:
    """A registry with the operators of ``packages`` (modules with a ``register``) and only
    their CPU algorithms: the CPU test modules run every registered algorithm on numpy arrays,
    which the OpenCL ones (registered too wherever pyopencl is installed) do not take."""
    full = Registry(load_plugins=False)
    for package in packages:
        package.register(full)
    registry = Registry(load_plugins=False)
    for name in full.operators():
        registry.register_operator(full.operator(name))
        for algorithm in full.algorithms(name):
            if algorithm.device_kind == "cpu":
                registry.register_algorithm(algorithm)
    return registry
