"""The tensor operators (transpose, concat, slice, pad, gather): every registered algorithm
against its operator's reference on random shapes, dtypes and parameters, against the ONNX
specification's own examples, and the contract with the ONNX runtime: ONNX Slice's clamping
rules, canonical keys, clear errors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrun
from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun_algorithms import tensor
from fastrun_algorithms.tensor import SUPPORTED_DTYPES, clamp_slice
from tests.algorithms._helpers import (
    TRACEMALLOC_SLACK,
    assert_matches_reference,
    cpu_registry,
    pretend_threads,
    traced_peak,
)
from tests.algorithms.test_activation import _params_of_cases, run_onnx_case, split_inputs
from tests.onnx_cases import node_attributes

#: the CPU algorithms only (numpy in, numpy out): the OpenCL ones, registered too where pyopencl
#: is installed, are tested on the device in test_tensor_opencl.py
REGISTRY = cpu_registry(tensor)
OP_NAMES = ["transpose", "concat", "slice", "pad", "gather"]
CASES = [(name, algorithm) for name in OP_NAMES for algorithm in REGISTRY.algorithms(name)]
CASE_IDS = [f"{name}-{algorithm.desc.name}" for name, algorithm in CASES]
INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


# -- the ONNX specification's examples -----------------------------------------------------------

#: op type -> (operator, constant inputs by position -> parameter)
ONNX_MAPPING = {
    "Transpose": ("transpose", {}),
    "Concat": ("concat", {}),
    "Slice": ("slice", {1: "starts", 2: "ends", 3: "axes", 4: "steps"}),
    "Pad": ("pad", {1: "pads", 2: "value", 3: "axes"}),
    "Gather": ("gather", {}),
}


def _tensor_mapping(op_type: str, node: onnx.NodeProto, inputs: list, outputs: list
                    ) -> tuple[str, list, dict[str, Any]]:
    operator, constant = ONNX_MAPPING[op_type]
    tensors, params = split_inputs(node, inputs, constant)
    return operator, tensors, {**node_attributes(node), **params}


ONNX_CASES = list(_params_of_cases(list(ONNX_MAPPING), _tensor_mapping))


def test_the_specification_has_examples() -> None:
    by_type = {op: sum(1 for case in ONNX_CASES if case.values[0] == op) for op in ONNX_MAPPING}
    assert all(count >= 1 for count in by_type.values()), by_type
    assert len(ONNX_CASES) >= 30


@pytest.mark.parametrize(("op_type", "node", "inputs", "outputs", "mapping"), ONNX_CASES)
def test_onnx_examples(op_type, node, inputs, outputs, mapping) -> None:
    run_onnx_case(REGISTRY, node, inputs, outputs, mapping)


# -- random problems ---------------------------------------------------------------------------

def random_data(shape: tuple, dtype: str, rng: np.random.Generator) -> np.ndarray:
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind == "f":
        x = rng.standard_normal(shape)
        x[rng.random(shape) < 0.1] = np.nan  # NaN must be moved like any value
        return x.astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


shape_st = st.lists(st.integers(0, 4), min_size=1, max_size=4).map(tuple)
index_st = st.one_of(st.integers(-6, 6), st.sampled_from([INT64_MAX, INT64_MIN]))


@st.composite
def problems(draw: st.DrawFn, op: str) -> tuple[list[tuple], dict[str, Any]]:
    """Input shapes and ONNX-style parameters for ``op``."""
    shape = draw(shape_st)
    rank = len(shape)
    if op == "transpose":
        perm = draw(st.permutations(range(rank)))
        return [shape], {} if draw(st.booleans()) else {"perm": perm}
    if op == "concat":
        axis = draw(st.integers(-rank, rank - 1))
        shapes = []
        for _ in range(draw(st.integers(1, 3))):
            other = list(shape)
            other[axis] = draw(st.integers(0, 3))
            shapes.append(tuple(other))
        return shapes, {"axis": axis}
    if op == "slice":
        axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
        n = len(axes)
        params = {"starts": draw(st.lists(index_st, min_size=n, max_size=n)),
                  "ends": draw(st.lists(index_st, min_size=n, max_size=n))}
        if draw(st.booleans()) or axes != list(range(n)):
            params["axes"] = [a - rank if draw(st.booleans()) else a for a in axes]
        if draw(st.booleans()):
            params["steps"] = draw(st.lists(st.sampled_from([-3, -2, -1, 1, 2, 3]),
                                            min_size=n, max_size=n))
        return [shape], params
    if op == "pad":
        mode = draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
        begins, ends = [], []
        for dim in shape:
            if mode == "constant":  # may crop the whole axis
                begins.append(draw(st.integers(-dim, 4)))
                ends.append(draw(st.integers(-dim - min(begins[-1], 0), 4)))
            elif dim:  # keeps at least one element to extend from when a pad is positive
                begins.append(draw(st.integers(-(dim // 2), 4)))
                ends.append(draw(st.integers(-(dim // 2), 4)))
            else:
                begins.append(0)
                ends.append(0)
        params: dict[str, Any] = {"pads": begins + ends, "mode": mode}
        if mode == "constant" and draw(st.booleans()):
            params["value"] = draw(st.sampled_from([0, 1, 7]))
        if draw(st.booleans()):  # the same pads through opset 18's axes
            axes = [a for a in range(rank) if begins[a] or ends[a]]
            params["pads"] = [begins[a] for a in axes] + [ends[a] for a in axes]
            params["axes"] = [a - rank for a in axes]
        return [shape], params
    # gather
    axis = draw(st.integers(-rank, rank - 1))
    indices = draw(st.lists(st.integers(0, 3), max_size=3).map(tuple))
    if shape[axis] == 0:
        shape = (*shape[:axis % rank], 1, *shape[axis % rank + 1:])
    return [shape, indices], {"axis": axis} if axis or draw(st.booleans()) else {}


def draw_case(data: st.DataObject, op: str) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Random inputs and parameters of ``op`` (valid gather indices; a bool pad value)."""
    shapes, params = data.draw(problems(op), label="problem")
    dtype = data.draw(st.sampled_from(SUPPORTED_DTYPES), label="dtype")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    if op == "gather":
        n = shapes[0][params.get("axis", 0)]
        inputs = [random_data(shapes[0], dtype, rng),
                  rng.integers(-n, n, size=shapes[1]).astype(data.draw(
                      st.sampled_from(["int32", "int64"])))]
    else:
        inputs = [random_data(shape, dtype, rng) for shape in shapes]
    if op == "pad" and dtype == "bool" and params.get("value") == 7:
        params["value"] = 1
    return inputs, params


@pytest.mark.parametrize(("op", "algorithm"), CASES, ids=CASE_IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_reference(op: str, algorithm: Algorithm, data: st.DataObject) -> None:
    inputs, params = draw_case(data, op)
    operator = REGISTRY.operator(op)
    problem = operator.problem_for(inputs, **params)
    operator.validate(problem)  # canonical problems pass validate (dispatch calls it)
    output = algorithm.run(problem, inputs, None)
    assert_matches_reference(operator, algorithm, problem, inputs, output)
    assert output.flags.c_contiguous
    assert not any(np.shares_memory(output, x) for x in inputs)


@pytest.mark.parametrize(("op", "shapes", "params"), [
    ("transpose", [(16, 32, 64)], {"perm": (2, 0, 1)}),
    ("concat", [(16, 32, 64), (16, 8, 64)], {"axis": 1}),
    ("slice", [(16, 32, 64)], {"starts": [1, -1], "ends": [15, 0], "axes": [0, 2],
                               "steps": [2, -3]}),
    ("pad", [(16, 32, 64)], {"pads": [1, -2, 3, 0, 4, -5], "mode": "reflect"}),
    ("pad", [(16, 32, 64)], {"pads": [1, -2, 3, 0, 4, -5], "value": 2.5}),
    ("gather", [(16, 32, 64), (40,)], {"axis": 1}),
])
def test_declared_workspace_covers_what_runs_allocate(op: str, shapes: list,
                                                      params: dict) -> None:
    """Besides their output the algorithms allocate no more than they declare (nothing, but
    for pad's non-constant modes).  Each runs once untraced first: a kernel's first call in a
    process compiles it or loads it from numba's cache (3.4 MB of Python objects for the
    parallel transpose), which no later call repeats."""
    operator = REGISTRY.operator(op)
    dtypes = ["float64"] + (["int64"] if op == "gather" else ["float64"] * (len(shapes) - 1))
    problem = operator.problem(shapes, dtypes, **params)
    inputs = operator.random_inputs(problem, np.random.default_rng(0))
    out_bytes = math.prod(operator.output_shape(problem)) * 8
    for algorithm in REGISTRY.algorithms(op):
        workspace = algorithm.workspace_bytes(problem)
        assert (workspace > 0) == (params.get("mode") == "reflect")
        algorithm.run(problem, inputs, None)
        with traced_peak() as peak:
            algorithm.run(problem, inputs, None)
        assert peak[0] <= out_bytes + workspace + TRACEMALLOC_SLACK, \
            f"{algorithm.desc}: {peak[0]}"


# -- slice: ONNX's rules -----------------------------------------------------------------------

def onnx_slice_indices(start: int, end: int, step: int, dim: int) -> list[int]:
    """The indices ONNX Slice picks, written out from the specification's text."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    picked, i = [], start
    while (step > 0 and i < end) or (step < 0 and i > end):
        picked.append(i)
        i += step
    return picked


@settings(max_examples=300, deadline=None)
@given(start=index_st, end=index_st, step=st.sampled_from([-4, -2, -1, 1, 2, 5]),
       dim=st.integers(0, 7))
def test_clamp_slice_follows_the_specification(start, end, step, dim) -> None:
    triple = clamp_slice(start, end, step, dim)
    assert list(range(*triple)) == onnx_slice_indices(start, end, step, dim)
    # the canonical form is recognised as such (validate depends on it)
    operator = REGISTRY.operator("slice")
    problem = operator.problem([(dim,)], ["float32"], starts=[start], ends=[end], steps=[step])
    assert problem.param("slices") == (triple,)
    operator.validate(problem)
    assert operator.problem([(dim,)], ["float32"], slices=[triple]).key == problem.key


def test_backward_slice_below_zero_starts_at_the_first_element() -> None:
    """ONNX clamps a backward start to [0, dim - 1] (Python's slicing would pick nothing)."""
    x = np.arange(5, dtype=np.int32)
    operator = REGISTRY.operator("slice")
    problem = operator.problem_for([x], starts=[-10], ends=[INT64_MIN], steps=[-1])
    assert problem.param("slices") == ((0, 1, 1),)
    for algorithm in REGISTRY.algorithms("slice"):
        np.testing.assert_array_equal(algorithm.run(problem, [x], None), [0])
    reverse = operator.problem_for([x], starts=[INT64_MAX], ends=[INT64_MIN], steps=[-1])
    assert reverse.param("slices") == ((4, -1, -1),)
    operator.validate(reverse)
    np.testing.assert_array_equal(REGISTRY.algorithms("slice")[0].run(reverse, [x], None),
                                  x[::-1])


# -- canonical keys ----------------------------------------------------------------------------

def _key(op: str, shapes: list, dtypes: list, **params: Any) -> str:
    return REGISTRY.operator(op).problem(shapes, dtypes, **params).key


def test_equal_calls_share_one_key() -> None:
    f32 = ["float32"]
    assert _key("transpose", [(2, 3, 4)], f32) == \
        _key("transpose", [(2, 3, 4)], f32, perm=[-1, 1, 0]) == "float32[2x3x4];perm=(2,1,0)"
    assert _key("concat", [(2, 3), (2, 1)], f32 * 2, axis=-1) == \
        "float32[2x3],float32[2x1];axis=1"
    same_slice = [
        {"starts": [1], "ends": [INT64_MAX]},
        {"starts": [1, 0], "ends": [9, 100], "axes": [0, 1]},
        {"starts": [-3], "ends": [4], "axes": [-2], "steps": [1]},
        {"slices": ((1, 4, 1), (0, 5, 1))},
    ]
    keys = {_key("slice", [(4, 5)], f32, **spelling) for spelling in same_slice}
    assert keys == {"float32[4x5];slices=((1,4,1),(0,5,1))"}
    # the same elements picked with different bounds and steps
    assert _key("slice", [(10,)], f32, starts=[0], ends=[10], steps=[3]) == \
        _key("slice", [(10,)], f32, starts=[0], ends=[100], steps=[3]) == \
        _key("slice", [(10,)], f32, starts=[-20], ends=[INT64_MAX], steps=[3]) == \
        "float32[10];slices=((0,10,3))"
    assert _key("slice", [(10,)], f32, starts=[9], ends=[INT64_MIN], steps=[-4]) == \
        _key("slice", [(10,)], f32, starts=[INT64_MAX], ends=[0], steps=[-4]) == \
        "float32[10];slices=((9,0,-4))"
    assert _key("slice", [(10,)], f32, starts=[4], ends=[5], steps=[3]) == \
        _key("slice", [(10,)], f32, starts=[4], ends=[2], steps=[-2]) == \
        "float32[10];slices=((4,5,1))"
    assert _key("slice", [(10,)], f32, starts=[7], ends=[2]) == \
        _key("slice", [(10,)], f32, starts=[0], ends=[0]) == "float32[10];slices=((0,0,1))"
    assert _key("pad", [(2, 3)], f32, pads=[0, 1, 0, 2]) == \
        _key("pad", [(2, 3)], f32, pads=[1, 2], axes=[-1], mode="CONSTANT", value=0) == \
        _key("pad", [(2, 3)], f32, pads=np.array([0, 1, 0, 2]), mode=b"constant") == \
        "float32[2x3];mode=constant,pads=(0,1,0,2),value=0.0"
    assert _key("pad", [(2, 3)], ["int8"], pads=[0, 1, 0, 2], value=np.float32(5)) == \
        "int8[2x3];mode=constant,pads=(0,1,0,2),value=5"
    assert _key("pad", [(2, 3)], f32, pads=[0, 1, 0, 2], mode="edge", value=3.0) == \
        "float32[2x3];mode=edge,pads=(0,1,0,2)"
    assert _key("pad", [(2, 3)], f32, pads=[0, -1, 0, 0], mode="reflect") == \
        _key("pad", [(2, 3)], f32, pads=[-1, 0], axes=[1], value=9) == \
        "float32[2x3];mode=constant,pads=(0,-1,0,0)"
    assert _key("gather", [(5, 4), (3,)], ["float32", "int64"]) == \
        _key("gather", [(5, 4), (3,)], ["float32", "int64"], axis=-2) == \
        "float32[5x4],int64[3];axis=0"


def test_canonical_problems_validate() -> None:
    for op, shapes, dtypes, params in [
        ("slice", [(6, 3)], ["int8"], {"starts": [INT64_MAX], "ends": [INT64_MIN],
                                        "steps": [-2]}),
        ("pad", [(3, 3)], ["bool"], {"pads": [1, -1, 0, 2], "value": True}),
        ("transpose", [()], ["float16"], {}),
    ]:
        operator = REGISTRY.operator(op)
        operator.validate(operator.problem(shapes, dtypes, **params))


@pytest.mark.parametrize(("op", "shapes", "dtypes", "params", "message"), [
    ("transpose", [(2, 3)], ["float32"], {"perm": [0, 0]},
     "transpose perm must be a permutation of the 2 axes 0..1, got [0, 0]"),
    ("transpose", [(2,)], ["complex64"], {}, "transpose supports dtypes bool, int8"),
    ("concat", [(2, 3), (2, 4)], ["float32"] * 2, {}, "concat needs the parameter axis"),
    ("concat", [(2, 3), (3, 4)], ["float32"] * 2, {"axis": 1},
     "input 1 (shape (3, 4)) differs from input 0 (shape (2, 3)) in dimension 0"),
    ("concat", [(2, 3), (2, 3)], ["float32", "int32"], {"axis": 0},
     "concat inputs must all have one dtype, got float32, int32"),
    ("concat", [(2, 3), (2,)], ["float32"] * 2, {"axis": 0}, "must have one rank"),
    ("concat", [(2, 3)], ["float32"], {"axis": 2}, "concat axis 2 is out of range for rank 2"),
    ("concat", [()], ["float32"], {"axis": 0}, "concat inputs must have rank >= 1"),
    ("slice", [(4,)], ["float32"], {"starts": [0]}, "slice needs the parameters starts and ends"),
    ("slice", [(4,)], ["float32"], {"starts": [0], "ends": [1], "steps": [0]},
     "slice steps must not be 0"),
    ("slice", [(4, 4)], ["float32"], {"starts": [0, 0], "ends": [1, 1], "axes": [1, -1]},
     "slice axes must not repeat an axis, got [1, -1]"),
    ("slice", [(4,)], ["float32"], {"starts": [0], "ends": [1, 2]},
     "slice starts, ends, axes and steps must have one length, got 1, 2, 1, 1"),
    ("slice", [(4,)], ["float32"], {"starts": [0], "ends": [1], "axes": [1]},
     "slice axes value 1 is out of range for rank 1"),
    ("slice", [(4,)], ["float32"], {"slices": ((0, 9, 1),)}, "slice slice (0, 9, 1) is not "
                                                            "canonical for an axis of size 4"),
    ("slice", [(4,)], ["float32"], {"starts": [0.5], "ends": [1]},
     "slice starts must be a list of integers"),
    ("pad", [(2, 3)], ["float32"], {}, "pad needs the parameter pads"),
    ("pad", [(2, 3)], ["float32"], {"pads": [1, 1]}, "pad pads needs 4 values"),
    ("pad", [(2, 3)], ["float32"], {"pads": [0, 0, 0, 0], "mode": "symmetric"},
     "pad mode must be one of constant, reflect, edge, wrap, got 'symmetric'"),
    ("pad", [(2, 3)], ["float32"], {"pads": [-2, 0, -1, 0]},
     "pad pads (-2, -1) remove more than the 2 elements of axis 0"),
    ("pad", [(0, 3)], ["float32"], {"pads": [1, 0, 0, 0], "mode": "edge"},
     "pad mode edge cannot extend axis 0"),
    ("pad", [(2, 3)], ["int8"], {"pads": [1, 0, 0, 0], "value": 0.5},
     "pad value must be a int8 value, got 0.5"),
    ("pad", [(2, 3)], ["float32"], {"pads": [1, 0], "axes": [2]},
     "pad axes value 2 is out of range for rank 2"),
    ("gather", [(5,), (2,)], ["float32", "float32"], {},
     "gather indices must be int32 or int64, got float32"),
    ("gather", [(), (2,)], ["float32", "int64"], {}, "gather data must have rank >= 1"),
    ("gather", [(0, 3), (2,)], ["float32", "int64"], {}, "axis 0 of data (shape (0, 3)) is "
                                                          "empty"),
    ("gather", [(5,)], ["float32"], {}, "gather takes exactly 2 inputs (data, indices), got 1"),
    ("gather", [(5, 2), (2,)], ["float32", "int32"], {"axis": 2},
     "gather axis 2 is out of range for rank 2"),
])
def test_invalid_problems_are_named(op, shapes, dtypes, params, message) -> None:
    with pytest.raises(ValueError) as info:
        REGISTRY.operator(op).problem(shapes, dtypes, **params)
    assert message in str(info.value)


def test_gather_index_out_of_range_is_a_clear_error() -> None:
    data = np.arange(10.0).reshape(5, 2)
    operator = REGISTRY.operator("gather")
    for bad in (5, -6):
        indices = np.array([0, bad], dtype=np.int64)
        problem = operator.problem_for([data, indices])
        message = f"gather index {bad} is out of range for axis 0 of size 5"
        with pytest.raises(IndexError, match=message):
            operator.reference(problem, [data, indices])
        for algorithm in REGISTRY.algorithms("gather"):
            with pytest.raises(IndexError, match=message):
                algorithm.run(problem, [data, indices], None)


def test_gather_scalar_index_drops_the_axis() -> None:
    data = np.arange(12, dtype=np.int16).reshape(3, 4)
    for algorithm in REGISTRY.algorithms("gather"):
        problem = REGISTRY.operator("gather").problem_for([data, np.array(-1)], axis=1)
        out = algorithm.run(problem, [data, np.array(-1)], None)
        np.testing.assert_array_equal(out, data[:, -1])
        assert out.shape == (3,) and out.dtype == np.int16


def test_pad_crops_before_it_reflects() -> None:
    x = np.arange(5, dtype=np.int32)
    problem = REGISTRY.operator("pad").problem_for([x], pads=[-1, 2], mode="reflect")
    expected = [1, 2, 3, 4, 3, 2]
    np.testing.assert_array_equal(REGISTRY.operator("pad").reference(problem, [x]), expected)
    for algorithm in REGISTRY.algorithms("pad"):
        np.testing.assert_array_equal(algorithm.run(problem, [x], None), expected)


# -- registration and the framework ------------------------------------------------------------

def test_registered_operators_and_algorithms() -> None:
    others = ["where", "expand", "gather_elements", "scatter_nd"]
    assert REGISTRY.operators() == sorted([*OP_NAMES, *others])
    for op in [*OP_NAMES, *others]:
        expected = ["numpy", "parallel"] if op in ("concat", "transpose") else ["numpy"]
        assert [a.desc.text for a in REGISTRY.algorithms(op)] == expected
        for algorithm in REGISTRY.algorithms(op):
            assert algorithm.attributes == AlgoAttribute.REPRODUCIBLE


def test_random_inputs_are_valid_for_profiling() -> None:
    operator = REGISTRY.operator("gather")
    problem = operator.problem([(4, 6), (20,)], ["uint8", "int32"], axis=1)
    data, indices = operator.random_inputs(problem, np.random.default_rng(0))
    assert data.dtype == np.uint8 and len(np.unique(data)) > 5
    assert indices.min() >= -6 and indices.max() < 6 and indices.min() < 0
    operator.reference(problem, [data, indices])


@pytest.mark.parametrize("strategy", ["heuristic", "fast-run"])
def test_fastrun_call_through_a_session(strategy: str) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    session = fastrun.session(strategy=strategy, cache=fastrun.InMemoryCache(),
                              registry=REGISTRY, progress=False, budget_s=0.01)
    with session:
        for _ in range(2):  # the second call takes the dispatch fast path
            np.testing.assert_array_equal(fastrun.call("transpose", x, perm=(0, 2, 1)),
                                          x.transpose(0, 2, 1))
            np.testing.assert_array_equal(fastrun.call("concat", x, x, axis=1),
                                          np.concatenate([x, x], axis=1))
            np.testing.assert_array_equal(
                fastrun.call("slice", x, starts=(1,), ends=(INT64_MAX,), axes=(-1,)),
                x[..., 1:])
            np.testing.assert_array_equal(
                fastrun.call("slice", x, starts=(-1,), ends=(INT64_MIN,), steps=(-2,)),
                x[::-2])
            np.testing.assert_array_equal(fastrun.call("pad", x, pads=(0, 0, 1, 0, 0, 1)),
                                          np.pad(x, ((0, 0), (0, 0), (1, 1))))
            np.testing.assert_array_equal(
                fastrun.call("gather", x, np.array([2, 0]), axis=-1), x[..., [2, 0]])


def test_concat_goes_parallel_on_large_outputs_and_several_threads(monkeypatch):
    concat = REGISTRY.operator("concat")
    fire = concat.problem([(8, 64, 55, 55), (8, 64, 55, 55)], ["float32"] * 2, axis=1)
    small = concat.problem([(1, 16, 13, 13), (1, 16, 13, 13)], ["float32"] * 2, axis=1)
    candidates = REGISTRY.algorithms("concat")

    def first(problem, threads):
        pretend_threads(monkeypatch, threads)
        return concat.heuristic_order(problem, candidates)[0].name

    assert first(fire, 16) == "parallel"
    assert first(fire, 1) == "numpy"
    assert first(small, 16) == "numpy"


def test_transposes_reduce_to_the_axes_they_move():
    from fastrun_algorithms.tensor.parallel import reduced_permutation

    # a transformer's heads split out, and its keys turned for the scores
    assert reduced_permutation((1, 128, 12, 64), (0, 2, 1, 3)) == ((128, 12, 64), (1, 0, 2))
    assert reduced_permutation((1, 128, 12, 64), (0, 2, 3, 1)) == ((128, 768), (1, 0))
    assert reduced_permutation((2, 3, 4), (0, 1, 2)) == ((24,), (0,))
    assert reduced_permutation((1, 1), (1, 0)) == ((), ())


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64", "uint8", "bool"])
def test_parallel_transpose_matches_numpy_for_every_width(dtype):
    transpose = REGISTRY.operator("transpose")
    parallel = next(a for a in REGISTRY.algorithms("transpose") if a.name == "parallel")
    rng = np.random.default_rng(0)
    for shape, perm in [((1, 12, 9, 8), (0, 2, 1, 3)), ((1, 12, 9, 8), (0, 2, 3, 1)),
                        ((3, 4, 5, 6), (3, 1, 0, 2)), ((7, 5), (1, 0)), ((1, 1, 3), (2, 0, 1)),
                        ((1, 1), (1, 0)), ((0, 4), (1, 0)), ((2, 1, 3, 1, 4), (4, 3, 0, 2, 1))]:
        problem = transpose.problem([shape], [dtype], perm=perm)
        assert parallel.unusable_reason(problem) is None, (shape, perm)
        x = transpose.random_inputs(problem, rng)
        out = parallel.run(problem, x, None)
        expected = transpose.reference(problem, x)
        assert out.dtype == expected.dtype and out.flags.c_contiguous
        np.testing.assert_array_equal(out, expected)


def test_parallel_transpose_leaves_permutations_of_five_moving_axes_to_numpy(monkeypatch):
    transpose = REGISTRY.operator("transpose")
    parallel = next(a for a in REGISTRY.algorithms("transpose") if a.name == "parallel")
    problem = transpose.problem([(2, 3, 4, 5, 6)], ["float32"], perm=(4, 2, 0, 3, 1))
    assert "moves 5 axes" in parallel.unusable_reason(problem)
    large = transpose.problem([(8, 128, 12, 64)], ["float32"], perm=(0, 2, 1, 3))
    pretend_threads(monkeypatch, 16)
    assert transpose.heuristic_order(large, REGISTRY.algorithms("transpose"))[0].name == \
        "parallel"


def test_parallel_concat_copies_large_rows_in_chunks_on_every_axis():
    """Rows wider than one chunk, several chunks per row, and every axis of a 4-D concat."""
    concat = REGISTRY.operator("concat")
    parallel = next(a for a in REGISTRY.algorithms("concat") if a.name == "parallel")
    rng = np.random.default_rng(0)
    for axis in range(4):
        shapes = [(2, 3, 40, 300), (2, 3, 40, 300)]
        shapes[1] = tuple(d * 2 if i == axis else d for i, d in enumerate(shapes[1]))
        problem = concat.problem(shapes, ["float32"] * 2, axis=axis)
        inputs = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
        np.testing.assert_array_equal(parallel.run(problem, inputs, None),
                                      np.concatenate(inputs, axis=axis))


# -- where ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 3)), ((1, 3), (2, 1), ()),
                                    ((4, 1, 5), (3, 1), (1, 5)), ((0, 3), (3,), (1,))])
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "uint8"])
def test_where_broadcasts_and_is_exact(shapes, dtype) -> None:
    operator = REGISTRY.operator("where")
    rng = np.random.default_rng(3)
    condition = rng.random(shapes[0]) < 0.5
    x, y = (np.asarray(rng.integers(0, 50, size=s)).astype(dtype) for s in shapes[1:])
    problem = operator.problem_for([condition, x, y])
    (algorithm,) = REGISTRY.algorithms("where")
    out = algorithm.run(problem, [condition, x, y], None)
    assert out.flags.c_contiguous and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, np.where(condition, x, y))
    assert operator.error(problem, out, operator.reference(problem, [condition, x, y])) == 0


@pytest.mark.parametrize("shapes, dtypes, message", [
    ([(2,), (2,), (2,)], ["int32", "float32", "float32"], "condition must be bool"),
    ([(2,), (2,), (2,)], ["bool", "float32", "float64"], "one supported dtype"),
    ([(2,), (3,), (2,)], ["bool", "float32", "float32"], "do not broadcast"),
    ([(2,), (2,)], ["bool", "float32"], "exactly 3 inputs"),
])
def test_where_refuses_bad_problems(shapes, dtypes, message) -> None:
    with pytest.raises(ValueError, match=message):
        REGISTRY.operator("where").problem(shapes, dtypes)


# -- expand --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, wanted, out", [
    ((3, 1), (2, 1, 6), (2, 3, 6)), ((1,), (4, 5), (4, 5)), ((2, 3), (1, 1), (2, 3)),
    ((), (0, 2), (0, 2)),
])
def test_expand_broadcasts_both_ways_and_copies(shape, wanted, out) -> None:
    operator = REGISTRY.operator("expand")
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    problem = operator.problem_for([x], shape=wanted)
    assert operator.output_shape(problem) == out
    assert problem.key == operator.problem_for([x], shape=out).key  # one key per result
    (algorithm,) = REGISTRY.algorithms("expand")
    result = algorithm.run(problem, [x], None)
    assert result.flags.c_contiguous and not np.shares_memory(result, x)
    np.testing.assert_array_equal(result, np.broadcast_to(x, out))


def test_expand_refuses_shapes_that_do_not_broadcast() -> None:
    with pytest.raises(ValueError, match="does not broadcast"):
        REGISTRY.operator("expand").problem([(3, 2)], ["float32"], shape=(4, 5))
    with pytest.raises(ValueError, match="negative size"):
        REGISTRY.operator("expand").problem([(3,)], ["float32"], shape=(-1,))



def test_gather_elements_matches_its_reference_on_every_axis():
    """Negative indices count from the end; indices may be shorter than data on any axis."""
    operator = REGISTRY.operator("gather_elements")
    (algorithm,) = REGISTRY.algorithms("gather_elements")
    rng = np.random.default_rng(9)
    for axis in range(3):
        for dtype in ("float32", "int64", "bool"):
            shapes = [(3, 4, 5), (2, 3, 4)]
            problem = operator.problem(shapes, [dtype, "int32"], axis=axis)
            inputs = operator.random_inputs(problem, rng)
            out = algorithm.run(problem, inputs, None)
            np.testing.assert_array_equal(out, operator.reference(problem, inputs))
            assert out.shape == (2, 3, 4) and out.dtype == np.dtype(dtype)


def test_gather_elements_names_what_is_wrong():
    operator = REGISTRY.operator("gather_elements")
    (algorithm,) = REGISTRY.algorithms("gather_elements")
    with pytest.raises(ValueError, match="indices of the same rank"):
        operator.problem([(3, 4), (3,)], ["float32", "int64"])
    with pytest.raises(ValueError, match="exceed data"):
        operator.problem([(3, 4), (2, 5)], ["float32", "int64"], axis=0)
    data, indices = np.zeros((2, 3), np.float32), np.array([[0, 5, 1]], np.int64)
    problem = operator.problem_for([data, indices], axis=1)
    with pytest.raises(IndexError, match="index 5 is out of range for axis 1 of size 3"):
        algorithm.run(problem, [data, indices], None)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_its_reference(reduction):
    """Rows addressing whole slices, single elements and everything between, negative ones
    included (random_inputs draws them); repeated rows where they must repeat."""
    operator = REGISTRY.operator("scatter_nd")
    (algorithm,) = REGISTRY.algorithms("scatter_nd")
    rng = np.random.default_rng(10)
    for data, indices in [((4, 3, 2), (2, 1)), ((4, 3, 2), (5, 3)), ((4, 3), (3, 2)),
                          ((5,), (7, 1)), ((2, 3), (0, 1))]:
        updates = indices[:-1] + data[indices[-1]:]
        for dtype in ("float32", "int64"):
            problem = operator.problem([data, indices, updates], [dtype, "int64", dtype],
                                       reduction=reduction)
            inputs = operator.random_inputs(problem, rng)
            out = algorithm.run(problem, inputs, None)
            np.testing.assert_array_equal(out, operator.reference(problem, inputs))
            assert out.dtype == np.dtype(dtype) and out.shape == data


def test_scatter_nd_names_what_is_wrong():
    operator = REGISTRY.operator("scatter_nd")
    (algorithm,) = REGISTRY.algorithms("scatter_nd")
    with pytest.raises(ValueError, match=r"updates must have shape \(2, 3\)"):
        operator.problem([(4, 3), (2, 1), (2, 4)], ["float32", "int64", "float32"])
    with pytest.raises(ValueError, match=r"last axis is 1\.\.2 long"):
        operator.problem([(4, 3), (2, 3), (2,)], ["float32", "int64", "float32"])
    with pytest.raises(ValueError, match="reduction must be one of"):
        operator.problem([(4, 3), (2, 1), (2, 3)], ["float32", "int64", "float32"],
                         reduction="mean")
    data, indices = np.zeros((4, 3), np.float32), np.array([[1], [4]], np.int64)
    problem = operator.problem_for([data, indices, np.ones((2, 3), np.float32)])
    with pytest.raises(IndexError, match=r"index \[4\] is out of range for axis 0 of size 4"):
        algorithm.run(problem, [data, indices, np.ones((2, 3), np.float32)], None)
