"""``matvec``: convolutions whose kernel spans the unpadded input, as one matrix-vector product
per image: the reference over random problems (row counts not a multiple of four, fewer
channels than a task's rows, sums shorter and longer than the partial-sum width, a kernel of
several taps, several images, every epilogue, a residual, strided inputs), the same bits on
every thread count, its refusals, and its place first among the usable algorithms."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun_algorithms import conv
from fastrun_algorithms.conv import matvec
from tests.algorithms._helpers import (
    NoSubProblems,
    assert_matches_reference,
    assert_same_bits_across_threads_and_concurrent_calls,
    conv_case,
    conv_epilogue_params,
    cpu_registry,
    numba_threads,
)

REGISTRY = cpu_registry(conv)
OPERATOR = REGISTRY.operator("conv")
MATVEC = matvec.MatvecConv()


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, list[np.ndarray]]:
    dtype = draw(st.sampled_from(["float32", "float64"]))
    n, c, k = draw(st.integers(1, 3)), draw(st.integers(1, 80)), draw(st.integers(1, 13))
    side = draw(st.sampled_from([(1, 1), (2, 3), (3, 3)]))
    return conv_case(draw, OPERATOR, dtype, (n, c, *side), (k, c, *side), (n, k, 1, 1),
                     conv_epilogue_params(draw))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), threads=st.sampled_from([1, 2, 3]))
def test_matvec_matches_the_reference(case, threads):
    problem, inputs = case
    assert MATVEC.usable(problem), MATVEC.unusable_reason(problem)
    with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
        output = MATVEC.run(problem, inputs, NoSubProblems())
    assert_matches_reference(OPERATOR, MATVEC, problem, inputs, output)


def test_squeeze_excitation_layers_repeat_exactly_on_every_thread_count():
    """MobileNetV3-Large's 960 -> 240 (Relu) and 240 -> 960 squeeze-excitation convolutions."""
    for c, k, activation in ((960, 240, "relu"), (240, 960, "none")):
        shapes = [(1, c, 1, 1), (k, c, 1, 1), (k,)]
        problem = OPERATOR.problem(shapes, ["float32"] * 3, activation=activation)
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(0))
        expected = MATVEC.run(problem, inputs, NoSubProblems())
        assert_matches_reference(OPERATOR, MATVEC, problem, inputs, expected)
        assert_same_bits_across_threads_and_concurrent_calls(
            lambda problem=problem, inputs=inputs: MATVEC.run(problem, inputs, NoSubProblems()),
            expected)


@pytest.mark.parametrize(("shapes", "params", "reason"), [
    ([(1, 8, 3, 3), (4, 8, 1, 1)], {}, "kernel 1x1 on 3x3, output 3x3"),
    ([(1, 8, 1, 1), (4, 8, 1, 1)], {"pads": [1, 1, 1, 1]}, "unpadded"),
    ([(1, 8, 1, 1), (4, 4, 1, 1)], {"group": 2}, "group 2"),
])
def test_other_layers_are_refused_with_the_reason(shapes, params, reason):
    problem = OPERATOR.problem(shapes, ["float32"] * 2, **params)
    assert reason in MATVEC.unusable_reason(problem)


def test_ranked_first_where_usable():
    problem = OPERATOR.problem([(1, 672, 1, 1), (168, 672, 1, 1), (168,)], ["float32"] * 3)
    usable = [a for a in REGISTRY.algorithms("conv") if a.usable(problem)]
    assert OPERATOR.heuristic_order(problem, usable)[0].desc.name == "matvec"
