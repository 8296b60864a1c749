"""The 1x1 conv in register tiles (8 x 32, or 3 x 32 on AVX2): the reference over random
problems (channel counts that are not a multiple of the tile's, planes smaller and larger than
a tile, several images, strided inputs, strides of 1 to 3, every epilogue, a residual), every
thread count, run-to-run identity (a strided problem's kept gather buffer included), and its
refusals."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun_algorithms.conv import tiled_1x1
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import (
    NoSubProblems,
    assert_matches_reference,
    numba_threads,
    one_by_one_case,
)

OPERATOR = ConvOperator()
TILED = tiled_1x1.Tiled1x1Conv()


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, list[np.ndarray]]:
    # up to 12x12 or 72 pixels: planes smaller and larger than one 32-pixel tile
    return one_by_one_case(draw, OPERATOR, ["float32"], 12, strided=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), threads=st.sampled_from([1, 2, 3]))
def test_tiled_1x1_matches_the_reference(case, threads):
    problem, inputs = case
    assert TILED.usable(problem), TILED.unusable_reason(problem)
    with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
        output = TILED.run(problem, inputs, NoSubProblems())
    assert_matches_reference(OPERATOR, TILED, problem, inputs, output)


def test_mobilenet_layers_match_and_repeat_exactly_on_every_thread_count():
    """16 -> 96 at 20x20 (400 pixels: 12 whole tiles and an overlapping one; 96 channels in
    12 tiles of 8), 160 -> 33 at 7x7 with a residual (33 channels: the last tile repeats
    its last channel) and a stride-2 layer of 24 -> 40 at 15x15 (8x8 outputs)."""
    layers = (([(1, 16, 20, 20), (96, 16, 1, 1), (96,)], {"activation": "clip"}),
              ([(2, 160, 7, 7), (33, 160, 1, 1), (33,), (2, 33, 7, 7)], {"residual": True}),
              ([(1, 24, 15, 15), (40, 24, 1, 1), (40,)], {"strides": [2, 2]}))
    for shapes, params in layers:
        problem = OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(0))
        results = []
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            with numba_threads(threads):
                results.append(TILED.run(problem, inputs, NoSubProblems()))
                for _ in range(3):
                    np.testing.assert_array_equal(TILED.run(problem, inputs, NoSubProblems()),
                                                  results[-1])
        assert_matches_reference(OPERATOR, TILED, problem, inputs, results[0])
        np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("shapes,dtype,params,reason", [
    ([(1, 4, 5, 5), (6, 4, 3, 3)], "float32", {}, "a 1x1 kernel"),
    ([(1, 4, 5, 5), (6, 4, 1, 1)], "float32", {"pads": [0, 1, 0, 0]}, "no padding"),
    ([(1, 4, 5, 5), (6, 2, 1, 1)], "float32", {"group": 2}, "one group"),
    ([(1, 4, 5, 5), (6, 4, 1, 1)], "float64", {}, "float32"),
])
def test_tiled_1x1_says_why_it_cannot(shapes, dtype, params, reason):
    problem = OPERATOR.problem(shapes, [dtype] * 2, **params)
    assert reason in TILED.unusable_reason(problem)
