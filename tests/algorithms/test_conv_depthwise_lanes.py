"""``depthwise_lanes``: NCHW depthwise convolution with vectors over 16 channels.

The cases cover what the kernel branches on: the three kernel sizes, strides 1 and 2,
dilation, asymmetric padding, a channel count that is not a multiple of 16 (the last block
overlaps the one before it), several images, planes large enough for several row blocks per
image, every activation, and weights packed in advance or on each call.  The claims the
chooser relies on are checked directly: the exact workspace, REPRODUCIBLE, and what it
refuses, with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest

from fastrun_algorithms.conv import depthwise_lanes
from fastrun_algorithms.conv._kernels_common import staged_columns
from fastrun_algorithms.conv.epilogue import epilogue_args
from fastrun_algorithms.conv.geometry import geometry
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import (
    CONV_ACTIVATIONS,
    assert_allocates_its_workspace,
    assert_matches_reference,
    assert_same_bits_across_threads_and_concurrent_calls,
    numba_threads,
)

OPERATOR = ConvOperator()
LANES_CONV = depthwise_lanes.DepthwiseLanesConv()


def _problem(n=1, c=16, side=9, kernel=3, stride=1, dilation=1, pads=None, activation="none",
             bias=True, width=None, **extra):
    shapes = [(n, c, side, width or side), (c, 1, kernel, kernel)] + ([(c,)] if bias else [])
    pads = pads if pads is not None else (kernel // 2 * dilation,) * 4
    return OPERATOR.problem(shapes, ["float32"] * len(shapes), strides=(stride, stride),
                            dilations=(dilation, dilation), pads=pads, group=c,
                            activation=activation, **extra)


CASES = [
    {},
    {"kernel": 5},
    {"kernel": 7, "side": 12},
    {"stride": 2, "side": 14},
    {"kernel": 5, "stride": 2, "side": 15},
    {"c": 24},  # the last block overlaps the first
    {"c": 40, "kernel": 5, "side": 7},
    {"n": 3, "c": 18},
    {"dilation": 2, "side": 11},
    {"pads": (0, 2, 1, 0)},  # asymmetric
    {"pads": (0, 0, 0, 0), "kernel": 5},
    {"side": 50, "width": 41},  # several row blocks per image
    {"bias": False},
    {"side": 3, "kernel": 7, "pads": (3, 3, 3, 3)},  # a kernel wider than the plane
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda case: ",".join(f"{k}={v}" for k, v in
                                                                  case.items()) or "plain")
def test_matches_the_reference(case, threads):
    problem = _problem(**case)
    assert LANES_CONV.usable(problem), LANES_CONV.unusable_reason(problem)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(1))
    with numba_threads(threads):
        output = LANES_CONV.run(problem, inputs, ctx=None)
    assert_matches_reference(OPERATOR, LANES_CONV, problem, inputs, output)


@pytest.mark.parametrize("activation", CONV_ACTIVATIONS)
def test_every_activation(activation):
    problem = _problem(c=20, side=10, kernel=5, activation=activation)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(2))
    inputs = [value * 3 for value in inputs]  # both sides of every activation's knees
    output = LANES_CONV.run(problem, inputs, ctx=None)
    assert_matches_reference(OPERATOR, LANES_CONV, problem, inputs, output)


def test_an_overlapping_last_block_leaves_the_shared_channels_to_the_block_before():
    """With C not a multiple of 16 the last block recomputes channels of the block before
    it.  Only that block may store them: when both stored and then activated them, a thread
    could activate values another had already activated (a HardSwish applied twice, a flaky
    7e-3 error).  The last block's tasks alone, into an output of NaNs, leave them NaN."""
    c, side = 20, 6
    problem = _problem(c=c, side=side, kernel=3, activation="hard_swish")
    geo = geometry(problem)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(4))
    packed, packed_bias = LANES_CONV.preprocess(problem, inputs)
    rows = LANES_CONV.row_block(geo)
    staged = np.zeros(LANES_CONV._stage_positions(geo) * depthwise_lanes.LANES, np.float32)
    out = np.full((1, c, side, side), np.nan, np.float32)
    tasks_per_block = -(-side // rows)
    last_block = packed.shape[0] - 1
    depthwise_lanes._tasks(
        last_block * tasks_per_block, (last_block + 1) * tasks_per_block, inputs[0].reshape(-1),
        inputs[0].shape, packed.reshape(packed.shape[0], -1), packed_bias, 3, 1, 1, 1, 1, 1, 1,
        rows, staged_columns(geo), *epilogue_args(geo), staged, out.shape, out.reshape(-1))
    shared = range(c - depthwise_lanes.LANES, last_block * depthwise_lanes.LANES)
    assert np.isnan(out[0, shared]).all()
    assert not np.isnan(out[0, last_block * depthwise_lanes.LANES:]).any()


def test_packed_weights_give_the_same_bits():
    """The weight preprocessing (packing once) changes nothing in the result."""
    problem = _problem(c=24, kernel=3, activation="relu")
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(3))
    packed = LANES_CONV.preprocess(problem, inputs)
    np.testing.assert_array_equal(LANES_CONV.run(problem, inputs, None, packed),
                                  LANES_CONV.run(problem, inputs, None))


def test_reproducible_across_threads_and_concurrent_calls():
    problem = _problem(n=2, c=40, side=17, kernel=5, stride=2, activation="relu")
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(4))
    expected = LANES_CONV.run(problem, inputs, ctx=None)
    assert_same_bits_across_threads_and_concurrent_calls(
        lambda: LANES_CONV.run(problem, inputs, ctx=None), expected)


@pytest.mark.parametrize("preprocessed", [False, True])
def test_workspace_is_what_run_allocates(preprocessed):
    problem = _problem(c=24, side=30, kernel=5, weight_preprocess=preprocessed)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(5))
    packed = LANES_CONV.preprocess(problem, inputs) if preprocessed else None
    LANES_CONV.run(problem, inputs, None, packed)  # warm-up: compile or load the kernel
    assert_allocates_its_workspace(LANES_CONV, problem,
                                   lambda: LANES_CONV.run(problem, inputs, None, packed))


@pytest.mark.parametrize(("shapes", "params", "dtype", "says"), [
    ([(1, 16, 8, 8), (16, 1, 3, 3)], {"group": 16}, "float64", "float32 only"),
    ([(1, 16, 8, 8), (16, 2, 3, 3)], {"group": 8}, "float32", "group == C == K"),
    ([(1, 16, 8, 8), (32, 1, 3, 3)], {"group": 16}, "float32", "multiplier 1"),
    ([(1, 8, 8, 8), (8, 1, 3, 3)], {"group": 8}, "float32", "at least 16 channels"),
    ([(1, 16, 8, 8), (16, 1, 4, 4)], {"group": 16}, "float32", "square kernel of 3, 5, 7"),
    ([(1, 16, 8, 8), (16, 1, 3, 5)], {"group": 16}, "float32", "got 3x5"),
])
def test_refuses_what_it_cannot_compute(shapes, params, dtype, says):
    problem = OPERATOR.problem(shapes, [dtype] * 2, **params)
    reason = LANES_CONV.unusable_reason(problem)
    assert reason is not None and says in reason and "depthwise_lanes" in reason


def test_refuses_a_residual():
    problem = OPERATOR.problem([(1, 16, 8, 8), (16, 1, 3, 3), (16,), (1, 16, 8, 8)],
                               ["float32"] * 4, group=16, pads=(1, 1, 1, 1), residual=True)
    assert "residual" in LANES_CONV.unusable_reason(problem)
