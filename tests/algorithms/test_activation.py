"""The activation operators (relu, leaky_relu, clip, sigmoid, tanh, hard_sigmoid, hard_swish,
the math functions, gelu, softmax, batch_norm, layer_norm):
every registered algorithm against its operator's reference on random shapes, values and
parameters, against the ONNX specification's own examples, and the operators' contract with the
ONNX runtime: canonical keys, clear errors, the heuristic order.

Compilation: each parallel kernel is compiled per dtype on first use (numba caches it on
disk), so the parallel algorithms are checked on float32, float64 and, for clip, int32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numba
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrun
from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun.registry import Registry
from fastrun_algorithms import activation
from fastrun_algorithms.activation import COMPUTE_BOUND_MIN_THREADS, PARALLEL_MIN_BYTES
from tests.algorithms._helpers import (
    TRACEMALLOC_SLACK,
    assert_matches_reference,
    cpu_registry,
    numba_threads,
    traced_peak,
)
from tests.onnx_cases import node_attributes, node_cases

REGISTRY = cpu_registry(activation)
MATH_OPS = ["sqrt", "exp", "log", "neg", "abs", "reciprocal", "erf"]
OP_NAMES = ["relu", "leaky_relu", "clip", "sigmoid", "tanh", "hard_sigmoid", "hard_swish",
            *MATH_OPS, "gelu", "softmax", "batch_norm", "layer_norm"]
CASES = [(name, algorithm) for name in OP_NAMES for algorithm in REGISTRY.algorithms(name)]
CASE_IDS = [f"{name}-{algorithm.desc.name}" for name, algorithm in CASES]
PARALLEL_OPS = ("relu", "leaky_relu", "clip", "sigmoid", "hard_sigmoid", "hard_swish", *MATH_OPS)
#: operators whose parallel loop calls a libm function, which may differ from numpy's SIMD one
#: in the last bit
LIBM_OPS = ("sigmoid", "exp", "log")


# -- the ONNX specification's examples (shared with test_tensor) ---------------------------------

def onnx_cases(op_type: str) -> list[tuple[str, onnx.NodeProto, list, list]]:
    """(name, node, inputs, outputs) of every example of ``op_type`` in ONNX's node tests
    (function-expanded variants left out, see ``tests.onnx_cases``)."""
    return [(case.name, case.model.graph.node[0], list(inputs), list(outputs))
            for case in node_cases(op_type) for inputs, outputs in case.data_sets]


def split_inputs(node: onnx.NodeProto, inputs: list, constant: dict[int, str]
                 ) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The node's tensor inputs, and its constant inputs (by position, per ``constant``) as
    parameters.  An omitted optional input ('' in the node) has no data and is left out."""
    present = [i for i, input_name in enumerate(node.input) if input_name]
    tensors, params = [], {}
    for position, value in zip(present, inputs, strict=True):
        if position in constant:
            params[constant[position]] = value
        else:
            tensors.append(value)
    return tensors, params


def _activation_mapping(op_type: str, node: onnx.NodeProto, inputs: list, outputs: list
                        ) -> tuple[str, list, dict[str, Any]] | str:
    """(operator, inputs, params), or the reason the contract cannot express the case."""
    attrs = node_attributes(node)
    if op_type == "BatchNormalization":
        if attrs.get("training_mode") or len(outputs) != 1:
            return ("training-mode BatchNormalization (batch statistics, 3 outputs) is not "
                    "an inference operation; batch_norm computes inference only")
        attrs.pop("momentum", None)
    if op_type == "Clip":
        tensors, params = split_inputs(node, inputs, {1: "min", 2: "max"})
        return "clip", tensors, {**attrs, **params}
    operator = {"Relu": "relu", "LeakyRelu": "leaky_relu", "Sigmoid": "sigmoid",
                "Tanh": "tanh", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish",
                "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "neg", "Abs": "abs",
                "Reciprocal": "reciprocal", "Erf": "erf", "Gelu": "gelu",
                "Softmax": "softmax", "BatchNormalization": "batch_norm"}
    if op_type in ("Neg", "Abs") and np.asarray(inputs[0]).dtype.kind != "f":
        return f"{op_type} of integers: the activation operators compute floats"
    return operator[op_type], inputs, attrs


def _params_of_cases(op_types: list[str], mapping: Callable) -> Iterator:
    for op_type in op_types:
        for name, node, inputs, outputs in onnx_cases(op_type):
            yield pytest.param(op_type, node, inputs, outputs, mapping, id=name)


ONNX_OP_TYPES = ["Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
                 "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Erf", "Gelu", "Softmax",
                 "BatchNormalization"]
ONNX_CASES = list(_params_of_cases(ONNX_OP_TYPES, _activation_mapping))


def run_onnx_case(registry: Registry, node: onnx.NodeProto, inputs: list, outputs: list,
                  mapping: Callable) -> None:
    """The reference and every usable algorithm reproduce the specification's output."""
    mapped = mapping(node.op_type, node, inputs, outputs)
    if isinstance(mapped, str):
        pytest.skip(mapped)
    name, tensors, params = mapped
    operator = registry.operator(name)
    problem = operator.problem_for(tensors, **params)
    expected = outputs[0]
    assert operator.output_shape(problem) == expected.shape
    assert operator.output_dtype(problem) == expected.dtype
    results = {"reference": operator.reference(problem, tensors)}
    for algorithm in registry.algorithms(name):
        if algorithm.usable(problem):
            results[algorithm.desc.text] = algorithm.run(problem, tensors, None)
    assert len(results) >= 2
    for label, out in results.items():
        assert out.shape == expected.shape and out.dtype == expected.dtype, label
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6, err_msg=label)
        else:
            np.testing.assert_array_equal(out, expected, err_msg=label)


def test_the_specification_has_examples() -> None:
    by_type = {op: sum(1 for case in ONNX_CASES if case.values[0] == op)
               for op in ONNX_OP_TYPES}
    assert all(count >= 1 for count in by_type.values()), by_type
    assert len(ONNX_CASES) >= 30


@pytest.mark.parametrize(("op_type", "node", "inputs", "outputs", "mapping"), ONNX_CASES)
def test_onnx_examples(op_type, node, inputs, outputs, mapping) -> None:
    run_onnx_case(REGISTRY, node, inputs, outputs, mapping)


# -- random problems ---------------------------------------------------------------------------

FLOAT_SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 100.0, -100.0, 1e-30, np.inf,
                  -np.inf, np.nan]


def random_tensor(shape: tuple, dtype: str, rng: np.random.Generator,
                  specials: bool) -> np.ndarray:
    """Normal values, with NaN, infinities, signed zeros and large values mixed in when
    ``specials`` (the elementwise activations must treat them as numpy does)."""
    if np.dtype(dtype).kind != "f":
        info = np.iinfo(dtype)
        pool = np.array([0, 1, -1, 5, -7, 100, -100, info.max, info.min], dtype=np.int64)
        return pool[rng.integers(0, len(pool), size=shape)].astype(dtype)
    x = rng.standard_normal(shape) * 3
    if specials:
        mask = rng.random(shape) < 0.2
        x = np.where(mask, np.array(FLOAT_SPECIALS)[rng.integers(0, len(FLOAT_SPECIALS),
                                                                  size=shape)], x)
    return np.asarray(x, dtype=dtype)


shapes_st = st.lists(st.sampled_from([0, 1, 2, 3, 5, 7]), min_size=0, max_size=4).map(tuple)


def draw_problem(op: str, algorithm: Algorithm, data: st.DataObject
                 ) -> tuple[Problem, list[np.ndarray]]:
    operator = REGISTRY.operator(op)
    dtypes = ["float32", "float64"]
    if op == "clip":
        dtypes += ["int32"] if algorithm.desc.name == "parallel" else ["int8", "int32", "int64"]
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    shape = data.draw(shapes_st, label="shape")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    params: dict[str, Any] = {}
    if op == "leaky_relu":
        params["alpha"] = data.draw(st.sampled_from([None, 0.01, 0.2, 1.0, 1.5, -0.5, 0.0]))
    elif op == "hard_sigmoid":
        params["alpha"] = data.draw(st.sampled_from([None, 0.2, 1 / 6, -0.5, 0.0]))
        params["beta"] = data.draw(st.sampled_from([None, 0.5, 0.0, 1.25]))
    elif op == "clip":
        bound = st.one_of(st.none(), st.integers(-5, 5).map(float))
        params["min"], params["max"] = data.draw(bound), data.draw(bound)
    elif op == "gelu":
        params["approximate"] = data.draw(st.sampled_from([None, "none", "tanh", b"tanh"]))
    elif op == "softmax":
        shape = shape or (3,)
        last = algorithm.desc.name != "numpy"  # the numba passes take the last axis only
        params["axis"] = (len(shape) - 1 if last and data.draw(st.booleans())
                          else data.draw(st.integers(-len(shape), len(shape) - 1)))
    if op == "layer_norm":
        shape = shape or (3,)
        axis = data.draw(st.integers(-len(shape), len(shape) - 1))
        normalized = shape[axis % len(shape):]
        params["axis"] = axis
        params["epsilon"] = data.draw(st.sampled_from([None, 1e-5, 1e-3]))
        inputs = [random_tensor(shape, dtype, rng, False) + 2,
                  random_tensor(normalized, dtype, rng, False),
                  random_tensor(normalized, dtype, rng, False)]
    elif op == "batch_norm":
        shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)),
                 *data.draw(st.lists(st.integers(1, 5), max_size=2)))
        params["epsilon"] = data.draw(st.sampled_from([None, 1e-5, 1e-3]))
        params["activation"] = data.draw(st.sampled_from([None, "none", "relu"]))
        c = shape[1]
        inputs = [random_tensor(shape, dtype, rng, False),
                  *(random_tensor((c,), dtype, rng, False) for _ in range(3)),
                  np.abs(random_tensor((c,), dtype, rng, False))]
    else:
        inputs = [random_tensor(shape, dtype, rng, specials=op != "softmax")]
    params = {k: v for k, v in params.items() if v is not None}
    return operator.problem_for(inputs, **params), inputs


@pytest.mark.parametrize(("op", "algorithm"), CASES, ids=CASE_IDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_reference(op: str, algorithm: Algorithm, data: st.DataObject) -> None:
    problem, inputs = draw_problem(op, algorithm, data)
    operator = REGISTRY.operator(op)
    operator.validate(problem)  # canonical problems pass validate (dispatch calls it)
    if not algorithm.usable(problem):
        assert algorithm.unusable_reason(problem), "an unusable algorithm says why"
        return
    output = algorithm.run(problem, inputs, None)
    assert_matches_reference(operator, algorithm, problem, inputs, output)
    if op in EXACT_OPS:  # exact operations: equal to the reference
        np.testing.assert_array_equal(output, operator.reference(problem, inputs))


EXACT_OPS = ("relu", "leaky_relu", "clip")
ELEMENTWISE_CASES = [(op, a) for op, a in CASES
                     if op not in ("softmax", "batch_norm", "layer_norm")]


@pytest.mark.parametrize(("op", "algorithm"), ELEMENTWISE_CASES,
                         ids=[f"{op}-{a.desc.name}" for op, a in ELEMENTWISE_CASES])
def test_large_strided_and_read_only_inputs(op: str, algorithm: Algorithm) -> None:
    """More elements than a thread's share, a transposed input, a read-only one."""
    rng = np.random.default_rng(4)
    params = {"leaky_relu": {"alpha": 0.1}, "clip": {"min": -1.0, "max": 2.0}}.get(op, {})
    big = random_tensor((3, 70, 333), "float32", rng, specials=True)
    read_only = big.copy()
    read_only.flags.writeable = False
    operator = REGISTRY.operator(op)
    for x in (big, big.transpose(2, 0, 1), read_only, big[:, ::3]):
        problem = operator.problem_for([x], **params)
        output = algorithm.run(problem, [x], None)
        assert output.flags.c_contiguous and not np.shares_memory(output, x)
        assert_matches_reference(operator, algorithm, problem, [x], output)
        if op in EXACT_OPS:
            np.testing.assert_array_equal(output, operator.reference(problem, [x]))


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_is_reproducible_at_any_thread_count(threads: int) -> None:
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("numba has fewer threads")
    x = random_tensor((4, 8, 50, 50), "float32", np.random.default_rng(2), specials=True)
    for op in PARALLEL_OPS:
        by_name = {a.desc.name: a for a in REGISTRY.algorithms(op)}
        problem = REGISTRY.operator(op).problem_for([x])
        with numba_threads(threads):
            parallel = by_name["parallel"].run(problem, [x], None)
        assert parallel.tobytes() == by_name["parallel"].run(problem, [x], None).tobytes()
        # equal to numpy's, NaN for NaN (the sign of a zero clip returns is numpy's choice;
        # libm's exp and log may differ in the last bit); numpy has no erf
        if "numpy" not in by_name:
            continue
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            numpy_out = by_name["numpy"].run(problem, [x], None)
        if op in LIBM_OPS:
            np.testing.assert_allclose(parallel, numpy_out, rtol=4e-7, atol=1e-37)
        else:
            np.testing.assert_array_equal(parallel, numpy_out)


@pytest.mark.parametrize(("op", "algorithm"), CASES, ids=CASE_IDS)
def test_declared_workspace_covers_what_runs_allocate(op: str, algorithm: Algorithm) -> None:
    operator = REGISTRY.operator(op)
    shapes = [(4, 16, 24, 24)] + ([(16,)] * 4 if op == "batch_norm" else [])
    dtypes = ["float32"] + (["float32", "float64", "float32", "float64"]
                            if op == "batch_norm" else [])
    if op == "layer_norm":
        shapes, dtypes = [(4, 16, 24, 24), (24,), (24,)], ["float32"] * 3
    params = {"leaky_relu": {"alpha": 1.5}, "clip": {"min": -0.5}, "softmax": {"axis": 1}}
    problem = operator.problem(shapes, dtypes, **params.get(op, {}))
    inputs = operator.random_inputs(problem, np.random.default_rng(0))
    algorithm.run(problem, inputs, None)  # compile first: numba allocates while compiling
    out_bytes = operator.output_bytes(problem)
    with traced_peak() as peak:
        algorithm.run(problem, inputs, None)
    assert peak[0] <= out_bytes + algorithm.workspace_bytes(problem) + TRACEMALLOC_SLACK


# -- semantics ---------------------------------------------------------------------------------

def _run_all(op: str, inputs: list, **params: Any) -> list[np.ndarray]:
    operator = REGISTRY.operator(op)
    problem = operator.problem_for(inputs, **params)
    results = [operator.reference(problem, inputs)]
    results += [a.run(problem, inputs, None) for a in REGISTRY.algorithms(op)
                if a.usable(problem)]
    return results


def test_elementwise_values() -> None:
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0, np.nan, -np.inf, np.inf], dtype=np.float32)
    expected = {
        "relu": ({}, [0, 0, 0, 0.5, 3, np.nan, 0, np.inf]),
        "leaky_relu": ({"alpha": 0.5}, [-1, -0.25, 0, 0.5, 3, np.nan, -np.inf, np.inf]),
        "clip": ({"min": -1.0, "max": 1.0}, [-1, -0.5, 0, 0.5, 1, np.nan, -1, 1]),
        "sigmoid": ({}, [0.11920292, 0.37754067, 0.5, 0.62245933, 0.95257413, np.nan, 0, 1]),
        "tanh": ({}, [-0.96402758, -0.46211716, 0, 0.46211716, 0.99505475, np.nan, -1, 1]),
        "hard_sigmoid": ({}, [0.1, 0.4, 0.5, 0.6, 1, np.nan, 0, 1]),
        "hard_swish": ({}, [-1 / 3, -0.5 * 5 / 12, 0, 0.5 * 7 / 12, 3, np.nan, np.nan,
                            np.inf]),
    }
    for op, (params, values) in expected.items():
        for out in _run_all(op, [x], **params):
            assert out.dtype == np.float32
            np.testing.assert_allclose(out, np.array(values, np.float32), rtol=1e-6,
                                       err_msg=op)


def test_clip_min_above_max_gives_max_and_absent_bounds_are_unbounded() -> None:
    x = np.array([-5.0, 0.0, 5.0])
    for out in _run_all("clip", [x], min=2.0, max=1.0):
        np.testing.assert_array_equal(out, [1.0, 1.0, 1.0])
    for out in _run_all("clip", [x]):
        np.testing.assert_array_equal(out, x)
    for out in _run_all("clip", [x], max=1.0):
        np.testing.assert_array_equal(out, [-5.0, 0.0, 1.0])


def test_softmax_is_stable_and_sums_to_one() -> None:
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -1000.0]], dtype=np.float32)
    for out in _run_all("softmax", [x]):
        np.testing.assert_allclose(out[0], [0.09003057, 0.24472847, 0.66524096], rtol=1e-6)
        np.testing.assert_allclose(out[1], [1 / 3] * 3, rtol=1e-6)
    for out in _run_all("softmax", [x], axis=0):
        np.testing.assert_allclose(out.sum(axis=0), 1.0, rtol=1e-6)
    empty = np.zeros((0, 4), np.float32)
    for out in _run_all("softmax", [empty], axis=0):
        assert out.shape == (0, 4)


def test_a_scaled_softmax_is_the_softmax_of_the_scaled_input() -> None:
    """``scale`` (attention's 1/sqrt(d), folded in by the runtime): every algorithm computes
    softmax(scale * x); the scale is left out of the key at 1 and must be positive."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 5, 37)) * 4).astype(np.float32)
    scaled = x.astype(np.float64) * 0.125
    e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    expected = e / e.sum(axis=-1, keepdims=True)
    for out in _run_all("softmax", [x], scale=0.125):
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)
    op = REGISTRY.operator("softmax")
    assert op.problem([(2, 4)], ["float32"], scale=1.0).key == op.problem([(2, 4)],
                                                                        ["float32"]).key
    assert "scale=0.5" in op.problem([(2, 4)], ["float32"], scale=0.5).key
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="scale must be a positive number"):
            op.problem([(2, 4)], ["float32"], scale=bad)


def test_batch_norm_formula() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, 3).astype(np.float32)
    expected = (scale[:, None] * (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-3)
                + bias[:, None])
    for out in _run_all("batch_norm", [x, scale, bias, mean, var], epsilon=1e-3):
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # per-channel inputs of the other float dtype are converted to X's
    mixed = [x, scale.astype(np.float64), bias, mean.astype(np.float64), var]
    for out in _run_all("batch_norm", mixed, epsilon=1e-3):
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (1, 3, 40_000), (3, 4)])
def test_batch_norm_parallel_gives_numpy_values(shape, dtype, activation) -> None:
    """The same operations in the same order: the same values, planes longer than one task's
    run (40,000 values), strided inputs and a fused Relu included."""
    operator = REGISTRY.operator("batch_norm")
    c = shape[1]
    problem = operator.problem([shape] + [(c,)] * 4, [np.dtype(dtype).name] * 5,
                               activation=activation)
    inputs = operator.random_inputs(problem, np.random.default_rng(1))
    by_name = {a.desc.name: a for a in REGISTRY.algorithms("batch_norm")
               if a.device_kind == "cpu"}
    expected = by_name["numpy"].run(problem, inputs, None)
    np.testing.assert_array_equal(by_name["parallel"].run(problem, inputs, None), expected)
    strided = np.asfortranarray(inputs[0])
    np.testing.assert_array_equal(
        by_name["parallel"].run(problem, [strided, *inputs[1:]], None), expected)


# -- canonical keys ----------------------------------------------------------------------------

def _key(op: str, shapes: list, dtypes: list, **params: Any) -> str:
    return REGISTRY.operator(op).problem(shapes, dtypes, **params).key


def test_equal_calls_share_one_key() -> None:
    f32 = ["float32"]
    assert _key("relu", [(2, 3)], f32) == "float32[2x3]"
    assert _key("leaky_relu", [(2,)], f32) == _key("leaky_relu", [(2,)], f32, alpha=0.01) == \
        _key("leaky_relu", [(2,)], f32, alpha=np.float32(0.01)) == \
        "float32[2];alpha=0.009999999776482582"
    assert _key("leaky_relu", [(2,)], ["float64"]) == "float64[2];alpha=0.01"
    assert _key("clip", [(2,)], f32) == _key("clip", [(2,)], f32, min=None, max=-np.inf * -1) \
        == _key("clip", [(2,)], f32, min=-np.inf) == "float32[2]"
    assert _key("clip", [(2,)], f32, min=np.array(0, np.float32), max=6) == \
        _key("clip", [(2,)], f32, min=0.0, max=6.0) == "float32[2];max=6.0,min=0.0"
    assert _key("clip", [(2,)], ["int8"], min=-128, max=np.int8(5)) == "int8[2];max=5"
    assert _key("softmax", [(2, 3)], f32) == _key("softmax", [(2, 3)], f32, axis=1) == \
        _key("softmax", [(2, 3)], f32, axis=-1) == "float32[2x3];axis=1"
    bn = [(1, 2, 3), (2,), (2,), (2,), (2,)]
    assert _key("batch_norm", bn, f32 * 5) == \
        _key("batch_norm", bn, f32 * 5, epsilon=np.float32(1e-5), training_mode=0) == \
        _key("batch_norm", bn, f32 * 5, activation="none") == \
        "float32[1x2x3],float32[2],float32[2],float32[2],float32[2];epsilon=9.999999747378752e-06"
    assert _key("batch_norm", bn, f32 * 5, activation="relu").endswith(
        ";activation=relu,epsilon=9.999999747378752e-06")


def test_validate_accepts_canonical_and_refuses_other_problems() -> None:
    operator = REGISTRY.operator("softmax")
    problem = operator.problem([(2, 3)], ["float32"], axis=-1)
    operator.validate(problem)
    with pytest.raises(ValueError, match="not in canonical form"):
        operator.validate(Problem.create("softmax", [(2, 3)], ["float32"], {"axis": -1}))
    with pytest.raises(ValueError, match="cannot validate a 'relu' problem"):
        operator.validate(REGISTRY.operator("relu").problem([(2,)], ["float32"]))


@pytest.mark.parametrize(("op", "shapes", "dtypes", "params", "message"), [
    ("relu", [(2,)], ["float16"], {}, "relu supports dtypes float32, float64, got float16"),
    ("relu", [(2,), (2,)], ["float32"] * 2, {}, "relu takes exactly 1 input(s), got 2"),
    ("relu", [(2,)], ["float32"], {"alpha": 1}, "relu has no parameter(s) alpha; known: none"),
    ("sigmoid", [(2,)], ["int32"], {}, "sigmoid supports dtypes float32, float64, got int32"),
    ("leaky_relu", [(2,)], ["float32"], {"alpha": "big"}, "leaky_relu alpha must be a number"),
    ("leaky_relu", [(2,)], ["float32"], {"alpha": np.inf}, "leaky_relu alpha must be finite"),
    ("clip", [(2,)], ["float32"], {"min": np.nan}, "clip min must not be NaN"),
    ("clip", [(2,)], ["int8"], {"max": 300}, "clip max must be a int8 value, got 300"),
    ("clip", [(2,)], ["int32"], {"min": 0.5}, "clip min must be a int32 value, got 0.5"),
    ("clip", [(2,)], ["float32"], {"low": 0}, "clip has no parameter(s) low; known: min, max"),
    ("softmax", [(2, 3)], ["float32"], {"axis": 2}, "softmax axis 2 is out of range for an "
                                                    "input of rank 2 (allowed -2 to 1)"),
    ("softmax", [(2, 3)], ["float32"], {"axis": 0.5}, "softmax axis must be an integer"),
    ("softmax", [()], ["float32"], {}, "softmax needs an input of rank >= 1"),
    ("batch_norm", [(2, 3)] + [(3,)] * 3, ["float32"] * 4, {},
     "batch_norm takes exactly 5 input(s), got 4"),
    ("batch_norm", [(2, 3), (3,), (3,), (4,), (3,)], ["float32"] * 5, {},
     "batch_norm mean must have shape (3,) for X of shape (2, 3), got (4,)"),
    ("batch_norm", [(3,)] * 5, ["float32"] * 5, {}, "X must be (N, C, ...) of rank >= 2"),
    ("batch_norm", [(2, 3)] + [(3,)] * 4, ["float32"] * 4 + ["int32"], {},
     "batch_norm var must be float32 or float64, got int32"),
    ("batch_norm", [(2, 3)] + [(3,)] * 4, ["float32"] * 5, {"epsilon": -1.0},
     "epsilon must be finite and >= 0, got -1.0"),
    ("batch_norm", [(2, 3)] + [(3,)] * 4, ["float32"] * 5, {"training_mode": 1},
     "inference BatchNormalization only; training_mode=1"),
    ("batch_norm", [(2, 3)] + [(3,)] * 4, ["float32"] * 5, {"activation": "clip"},
     "batch_norm takes activation 'none' or 'relu', got 'clip'"),
])
def test_invalid_problems_are_named(op, shapes, dtypes, params, message) -> None:
    with pytest.raises(ValueError) as info:
        REGISTRY.operator(op).problem(shapes, dtypes, **params)
    assert message in str(info.value)


# -- registration, heuristic, framework --------------------------------------------------------

def test_registered_operators_and_algorithms() -> None:
    assert REGISTRY.operators() == sorted(OP_NAMES)
    for op in OP_NAMES:
        names = [a.desc.text for a in REGISTRY.algorithms(op)]
        expected = ["numpy", "parallel"] if op in (*PARALLEL_OPS, "layer_norm", "batch_norm") \
            else ["numpy"]
        expected = {"erf": ["parallel"],  # numpy has no erf
                    "gelu": ["serial", "parallel"],
                    "softmax": ["numpy", "serial", "parallel"]}.get(op, expected)
        assert names == expected
        for algorithm in REGISTRY.algorithms(op):
            assert algorithm.attributes == AlgoAttribute.REPRODUCIBLE
            assert REGISTRY.operator(op).version == 1


def _order(shape: tuple, dtype: str, op: str = "relu") -> list[str]:
    operator = REGISTRY.operator(op)
    problem = operator.problem([shape], [dtype])
    return [a.desc.name for a in operator.heuristic_order(problem, REGISTRY.algorithms(op))]


def test_heuristic_order_numpy_small_parallel_large() -> None:
    below = PARALLEL_MIN_BYTES // 4 - 1
    assert _order((16,), "float32") == ["numpy", "parallel"]
    assert _order((below,), "float32") == ["numpy", "parallel"]
    if numba.get_num_threads() > 1:
        assert _order((below,), "float64") == ["parallel", "numpy"]  # bytes, not elements
        assert _order((8, 64, 112, 112), "float32") == ["parallel", "numpy"]
    with numba_threads(1):
        assert _order((8, 64, 112, 112), "float32")[0] == "numpy"


def test_heuristic_order_of_compute_bound_sigmoid_needs_many_threads() -> None:
    threads = numba.get_num_threads()
    expected = "parallel" if threads >= COMPUTE_BOUND_MIN_THREADS else "numpy"
    assert _order((8, 64, 112, 112), "float32", "sigmoid")[0] == expected
    assert _order((16,), "float32", "sigmoid") == ["numpy", "parallel"]
    with numba_threads(min(2, threads)):
        assert _order((8, 64, 112, 112), "float32", "sigmoid")[0] == "numpy"


def test_random_inputs_are_valid() -> None:
    operator = REGISTRY.operator("batch_norm")
    problem = operator.problem([(2, 3, 4)] + [(3,)] * 4, ["float64"] * 5)
    inputs = operator.random_inputs(problem, np.random.default_rng(0))
    assert np.all(inputs[4] > 0)
    clip = REGISTRY.operator("clip")
    x, = clip.random_inputs(clip.problem([(50,)], ["int16"], min=-3), np.random.default_rng(0))
    assert x.dtype == np.int16 and len(np.unique(x)) > 10


@pytest.mark.parametrize("strategy", ["heuristic", "fast-run"])
def test_fastrun_call_through_a_session(strategy: str) -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    session = fastrun.session(strategy=strategy, cache=fastrun.InMemoryCache(),
                              registry=REGISTRY, progress=False, budget_s=0.01)
    with session:
        for _ in range(2):  # the second call takes the dispatch fast path
            np.testing.assert_array_equal(fastrun.call("relu", x), np.maximum(x, 0))
            np.testing.assert_array_equal(fastrun.call("clip", x, min=-1.0, max=1.0),
                                          np.clip(x, -1, 1))
            out = fastrun.call("softmax", x, axis=1)
            np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-6)
        decision = session.decide(session.problem("leaky_relu", [(2, 3)], ["float32"]))
    if strategy == "fast-run":
        assert {e.algorithm for e in decision.entries} == {"numpy", "parallel"}
    else:
        assert decision.algorithm.desc.name == "numpy"
