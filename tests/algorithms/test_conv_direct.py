"""The numba conv algorithms (naive, direct, depthwise, implicit_gemm) against the operator's
reference.

Random parameter sets cover what the kernels branch on: groups (depthwise and channel
multipliers included), strides 1-3 (the stride-1 and stride-2 staging paths and the general
one), dilations, asymmetric and automatic padding, 1-D inputs, bias, activations, both dtypes
and strided input views (the "A"-layout kernels).  The claims the chooser relies on are checked
directly: the epilogue, the exact workspace, REPRODUCIBLE (bit-identical across runs and thread
counts), and the depthwise algorithm's usability.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms.conv import depthwise, direct, implicit_gemm, naive
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import (
    CONV_ACTIVATIONS,
    assert_allocates_its_workspace,
    assert_matches_reference,
    assert_same_bits_across_threads_and_concurrent_calls,
    numba_threads,
)

OPERATOR = ConvOperator()
NAIVE = naive.algorithms()
DIRECT = direct.algorithms()
DEPTHWISE = depthwise.algorithms()
IMPLICIT_GEMM = implicit_gemm.algorithms()
ALGORITHMS = NAIVE + DIRECT + DEPTHWISE + IMPLICIT_GEMM
#: Algorithms whose kernels run in parallel: their results must not depend on the threads.
PARALLEL = DIRECT + DEPTHWISE + IMPLICIT_GEMM

ids = {"ids": lambda a: a.desc.text}


def run(algorithm: Algorithm, problem: Problem, inputs: list[np.ndarray]) -> np.ndarray:
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    return algorithm.run(problem, inputs, ctx=None)


def check(algorithm: Algorithm, problem: Problem, inputs: list[np.ndarray]) -> np.ndarray:
    output = run(algorithm, problem, inputs)
    assert_matches_reference(OPERATOR, algorithm, problem, inputs, output)
    return output


def strided(x: np.ndarray) -> np.ndarray:
    """The same values as a non-contiguous view (every other element of a wider array)."""
    wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


# -- random problems -------------------------------------------------------------------------

@st.composite
def conv_cases(draw: st.DrawFn, depthwise_only: bool = False
               ) -> tuple[Problem, list[np.ndarray]]:
    one_d = draw(st.integers(0, 3)) == 0
    if depthwise_only or draw(st.integers(0, 3)) == 0:
        group = draw(st.integers(1, 4))
        cg, kg = 1, draw(st.integers(1, 3))  # depthwise, with a channel multiplier
    else:
        group = draw(st.integers(1, 3))
        cg, kg = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    n = draw(st.integers(1, 2))
    spatial = 1 if one_d else 2
    size = draw(st.lists(st.integers(1, 12), min_size=spatial, max_size=spatial))
    kernel = draw(st.lists(st.integers(1, 5), min_size=spatial, max_size=spatial))
    params: dict[str, Any] = {
        "strides": draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial)),
        "dilations": draw(st.lists(st.integers(1, 2), min_size=spatial, max_size=spatial)),
        "group": group,
    }
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad == "NOTSET":
        params["pads"] = draw(st.lists(st.integers(0, 3), min_size=2 * spatial,
                                       max_size=2 * spatial))
    else:
        params["auto_pad"] = auto_pad
    activation = draw(st.sampled_from(CONV_ACTIVATIONS))
    if activation == "clip":
        # bounds on a coarse grid: a bound like 1e-300 would round to 0 in float32 and the
        # relative error against a 1e-300 reference would be meaningless
        low = draw(st.integers(-100, 50)) / 100
        params.update(activation="clip", clip_min=low,
                      clip_max=low + draw(st.integers(0, 100)) / 100)
    elif activation == "relu":
        params["activation"] = "relu"
    shapes = [(n, group * cg, *size), (group * kg, cg, *kernel)]
    if draw(st.booleans()):
        shapes.append((group * kg,))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    try:
        problem = OPERATOR.problem(shapes, [dtype] * len(shapes), **params)
    except ValueError:
        assume(False)  # an empty output: nothing to compute
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = OPERATOR.random_inputs(problem, rng)
    if draw(st.integers(0, 4)) == 0:
        inputs[0] = strided(inputs[0])
    if draw(st.integers(0, 4)) == 0:
        inputs[1] = strided(inputs[1])
    return problem, inputs


SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("algorithm", NAIVE + DIRECT + IMPLICIT_GEMM, **ids)
@SETTINGS
@given(case=conv_cases())
def test_matches_reference(algorithm: Algorithm, case: tuple) -> None:
    assume(algorithm.usable(case[0]))  # implicit_gemm: group 1 only
    check(algorithm, *case)


@pytest.mark.parametrize("algorithm", ALGORITHMS, **ids)
@SETTINGS
@given(case=conv_cases(depthwise_only=True))
def test_depthwise_problems_match_reference(algorithm: Algorithm, case: tuple) -> None:
    assume(algorithm.usable(case[0]))
    check(algorithm, *case)


def test_implicit_gemm_wide_and_narrow_rows() -> None:
    """Rows wider than a tile (the last tile overlaps its neighbour), exactly one tile, and
    narrower (16 columns computed, the real ones stored); output channels past a multiple of
    8; both dtypes."""
    for width, k, dtype in [(40, 13, "float32"), (16, 8, "float64"), (5, 17, "float32")]:
        problem = OPERATOR.problem([(2, 3, 9, width), (k, 3, 3, 3), (k,)], [dtype] * 3,
                                   pads=(1, 1, 1, 1), activation="relu")
        check(IMPLICIT_GEMM[0], problem, OPERATOR.random_inputs(problem,
                                                                np.random.default_rng(width)))


@pytest.mark.parametrize("algorithm", ALGORITHMS, **ids)
@pytest.mark.parametrize(("shapes", "params"), [
    # the ResNet first layer, scaled down: few channels, 7x7 stride 2
    ([(1, 3, 30, 30), (8, 3, 7, 7), (8,)], {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
    # more channels than one block, a channel count that is no multiple of four
    ([(2, 6, 9, 9), (18, 6, 3, 3), (18,)], {"pads": (1, 1, 1, 1)}),
    # rows longer than one vector, 5x5 (a 3+2 tap split), dilation, asymmetric pads
    ([(1, 2, 7, 40), (5, 2, 5, 5)], {"dilations": (1, 2), "pads": (2, 0, 1, 3)}),
    # MobileNet depthwise, stride 1 and 2, and a channel multiplier of 2
    ([(1, 8, 20, 20), (8, 1, 3, 3), (8,)], {"pads": (1, 1, 1, 1), "group": 8}),
    ([(1, 8, 21, 21), (8, 1, 3, 3)], {"strides": (2, 2), "pads": (1, 1, 1, 1), "group": 8}),
    ([(2, 4, 11, 11), (8, 1, 5, 5)], {"pads": (2, 2, 2, 2), "group": 4}),
    # depthwise planes with rows long enough for the per-row path, 3x3 and other kernels
    ([(1, 3, 9, 40), (3, 1, 3, 3)], {"pads": (0, 1, 2, 1), "group": 3}),
    ([(1, 4, 6, 41), (8, 1, 3, 5), (8,)], {"strides": (1, 2), "dilations": (2, 1),
                                          "pads": (2, 2, 2, 2), "group": 4}),
    # depthwise 3x3 rows wider than store_taps3x3's buffer: summed in column chunks
    ([(1, 2, 3, 1100), (2, 1, 3, 3), (2,)], {"pads": (1, 1, 1, 1), "group": 2}),
    # depthwise 5x5 in one pass (sum_taps5x5): rows per task, flat mode, stride 2, dilation
    ([(1, 3, 12, 40), (3, 1, 5, 5), (3,)], {"strides": (2, 1), "dilations": (1, 2),
                                           "pads": (2, 4, 2, 4), "group": 3}),
    ([(2, 5, 9, 9), (5, 1, 5, 5), (5,)], {"strides": (2, 2), "pads": (2, 2, 2, 2), "group": 5}),
    # 1-D
    ([(2, 4, 50), (6, 2, 3), (6,)], {"strides": (2,), "pads": (1, 1), "group": 2}),
])
def test_fixed_shapes(algorithm: Algorithm, shapes: list, params: dict) -> None:
    for dtype in ("float32", "float64"):
        problem = OPERATOR.problem(shapes, [dtype] * len(shapes), **params)
        if algorithm.usable(problem):
            check(algorithm, problem, OPERATOR.random_inputs(problem, np.random.default_rng(0)))


# -- epilogue --------------------------------------------------------------------------------

EPILOGUE_CASES = [
    ([(2, 4, 9, 10), (6, 2, 3, 3), (6,)], {"pads": (1, 1, 1, 1), "group": 2}),
    ([(1, 4, 12, 12), (8, 1, 3, 3), (8,)], {"strides": (2, 2), "pads": (0, 1, 2, 1),
                                            "group": 4}),
]


@pytest.mark.parametrize("algorithm", ALGORITHMS, **ids)
@pytest.mark.parametrize(("shapes", "params"), EPILOGUE_CASES)
def test_epilogue(algorithm: Algorithm, shapes: list, params: dict) -> None:
    """Bias, relu and clip are applied in the output loop: compare with the plain convolution
    computed by the same algorithm, then the reference."""
    problem = OPERATOR.problem(shapes[:2], ["float64"] * 2, **params)
    if not algorithm.usable(problem):
        pytest.skip(algorithm.unusable_reason(problem))
    rng = np.random.default_rng(3)
    x, w, b = (rng.uniform(-1, 1, s) for s in shapes)
    plain = run(algorithm, problem, [x, w])
    channel = (1, -1) + (1,) * (len(shapes[0]) - 2)
    biased = plain + b.reshape(channel)
    with_bias = OPERATOR.problem(shapes, ["float64"] * 3, **params)
    np.testing.assert_allclose(run(algorithm, with_bias, [x, w, b]), biased, rtol=0, atol=1e-12)
    relu = OPERATOR.problem(shapes, ["float64"] * 3, activation="relu", **params)
    out = check(algorithm, relu, [x, w, b])
    np.testing.assert_allclose(out, np.maximum(biased, 0), rtol=0, atol=1e-12)
    assert (out == 0).any() and (out > 0).any()
    low, high = -0.3, 0.4
    clip = OPERATOR.problem(shapes, ["float64"] * 3, activation="clip", clip_min=low,
                            clip_max=high, **params)
    out = check(algorithm, clip, [x, w, b])
    np.testing.assert_allclose(out, np.clip(biased, low, high), rtol=0, atol=1e-12)
    assert out.min() == low and out.max() == high
    relu6 = OPERATOR.problem(shapes, ["float32"] * 3, activation="relu6", **params)
    inputs32 = [v.astype(np.float32) * 8 for v in (x, w, b)]
    out = check(algorithm, relu6, inputs32)
    assert out.min() == 0 and out.max() == 6


# -- workspace -------------------------------------------------------------------------------



WORKSPACE_CASES = [
    ([(1, 3, 40, 40), (16, 3, 7, 7), (16,)], {"strides": (2, 2), "pads": (3, 3, 3, 3)}),
    ([(2, 8, 20, 20), (12, 4, 3, 3)], {"pads": (1, 1, 1, 1), "group": 2}),
    ([(1, 16, 30, 30), (16, 1, 3, 3), (16,)], {"strides": (2, 2), "pads": (1, 1, 1, 1),
                                               "group": 16}),
    ([(2, 4, 90), (8, 1, 5)], {"dilations": (3,), "pads": (2, 4), "group": 4}),
]


@pytest.mark.parametrize("algorithm", ALGORITHMS, **ids)
@pytest.mark.parametrize(("shapes", "params"), WORKSPACE_CASES)
@pytest.mark.parametrize("strided_x", [False, True])
def test_workspace_is_what_run_allocates(algorithm: Algorithm, shapes: list, params: dict,
                                         strided_x: bool) -> None:
    """Exact whatever the inputs' layout: a strided X is read in place, never copied.  An
    algorithm that keeps its buffers between calls (``scratch``) allocates its workspace on the
    first call of a problem and only the output on the next ones."""
    problem = OPERATOR.problem(shapes, ["float64"] * len(shapes), **params)
    if not algorithm.usable(problem):
        pytest.skip(algorithm.unusable_reason(problem))
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(4))
    if strided_x:
        inputs[0] = strided(inputs[0])
    run(algorithm, problem, inputs)  # warm-up: compile or load the kernel
    assert_allocates_its_workspace(algorithm, problem, lambda: run(algorithm, problem, inputs))
    if algorithm in PARALLEL:
        assert algorithm.workspace_bytes(problem) > 0
    else:
        assert algorithm.workspace_bytes(problem) == 0


def test_kernels_allocate_nothing_themselves() -> None:
    """tracemalloc does not see numba's allocator, so count its allocations: a kernel call may
    only wrap its array arguments (one allocation each), whatever the problem."""
    nrt = pytest.importorskip("numba.core.runtime")
    try:
        nrt._nrt_python.memsys_enable_stats()
    except AttributeError:
        pytest.skip("this numba has no NRT statistics switch")

    def allocations(algorithm: Algorithm, problem: Problem, inputs: list) -> int:
        run(algorithm, problem, inputs)
        before = nrt.rtsys.get_allocation_stats().alloc
        run(algorithm, problem, inputs)
        return nrt.rtsys.get_allocation_stats().alloc - before

    for shapes, params in WORKSPACE_CASES:
        problem = OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(5))
        # x, w, bias (or its placeholder), out, the residual's placeholder; then the workspace
        # buffers (direct: two; depthwise: two, the flat views of x and out and the two index
        # maps, or placeholders)
        assert allocations(NAIVE[0], problem, inputs) == 5
        for algorithm in DIRECT:
            assert allocations(algorithm, problem, inputs) == 7
        if DEPTHWISE[0].usable(problem):
            assert allocations(DEPTHWISE[0], problem, inputs) == 11
        if IMPLICIT_GEMM[0].usable(problem):  # per image: x and the staged image to stage it,
            # the weights, staged image, tap table, bias, out and the residual's placeholder
            # to compute
            assert allocations(IMPLICIT_GEMM[0], problem, inputs) == 8 * problem.shapes[0][0]


def test_workspace_counts_only_busy_workers() -> None:
    """direct: a problem with a single task keeps one worker's buffers, whatever the thread
    count: one group of four accumulator rows of (3 - 1) * 5 + 3 positions, rounded up to 16,
    and one staged 5x5 block with 16 values of slack; 64 bytes more each for their alignment.
    depthwise deals its tasks to whichever thread is free, so it keeps one set per thread."""
    problem = OPERATOR.problem([(1, 1, 5, 5), (1, 1, 3, 3)], ["float32"] * 2)
    with numba_threads(2):
        assert DIRECT[0].workspace_bytes(problem) == (4 * 16 + 16) * 4 + (25 + 16 + 16) * 4
        # depthwise: a 3-column output takes flat mode, with one accumulator row per thread and
        # the int64 index maps of the 5x5 input and 3x3 output planes (64 bytes more each)
        assert DEPTHWISE[0].workspace_bytes(problem) == ((2 * 16 + 16) * 4
                                                         + (2 * (25 + 16) + 16) * 4
                                                         + (25 + 8) * 8 + (9 + 8) * 8)
        # outside flat mode a 3x3 depthwise kernel needs no accumulator: a one-position
        # placeholder per thread
        wide = OPERATOR.problem([(1, 1, 5, 40), (1, 1, 3, 3)], ["float32"] * 2)
        assert DEPTHWISE[0].workspace_bytes(wide) == ((2 + 16) * 4
                                                      + (2 * (5 * 40 + 16) + 16) * 4)


# -- usability, identity, attributes ---------------------------------------------------------

@pytest.mark.parametrize(("shapes", "group"), [
    ([(1, 4, 8, 8), (4, 4, 3, 3)], 1),
    ([(1, 4, 8, 8), (4, 2, 3, 3)], 2),
])
def test_depthwise_unusable_when_groups_have_several_channels(shapes: list, group: int) -> None:
    problem = OPERATOR.problem(shapes, ["float32"] * 2, group=group)
    reason = DEPTHWISE[0].unusable_reason(problem)
    assert reason is not None and not DEPTHWISE[0].usable(problem)
    assert f"group={group}" in reason and "C=4" in reason and "group == C" in reason
    assert all(a.usable(problem) for a in NAIVE + DIRECT)


def test_depthwise_usable_with_a_channel_multiplier() -> None:
    problem = OPERATOR.problem([(1, 4, 8, 8), (12, 1, 3, 3)], ["float32"] * 2, group=4)
    assert DEPTHWISE[0].usable(problem)


def test_attributes_and_identities() -> None:
    assert [a.desc.text for a in ALGORITHMS] == [
        "naive", *(f"direct(kb={kb})" for kb in direct.BLOCKS), "depthwise",
        "implicit_gemm"]
    assert all(a.desc.operator == "conv" for a in ALGORITHMS)
    assert NAIVE[0].attributes == AlgoAttribute.NAIVE | AlgoAttribute.REPRODUCIBLE
    for algorithm in PARALLEL:
        assert algorithm.attributes == AlgoAttribute.REPRODUCIBLE


@pytest.mark.parametrize("param", [{}, {"kb": 0}, {"kb": 2.0}, {"kb": True}])
def test_direct_rejects_bad_parameters(param: dict) -> None:
    with pytest.raises(ValueError, match="'kb'"):
        direct.DirectConv(param)


# -- reproducibility -------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ALGORITHMS, **ids)
@pytest.mark.parametrize(("shapes", "params"), [
    ([(2, 6, 23, 23), (16, 3, 5, 5), (16,)], {"strides": (2, 1), "pads": (2, 1, 0, 2),
                                             "group": 2, "activation": "relu"}),
    ([(1, 12, 25, 25), (24, 1, 3, 3), (24,)], {"strides": (2, 2), "pads": (1, 1, 1, 1),
                                               "group": 12}),
    ([(1, 6, 18, 40), (6, 1, 3, 3), (6,)], {"pads": (1, 1, 1, 1), "group": 6}),
])
def test_reproducible(algorithm: Algorithm, shapes: list, params: dict) -> None:
    """REPRODUCIBLE means bit-identical on every run; the parallel kernels also claim that the
    thread count does not matter (each output is summed by one task in a fixed order)."""
    problem = OPERATOR.problem(shapes, ["float32"] * 3, **params)
    if not algorithm.usable(problem):
        pytest.skip(algorithm.unusable_reason(problem))
    assert AlgoAttribute.REPRODUCIBLE in algorithm.attributes
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(6))
    first = run(algorithm, problem, inputs)
    np.testing.assert_array_equal(run(algorithm, problem, inputs), first)
    with numba_threads(1):
        single = run(algorithm, problem, inputs)
    np.testing.assert_array_equal(single, first)


@pytest.mark.parametrize(("spatial", "stride"), [(7, 1), (14, 2), (30, 1), (61, 2)])
def test_depthwise_keeps_its_buffers_correct_across_threads_and_concurrent_calls(
        spatial: int, stride: int) -> None:
    """Buffers kept between calls (flat mode for the small planes, staged row blocks for the
    large ones) give the same bits whatever ran before: another thread count, the same
    problem from two Python threads at once, another problem in between."""
    algorithm = DEPTHWISE[0]
    problem = OPERATOR.problem([[2, 24, spatial, spatial], [24, 1, 3, 3], [24]],
                               ["float32"] * 3, group=24, strides=[stride, stride],
                               pads=[1, 1, 1, 1], activation="relu")
    other = OPERATOR.problem([[1, 24, spatial + 3, spatial], [24, 1, 3, 3], [24]],
                             ["float32"] * 3, group=24, pads=[1, 1, 1, 1])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(6))
    first = check(algorithm, problem, inputs)
    run(algorithm, other, OPERATOR.random_inputs(other, np.random.default_rng(7)))
    assert_same_bits_across_threads_and_concurrent_calls(
        lambda: run(algorithm, problem, inputs), first)
