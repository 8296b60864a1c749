"""The reduce operator (ONNX's Reduce{Sum,Mean,Max,Min,Prod,L1,L2,SumSquare}): every algorithm
against the reference on random shapes, axes and modes; canonical keys; clear errors; empty
reductions and NaN; the parallel kernel's result at any thread count.  ONNX's own node tests of
these ops run in tests/runtime/test_onnx_backend.py."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun_algorithms import reduce
from fastrun_algorithms.reduce import MODES
from tests.algorithms._helpers import (
    check_drawn_problem,
    cpu_registry,
    numba_threads,
)

REGISTRY = cpu_registry(reduce)
OPERATOR = REGISTRY.operator("reduce")
ALGORITHMS = REGISTRY.algorithms("reduce")


@st.composite
def problems(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    mode = draw(st.sampled_from(MODES))
    dtypes = ["float32", "float64"] + (["int32", "int64"] if mode in ("sum", "max", "min")
                                       else [])
    dtype = draw(st.sampled_from(dtypes))
    axes = draw(st.one_of(st.none(), st.lists(st.integers(-rank, rank - 1), min_size=1,
                                              max_size=rank, unique_by=lambda a: a % rank)))
    keepdims = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype.startswith("int"):
        x = rng.integers(-20, 20, size=shape).astype(dtype)
    else:
        x = (rng.standard_normal(shape) * 3).astype(dtype)
    return OPERATOR.problem_for([x], mode=mode, axes=axes, keepdims=keepdims), x


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.desc.text)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=problems())
def test_matches_reference(algorithm, drawn):
    check_drawn_problem(OPERATOR, algorithm, drawn)


def test_keys_are_canonical():
    shape = [(2, 3, 4)]
    key = OPERATOR.problem(shape, ["float32"], mode="mean", axes=(-1, 1)).key
    assert key == OPERATOR.problem(shape, ["float32"], mode="mean", axes=[1, 2],
                                   keepdims=1).key
    everything = OPERATOR.problem(shape, ["float32"], mode="sum").key
    assert everything == OPERATOR.problem(shape, ["float32"], mode="sum", axes=()).key
    assert everything == OPERATOR.problem(shape, ["float32"], mode="sum", axes=(0, 1, 2)).key


@pytest.mark.parametrize("params, dtype, message", [
    ({"mode": "median"}, "float32", "mode must be one of"),
    ({"mode": "sum", "axes": (3,)}, "float32", "out of range"),
    ({"mode": "sum", "axes": (1, -2)}, "float32", "repeat an axis"),
    ({"mode": "mean"}, "int32", "supports dtypes float32, float64"),
    ({"mode": "sum", "scale": 2}, "float32", r"no parameter\(s\) scale"),
])
def test_bad_problems_say_what_is_wrong(params, dtype, message):
    with pytest.raises(ValueError, match=message):
        OPERATOR.problem([(2, 3, 4)], [dtype], **params)


def test_empty_reductions_give_the_identity():
    x = np.zeros((2, 0, 3), np.float32)
    expected = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf, "sum_square": 0.0}
    for mode, value in expected.items():
        problem = OPERATOR.problem_for([x], mode=mode, axes=(1,), keepdims=False)
        for algorithm in ALGORITHMS:
            if algorithm.usable(problem):
                out = algorithm.run(problem, [x], None)
                np.testing.assert_array_equal(out, np.full((2, 3), value, np.float32))
    flags = np.zeros((0, 2), bool)
    problem = OPERATOR.problem_for([flags], mode="min", axes=(0,))
    np.testing.assert_array_equal(ALGORITHMS[0].run(problem, [flags], None), [[True, True]])


def test_max_and_min_keep_nan_and_bool_works():
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, -1.0]], np.float32)
    for mode in ("max", "min"):
        problem = OPERATOR.problem_for([x], mode=mode, axes=(1,))
        for algorithm in ALGORITHMS:
            out = algorithm.run(problem, [x], None)
            assert np.isnan(out[0, 0]) and out[1, 0] == (5.0 if mode == "max" else -1.0)
    flags = np.array([[True, False], [False, False]])
    problem = OPERATOR.problem_for([flags], mode="max", axes=(1,), keepdims=False)
    np.testing.assert_array_equal(ALGORITHMS[0].run(problem, [flags], None), [True, False])


@pytest.mark.parametrize("axes", [(2, 3), (1,), (0, 1)])
def test_parallel_gives_the_same_bits_at_any_thread_count(axes):
    parallel = next(a for a in ALGORITHMS if a.desc.name == "parallel")
    x = np.random.default_rng(1).standard_normal((4, 32, 14, 14)).astype(np.float32)
    problem = OPERATOR.problem_for([x], mode="mean", axes=axes)
    results = []
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        with numba_threads(threads):
            results.append(parallel.run(problem, [x], None).tobytes())
    assert len(set(results)) == 1


def test_parallel_refuses_axes_that_are_not_adjacent():
    parallel = next(a for a in ALGORITHMS if a.desc.name == "parallel")
    problem = OPERATOR.problem([(2, 3, 4)], ["float32"], mode="sum", axes=(0, 2))
    assert "adjacent" in parallel.unusable_reason(problem)
    problem = OPERATOR.problem([(2, 3, 4)], ["int32"], mode="sum", axes=(1,))
    assert "float" in parallel.unusable_reason(problem)


# -- arg_reduce (ArgMax, ArgMin) ---------------------------------------------------------------
ARG = REGISTRY.operator("arg_reduce")
ARG_ALGORITHMS = REGISTRY.algorithms("arg_reduce")


@st.composite
def arg_problems(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(["float32", "float64", "int32", "int64"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(-3, 3, size=shape).astype(dtype)  # few values: many ties
    if dtype.startswith("float") and draw(st.booleans()):
        x.flat[rng.integers(0, x.size)] = np.nan
    params = {"mode": draw(st.sampled_from(["max", "min"])),
              "axis": draw(st.integers(-rank, rank - 1)), "keepdims": draw(st.booleans()),
              "select_last_index": draw(st.booleans())}
    return ARG.problem_for([x], **params), x


@pytest.mark.parametrize("algorithm", ARG_ALGORITHMS, ids=lambda a: a.desc.text)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=arg_problems())
def test_arg_reduce_matches_reference(algorithm, drawn):
    problem, x = drawn
    ARG.validate(problem)
    out = algorithm.run(problem, [x], None)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, ARG.reference(problem, [x]))


def test_arg_reduce_picks_the_first_or_last_tie_and_a_nan():
    x = np.array([[1, 3, 3, 0], [np.nan, 2, np.nan, 5]], np.float32)
    first = ARG.problem_for([x], mode="max", axis=1, keepdims=False)
    last = ARG.problem_for([x], mode="max", axis=-1, keepdims=False, select_last_index=True)
    for algorithm in ARG_ALGORITHMS:
        np.testing.assert_array_equal(algorithm.run(first, [x], None), [1, 0])
        np.testing.assert_array_equal(algorithm.run(last, [x], None), [2, 2])


@pytest.mark.parametrize("params, shape, message", [
    ({"mode": "median"}, (2, 3), "mode must be max or min"),
    ({"mode": "max", "axis": 2}, (2, 3), "out of range"),
    ({"mode": "max", "axis": 1}, (2, 0), "empty: there is no extreme"),
    ({"mode": "max", "keep": 1}, (2, 3), r"no parameter\(s\) keep"),
])
def test_arg_reduce_bad_problems_say_what_is_wrong(params, shape, message):
    with pytest.raises(ValueError, match=message):
        ARG.problem([shape], ["float32"], **params)


# -- topk (TopK's indices) --------------------------------------------------------------------
TOPK = REGISTRY.operator("topk")
TOPK_ALGORITHMS = REGISTRY.algorithms("topk")


@st.composite
def topk_problems(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    dtype = draw(st.sampled_from(["float32", "float64", "int32", "int64", "uint8"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(0 if dtype == "uint8" else -3, 3, size=shape).astype(dtype)  # many ties
    if dtype.startswith("float") and draw(st.booleans()):
        x.flat[rng.integers(0, x.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    axis = draw(st.integers(-rank, rank - 1))
    params = {"axis": axis, "k": draw(st.integers(0, shape[axis])),
              "largest": draw(st.booleans())}
    return TOPK.problem_for([x], **params), x


@pytest.mark.parametrize("algorithm", TOPK_ALGORITHMS, ids=lambda a: a.desc.text)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=topk_problems())
def test_topk_matches_reference(algorithm, drawn):
    """Ties by the lower index, NaN above every number, the infinities in place."""
    problem, x = drawn
    TOPK.validate(problem)
    out = algorithm.run(problem, [x], None)
    assert out.dtype == np.int64 and out.shape == TOPK.output_shape(problem)
    np.testing.assert_array_equal(out, TOPK.reference(problem, [x]))


def test_topk_of_extreme_integers_does_not_wrap():
    x = np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max, 0], np.int64)
    for algorithm in TOPK_ALGORITHMS:
        largest = algorithm.run(TOPK.problem_for([x], k=4, axis=0), [x], None)
        np.testing.assert_array_equal(largest, [2, 1, 3, 0])


@pytest.mark.parametrize("params, shape, message", [
    ({"k": 4, "axis": 1}, (2, 3), "k must be an integer in 0..3"),
    ({"k": 1, "axis": 2}, (2, 3), "out of range"),
    ({"axis": 1}, (2, 3), "k must be an integer"),
    ({"k": 1, "sorted": 1}, (2, 3), r"no parameter\(s\) sorted"),
])
def test_topk_bad_problems_say_what_is_wrong(params, shape, message):
    with pytest.raises(ValueError, match=message):
        TOPK.problem([shape], ["float32"], **params)
