"""The resize operator (ONNX's Resize and Upsample): every algorithm against the reference on
random shapes, modes and coordinate transforms; the parallel kernel's refusals and its result
at any thread count; canonical keys; clear errors.  ONNX's own node tests of Resize and
Upsample run in tests/runtime/test_onnx_backend.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun_algorithms import resize
from fastrun_algorithms.resize.operator import COORDINATE_MODES, NEAREST_MODES
from tests.algorithms._helpers import (
    assert_allocates_its_workspace,
    assert_matches_reference,
    assert_same_bits_across_threads_and_concurrent_calls,
    check_drawn_problem,
    cpu_registry,
)

REGISTRY = cpu_registry(resize)
OPERATOR = REGISTRY.operator("resize")
ALGORITHMS = REGISTRY.algorithms("resize")
PARALLEL = next(a for a in ALGORITHMS if a.name == "parallel")
NUMPY = next(a for a in ALGORITHMS if a.name == "numpy")


@st.composite
def problems(draw):
    rank = draw(st.sampled_from([4, 4, 3, 2]))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    dtype = draw(st.sampled_from(["float32", "float64"] + (["int32"] if mode == "nearest"
                                                           else [])))
    resized = range(rank - 2, rank) if draw(st.booleans()) else range(rank)
    sizes = [draw(st.integers(1, 13)) if axis in resized else shape[axis]
             for axis in range(rank)]
    params = {"mode": mode, "sizes": sizes,
              "coordinate_transformation_mode": draw(st.sampled_from(COORDINATE_MODES))}
    if draw(st.booleans()):  # scales as a model gives them: the sizes rounded down
        scales = [draw(st.floats(0.3, 3.0)) if axis in resized else 1.0
                  for axis in range(rank)]
        params["scales"] = scales
        params["sizes"] = [max(1, int(d * s)) for d, s in zip(shape, scales, strict=True)]
    if mode == "nearest":
        params["nearest_mode"] = draw(st.sampled_from(NEAREST_MODES))
    else:
        params["antialias"] = draw(st.booleans())
    params["exclude_outside"] = draw(st.booleans())
    if params["coordinate_transformation_mode"] == "tf_crop_and_resize":
        params["roi"] = [draw(st.floats(-0.3, 0.5)) for _ in range(rank)] + \
            [draw(st.floats(0.5, 1.3)) for _ in range(rank)]
        params["extrapolation_value"] = 10.0
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(-50, 50, shape).astype(dtype) if dtype == "int32" else \
        rng.standard_normal(shape).astype(dtype)
    return OPERATOR.problem_for([x], **params), x


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.desc.text)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=problems())
def test_matches_reference(algorithm, drawn):
    check_drawn_problem(OPERATOR, algorithm, drawn)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_parallel_is_the_same_at_any_thread_count(mode):
    x = np.random.default_rng(0).standard_normal((2, 3, 17, 23)).astype(np.float32)
    problem = OPERATOR.problem_for([x], mode=mode, sizes=[2, 3, 40, 31])
    expected = PARALLEL.run(problem, [x], None)
    assert_matches_reference(OPERATOR, PARALLEL, problem, [x], expected)
    assert_same_bits_across_threads_and_concurrent_calls(
        lambda: PARALLEL.run(problem, [x], None), expected)


@pytest.mark.parametrize("transform", ["half_pixel", "align_corners", "pytorch_half_pixel"])
def test_parallel_takes_a_segmentation_heads_linear_upsample(transform):
    """N and C at scale 1 in linear mode have two taps weighing 0 and 1: copied as they are,
    so the parallel kernel takes DeepLabV3's and FCN's bilinear upsampling."""
    x = np.random.default_rng(2).standard_normal((1, 21, 28, 28)).astype(np.float32)
    problem = OPERATOR.problem_for([x], mode="linear", sizes=[1, 21, 224, 224],
                                   coordinate_transformation_mode=transform)
    assert PARALLEL.unusable_reason(problem) is None
    assert_matches_reference(OPERATOR, PARALLEL, problem, [x], PARALLEL.run(problem, [x], None))


@pytest.mark.parametrize(("height", "out_h", "two_pass"), [(28, 224, True), (17, 40, True),
                                                            (40, 17, False), (9, 9, False)])
def test_parallel_upsamples_in_two_passes_with_the_one_pass_bits(height, out_h, two_pass):
    """Blending along W once per input row and then along H computes each output in the same
    order as blending both rows for every output: the same bits.  Only an upsampling along H
    takes the two passes, and counts the rows it keeps."""
    from fastrun_algorithms.resize import algorithms

    x = np.random.default_rng(4).standard_normal((1, 3, height, 11)).astype(np.float32)
    problem = OPERATOR.problem_for([x], mode="linear", sizes=[1, 3, out_h, 29])
    assert algorithms._two_pass(problem) is two_pass
    assert PARALLEL.workspace_bytes(problem) == (3 * height * 29 * 4 if two_pass else 0)
    rows, cols = algorithms.tables(problem)[2:]
    row_weight, col_weight = (w[1] for w in algorithms._cast_weights(problem)[2:])
    one_pass = np.empty((3, out_h, 29), np.float32)
    algorithms._linear_rows(x[0], one_pass, rows.index[:, 0], rows.index[:, 1], row_weight,
                            cols.index[:, 0], cols.index[:, 1], col_weight)
    np.testing.assert_array_equal(PARALLEL.run(problem, [x], None)[0], one_pass)


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.desc.text)
def test_allocates_only_its_workspace(algorithm):
    x = np.random.default_rng(1).standard_normal((1, 4, 32, 32)).astype(np.float32)
    problem = OPERATOR.problem_for([x], mode="linear", sizes=[1, 4, 64, 48])
    algorithm.run(problem, [x], None)  # compiled, its tables made: what every call shares
    assert_allocates_its_workspace(algorithm, problem, lambda: algorithm.run(problem, [x], None))


@pytest.mark.parametrize("params, reason", [
    ({"mode": "cubic", "sizes": [1, 2, 8, 8]}, "one tap (nearest) or two"),
    ({"mode": "linear", "sizes": [1, 3, 8, 8]}, "N or C changes"),
    ({"mode": "linear", "sizes": [1, 2, 8, 8], "exclude_outside": True}, "exclude outside"),
    ({"mode": "linear", "sizes": [1, 2, 8, 8],
      "coordinate_transformation_mode": "tf_crop_and_resize", "roi": [0] * 4 + [1] * 4},
     "does not crop"),
])
def test_parallel_says_why_it_refuses(params, reason):
    problem = OPERATOR.problem([(1, 2, 4, 4)], ["float32"], **params)
    assert reason in PARALLEL.unusable_reason(problem)
    assert NUMPY.usable(problem)


def test_keys_are_canonical():
    shape, dtype = [(1, 2, 4, 4)], ["float32"]
    plain = OPERATOR.problem(shape, dtype, mode="linear", sizes=[1, 2, 8, 8]).key
    # scales follow from sizes; nearest_mode and cubic_coeff_a do not apply to linear
    assert plain == OPERATOR.problem(shape, dtype, mode="linear", sizes=(1, 2, 8, 8),
                                     scales=[1, 1, 2, 2], nearest_mode="floor",
                                     cubic_coeff_a=-0.5).key
    # the roi and extrapolation value apply to tf_crop_and_resize only
    assert plain == OPERATOR.problem(shape, dtype, mode="linear", sizes=[1, 2, 8, 8],
                                     roi=[0.1] * 8, extrapolation_value=3.0).key


@pytest.mark.parametrize("params, dtype, message", [
    ({"mode": "area", "sizes": [1, 2, 8, 8]}, "float32", "mode must be one of"),
    ({"mode": "linear", "sizes": [1, 2, 8]}, "float32", "must give 4 non-negative sizes"),
    ({"mode": "linear", "sizes": [1, 2, 8, 8], "scales": [1, 1, 0, 2]}, "float32",
     "positive finite scales"),
    ({"mode": "linear", "sizes": [1, 2, 8, 8]}, "int32", "supports dtypes float32, float64"),
    ({"mode": "nearest", "sizes": [1, 2, 8, 8], "antialias": True}, "float32",
     "antialias applies to linear and cubic"),
    ({"mode": "linear", "sizes": [1, 2, 8, 8],
      "coordinate_transformation_mode": "tf_crop_and_resize"}, "float32", "needs a roi"),
    ({"mode": "linear", "sizes": [1, 2, 8, 8], "coordinate_transformation_mode": "bogus"},
     "float32", "coordinate_transformation_mode must be one of"),
    ({"mode": "linear", "size": [1, 2, 8, 8]}, "float32", r"no parameter\(s\) size"),
])
def test_bad_problems_say_what_is_wrong(params, dtype, message):
    with pytest.raises(ValueError, match=message):
        OPERATOR.problem([(1, 2, 4, 4)], [dtype], **params)


def test_nearest_keeps_infinities_and_integers_exact():
    """Nearest is a gather: no weight multiplies a value (0 * inf would be NaN)."""
    x = np.array([[[[1, np.inf], [-np.inf, 4]]]], np.float32)
    problem = OPERATOR.problem_for([x], mode="nearest", sizes=[1, 1, 4, 4])
    for algorithm in ALGORITHMS:
        out = algorithm.run(problem, [x], None)
        assert np.isinf(out).sum() == 8 and not np.isnan(out).any()
    big = np.array([[2**31 - 1, -2**31]], np.int32)
    problem = OPERATOR.problem_for([big], mode="nearest", sizes=[1, 5])
    np.testing.assert_array_equal(NUMPY.run(problem, [big], None)[0, [0, -1]],
                                  [2**31 - 1, -2**31])
