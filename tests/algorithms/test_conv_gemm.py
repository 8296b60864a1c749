"""The conv algorithms that hand their heavy lifting to matmul sub-problems: im2col, conv1x1 and
winograd F(2x2,3x3) / F(4x4,3x3).

Every algorithm runs under a checking RunContext that insists each ``ctx.call`` is one of the
sub-problems the algorithm declared (shapes and dtypes included) and computes it with
``np.matmul``; results are compared with the operator's reference over random parameter sets
within each algorithm's usability.  The claims the chooser relies on are checked directly: the
declared sub-problems, the workspace (against what tracemalloc sees), weight preprocessing,
reproducibility and the reasons for being unusable.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms.conv import conv1x1, im2col, winograd
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import (
    CONV_ACTIVATIONS,
    TRACEMALLOC_SLACK,
    assert_matches_reference,
    numba_threads,
    traced_peak,
)

OPERATOR = ConvOperator()
ALGORITHMS: list[Algorithm] = [*im2col.algorithms(), *conv1x1.algorithms(),
                               *winograd.algorithms()]
BY_NAME = {algorithm.name: algorithm for algorithm in ALGORITHMS}
IM2COL, CONV1X1 = BY_NAME["im2col"], BY_NAME["conv1x1"]
WINOGRAD = [BY_NAME["winograd_f2x3"], BY_NAME["winograd_f4x3"]]



class CheckingContext:
    """A RunContext that fails on any call that is not a declared sub-problem with inputs of
    exactly the declared shapes and dtypes, and computes products with ``np.matmul``."""

    def __init__(self) -> None:
        self.declared: list[Problem] = []
        self.calls: list[Problem] = []

    def run(self, algorithm: Algorithm, problem: Problem, inputs: Any,
            prepared: Any = None) -> Any:
        self.declared = list(algorithm.sub_problems(problem))
        return algorithm.run(problem, inputs, self, prepared)

    def call(self, problem: Problem, *inputs: Any) -> Any:
        assert problem in self.declared, f"{problem} was not declared as a sub-problem"
        assert problem.operator == "matmul"
        assert len(inputs) == len(problem.shapes)
        for index, (x, shape, dtype) in enumerate(zip(inputs, problem.shapes, problem.dtypes,
                                                      strict=True)):
            assert x.shape == shape, f"input {index}: shape {x.shape} != declared {shape}"
            assert x.dtype == np.dtype(dtype), f"input {index}: {x.dtype} != declared {dtype}"
        self.calls.append(problem)
        return np.matmul(*inputs)


def check(algorithm: Algorithm, problem: Problem, inputs: list[np.ndarray],
          prepared: Any = None) -> np.ndarray:
    """Run under a checking context and compare with the reference; returns the output."""
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    ctx = CheckingContext()
    output = ctx.run(algorithm, problem, inputs, prepared)
    assert Counter(ctx.calls) == Counter(ctx.declared), "every declared product is computed"
    assert_matches_reference(OPERATOR, algorithm, problem, inputs, output)
    return output


# -- random problems -------------------------------------------------------------------------

@st.composite
def conv_cases(draw: st.DrawFn, kind: str) -> tuple[Problem, list[np.ndarray]]:
    """A random conv within the usability of ``kind``: "any" (im2col), "1x1" or "winograd"
    (3x3, stride 1, dilation 1, one group)."""
    dtype = draw(st.sampled_from(["float32", "float64"]))
    one_d = kind != "winograd" and draw(st.booleans())
    spatial = 1 if one_d else 2
    group = 1 if kind == "winograd" else draw(st.integers(1, 3))
    c = group * draw(st.integers(1, 4))
    k = group * draw(st.integers(1, 4))
    if kind == "winograd":
        kernel, strides, dilations = [3, 3], [1, 1], [1, 1]
    else:
        size = 1 if kind == "1x1" else None
        kernel = [size or draw(st.integers(1, 3)) for _ in range(spatial)]
        strides = [draw(st.integers(1, 3)) for _ in range(spatial)]
        dilations = [draw(st.integers(1, 2)) for _ in range(spatial)]
    params: dict[str, Any] = {"strides": strides, "dilations": dilations, "group": group}
    if draw(st.booleans()):
        params["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        params["pads"] = [draw(st.integers(0, 2)) for _ in range(2 * spatial)]
    activation = draw(st.sampled_from(CONV_ACTIVATIONS))
    if activation != "none":
        params["activation"] = activation
    if activation == "clip":
        params["clip_min"], params["clip_max"] = -0.5, draw(st.sampled_from([0.25, 1.0]))
    # The input is at least as large as the dilated kernel, so the output is never empty.
    sizes = [max(draw(st.integers(1, 11)), d * (r - 1) + 1)
             for r, d in zip(kernel, dilations, strict=True)]
    n = draw(st.integers(1, 2))
    shapes = [(n, c, *sizes), (k, c // group, *kernel)]
    if draw(st.booleans()):
        shapes.append((k,))
    problem = OPERATOR.problem(shapes, [dtype] * len(shapes), **params)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = OPERATOR.random_inputs(problem, rng)
    if draw(st.booleans()):  # X as a strided view, as a slice of a larger tensor would be
        wide = np.zeros((*inputs[0].shape[:-1], 2 * inputs[0].shape[-1]), dtype=dtype)
        wide[..., ::2] = inputs[0]
        inputs[0] = wide[..., ::2]
    return problem, inputs


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(case=conv_cases("any"))
def test_im2col_matches_reference(case: tuple[Problem, list[np.ndarray]]) -> None:
    check(IM2COL, *case)


@SETTINGS
@given(case=conv_cases("1x1"))
def test_conv1x1_matches_reference(case: tuple[Problem, list[np.ndarray]]) -> None:
    check(CONV1X1, *case)


@pytest.mark.parametrize("algorithm", WINOGRAD, ids=lambda a: a.name)
@SETTINGS
@given(case=conv_cases("winograd"))
def test_winograd_matches_reference(algorithm: Algorithm,
                                    case: tuple[Problem, list[np.ndarray]]) -> None:
    check(algorithm, *case)


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.name)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fixed_problem_with_epilogue(algorithm: Algorithm, dtype: str) -> None:
    """Several tiles and channel blocks, padding on every side, bias and clip."""
    r = 1 if algorithm is CONV1X1 else 3
    shapes = [(2, 24, 19, 22), (20, 24, r, r), (20,)]
    problem = OPERATOR.problem(shapes, [dtype] * 3, pads=[1, 0, 2, 1], activation="clip",
                               clip_min=-0.3, clip_max=0.4)
    check(algorithm, problem, OPERATOR.random_inputs(problem, np.random.default_rng(1)))


@pytest.mark.parametrize("algorithm", WINOGRAD, ids=lambda a: a.name)
def test_winograd_accuracy_with_many_channels(algorithm: Algorithm) -> None:
    """Winograd's transforms cost accuracy (F(4,3) most); with 512 channels and values in
    [-1, 1] the float32 error must still be far inside the operator's tolerance."""
    problem = OPERATOR.problem([(1, 512, 10, 10), (64, 512, 3, 3)], ["float32"] * 2,
                               pads=[1, 1, 1, 1])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(2))
    output = CheckingContext().run(algorithm, problem, inputs)
    error = OPERATOR.error(problem, output, OPERATOR.reference(problem, inputs))
    assert error < OPERATOR.tolerance(problem) / 20, f"{algorithm.name}: error {error:.3g}"


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_transforms_compute_a_correlation(m: int) -> None:
    """A^T [(G g) * (B^T d)] is the 1-D correlation of d (m+2 values) with g (3 taps)."""
    bt, g, at = (np.array(t, dtype=np.float64) for t in winograd.TRANSFORMS[m])
    rng = np.random.default_rng(m)
    d, taps = rng.uniform(-1, 1, m + 2), rng.uniform(-1, 1, 3)
    expected = [d[i:i + 3] @ taps for i in range(m)]
    np.testing.assert_allclose(at @ ((g @ taps) * (bt @ d)), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_written_out_transforms_are_the_matrices(m: int) -> None:
    """The kernels apply B^T and A^T as written-out sums with shared terms; they must be the
    matrices of TRANSFORMS, which the test above checks against the correlation."""
    bt, _, at = (np.array(t, dtype=np.float64) for t in winograd.TRANSFORMS[m])
    rng = np.random.default_rng(10 + m)
    d, p = rng.uniform(-1, 1, m + 2), rng.uniform(-1, 1, m + 2)
    if m == 4:
        forward, backward = winograd._bt4(*d, 2.0, 4.0, 5.0), winograd._at4(*p, 2.0, 4.0, 8.0)
    else:
        forward, backward = winograd._bt2(*d), winograd._at2(*p)
    np.testing.assert_allclose(forward, bt @ d, rtol=0, atol=1e-12)
    np.testing.assert_allclose(backward, at @ p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("algorithm", WINOGRAD, ids=lambda a: a.name)
def test_winograd_planes_larger_than_a_chunk(algorithm: Algorithm) -> None:
    """Planes of more tiles than the transforms' chunk, so that tile rows and planes are split
    between chunks, on both sides of the product; two images, uneven padding, bias and relu."""
    shapes = [(2, 3, 50, 61), (5, 3, 3, 3), (5,)]
    problem = OPERATOR.problem(shapes, ["float64"] * 3, pads=[2, 0, 1, 1], activation="relu")
    _, _, oh, ow = OPERATOR.output_shape(problem)
    assert -(-oh // algorithm.m) * -(-ow // algorithm.m) > winograd.CHUNK
    check(algorithm, problem, OPERATOR.random_inputs(problem, np.random.default_rng(11)))


# -- sub-problems ----------------------------------------------------------------------------

def _matmul(a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: str) -> Problem:
    return Problem.create("matmul", (a_shape, b_shape), (dtype, dtype))


@pytest.mark.parametrize(("algorithm", "shapes", "params", "expected"), [
    (IM2COL, [(1, 64, 56, 56), (64, 64, 3, 3)], {"pads": [1, 1, 1, 1]},
     [_matmul((64, 576), (576, 3136), "float32")]),
    (IM2COL, [(3, 8, 9, 9), (6, 4, 3, 3)], {"group": 2, "strides": [2, 2]},
     [_matmul((2, 3, 36), (2, 36, 16), "float32")] * 3),
    (CONV1X1, [(1, 64, 7, 7), (32, 64, 1, 1)], {},
     [_matmul((32, 64), (64, 49), "float32")]),
    (CONV1X1, [(2, 8, 5, 5), (6, 4, 1, 1)], {"group": 2, "strides": [2, 2]},
     [_matmul((2, 3, 4), (2, 2, 4, 9), "float32")]),
    (WINOGRAD[0], [(2, 16, 8, 8), (32, 16, 3, 3)], {"pads": [1, 1, 1, 1]},
     [_matmul((16, 32, 16), (16, 16, 32), "float32")]),
    (WINOGRAD[1], [(1, 64, 56, 56), (64, 64, 3, 3)], {"pads": [1, 1, 1, 1]},
     [_matmul((36, 64, 64), (36, 64, 196), "float32")]),
])
def test_declared_sub_problems(algorithm: Algorithm, shapes: list, params: dict,
                               expected: list[Problem]) -> None:
    problem = OPERATOR.problem(shapes, ["float32"] * 2, **params)
    assert list(algorithm.sub_problems(problem)) == expected


class _NothingDeclared(CheckingContext):
    def run(self, algorithm: Algorithm, problem: Problem, inputs: Any,
            prepared: Any = None) -> Any:
        self.declared = []
        return algorithm.run(problem, inputs, self, prepared)


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.name)
def test_undeclared_calls_are_caught(algorithm: Algorithm) -> None:
    """The checking context is not vacuous: an algorithm's products go through ctx.call."""
    r = 1 if algorithm is CONV1X1 else 3
    problem = OPERATOR.problem([(1, 4, 6, 6), (4, 4, r, r)], ["float64"] * 2)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(3))
    with pytest.raises(AssertionError, match="was not declared"):
        _NothingDeclared().run(algorithm, problem, inputs)


# -- weight preprocessing --------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", WINOGRAD, ids=lambda a: a.name)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_preprocessed_weights_give_the_same_result(algorithm: Algorithm, dtype: str) -> None:
    """Bit-identical: ``preprocess`` and a run without ``prepared`` compute U with the same
    kernel on the same weights, and everything after U is the same computation."""
    shapes = [(2, 12, 9, 10), (8, 12, 3, 3), (8,)]
    plain = OPERATOR.problem(shapes, [dtype] * 3, pads=[1, 1, 1, 1], activation="relu")
    problem = OPERATOR.problem(shapes, [dtype] * 3, pads=[1, 1, 1, 1], activation="relu",
                               weight_preprocess=True)
    assert problem.key != plain.key
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(4))
    prepared = algorithm.preprocess(problem, inputs)
    assert prepared.shape == ((algorithm.m + 2) ** 2, 8, 12)
    with_prepared = check(algorithm, problem, inputs, prepared)
    without = check(algorithm, problem, inputs)
    np.testing.assert_array_equal(with_prepared, without)
    assert algorithm.workspace_bytes(problem) < algorithm.workspace_bytes(plain)


# -- workspace -------------------------------------------------------------------------------



WORKSPACE_CASES = [
    (IM2COL, [(1, 16, 20, 20), (24, 16, 3, 3)], {"pads": [1, 1, 1, 1]}),
    (IM2COL, [(3, 8, 15, 13), (6, 4, 3, 2), (6,)], {"group": 2, "strides": [2, 1],
                                                    "activation": "relu"}),
    (CONV1X1, [(2, 32, 12, 12), (48, 32, 1, 1)], {}),
    (CONV1X1, [(2, 32, 12, 12), (48, 16, 1, 1), (48,)], {"group": 2, "strides": [2, 2],
                                                         "pads": [1, 0, 1, 1]}),
    (WINOGRAD[0], [(2, 24, 18, 20), (40, 24, 3, 3), (40,)], {"pads": [1, 1, 1, 1]}),
    (WINOGRAD[1], [(1, 64, 28, 28), (32, 64, 3, 3)], {"pads": [1, 1, 1, 1]}),
    (WINOGRAD[1], [(1, 64, 28, 28), (32, 64, 3, 3)], {"pads": [1, 1, 1, 1],
                                                      "weight_preprocess": True}),
]


@pytest.mark.parametrize(("algorithm", "shapes", "params"), WORKSPACE_CASES,
                         ids=lambda v: getattr(v, "name", None))
def test_workspace_is_what_run_allocates(algorithm: Algorithm, shapes: list,
                                         params: dict) -> None:
    """Peak traced memory of a run = workspace_bytes + the output (np.matmul's results, which
    the algorithms hold as their own temporaries or return as the output, are included), on
    the first call of the problem (winograd keeps its transforms' buffers for the next)."""
    problem = OPERATOR.problem(shapes, ["float64"] * len(shapes), **params)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(5))
    prepared = algorithm.preprocess(problem, inputs) if problem.weight_preprocess else None
    CheckingContext().run(algorithm, problem, inputs, prepared)  # warm-up: compile kernels
    if getattr(algorithm, "scratch", None) is not None:
        algorithm.scratch.clear()
    with traced_peak() as peak:
        output = CheckingContext().run(algorithm, problem, inputs, prepared)
    expected = algorithm.workspace_bytes(problem) + output.nbytes
    assert expected <= peak[0] <= expected + TRACEMALLOC_SLACK


def test_conv1x1_without_stride_or_padding_needs_no_workspace() -> None:
    problem = OPERATOR.problem([(2, 32, 12, 12), (48, 32, 1, 1)], ["float32"] * 2)
    assert CONV1X1.workspace_bytes(problem) == 0
    strided = OPERATOR.problem([(2, 32, 12, 12), (48, 32, 1, 1)], ["float32"] * 2, strides=2)
    assert CONV1X1.workspace_bytes(strided) == 2 * 32 * 6 * 6 * 4


# -- reproducibility, attributes, usability --------------------------------------------------

@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.name)
def test_reproducible_whatever_the_thread_count(algorithm: Algorithm) -> None:
    assert AlgoAttribute.REPRODUCIBLE in algorithm.attributes
    assert AlgoAttribute.NAIVE not in algorithm.attributes
    r = 1 if algorithm is CONV1X1 else 3
    problem = OPERATOR.problem([(2, 20, 13, 11), (12, 20, r, r), (12,)], ["float32"] * 3,
                               pads=[1, 1, 1, 1])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(6))
    first = CheckingContext().run(algorithm, problem, inputs)
    np.testing.assert_array_equal(CheckingContext().run(algorithm, problem, inputs), first)
    with numba_threads(1):
        single = CheckingContext().run(algorithm, problem, inputs)
    np.testing.assert_array_equal(single, first)


def test_identities() -> None:
    assert all(a.desc.operator == "conv" for a in ALGORITHMS)
    assert [a.desc.text for a in ALGORITHMS] == ["im2col", "conv1x1", "winograd_f2x3",
                                                 "winograd_f4x3"]


@pytest.mark.parametrize(("algorithm", "shapes", "params", "reason"), [
    (CONV1X1, [(1, 4, 8, 8), (4, 4, 3, 3)], {}, "1x1 kernel, got 3x3"),
    (CONV1X1, [(1, 4, 8), (4, 4, 2)], {}, "1x1 kernel, got 1x2"),
    (WINOGRAD[0], [(1, 4, 8, 8), (4, 4, 1, 1)], {}, "3x3 kernel (got 1x1)"),
    (WINOGRAD[1], [(1, 4, 8, 8), (4, 4, 5, 5)], {}, "3x3 kernel (got 5x5)"),
    (WINOGRAD[1], [(1, 4, 8), (4, 4, 3)], {}, "3x3 kernel (got 1x3)"),
    (WINOGRAD[0], [(1, 4, 8, 8), (4, 4, 3, 3)], {"strides": [2, 1]}, "stride 1 (got 2x1)"),
    (WINOGRAD[1], [(1, 4, 8, 8), (4, 4, 3, 3)], {"dilations": [1, 2]}, "dilation 1 (got 1x2)"),
    (WINOGRAD[0], [(1, 4, 8, 8), (4, 2, 3, 3)], {"group": 2}, "group 1 (got 2)"),
])
def test_unusable_reasons(algorithm: Algorithm, shapes: list, params: dict,
                          reason: str) -> None:
    problem = OPERATOR.problem(shapes, ["float32"] * 2, **params)
    assert not algorithm.usable(problem)
    assert reason in algorithm.unusable_reason(problem)
    assert algorithm.name in algorithm.unusable_reason(problem)


def test_im2col_and_conv1x1_are_usable_for_their_whole_domain() -> None:
    problem = OPERATOR.problem([(1, 6, 9), (6, 2, 1)], ["float64"] * 2, group=3, strides=[2],
                               dilations=[3], pads=[2, 1])
    assert IM2COL.usable(problem) and CONV1X1.usable(problem)
