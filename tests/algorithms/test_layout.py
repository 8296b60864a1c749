"""The channel-blocked layout ``nchw16c``: the ``reorder`` operator both ways, conv problems in
that layout (validation, the reference), and the algorithms that compute them
(``blocked_direct``, ``blocked_depthwise``, ``via_nchw``) against the reference over random
problems with channel counts that are not a multiple of the block and garbage in the input's
padding lanes; the NCHW algorithms' refusal; and a search that times a blocked problem."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun.algorithm import Algorithm
from fastrun.api import Session
from fastrun.cache import InMemoryCache
from fastrun.core.strategy import Strategy
from fastrun.operator import Problem
from fastrun_algorithms.conv import blocked_1x1, blocked_depthwise, blocked_direct, via_nchw
from fastrun_algorithms.conv.geometry import geometry
from fastrun_algorithms.conv.operator import ConvOperator
from fastrun_algorithms.layout import algorithms as reorders
from fastrun_algorithms.layout.blocking import LANES, blocked_shape, blocks, to_blocked
from fastrun_algorithms.layout.operator import ReorderOperator
from tests.algorithms._helpers import (
    CONV_ACTIVATIONS,
    NoSubProblems,
    assert_matches_reference,
    numba_threads,
)

CONV = ConvOperator()
REORDER = ReorderOperator()
DIRECT = blocked_direct.BlockedDirectConv()
DEPTHWISE = blocked_depthwise.BlockedDepthwiseConv()
POINTWISE = blocked_1x1.BlockedPointwiseConv()
#: what a blocked tensor's padding lanes hold in these tests: consumers must never read them
GARBAGE = 1e6


def _blocked_input(x: np.ndarray) -> np.ndarray:
    blocked = to_blocked(x)
    channels = x.shape[1]
    if channels % LANES:
        blocked[:, -1, ..., channels % LANES:] = GARBAGE
    return blocked


# -- reorder -------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 40), spatial=st.lists(st.integers(1, 9), min_size=1,
                                                                       max_size=3),
       dtype=st.sampled_from(["float32", "float64"]), threads=st.sampled_from([1, 2, 3]))
def test_reorder_round_trips_exactly(n, c, spatial, dtype, threads):
    x = np.random.default_rng(c).uniform(-1, 1, (n, c, *spatial)).astype(dtype)
    there = REORDER.problem([x.shape], [dtype], to="nchw16c")
    assert REORDER.output_shape(there) == (n, blocks(c), *spatial, LANES)
    expected = REORDER.reference(there, [x])
    assert np.all(expected[:, -1, ..., (c % LANES or LANES):] == 0)  # zero padding lanes
    for algorithm in reorders.algorithms(REORDER.parallel_pays):
        with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
            blocked = algorithm.run(there, [x], NoSubProblems())
            assert blocked.dtype == x.dtype and np.array_equal(blocked, expected)
            back = REORDER.problem([blocked.shape], [dtype], to="nchw", channels=c)
            assert np.array_equal(algorithm.run(back, [_blocked_input(x)], NoSubProblems()), x)


@pytest.mark.parametrize("shapes, params, message", [
    ([(1, 3, 4, 4)], {}, "to= one of"),
    ([(1, 3, 4, 4)], {"to": "nhwc"}, "to= one of"),
    ([(1, 3)], {"to": "nchw16c"}, "spatial"),
    ([(1, 3, 4, 4)], {"to": "nchw16c", "channels": 3}, "takes no channels"),
    ([(1, 1, 4, 4, 16)], {"to": "nchw"}, "needs channels"),
    ([(1, 2, 4, 4, 16)], {"to": "nchw", "channels": 3}, "(N, 1, ..., 16)"),
    ([(1, 1, 4, 4, 8)], {"to": "nchw", "channels": 3}, "must have shape"),
    ([(1, 3, 4, 4)], {"to": "nchw16c", "axis": 1}, "no parameter(s) axis"),
])
def test_reorder_rejects_bad_problems(shapes, params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        REORDER.problem(shapes, ["float32"], **params)


# -- conv problems in nchw16c --------------------------------------------------------------------

def test_blocked_conv_problem_shapes_and_errors():
    problem = CONV.problem([(2, 2, 7, 7, 16), (40, 20, 3, 3), (40,)], ["float32"] * 3,
                           pads=[1, 1, 1, 1], layout="nchw16c")
    assert problem.param("layout") == "nchw16c"
    assert CONV.output_shape(problem) == (2, 3, 7, 7, 16)
    nchw = CONV.problem([(2, 20, 7, 7), (40, 20, 3, 3), (40,)], ["float32"] * 3,
                        pads=[1, 1, 1, 1], layout="nchw")
    assert nchw.param("layout") is None  # the default is not spelled: NCHW keys are unchanged
    with pytest.raises(ValueError, match="must have shape"):  # 20 channels are 2 blocks
        CONV.problem([(2, 3, 7, 7, 16), (40, 20, 3, 3)], ["float32"] * 2, layout="nchw16c")
    with pytest.raises(ValueError, match="is 2-D"):
        CONV.problem([(2, 20, 7, 7), (40, 20, 3, 3)], ["float32"] * 2, layout="nchw16c")
    with pytest.raises(ValueError, match="layout must be one of"):
        CONV.problem([(2, 20, 7, 7), (40, 20, 3, 3)], ["float32"] * 2, layout="nhwc")


def test_blocked_reference_is_the_blocked_nchw_reference():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 20, 6, 6))
    w, b = rng.uniform(-1, 1, (24, 20, 3, 3)), rng.uniform(-1, 1, 24)
    z = rng.uniform(-1, 1, (1, 24, 6, 6))
    params = {"pads": [1, 1, 1, 1], "activation": "relu", "residual": True}
    nchw = CONV.problem([x.shape, w.shape, b.shape, z.shape], ["float64"] * 4, **params)
    xb, zb = _blocked_input(x), _blocked_input(z)
    blocked = CONV.problem([xb.shape, w.shape, b.shape, zb.shape], ["float64"] * 4, **params,
                           layout="nchw16c")
    expected = to_blocked(CONV.reference(nchw, [x, w, b, z]))
    assert np.array_equal(CONV.reference(blocked, [xb, w, b, zb]), expected)


def test_nchw_algorithms_refuse_blocked_problems():
    from tests.algorithms._helpers import conv_registry

    problem = CONV.problem([(1, 1, 8, 8, 16), (16, 16, 3, 3)], ["float32"] * 2,
                           layout="nchw16c")
    usable = {a.desc.name for a in conv_registry().algorithms("conv")
              if a.device_kind == "cpu" and a.usable(problem)}
    assert usable == {"blocked_direct", "via_nchw"}
    direct = next(a for a in conv_registry().algorithms("conv") if a.desc.name == "direct")
    reason = direct.unusable_reason(problem)
    assert "not nchw16c" in reason


# -- the algorithms ------------------------------------------------------------------------------

@st.composite
def cases(draw: st.DrawFn, depthwise: bool, unrolled: bool = False
          ) -> tuple[Problem, list[np.ndarray]]:
    n = draw(st.integers(1, 2))
    if depthwise:
        c = k = group = draw(st.integers(1, 40))
    else:
        group = draw(st.sampled_from([1, 1, 1, 2]))
        c = group * (LANES * draw(st.integers(1, 2)) if group > 1 else draw(st.integers(1, 40)))
        k = group * (LANES if group > 1 else draw(st.integers(1, 40)))
    kernel = [draw(st.sampled_from([3, 5]))] * 2 if unrolled else \
        [draw(st.integers(1, 5 if depthwise else 3)) for _ in range(2)]
    spatial = [draw(st.integers(kk, 13)) for kk in kernel]
    params: dict[str, Any] = {"group": group, "layout": "nchw16c"}
    if draw(st.booleans()):
        params["strides"] = [draw(st.integers(1, 3)) for _ in kernel]
    if draw(st.booleans()):
        params["pads"] = [draw(st.integers(0, 2)) for _ in range(4)]
    if draw(st.booleans()) and not unrolled:
        params["dilations"] = [1 if size < 2 * kk - 1 else draw(st.integers(1, 2))
                               for kk, size in zip(kernel, spatial, strict=True)]
    activation = draw(st.sampled_from(CONV_ACTIVATIONS))
    if activation != "none":
        params["activation"] = activation
    if activation == "clip":
        params["clip_min"], params["clip_max"] = 0.1, 0.5  # nonzero at zero: padding lanes
    if draw(st.booleans()):
        params["weight_preprocess"] = True
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.uniform(-1, 1, (n, c, *spatial)).astype(np.float32)
    inputs = [_blocked_input(x),
              rng.uniform(-1, 1, (k, c // group, *kernel)).astype(np.float32)]
    if draw(st.booleans()):
        inputs.append(rng.uniform(-1, 1, k).astype(np.float32))
    shapes = [a.shape for a in inputs]
    out_shape = CONV.output_shape(CONV.problem(shapes, ["float32"] * len(shapes), **params))
    if draw(st.booleans()):
        z = rng.uniform(-1, 1, (n, k, *out_shape[2:4])).astype(np.float32)
        inputs.append(_blocked_input(z))
        params["residual"] = True
    problem = CONV.problem([a.shape for a in inputs], ["float32"] * len(inputs), **params)
    return problem, inputs


def _check(algorithm: Algorithm, problem: Problem, inputs: list[np.ndarray],
           threads: int, ctx: Any = None) -> np.ndarray:
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    prepared = algorithm.preprocess(problem, inputs) if problem.weight_preprocess else None
    with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
        output = algorithm.run(problem, inputs, ctx or NoSubProblems(), prepared)
    assert_matches_reference(CONV, algorithm, problem, inputs, output)
    k = problem.shapes[1][0]
    if k % LANES:  # the padding lanes hold zeros, whatever the epilogue makes of zero
        assert np.all(output[:, -1, ..., k % LANES:] == 0)
    return output


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(depthwise=False), threads=st.sampled_from([1, 2, 3]))
def test_blocked_direct_in_nchw16c_matches_the_reference(case, threads):
    problem, inputs = case
    first = _check(DIRECT, problem, inputs, threads)
    assert np.array_equal(first, _check(DIRECT, problem, inputs, 1))  # any thread count


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(depthwise=True), threads=st.sampled_from([1, 2, 3]))
def test_blocked_depthwise_matches_the_reference(case, threads):
    problem, inputs = case
    first = _check(DEPTHWISE, problem, inputs, threads)
    assert np.array_equal(first, _check(DEPTHWISE, problem, inputs, 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(depthwise=True, unrolled=True), threads=st.sampled_from([1, 2, 3]))
def test_blocked_depthwise_3x3_and_5x5_match_the_reference(case, threads):
    """The unrolled kernel of 3x3 and 5x5 layers (input rows staged zero-padded, the
    activation and residual in a pass of their own) at every stride and padding."""
    problem, inputs = case
    first = _check(DEPTHWISE, problem, inputs, threads)
    assert np.array_equal(first, _check(DEPTHWISE, problem, inputs, 1))


@pytest.mark.parametrize("width", [40, 260])
def test_blocked_depthwise_planes_too_wide_to_stage_take_the_general_kernel(width):
    """A 5x5 layer whose five padded input rows outgrow the unrolled kernel's stack buffer
    (260 pixels) is computed by the general kernel, to the same result as a narrower one."""
    rng = np.random.default_rng(width)
    x = rng.uniform(-1, 1, (1, 20, 6, width)).astype(np.float32)
    w = rng.uniform(-1, 1, (20, 1, 5, 5)).astype(np.float32)
    problem = CONV.problem([blocked_shape(x.shape), w.shape], ["float32"] * 2, group=20,
                           pads=[2, 2, 2, 2], activation="hard_swish", layout="nchw16c")
    assert blocked_depthwise._unrolled(geometry(problem)) == (width < 200)
    _check(DEPTHWISE, problem, [_blocked_input(x), w], 2)


@st.composite
def pointwise_cases(draw: st.DrawFn) -> tuple[Problem, list[np.ndarray]]:
    """1x1 layers at stride 1: channel counts on and off block boundaries, planes smaller and
    larger than a tile, every activation, with and without bias and residual."""
    n, c, k = draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.integers(1, 70))
    spatial = draw(st.sampled_from([(1, 1), (2, 3), (7, 7), (5, 13), (14, 14)]))
    params: dict[str, Any] = {"layout": "nchw16c"}
    activation = draw(st.sampled_from(CONV_ACTIVATIONS))
    if activation != "none":
        params["activation"] = activation
    if activation == "clip":
        params["clip_min"], params["clip_max"] = 0.1, 0.5
    if draw(st.booleans()):
        params["weight_preprocess"] = True
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    inputs = [_blocked_input(rng.uniform(-1, 1, (n, c, *spatial)).astype(np.float32)),
              rng.uniform(-1, 1, (k, c, 1, 1)).astype(np.float32)]
    if draw(st.booleans()):
        inputs.append(rng.uniform(-1, 1, k).astype(np.float32))
    if draw(st.booleans()):
        inputs.append(_blocked_input(rng.uniform(-1, 1, (n, k, *spatial)).astype(np.float32)))
        params["residual"] = True
    return CONV.problem([a.shape for a in inputs], ["float32"] * len(inputs), **params), inputs


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=pointwise_cases(), threads=st.sampled_from([1, 2, 3]))
def test_blocked_1x1_matches_the_reference(case, threads):
    problem, inputs = case
    first = _check(POINTWISE, problem, inputs, threads)
    assert np.array_equal(first, _check(POINTWISE, problem, inputs, 1))


def test_blocked_1x1_refuses_what_it_cannot_compute():
    def reason(w_shape, **params):
        problem = CONV.problem([(1, 2, 8, 8, 16), w_shape], ["float32"] * 2, layout="nchw16c",
                               **params)
        return POINTWISE.unusable_reason(problem)

    assert "1x1 kernel at stride 1" in reason((16, 32, 3, 3))
    assert "1x1 kernel at stride 1" in reason((16, 32, 1, 1), strides=[2, 2])
    assert "no padding" in reason((16, 32, 1, 1), pads=[1, 1, 1, 1])
    assert "one group" in reason((32, 16, 1, 1), group=2)
    nchw = CONV.problem([(1, 32, 8, 8), (16, 32, 1, 1)], ["float32"] * 2)
    assert "not nchw" in POINTWISE.unusable_reason(nchw)


def test_blocked_depthwise_refuses_what_it_cannot_compute():
    regular = CONV.problem([(1, 1, 8, 8, 16), (16, 16, 3, 3)], ["float32"] * 2,
                           layout="nchw16c")
    assert "group == C == K" in DEPTHWISE.unusable_reason(regular)
    multiplier = CONV.problem([(1, 1, 8, 8, 16), (32, 1, 3, 3)], ["float32"] * 2, group=16,
                              layout="nchw16c")
    assert "multiplier 1" in DEPTHWISE.unusable_reason(multiplier)
    nchw = CONV.problem([(1, 16, 8, 8), (16, 1, 3, 3)], ["float32"] * 2, group=16)
    assert "not nchw" in DEPTHWISE.unusable_reason(nchw)
    grouped = CONV.problem([(1, 2, 8, 8, 16), (24, 10, 3, 3)], ["float32"] * 2, group=2,
                           layout="nchw16c")
    assert "multiples of 16" in DIRECT.unusable_reason(grouped)


def _heuristic_session() -> Session:
    from fastrun_algorithms import conv, layout, matmul
    from tests.algorithms._helpers import cpu_registry

    return Session(registry=cpu_registry(matmul, conv, layout), cache=InMemoryCache(),
                   strategy=Strategy.HEURISTIC)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.one_of(cases(depthwise=False), cases(depthwise=True)))
def test_via_nchw_matches_the_reference_through_its_sub_problems(case):
    problem, inputs = case
    algorithm = via_nchw.ViaNchwConv()
    subs = algorithm.sub_problems(problem)
    assert {s.operator for s in subs} == {"reorder", "conv"}
    (conv,) = [s for s in subs if s.operator == "conv"]
    assert conv.param("layout") is None
    assert conv.weight_preprocess == problem.weight_preprocess
    _check(algorithm, problem, inputs, 2, _heuristic_session().chooser)


def test_a_search_times_a_blocked_problem_among_its_candidates():
    """A blocked problem always has two candidates, so a search times it and the cache keeps
    that time: the figure a runtime weighs the blocked layout by."""
    session = _heuristic_session()
    session = Session(registry=session.registry, cache=InMemoryCache(),
                      strategy=Strategy.parse("fast-run"))
    problem = CONV.problem([(1, 2, 6, 6, 16), (24, 1, 3, 3), (24,)], ["float32"] * 3,
                           group=24, pads=[1, 1, 1, 1], layout="nchw16c")
    decision = session.chooser.decide(problem)
    assert decision.source == "profiled" and decision.policy.time_s > 0
    assert {e.algorithm for e in decision.entries} >= {"blocked_depthwise", "via_nchw"}
