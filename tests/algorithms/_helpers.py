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

#: Every epilogue activation of the conv operator, for the conv tests' random cases.
CONV_ACTIVATIONS = ["none", "relu", "clip", "hard_swish", "sigmoid", "silu", "hard_sigmoid"]

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


def assert_allocates_its_workspace(algorithm: Any, problem: Any, call: Any) -> Any:
    """``call()``'s peak allocation is the algorithm's workspace plus its output (within
    :data:`TRACEMALLOC_SLACK`).  An algorithm that keeps its buffers between calls (a
    ``scratch`` pool) allocates them on its first call of a problem, and on the next calls
    only the output and what it makes per call (weights it packs when they are not
    preprocessed): the first call's figure less the buffers it kept, and the same result.
    Returns the output."""
    scratch = getattr(algorithm, "scratch", None)
    if scratch is not None:
        scratch.clear()
    with traced_peak() as peak:
        output = call()
    expected = algorithm.workspace_bytes(problem) + output.nbytes
    assert expected <= peak[0] <= expected + TRACEMALLOC_SLACK, (expected, peak[0])
    if scratch is not None:
        with traced_peak() as peak:
            again = call()
        per_call = expected - scratch.kept_bytes
        assert again.nbytes <= peak[0] <= per_call + TRACEMALLOC_SLACK, (per_call, peak[0])
        np.testing.assert_array_equal(again, output)
    return output


def assert_same_bits_across_threads_and_concurrent_calls(call: Any, expected: np.ndarray
                                                         ) -> None:
    """``call()`` gives ``expected`` on 1 and 2 numba threads, and from three Python threads
    calling it at once: what an algorithm that keeps buffers between calls must keep."""
    import threading

    for threads in (1, 2):
        with numba_threads(threads):
            np.testing.assert_array_equal(call(), expected)
    results: list[np.ndarray] = []

    def call_repeatedly() -> None:
        for _ in range(20):
            results.append(call())

    workers = [threading.Thread(target=call_repeatedly) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(results) == 60
    for result in results:
        np.testing.assert_array_equal(result, expected)


@contextmanager
def numba_threads(count: int) -> Iterator[None]:
    """Run numba's parallel kernels on ``count`` threads inside the block."""
    previous = numba.get_num_threads()
    numba.set_num_threads(count)
    try:
        yield
    finally:
        numba.set_num_threads(previous)


def pretend_threads(monkeypatch: Any, count: int) -> None:
    """Make the algorithms' plans and rules see ``count`` numba threads (more than this
    machine may have), as ``_common.thread_count`` reads them."""
    from fastrun_algorithms import _common

    monkeypatch.setattr(_common, "_thread_count_function", lambda: lambda: count)


def assert_matches_reference(operator: Operator, algorithm: Algorithm, problem: Problem,
                             inputs: Sequence[np.ndarray], output: Any) -> None:
    """``output`` is an array of the problem's output shape and dtype, within the operator's
    tolerance of its reference."""
    assert isinstance(output, np.ndarray)
    assert output.shape == operator.output_shape(problem)
    assert output.dtype == np.dtype(problem.dtypes[0])
    error = operator.error(problem, output, operator.reference(problem, inputs))
    assert error <= operator.tolerance(problem), f"{algorithm.desc} on {problem}: {error:.3g}"


def check_drawn_problem(operator: Operator, algorithm: Algorithm,
                        drawn: tuple[Problem, np.ndarray]) -> None:
    """A drawn (problem, X) of a one-input operator: the problem is canonical, and the
    algorithm, where usable, matches the reference."""
    problem, x = drawn
    operator.validate(problem)
    if algorithm.usable(problem):
        assert_matches_reference(operator, algorithm, problem, [x],
                                 algorithm.run(problem, [x], None))


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


class NoSubProblems:
    """The run context of an algorithm that declares no sub-problem: calling one fails."""

    def call(self, problem: Problem, *inputs: Any) -> Any:
        raise AssertionError(f"an algorithm that declared no sub-problem called {problem}")


def one_by_one_case(draw: Any, operator: Operator, dtypes: Sequence[str],
                    max_side: int, strided: bool = False) -> tuple[Problem, list[np.ndarray]]:
    """A random 1x1 conv problem and its inputs, for hypothesis's ``st.composite``: 1 to 3
    images, 1 to 40 channels in and out, 1-D (up to ``max_side**2 // 2`` pixels) or 2-D (up
    to ``max_side`` a side), every activation, optional bias and residual, and X sometimes a
    strided view, as a slice of a larger tensor would be.  With ``strided``, the convolution's
    strides are 1 to 3 per axis."""
    from hypothesis import strategies as st

    dtype = draw(st.sampled_from(list(dtypes)))
    n, c, k = draw(st.integers(1, 3)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    spatial = [draw(st.integers(1, max_side * max_side // 2))] if draw(st.booleans()) else [
        draw(st.integers(1, max_side)), draw(st.integers(1, max_side))]
    params = conv_epilogue_params(draw)
    out_spatial = list(spatial)
    if strided:
        params["strides"] = [draw(st.integers(1, 3)) for _ in spatial]
        out_spatial = [(side - 1) // step + 1
                       for side, step in zip(spatial, params["strides"], strict=True)]
    return conv_case(draw, operator, dtype, (n, c, *spatial), (k, c, *[1] * len(spatial)),
                     (n, k, *out_spatial), params)


def conv_case(draw: Any, operator: Operator, dtype: str, x_shape: Sequence[int],
              w_shape: Sequence[int], out_shape: Sequence[int],
              params: dict[str, Any]) -> tuple[Problem, list[np.ndarray]]:
    """A conv problem of these shapes and its inputs, for hypothesis's ``st.composite``: the
    bias and a residual (of ``out_shape``) each drawn or not, and X sometimes a strided view."""
    from hypothesis import strategies as st

    shapes = [tuple(x_shape), tuple(w_shape)]
    if draw(st.booleans()):
        shapes.append((w_shape[0],))
    if draw(st.booleans()):
        shapes.append(tuple(out_shape))
        params = {**params, "residual": True}
    problem = operator.problem(shapes, [dtype] * len(shapes), **params)
    inputs = operator.random_inputs(problem, np.random.default_rng(draw(st.integers(0, 2**31))))
    if draw(st.booleans()):
        inputs[0] = every_other_column_view(inputs[0])
    return problem, inputs


def conv_epilogue_params(draw: Any) -> dict[str, Any]:
    """A random conv activation and its parameters, for hypothesis's ``st.composite``."""
    from hypothesis import strategies as st

    params: dict[str, Any] = {}
    activation = draw(st.sampled_from(CONV_ACTIVATIONS))
    if activation != "none":
        params["activation"] = activation
    if activation == "clip":
        params["clip_min"], params["clip_max"] = -0.5, 0.25
    return params


def every_other_column_view(x: np.ndarray) -> np.ndarray:
    """``x``'s values as a strided view (every other column of a wider array), as a slice of a
    larger tensor would be."""
    wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]
