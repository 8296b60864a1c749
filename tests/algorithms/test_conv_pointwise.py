"""The pointwise conv (epilogue-finished gemm blocks taken from a shared task counter): the
reference over random 1x1 problems (odd channel and pixel counts, several images, strided
inputs, every epilogue, a residual), every thread count, the block plan, and the counter that
hands out the tasks."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import prange

from fastrun_algorithms._common import next_task
from fastrun_algorithms.conv import heuristic, pointwise
from fastrun_algorithms.conv.conv1x1 import Conv1x1
from fastrun_algorithms.conv.geometry import geometry
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import (
    NoSubProblems,
    assert_matches_reference,
    numba_threads,
    one_by_one_case,
    pretend_threads,
)

OPERATOR = ConvOperator()
POINTWISE = pointwise.PointwiseConv()


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, list[np.ndarray]]:
    return one_by_one_case(draw, OPERATOR, ["float32", "float64"], 23)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), threads=st.sampled_from([1, 2, 3]))
def test_pointwise_matches_the_reference(case, threads):
    problem, inputs = case
    assert POINTWISE.usable(problem), POINTWISE.unusable_reason(problem)
    with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
        output = POINTWISE.run(problem, inputs, NoSubProblems())
    assert_matches_reference(OPERATOR, POINTWISE, problem, inputs, output)


def test_every_thread_count_gives_the_reference_and_the_same_result_run_to_run():
    """MobileNetV2's 24 -> 144 layer at 56x56 and a 7x7 one.  REPRODUCIBLE holds per thread
    count, which the CPU category records: the blocks (and so OpenBLAS's kernels for their
    edges) follow the thread count, and workers take them in any order, yet each value is
    summed by one gemm call that does not depend on which worker makes it."""
    for x_shape, w_shape in (((1, 24, 56, 56), (144, 24, 1, 1)),
                             ((2, 96, 7, 7), (160, 96, 1, 1))):
        problem = OPERATOR.problem([x_shape, w_shape, (w_shape[0],)], ["float32"] * 3,
                                   activation="relu")
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(0))
        for threads in (1, 2):
            with numba_threads(threads):
                first = POINTWISE.run(problem, inputs, NoSubProblems())
                assert_matches_reference(OPERATOR, POINTWISE, problem, inputs, first)
                for _ in range(5):
                    np.testing.assert_array_equal(
                        POINTWISE.run(problem, inputs, NoSubProblems()), first)


@pytest.mark.parametrize("images,channels,pixels,threads", [
    (1, 144, 3136, 16), (1, 144, 3136, 2), (1, 1280, 49, 16), (8, 64, 3136, 16),
    (1, 3, 5, 16), (2, 33, 97, 3), (1, 1, 1, 1)])
def test_the_plan_covers_the_output_with_enough_blocks(images, channels, pixels, threads):
    kb, pb = pointwise.plan(images, channels, pixels, threads)
    assert 1 <= kb <= channels and 1 <= pb <= pixels
    blocks = images * -(-channels // kb) * -(-pixels // pb)
    # enough blocks for every thread several times over, unless the output is too small to
    # cut into blocks of the least sizes
    enough = pointwise.TASKS_PER_THREAD * threads
    assert blocks >= min(enough, images * max(1, pixels // pointwise.MIN_PIXELS)
                         * max(1, channels // pointwise.MIN_CHANNELS)) or blocks >= enough
    assert pb == pixels or pb % 16 == 0


@pytest.mark.parametrize("shapes,params,reason", [
    ([(1, 4, 5, 5), (6, 4, 3, 3)], {}, "needs a 1x1 kernel"),
    ([(1, 4, 5, 5), (6, 4, 1, 1)], {"strides": [2, 2]}, "stride 1 and no padding"),
    ([(1, 4, 5, 5), (6, 4, 1, 1)], {"pads": [1, 0, 0, 0]}, "stride 1 and no padding"),
    ([(1, 4, 5, 5), (6, 2, 1, 1)], {"group": 2}, "one group"),
])
def test_pointwise_says_why_it_cannot(shapes, params, reason):
    problem = OPERATOR.problem(shapes, ["float32"] * 2, **params)
    assert reason in POINTWISE.unusable_reason(problem)


@numba.njit(parallel=True)
def _take_every_task(counter, taken, workers):
    counter[0] = 0
    for _ in prange(workers):
        while True:
            task = next_task(counter)
            if task >= taken.size:
                break
            taken[task] += 1


def test_workers_take_each_task_exactly_once():
    with numba_threads(min(2, numba.config.NUMBA_NUM_THREADS)):
        taken = np.zeros(50_000, dtype=np.int64)
        counter = np.zeros(1, dtype=np.int64)
        _take_every_task(counter, taken, 8)
    assert (taken == 1).all()
    # each of the 8 workers ran out of tasks once: the counter went past the end 8 times
    assert counter[0] == taken.size + 8


def test_its_rule_of_thumb_puts_it_before_conv1x1_for_one_image_on_many_threads(monkeypatch):
    """``conv_rank`` is a method of the class (it once sat, unreachable, after a return)."""
    geo_one = geometry(OPERATOR.problem([(1, 64, 14, 14), (32, 64, 1, 1)], ["float32"] * 2))
    geo_batch = geometry(OPERATOR.problem([(8, 64, 14, 14), (32, 64, 1, 1)], ["float32"] * 2))
    conv1x1_rank = Conv1x1().conv_rank(geo_one)
    pretend_threads(monkeypatch, heuristic.POINTWISE_MIN_THREADS)
    assert POINTWISE.conv_rank(geo_one) < conv1x1_rank < POINTWISE.conv_rank(geo_batch)
    pretend_threads(monkeypatch, 2)
    assert POINTWISE.conv_rank(geo_one) > conv1x1_rank
