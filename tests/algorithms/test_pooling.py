"""The pooling operators (ONNX semantics, canonical keys, clear errors) and every registered
pooling algorithm: against the operators' references over random parameter sets, on the ONNX
specification's own examples, for their exact workspace and reproducibility."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import pooling
from tests.algorithms._helpers import (
    assert_allocates_its_workspace,
    assert_matches_reference,
    assert_same_bits_across_threads_and_concurrent_calls,
    cpu_registry,
    numba_threads,
    pretend_threads,
)
from tests.onnx_cases import node_attributes, node_cases

REGISTRY = cpu_registry(pooling)
OPERATORS = ("maxpool", "avgpool", "global_maxpool", "global_avgpool", "lrn")
WINDOWED = [a for op in ("maxpool", "avgpool") for a in REGISTRY.algorithms(op)]
GLOBAL = [a for op in ("global_maxpool", "global_avgpool") for a in REGISTRY.algorithms(op)]
LRN = REGISTRY.algorithms("lrn")
ALL = WINDOWED + GLOBAL + LRN

ids = {"ids": lambda a: str(a.desc)}


def op(name: str):
    return REGISTRY.operator(name)


def check(algorithm: Algorithm, problem: Problem, inputs: list[np.ndarray]) -> np.ndarray:
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    output = algorithm.run(problem, inputs, ctx=None)
    assert_matches_reference(op(problem.operator), algorithm, problem, inputs, output)
    return output


def strided(x: np.ndarray) -> np.ndarray:
    """The same values as a non-contiguous view (every other element of a wider array)."""
    wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


# -- the ONNX specification's examples -------------------------------------------------------

ONNX_NAMES = {"MaxPool": "maxpool", "AveragePool": "avgpool", "GlobalMaxPool": "global_maxpool",
              "GlobalAveragePool": "global_avgpool", "LRN": "lrn"}


def _spec_cases(op_type: str) -> list:
    """The node test cases of one ONNX operator, as pytest parameters."""
    cases = node_cases(op_type)
    params = []
    for case in cases:
        node = case.model.graph.node[0]
        attrs = node_attributes(node)
        for inputs, outputs in case.data_sets:
            marks = []
            if len(node.output) != 1:
                marks.append(pytest.mark.skip(reason="the Indices output is not supported"))
            elif inputs[0].dtype not in (np.float32, np.float64):
                marks.append(pytest.mark.skip(
                    reason=f"{inputs[0].dtype} inputs are not supported (float32/float64)"))
            # the case's own tolerance: some expected values are written to four digits
            params.append(pytest.param(ONNX_NAMES[op_type], inputs, attrs, outputs[0],
                                       max(case.rtol, 1e-5), id=case.name, marks=marks))
    return params


ONNX_CASES = [case for op_type in ONNX_NAMES for case in _spec_cases(op_type)]


def test_the_specification_has_examples():
    operators = [case.values[0] for case in ONNX_CASES if not case.marks]
    assert {name: operators.count(name) for name in OPERATORS} == {
        "maxpool": 16, "avgpool": 20, "global_maxpool": 2, "global_avgpool": 2, "lrn": 2}


@pytest.mark.parametrize("name, inputs, attrs, expected, rtol", ONNX_CASES)
def test_onnx_examples(name, inputs, attrs, expected, rtol):
    operator = op(name)
    problem = operator.problem([x.shape for x in inputs], [x.dtype for x in inputs], **attrs)
    assert operator.output_shape(problem) == expected.shape
    np.testing.assert_allclose(operator.reference(problem, inputs), expected, rtol=rtol,
                               atol=1e-6)
    for algorithm in REGISTRY.algorithms(name):
        if algorithm.usable(problem):
            out = algorithm.run(problem, inputs, ctx=None)
            assert out.dtype == expected.dtype
            np.testing.assert_allclose(out, expected, rtol=rtol, atol=1e-5,
                                       err_msg=str(algorithm.desc))


# -- random problems -------------------------------------------------------------------------

@st.composite
def window_cases(draw: st.DrawFn, operator: str) -> tuple[Problem, list[np.ndarray]]:
    spatial = draw(st.integers(1, 3))
    top = 9 if spatial < 3 else 5
    sizes = draw(st.lists(st.integers(1, top), min_size=spatial, max_size=spatial))
    axis = st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial)
    params: dict[str, Any] = {
        "kernel_shape": draw(st.lists(st.integers(1, 4), min_size=spatial, max_size=spatial)),
        "strides": draw(axis),
        "dilations": draw(st.lists(st.integers(1, 2), min_size=spatial, max_size=spatial)),
        "ceil_mode": draw(st.integers(0, 1)),
    }
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER",
                                     "VALID"]))
    if auto_pad == "NOTSET":
        params["pads"] = draw(st.lists(st.integers(0, 3), min_size=2 * spatial,
                                       max_size=2 * spatial))
    else:
        params["auto_pad"] = auto_pad
    if operator == "avgpool":
        params["count_include_pad"] = draw(st.integers(0, 1))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *sizes)
    dtype = draw(st.sampled_from(["float32", "float64"]))
    try:
        problem = op(operator).problem([shape], [dtype], **params)
    except ValueError:
        assume(False)  # an empty output or a window of padding only: nothing to compute
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = op(operator).random_inputs(problem, rng)
    if draw(st.integers(0, 4)) == 0:
        inputs[0] = strided(inputs[0])
    return problem, inputs


SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.mark.parametrize("algorithm", WINDOWED, **ids)
@SETTINGS
@given(data=st.data())
def test_matches_reference(algorithm: Algorithm, data: st.DataObject) -> None:
    problem, inputs = data.draw(window_cases(algorithm.operator))
    if not algorithm.usable(problem):
        assert len(problem.shapes[0]) == 5 and algorithm.name in ("direct", "rows")
        return
    check(algorithm, problem, inputs)


@st.composite
def plain_cases(draw: st.DrawFn, operator: str) -> tuple[Problem, list[np.ndarray]]:
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=2, max_size=5)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    params: dict[str, Any] = {}
    if operator == "lrn":
        params = {"size": draw(st.integers(1, 8)), "alpha": draw(st.sampled_from([1e-4, 0.5])),
                  "beta": draw(st.sampled_from([0.75, 0.5, 1.5])),
                  "bias": draw(st.sampled_from([1.0, 2.0]))}
    problem = op(operator).problem([shape], [dtype], **params)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = op(operator).random_inputs(problem, rng)
    if draw(st.integers(0, 4)) == 0:
        inputs[0] = strided(inputs[0])
    return problem, inputs


@pytest.mark.parametrize("algorithm", GLOBAL + LRN, **ids)
@SETTINGS
@given(data=st.data())
def test_global_and_lrn_match_reference(algorithm: Algorithm, data: st.DataObject) -> None:
    check(algorithm, *data.draw(plain_cases(algorithm.operator)))


@pytest.mark.parametrize("algorithm", WINDOWED, **ids)
@pytest.mark.parametrize(("shape", "params"), [
    # the ResNet stem pool and the VGG/AlexNet-style ones
    ((2, 5, 23, 23), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 3, 16, 17), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 13, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    # ceil_mode windows past the end padding, asymmetric pads, dilation, stride 3
    ((1, 2, 11, 40), {"kernel_shape": [3, 4], "strides": [3, 3], "dilations": [2, 1],
                      "pads": [2, 0, 1, 3], "ceil_mode": 1}),
    # 1-D
    ((2, 3, 50), {"kernel_shape": [5], "strides": [2], "pads": [2, 1], "ceil_mode": 1}),
])
def test_fixed_shapes(algorithm: Algorithm, shape: tuple, params: dict) -> None:
    extra = [{}] if algorithm.operator == "maxpool" else [{"count_include_pad": 0},
                                                          {"count_include_pad": 1}]
    for dtype in ("float32", "float64"):
        for more in extra:
            problem = op(algorithm.operator).problem([shape], [dtype], **params, **more)
            check(algorithm, problem,
                  op(algorithm.operator).random_inputs(problem, np.random.default_rng(0)))


@pytest.mark.parametrize("algorithm", [a for a in WINDOWED if a.operator == "maxpool"]
                         + [a for a in GLOBAL if a.operator == "global_maxpool"], **ids)
def test_max_propagates_nan(algorithm: Algorithm) -> None:
    """As np.maximum (and the reference) has it: a NaN in a window wins, wherever it is."""
    params = {} if algorithm.operator == "global_maxpool" else {
        "kernel_shape": [2, 2], "strides": [2, 2]}
    problem = op(algorithm.operator).problem([(1, 1, 4, 4)], ["float32"], **params)
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 0] = x[0, 0, 3, 3] = np.nan
    out = algorithm.run(problem, [x], ctx=None)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(op(problem.operator).reference(
        problem, [x])))
    assert np.isnan(out).any()


@pytest.mark.parametrize("algorithm", [a for a in WINDOWED if a.operator == "maxpool"], **ids)
def test_3x3_max_propagates_nan_at_every_tap(algorithm: Algorithm) -> None:
    """ResNet's stem pooling (3x3, stride 2, padded), which the direct kernel computes in one
    pass per row: a NaN at any of the nine taps of a window wins."""
    problem = op("maxpool").problem([(1, 1, 7, 7)], ["float32"], kernel_shape=[3, 3],
                                    strides=[2, 2], pads=[1] * 4)
    for row in range(7):
        for col in range(7):
            x = np.arange(49, dtype=np.float32).reshape(1, 1, 7, 7)
            x[0, 0, row, col] = np.nan
            out = algorithm.run(problem, [x], ctx=None)
            np.testing.assert_array_equal(np.isnan(out), np.isnan(op("maxpool").reference(
                problem, [x])))


@pytest.mark.parametrize("shape", [(2, 3, 8, 10), (1, 2, 9, 7)])
def test_whole_2x2_average_windows_sum_in_kernel_order(shape) -> None:
    """DenseNet's transitions (2x2, stride 2, no padding), which the direct kernel averages in
    one pass per row: ((a + b) + c) + d divided by 4, the numpy algorithm's bits; an odd edge
    (no window over it) included, and a padded pool on the general path beside it."""
    direct = next(a for a in WINDOWED if a.operator == "avgpool" and a.desc.name == "direct")
    numpy_pool = next(a for a in WINDOWED if a.operator == "avgpool" and a.desc.name == "numpy")
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    for params in ({"kernel_shape": [2, 2], "strides": [2, 2]},
                   {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                   {"kernel_shape": [2, 2], "strides": [1, 1]}):
        problem = op("avgpool").problem([shape], ["float32"], **params)
        np.testing.assert_array_equal(direct.run(problem, [x], None),
                                      numpy_pool.run(problem, [x], None))


# -- canonical keys and semantics ------------------------------------------------------------

@pytest.mark.parametrize("spelling", [
    {"auto_pad": "SAME_UPPER"},
    {"pads": [0, 0, 1, 1]},
    {"pads": [0, 0, 1, 1], "strides": 2, "dilations": [1, 1], "storage_order": 1},
    {"auto_pad": "SAME_UPPER", "ceil_mode": 1},
    {"auto_pad": "NOTSET", "pads": [0, 0, 1, 1], "ceil_mode": 1},  # ceil adds no window here
])
def test_equal_poolings_share_one_key(spelling):
    params = {"kernel_shape": [3, 3], "strides": [2, 2], **spelling}
    assert op("maxpool").problem([(1, 4, 8, 8)], ["float32"], **params).key == (
        "float32[1x4x8x8];ceil_mode=0,dilations=(1,1),kernel_shape=(3,3),pads=(0,0,1,1),"
        "strides=(2,2)")


def test_avgpool_keys_and_count_include_pad():
    shape = [(1, 1, 6, 6)]
    # count_include_pad changes nothing without pads
    plain = op("avgpool").problem(shape, ["float32"], kernel_shape=[2, 2], count_include_pad=1)
    assert plain.param("count_include_pad") == 0
    assert plain.key == op("avgpool").problem(shape, ["float32"], kernel_shape=(2, 2)).key
    padded = op("avgpool").problem(shape, ["float32"], kernel_shape=[3, 3], pads=[1] * 4,
                                   count_include_pad=1)
    assert padded.key.endswith("count_include_pad=1,dilations=(1,1),kernel_shape=(3,3),"
                               "pads=(1,1,1,1),strides=(1,1)")


def test_same_lower_puts_the_odd_pad_first():
    upper = op("maxpool").problem([(1, 1, 6, 6)], ["float32"], kernel_shape=[4, 4],
                                  auto_pad="SAME_UPPER")
    lower = op("maxpool").problem([(1, 1, 6, 6)], ["float32"], kernel_shape=[4, 4],
                                  auto_pad="SAME_LOWER")
    assert upper.param("pads") == (1, 1, 2, 2) and lower.param("pads") == (2, 2, 1, 1)
    assert op("maxpool").output_shape(upper) == (1, 1, 6, 6)


def test_ceil_mode_drops_a_window_starting_in_the_end_padding():
    # 2 + 1 + 1 - 3 = 1 -> ceil(1 / 3) + 1 = 2 windows, but the second starts at 3 = 2 + 1
    problem = op("avgpool").problem([(1, 1, 2, 2)], ["float64"], kernel_shape=[3, 3],
                                    strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1,
                                    count_include_pad=1)
    assert op("avgpool").output_shape(problem) == (1, 1, 1, 1)
    # a kept ceil window: positions past the end padding count neither way
    problem = op("avgpool").problem([(1, 1, 1, 5)], ["float64"], kernel_shape=[1, 3],
                                    strides=[1, 3], pads=[0, 1, 0, 0], ceil_mode=1,
                                    count_include_pad=1)
    x = np.arange(1.0, 6.0).reshape(1, 1, 1, 5)
    expected = [[[[(0 + 1 + 2) / 3, (3 + 4 + 5) / 3]]]]  # (pad, 1, 2), (3, 4, 5)
    np.testing.assert_allclose(op("avgpool").reference(problem, [x]), expected)
    problem = op("avgpool").problem([(1, 1, 1, 6)], ["float64"], kernel_shape=[1, 3],
                                    strides=[1, 3], pads=[0, 1, 0, 0], ceil_mode=1,
                                    count_include_pad=1)
    x = np.arange(1.0, 7.0).reshape(1, 1, 1, 6)
    expected = [[[[(1 + 2) / 3, (3 + 4 + 5) / 3, 6.0]]]]  # the last window: (6, beyond, beyond)
    np.testing.assert_allclose(op("avgpool").reference(problem, [x]), expected)
    for algorithm in REGISTRY.algorithms("avgpool"):
        np.testing.assert_allclose(algorithm.run(problem, [x], None), expected)


def test_lrn_window_for_even_sizes():
    """size 4 sums channels c-1 .. c+2 (floor and ceil of (size-1)/2)."""
    problem = op("lrn").problem([(1, 5, 1)], ["float64"], size=4, alpha=4.0, beta=1.0, bias=0.0)
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0]).reshape(1, 5, 1)
    squares = x[0, :, 0] ** 2
    sums = [squares[max(0, c - 1):c + 3].sum() for c in range(5)]
    expected = (x[0, :, 0] / np.array(sums)).reshape(1, 5, 1)
    np.testing.assert_allclose(op("lrn").reference(problem, [x]), expected)
    np.testing.assert_allclose(LRN[0].run(problem, [x], None), expected)
    assert problem.key == "float64[1x5x1];alpha=4.0,beta=1.0,bias=0.0,size=4"
    assert op("lrn").problem([(1, 5, 1)], ["float64"], size=3).key.endswith(
        "alpha=0.0001,beta=0.75,bias=1.0,size=3")


# -- clear errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, shape, params, message", [
    ("maxpool", (1, 1, 3, 3), {"kernel_shape": [5, 5]}, "larger than the padded input"),
    ("maxpool", (1, 1, 3, 3), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 0, 0, 0]},
     "larger than the padded input"),
    ("maxpool", (1, 1, 8), {"kernel_shape": [2, 2]}, "kernel_shape needs 1 value(s)"),
    ("maxpool", (8, 8), {"kernel_shape": [2]}, "1-D, 2-D and 3-D pooling"),
    ("avgpool", (1, 1, 2, 2, 2, 2), {"kernel_shape": [1] * 4}, "1-D, 2-D and 3-D pooling"),
    ("maxpool", (1, 1, 8, 8), {}, "needs kernel_shape"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "padding": 1},
     "no parameter(s) padding"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "count_include_pad": 1},
     "no parameter(s) count_include_pad"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "pads": [1, 1]}, "pads needs 4 values"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "pads": [1, -1, 0, 0]},
     "must not be negative"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 0]}, "kernel_shape must be positive"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "strides": [0, 1]},
     "strides must be positive"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "auto_pad": "SAME"},
     "auto_pad must be one of"),
    ("maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "auto_pad": "VALID", "pads": [1] * 4},
     "cannot take both pads"),
    ("avgpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "ceil_mode": 2},
     "ceil_mode must be 0 or 1"),
    ("avgpool", (1, 1, 8, 8), {"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]},
     "window of padding only"),
    ("global_maxpool", (1, 1, 8, 8), {"kernel_shape": [2, 2]}, "takes no parameters"),
    ("global_avgpool", (4,), {}, "(N, C, *spatial)"),
    ("lrn", (1, 4, 2, 2), {}, "needs size"),
    ("lrn", (1, 4, 2, 2), {"size": 0}, "size must be a positive integer"),
    ("lrn", (1, 4, 2, 2), {"size": 3, "gamma": 1}, "no parameter(s) gamma"),
    ("lrn", (1, 4, 2, 2), {"size": 3, "beta": float("nan")}, "beta must be a finite number"),
])
def test_invalid_parameters_are_named(name, shape, params, message):
    with pytest.raises(ValueError) as info:
        op(name).problem([shape], ["float32"], **params)
    assert message in str(info.value)


@pytest.mark.parametrize("name", OPERATORS)
def test_dtypes_and_input_counts_are_checked(name):
    params = {"kernel_shape": [2, 2]} if "pool" in name and "global" not in name else {}
    if name == "lrn":
        params = {"size": 3}
    with pytest.raises(ValueError, match="float32 or float64"):
        op(name).problem([(1, 1, 4, 4)], ["int8"], **params)
    with pytest.raises(ValueError):
        op(name).problem([(1, 1, 4, 4), (1, 1, 4, 4)], ["float32"] * 2, **params)


def test_problems_must_be_canonical():
    raw = Problem.create("maxpool", [(1, 1, 8, 8)], ["float32"],
                         {"kernel_shape": (2, 2), "auto_pad": "VALID"})
    with pytest.raises(ValueError, match="canonical"):
        op("maxpool").validate(raw)


# -- workspace, attributes, reproducibility --------------------------------------------------

WORKSPACE_CASES = [
    ("maxpool", (2, 8, 30, 30), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}),
    ("maxpool", (1, 4, 32, 32), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("avgpool", (1, 6, 29, 31), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1],
                                 "ceil_mode": 1, "count_include_pad": 1}),
    ("avgpool", (2, 3, 12, 10, 9), {"kernel_shape": [3, 3, 2], "strides": [2, 2, 2],
                                    "ceil_mode": 1}),
    ("avgpool", (1, 4, 90), {"kernel_shape": [5], "dilations": [2], "pads": [2, 4]}),
    ("global_maxpool", (2, 16, 14, 14), {}),
    ("global_avgpool", (2, 16, 7, 9), {}),
    ("lrn", (2, 16, 9, 9), {"size": 5}),
]


@pytest.mark.parametrize(("algorithm", "name", "shape", "params"), [
    pytest.param(algorithm, name, shape, params, id=f"{algorithm.desc}-{shape}")
    for name, shape, params in WORKSPACE_CASES for algorithm in ALL
    if algorithm.operator == name])
@pytest.mark.parametrize("strided_x", [False, True])
def test_workspace_is_what_run_allocates(algorithm: Algorithm, name: str, shape: tuple,
                                         params: dict, strided_x: bool) -> None:
    """Exact whatever the input's layout: a strided X is read (or copied) in place."""
    problem = op(name).problem([shape], ["float64"], **params)
    if not algorithm.usable(problem):
        pytest.skip(algorithm.unusable_reason(problem))
    inputs = op(name).random_inputs(problem, np.random.default_rng(4))
    if strided_x:
        inputs[0] = strided(inputs[0])
    algorithm.run(problem, inputs, None)  # warm-up: compile or load the kernel
    assert_allocates_its_workspace(algorithm, problem,
                                   lambda: algorithm.run(problem, inputs, None))


def test_workspace_figures():
    padded = op("maxpool").problem([(2, 8, 30, 30)], ["float32"], kernel_shape=[3, 3],
                                   strides=[2, 2], pads=[1] * 4)
    numpy_max = next(a for a in REGISTRY.algorithms("maxpool") if a.name == "numpy")
    direct_max = next(a for a in REGISTRY.algorithms("maxpool") if a.name == "direct")
    # the padded copy (30 + 1 + 1 = 32 per axis) and one 15x15 output-sized buffer
    assert numpy_max.workspace_bytes(padded) == 2 * 8 * (32 * 32 + 15 * 15) * 4
    # per numba worker, the 30 input rows and one row of the pad value, staged in 2 column
    # phases of 15 outputs + 1 tap
    assert direct_max.workspace_bytes(padded) == numba.get_num_threads() * 31 * 2 * 16 * 4
    in_place = op("maxpool").problem([(1, 4, 32, 32)], ["float32"], kernel_shape=[2, 2],
                                     strides=[2, 2])
    assert numpy_max.workspace_bytes(in_place) == 4 * 16 * 16 * 4  # X is read in place
    one_tap = op("avgpool").problem([(1, 4, 32, 32)], ["float32"], kernel_shape=[1, 1],
                                    strides=[2, 2])
    assert REGISTRY.algorithms("avgpool")[1].workspace_bytes(one_tap) == 0
    assert LRN[0].workspace_bytes(op("lrn").problem([(2, 3, 4)], ["float32"], size=3)) == 96


def test_attributes_identities_and_order():
    for name in OPERATORS:
        texts = [a.desc.text for a in REGISTRY.algorithms(name)]
        assert texts == (["rows", "direct", "numpy"] if name == "maxpool" else
                         ["direct", "numpy"] if name == "avgpool" else
                         ["numpy", "parallel"] if name.startswith("global") else ["numpy"])
    for algorithm in ALL:
        assert algorithm.attributes == AlgoAttribute.REPRODUCIBLE
    three_d = op("maxpool").problem([(1, 1, 4, 4, 4)], ["float32"], kernel_shape=[2, 2, 2])
    for windowed in REGISTRY.algorithms("maxpool")[:2]:  # rows and direct
        assert "1-D and 2-D" in windowed.unusable_reason(three_d)
    stem = op("maxpool").problem([(1, 64, 112, 112)], ["float32"], kernel_shape=[3, 3],
                                 strides=[2, 2], pads=[1] * 4)
    order = op("maxpool").heuristic_order(stem, REGISTRY.algorithms("maxpool"))
    assert [a.name for a in order] == ["rows", "direct", "numpy"]
    # unpadded but overlapping windows (SqueezeNet): numpy's strided view would re-read them
    squeeze = op("maxpool").problem([(1, 64, 111, 111)], ["float32"], kernel_shape=[3, 3],
                                    strides=[2, 2])
    order = op("maxpool").heuristic_order(squeeze, REGISTRY.algorithms("maxpool"))
    assert [a.name for a in order] == ["rows", "direct", "numpy"]
    disjoint = op("maxpool").problem([(1, 64, 112, 112)], ["float32"], kernel_shape=[2, 2],
                                     strides=[2, 2])
    order = op("maxpool").heuristic_order(disjoint, REGISTRY.algorithms("maxpool"))
    assert [a.name for a in order] == ["rows", "numpy", "direct"]


@pytest.mark.parametrize("name", ["global_maxpool", "global_avgpool"])
def test_global_pools_go_parallel_on_large_inputs_and_several_threads(name, monkeypatch):
    squeezenet_b8 = op(name).problem([(8, 1000, 13, 13)], ["float32"])  # 5.4 MB
    resnet_b1 = op(name).problem([(1, 512, 7, 7)], ["float32"])  # 100 kB
    candidates = REGISTRY.algorithms(name)

    def first(problem, threads):
        pretend_threads(monkeypatch, threads)
        return op(name).heuristic_order(problem, candidates)[0].name

    assert first(squeezenet_b8, 16) == "parallel"
    assert first(squeezenet_b8, 1) == "numpy"
    assert first(resnet_b1, 16) == "numpy"
    # the average's vector sum goes first at every size on 2 threads (measured there)
    assert first(resnet_b1, 2) == ("parallel" if name == "global_avgpool" else "numpy")


@pytest.mark.parametrize("algorithm", WINDOWED, **ids)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_reproducible(algorithm: Algorithm, count_include_pad: int) -> None:
    """Bit-identical on every run and on any thread count (one task per output plane)."""
    params = {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 2, 0, 1], "ceil_mode": 1}
    if algorithm.operator == "avgpool":
        params["count_include_pad"] = count_include_pad
    problem = op(algorithm.operator).problem([(2, 7, 19, 23)], ["float32"], **params)
    inputs = op(algorithm.operator).random_inputs(problem, np.random.default_rng(6))
    first = algorithm.run(problem, inputs, None)
    np.testing.assert_array_equal(algorithm.run(problem, inputs, None), first)
    with numba_threads(1):
        np.testing.assert_array_equal(algorithm.run(problem, inputs, None), first)


@pytest.mark.parametrize("name", ["maxpool", "avgpool"])
def test_direct_keeps_its_staging_buffers_correct_across_threads_and_concurrent_calls(name):
    """The staging buffers' padding (-inf for max, 0 for the sums) is written when they are
    made and kept between calls: the same bits whatever ran before."""
    direct = next(a for a in REGISTRY.algorithms(name) if a.name == "direct")
    problem = op(name).problem([(2, 6, 29, 31)], ["float32"], kernel_shape=[3, 3],
                               strides=[2, 2], pads=[1] * 4)
    other = op(name).problem([(1, 6, 12, 12)], ["float32"], kernel_shape=[2, 2],
                             strides=[2, 2])
    inputs = op(name).random_inputs(problem, np.random.default_rng(8))
    first = direct.run(problem, inputs, None)
    np.testing.assert_allclose(first, op(name).reference(problem, inputs), rtol=1e-5, atol=1e-6)
    direct.run(other, op(name).random_inputs(other, np.random.default_rng(9)), None)
    assert_same_bits_across_threads_and_concurrent_calls(
        lambda: direct.run(problem, inputs, None), first)


def test_direct_max_and_average_pools_of_one_shape_keep_apart_buffers():
    """The staging buffers' padding differs (-inf for max, 0 for the sums): a maxpool and an
    avgpool of the same shapes and parameters, run one after the other, each stay right."""
    shape, params = (1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4}
    x = op("maxpool").random_inputs(op("maxpool").problem([shape], ["float32"], **params),
                                    np.random.default_rng(10))
    for _ in range(2):
        for name in ("maxpool", "avgpool"):
            problem = op(name).problem([shape], ["float32"], **params)
            direct = next(a for a in REGISTRY.algorithms(name) if a.name == "direct")
            np.testing.assert_allclose(direct.run(problem, x, None),
                                       op(name).reference(problem, x), rtol=1e-5, atol=1e-6)


def test_rows_matches_direct_bit_for_bit_and_refuses_rows_past_its_buffer():
    """SqueezeNet's ceil-mode pools and GoogLeNet's stride-1 padded one: a max is exact, so
    the two kernels agree to the bit; a padded row longer than the stack buffer is refused
    with its length."""
    rows = next(a for a in REGISTRY.algorithms("maxpool") if a.name == "rows")
    direct = next(a for a in REGISTRY.algorithms("maxpool") if a.name == "direct")
    for shape, params in (((1, 8, 27, 27), {"kernel_shape": [3, 3], "strides": [2, 2],
                                             "ceil_mode": 1}),
                          ((2, 4, 28, 28), {"kernel_shape": [3, 3], "pads": [1] * 4})):
        problem = op("maxpool").problem([shape], ["float32"], **params)
        x = op("maxpool").random_inputs(problem, np.random.default_rng(11))
        np.testing.assert_array_equal(rows.run(problem, x, None), direct.run(problem, x, None))
    wide = op("maxpool").problem([(1, 1, 2, 5000)], ["float32"], kernel_shape=[2, 2],
                                 pads=[0, 1, 0, 1])
    assert "at most 4096 values, this one has 5002" in rows.unusable_reason(wide)
