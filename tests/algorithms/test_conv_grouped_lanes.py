"""``grouped_lanes``: NCHW grouped convolution with vectors over a group's output channels.

The cases cover what the kernel branches on: groups of 8 output channels (8-channel tiles)
and of 16 or more (16-channel tiles, a last block that overlaps the one before it when the
group is not a multiple of the block), input channels per group from one (a depthwise layer
with a multiplier) to many, the unrolled kernel rows (three taps at stride 1 and 2) and the
general ones (other widths, dilation, stride 3), asymmetric padding, rows narrower than a
tile, several row blocks per image, several images, every activation, and weights packed in
advance or on each call.  The claims the chooser relies on are checked directly: the exact
workspace, REPRODUCIBLE, and what it refuses, with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastrun_algorithms.conv import grouped_lanes
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import (
    CONV_ACTIVATIONS,
    assert_allocates_its_workspace,
    assert_matches_reference,
    assert_same_bits_across_threads_and_concurrent_calls,
    numba_threads,
)

OPERATOR = ConvOperator()
GROUPED = grouped_lanes.GroupedLanesConv()


def _problem(n=1, c=16, k=None, group=2, side=9, kernel=3, stride=1, dilation=1, pads=None,
             activation="none", bias=True, width=None, **extra):
    k = k or c
    shapes = [(n, c, side, width or side), (k, c // group, kernel, kernel)] + (
        [(k,)] if bias else [])
    pads = pads if pads is not None else (kernel // 2 * dilation,) * 4
    return OPERATOR.problem(shapes, ["float32"] * len(shapes), strides=(stride, stride),
                            dilations=(dilation, dilation), pads=pads, group=group,
                            activation=activation, **extra)


CASES = [
    {},  # 8 channels per group: 8-channel tiles
    {"c": 32, "group": 2, "side": 7},  # 16 per group: 16-channel tiles
    {"c": 48, "group": 2, "stride": 2, "side": 14},  # 24 per group: overlapping blocks
    {"c": 36, "group": 3, "side": 10},  # 12 per group: two overlapping 8-channel blocks
    {"c": 8, "k": 64, "group": 8},  # one input channel per group, multiplier 8
    {"c": 16, "k": 32, "group": 2, "kernel": 5, "side": 11},
    {"stride": 2, "side": 15},
    {"stride": 3, "side": 16},
    {"kernel": 1, "pads": (0, 0, 0, 0)},
    {"dilation": 2, "side": 11},
    {"pads": (0, 2, 1, 0)},  # asymmetric
    {"side": 5, "width": 3},  # rows narrower than a tile
    {"side": 60, "width": 37},  # several row blocks per image
    {"n": 3, "c": 24, "group": 3},
    {"bias": False},
    {"side": 3, "kernel": 7, "pads": (3, 3, 3, 3)},  # a kernel wider than the plane
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda case: ",".join(f"{k}={v}" for k, v in
                                                                  case.items()) or "plain")
def test_matches_the_reference(case, threads):
    problem = _problem(**case)
    assert GROUPED.usable(problem), GROUPED.unusable_reason(problem)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(1))
    with numba_threads(threads):
        output = GROUPED.run(problem, inputs, ctx=None)
    assert_matches_reference(OPERATOR, GROUPED, problem, inputs, output)


@pytest.mark.parametrize("activation", CONV_ACTIVATIONS)
def test_every_activation(activation):
    problem = _problem(c=32, side=10, activation=activation)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(2))
    inputs = [value * 3 for value in inputs]  # both sides of every activation's knees
    output = GROUPED.run(problem, inputs, ctx=None)
    assert_matches_reference(OPERATOR, GROUPED, problem, inputs, output)


@pytest.mark.parametrize("activation", ["hard_swish", "sigmoid"])
def test_activations_after_overlapping_blocks(activation):
    """12 channels per group are two 8-channel blocks sharing four channels: the activation
    applies once to each channel, after both blocks are stored."""
    problem = _problem(c=36, group=3, side=10, activation=activation)
    inputs = [value * 3 for value in OPERATOR.random_inputs(problem, np.random.default_rng(6))]
    output = GROUPED.run(problem, inputs, ctx=None)
    assert_matches_reference(OPERATOR, GROUPED, problem, inputs, output)


def test_packed_weights_give_the_same_bits():
    """The weight preprocessing (packing once) changes nothing in the result."""
    problem = _problem(c=48, group=2, activation="relu")
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(3))
    packed = GROUPED.preprocess(problem, inputs)
    np.testing.assert_array_equal(GROUPED.run(problem, inputs, None, packed),
                                  GROUPED.run(problem, inputs, None))


def test_reproducible_across_threads_and_concurrent_calls():
    problem = _problem(n=2, c=64, group=4, side=17, stride=2, activation="relu")
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(4))
    expected = GROUPED.run(problem, inputs, ctx=None)
    assert_same_bits_across_threads_and_concurrent_calls(
        lambda: GROUPED.run(problem, inputs, ctx=None), expected)


@pytest.mark.parametrize("preprocessed", [False, True])
def test_workspace_is_what_run_allocates(preprocessed):
    problem = _problem(c=48, group=3, side=30, kernel=5, weight_preprocess=preprocessed)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(5))
    packed = GROUPED.preprocess(problem, inputs) if preprocessed else None
    GROUPED.run(problem, inputs, None, packed)  # warm-up: compile or load the kernel
    assert_allocates_its_workspace(GROUPED, problem,
                                   lambda: GROUPED.run(problem, inputs, None, packed))


@pytest.mark.parametrize(("shapes", "params", "dtype", "says"), [
    ([(1, 16, 8, 8), (16, 8, 3, 3)], {"group": 2}, "float64", "float32 only"),
    ([(1, 16, 8, 8), (16, 16, 3, 3)], {"group": 1}, "float32", "more than one group"),
    ([(1, 16, 8, 8), (16, 4, 3, 3)], {"group": 4}, "float32", "at least 8 output channels"),
])
def test_refuses_what_it_cannot_compute(shapes, params, dtype, says):
    problem = OPERATOR.problem(shapes, [dtype] * 2, **params)
    reason = GROUPED.unusable_reason(problem)
    assert reason is not None and says in reason and "grouped_lanes" in reason


def test_refuses_a_residual():
    problem = OPERATOR.problem([(1, 16, 8, 8), (16, 8, 3, 3), (16,), (1, 16, 8, 8)],
                               ["float32"] * 4, group=2, pads=(1, 1, 1, 1), residual=True)
    assert "residual" in GROUPED.unusable_reason(problem)
