"""``tapwise``: which taps reach which outputs, the reference on dilated, strided and padded
layers (taps that reach nothing included; run directly also where the algorithm would not be
offered), its exact workspace, its sub-problems, and where it is usable."""

from __future__ import annotations

import numpy as np
import pytest

from fastrun_algorithms import conv
from fastrun_algorithms.conv import tapwise
from tests.algorithms._helpers import (
    assert_allocates_its_workspace,
    assert_matches_reference,
    cpu_registry,
)

REGISTRY = cpu_registry(conv)
OPERATOR = REGISTRY.operator("conv")
TAPWISE = next(a for a in REGISTRY.algorithms("conv") if a.desc.name == "tapwise")


class Products:
    """A RunContext computing the matmul sub-problems with numpy, checking each is declared."""

    def __init__(self, problem):
        self.declared = list(TAPWISE.sub_problems(problem))
        self.asked = []

    def call(self, problem, *inputs):
        self.asked.append(problem)
        return np.matmul(*inputs)


def _problem(shape, weight, dilation, pad, stride=1, **params):
    shapes = [shape, weight, (weight[0],)]
    return OPERATOR.problem(shapes, ["float32"] * 3, dilations=(dilation, dilation),
                            pads=(pad,) * 4, strides=(stride, stride), **params)


def test_an_aspp_layer_on_a_small_map_is_its_centre_tap():
    """DeepLabV3's dilation-24 3x3 on the 14x14 map of a 224-pixel input: the outer taps read
    only padding, so one product remains, over every output, reading the whole input."""
    problem = _problem((1, 960, 14, 14), (256, 960, 3, 3), 24, 24)
    (tap,) = tapwise._taps(problem)
    assert (tap.r, tap.s, tap.pixels) == (1, 1, 196)
    assert tapwise._whole(tapwise.geometry(problem), tap)
    assert TAPWISE.sub_problems(problem)[0].shapes == ((256, 960), (960, 196))


def test_a_dilation_12_layer_keeps_each_tap_where_it_reads_the_image():
    """Dilation 12 on 14 rows: an outer tap row reaches outputs 12-13 (top) or 0-1 (bottom);
    the centre tap, which reaches all 196, goes first."""
    taps = tapwise._taps(_problem((1, 8, 14, 14), (4, 8, 3, 3), 12, 12))
    assert (taps[0].r, taps[0].s) == (1, 1)
    by_tap = {(t.r, t.s): (t.rows.first, t.rows.last, t.cols.first, t.cols.last) for t in taps}
    assert by_tap[(0, 1)] == (12, 13, 0, 13) and by_tap[(2, 1)] == (0, 1, 0, 13)
    assert by_tap[(0, 0)] == (12, 13, 12, 13)
    assert sum(t.pixels for t in taps) == 196 + 4 * 28 + 4 * 4


@pytest.mark.parametrize(("shape", "weight", "dilation", "pad", "stride"), [
    ((1, 5, 14, 14), (6, 5, 3, 3), 24, 24, 1),  # the centre tap only
    ((2, 5, 14, 14), (6, 5, 3, 3), 12, 12, 1),  # partial outer taps, two images
    ((1, 3, 9, 7), (4, 3, 3, 3), 2, 3, 2),  # strided and dilated
    ((1, 3, 2, 2), (4, 3, 1, 1), 1, 3, 1),  # outputs no tap reaches: the bias alone
    ((1, 3, 11, 10), (4, 3, 5, 3), 1, 0, 1),  # no padding
])
@pytest.mark.parametrize("preprocessed", [False, True])
def test_matches_the_reference_with_its_exact_workspace(shape, weight, dilation, pad, stride,
                                                        preprocessed):
    problem = _problem(shape, weight, dilation, pad, stride, activation="relu",
                       **({"weight_preprocess": True} if preprocessed else {}))
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in problem.shapes]
    prepared = TAPWISE.preprocess(problem, inputs) if preprocessed else None
    TAPWISE.run(problem, inputs, Products(problem), prepared)  # compiled: what calls share
    context = Products(problem)
    out = assert_allocates_its_workspace(
        TAPWISE, problem, lambda: TAPWISE.run(problem, inputs, context, prepared))
    assert_matches_reference(OPERATOR, TAPWISE, problem, inputs, out)
    assert context.asked == context.declared[:len(context.asked)]
    assert len(context.asked) == len(context.declared)


def test_groups_are_refused_with_the_reason():
    grouped = OPERATOR.problem([(1, 4, 5, 5), (4, 2, 3, 3)], ["float32"] * 2, group=2)
    assert "one group" in TAPWISE.unusable_reason(grouped)


def test_usable_only_where_taps_read_mostly_padding_and_then_ranked_first():
    """A 3x3 layer with a one-pixel border keeps most of its taps' outputs: refused, with the
    share; the ASPP layers keep 11-18% and go ahead of im2col by the rule of thumb."""
    plain = _problem((1, 64, 14, 14), (64, 64, 3, 3), 1, 1)
    assert "reach 91% of their outputs" in TAPWISE.unusable_reason(plain)
    for dilation in (12, 24, 36):
        aspp = _problem((1, 960, 14, 14), (256, 960, 3, 3), dilation, dilation)
        assert TAPWISE.unusable_reason(aspp) is None
        order = [a.desc.name
                 for a in OPERATOR.heuristic_order(aspp, REGISTRY.algorithms("conv"))]
        assert order.index("tapwise") < order.index("im2col")
