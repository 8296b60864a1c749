"""The conv_transpose operator (ONNX ConvTranspose) and its algorithms: every algorithm against
the reference on random geometries, the reference against a direct definition, canonical keys,
clear errors, and a decoder model against onnxruntime.  ONNX's own node tests run in
``tests/runtime/test_onnx_backend.py``."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import fastrun
from fastrun.attribute import AlgoAttribute
from fastrun.cache import InMemoryCache
from fastrun.runtime import load
from fastrun_algorithms import conv_transpose
from tests.algorithms._helpers import (
    assert_allocates_its_workspace,
    assert_matches_reference,
    cpu_registry,
)

REGISTRY = cpu_registry(conv_transpose)
OPERATOR = REGISTRY.operator("conv_transpose")
ALGORITHMS = REGISTRY.algorithms("conv_transpose")


@st.composite
def problems(draw):
    spatial = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    channels = group * draw(st.integers(1, 3))
    out_per_group = draw(st.integers(1, 3))
    sizes = [draw(st.integers(1, 6)) for _ in range(spatial)]
    kernel = [draw(st.integers(1, 4)) for _ in range(spatial)]
    strides = [draw(st.integers(1, 3)) for _ in range(spatial)]
    dilations = [draw(st.integers(1, 2)) for _ in range(spatial)]
    padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(strides, dilations,
                                                                    strict=True)]
    params = {"strides": strides, "dilations": dilations, "output_padding": padding,
              "group": group}
    form = draw(st.sampled_from(["pads", "same_upper", "same_lower", "output_shape"]))
    full = [s * (n - 1) + p + (k - 1) * d + 1 for n, k, s, d, p in
            zip(sizes, kernel, strides, dilations, padding, strict=True)]
    if form == "pads":
        params["pads"] = [draw(st.integers(0, (f - 1) // 2)) for f in full] * 2
    elif form == "output_shape":
        params["output_shape"] = [max(1, f + draw(st.integers(-2, 1))) for f in full]
    else:
        params["auto_pad"] = form.upper()
    x_shape = (draw(st.integers(1, 2)), channels, *sizes)
    w_shape = (channels, out_per_group, *kernel)
    shapes = [x_shape, w_shape]
    if draw(st.booleans()):
        shapes.append((out_per_group * group,))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    problem = OPERATOR.problem(shapes, [dtype] * len(shapes), **params)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    return problem, inputs


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=[a.desc.name for a in ALGORITHMS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=problems())
def test_matches_the_reference(algorithm, drawn):
    problem, inputs = drawn
    OPERATOR.validate(problem)  # canonical problems pass validate (dispatch calls it)
    assert_matches_reference(OPERATOR, algorithm, problem, inputs,
                             algorithm.run(problem, inputs, None))


def _direct(x, w, bias, strides, pads, dilations, group, out_hw):
    """ConvTranspose by its definition: every input pixel's kernel-weighted values, added
    where they land, for a 2-D problem."""
    n, c, h, wd = x.shape
    per_in, per_out = c // group, w.shape[1]
    out = np.zeros((n, per_out * group, *out_hw))
    for b in range(n):
        for ci in range(c):
            g = ci // per_in
            for i in range(h):
                for j in range(wd):
                    for r in range(w.shape[2]):
                        for s in range(w.shape[3]):
                            oh = i * strides[0] + r * dilations[0] - pads[0]
                            ow = j * strides[1] + s * dilations[1] - pads[1]
                            if 0 <= oh < out_hw[0] and 0 <= ow < out_hw[1]:
                                out[b, g * per_out:(g + 1) * per_out, oh, ow] += \
                                    x[b, ci, i, j] * w[ci, :, r, s]
    return out + (bias.reshape(1, -1, 1, 1) if bias is not None else 0)


def test_the_reference_follows_the_definition():
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((4, 3, 3, 2)), \
        rng.standard_normal(6)
    params = {"strides": (2, 3), "pads": (1, 0, 2, 1), "dilations": (2, 1), "group": 2,
              "output_padding": (1, 2)}
    problem = OPERATOR.problem([x.shape, w.shape, b.shape], ["float64"] * 3, **params)
    out = OPERATOR.reference(problem, [x, w, b])
    expected = _direct(x, w, b, params["strides"], params["pads"], params["dilations"], 2,
                       out.shape[2:])
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_spellings_of_one_problem_share_a_key():
    shapes, dtypes = [(1, 2, 4, 4), (2, 3, 3, 3)], ["float32"] * 2
    same = OPERATOR.problem(shapes, dtypes, strides=[2, 2], auto_pad="SAME_UPPER")
    assert OPERATOR.output_shape(same) == (1, 3, 8, 8)
    assert same.key == OPERATOR.problem(shapes, dtypes, strides=(2, 2), pads=(0, 0, 1, 1),
                                        output_padding=[0, 0], group=1).key
    assert same.key == OPERATOR.problem(shapes, dtypes, strides=[2, 2],
                                        output_shape=[8, 8], auto_pad=b"SAME_UPPER").key
    one_d = OPERATOR.problem([(1, 2, 5), (2, 3, 3)], dtypes, strides=[2])
    assert OPERATOR.output_shape(one_d) == (1, 3, 11)
    OPERATOR.validate(one_d)


@pytest.mark.parametrize(("shapes", "params", "message"), [
    ([(1, 2, 3, 3, 3), (2, 1, 1, 1, 1)], {}, "1-D and 2-D inputs"),
    ([(1, 4, 3, 3), (3, 1, 1, 1)], {}, "equal to X's channels"),
    ([(1, 4, 3, 3), (4, 1, 1, 1)], {"group": 3}, "divisible by group 3"),
    ([(1, 2, 3, 3), (2, 1, 1, 1), (2,)], {}, "bias must be (1,)"),
    ([(1, 2, 3, 3), (2, 1, 2, 2)], {"kernel_shape": [3, 3]}, "does not match"),
    ([(1, 2, 3, 3), (2, 1, 2, 2)], {"output_padding": [2, 0], "strides": [2, 2]},
     "smaller than the stride"),
    ([(1, 2, 3, 3), (2, 1, 2, 2)], {"pads": [2, 2, 2, 2]}, "crop the whole output"),
    ([(1, 2, 3, 3), (2, 1, 2, 2)], {"auto_pad": "SAME"}, "auto_pad must be one of"),
    ([(1, 2, 3, 3), (2, 1, 2, 2)], {"padding": 1}, "no parameter(s) padding"),
])
def test_bad_problems_are_named(shapes, params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)


def test_registered_algorithms_their_order_and_workspace():
    assert [a.desc.name for a in ALGORITHMS] == ["per_tap", "col2im"]
    assert all(a.attributes == AlgoAttribute.REPRODUCIBLE for a in ALGORITHMS)

    def order(kernel):
        problem = OPERATOR.problem([(1, 8, 6, 6), (8, 4, kernel, kernel)], ["float32"] * 2,
                                   strides=[2, 2])
        return [a.desc.name for a in OPERATOR.heuristic_order(problem, ALGORITHMS)]

    assert order(2) == ["per_tap", "col2im"]  # four taps, each a disjoint quarter
    assert order(4) == ["col2im", "per_tap"]
    problem = OPERATOR.problem([(2, 6, 5, 7), (6, 2, 3, 3), (6,)], ["float32"] * 3,
                               strides=[2, 2], pads=[1, 1, 1, 1], group=3)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in problem.shapes]
    for algorithm in ALGORITHMS:
        algorithm.run(problem, inputs, None)  # the problem's geometry is cached on first use
        assert_allocates_its_workspace(algorithm, problem,
                                       lambda a=algorithm: a.run(problem, inputs, None))


def test_a_decoder_with_learned_upsampling_matches_onnxruntime():
    """Conv -> ConvTranspose (2x2, stride 2) -> Relu -> ConvTranspose (3x3, stride 2, output
    padding), searched."""
    rng = np.random.default_rng(5)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32),
                                       name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ConvTranspose", ["c", "w1", "b1"], ["u"], strides=[2, 2]),
        helper.make_node("Relu", ["u"], ["r"]),
        helper.make_node("ConvTranspose", ["r", "w2"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                         output_padding=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 36, 36])],
        [weight("w0", (8, 3, 3, 3)), weight("w1", (8, 6, 2, 2)), weight("b1", (6,)),
         weight("w2", (6, 4, 3, 3))])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run",
                                        budget_s=0.002, progress=False))
    assert [s.operator for s in model.steps].count("conv_transpose") == 2
    feeds = model.random_inputs(seed=1)
    got = model.run(feeds)["y"]
    expected = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    assert got.shape == expected.shape == (1, 4, 36, 36)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    onnx.checker.check_model(proto)
