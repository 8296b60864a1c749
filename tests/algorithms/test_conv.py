"""The conv operator (ONNX semantics, canonical keys, clear errors) and every registered conv
algorithm against the ONNX specification's own examples and through the framework."""

from __future__ import annotations

import numpy as np
import pytest

import fastrun
from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, InMemoryCache
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import conv_registry
from tests.onnx_cases import node_attributes, node_cases

OPERATOR = ConvOperator()


REGISTRY = conv_registry()
ALGORITHMS = [a for a in REGISTRY.algorithms("conv") if a.device_kind == "cpu"]


def _onnx_conv_cases():
    for case in node_cases("Conv"):
        node = case.model.graph.node[0]
        attrs = node_attributes(node)
        for inputs, outputs in case.data_sets:
            yield pytest.param(inputs, attrs, outputs[0], id=case.name)


ONNX_CASES = list(_onnx_conv_cases())


class SubProblems:
    """RunContext computing sub-problems with the blas matmul algorithm."""

    def call(self, problem, *inputs):
        return np.matmul(*inputs)


def test_the_specification_has_examples():
    assert len(ONNX_CASES) >= 6


@pytest.mark.parametrize("inputs, attrs, expected", ONNX_CASES)
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a.desc.text)
def test_onnx_examples(algorithm, inputs, attrs, expected):
    problem = OPERATOR.problem([x.shape for x in inputs], [x.dtype for x in inputs], **attrs)
    np.testing.assert_allclose(OPERATOR.reference(problem, inputs), expected, rtol=0, atol=1e-5)
    if not algorithm.usable(problem):
        pytest.skip(algorithm.unusable_reason(problem))
    out = algorithm.run(problem, inputs, SubProblems())
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("spelling", [
    {"auto_pad": "SAME_UPPER"},
    {"pads": [1, 1, 1, 1]},
    {"pads": [1, 1, 1, 1], "strides": 1, "dilations": [1, 1], "group": 1},
    {"auto_pad": "NOTSET", "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]},
])
def test_equal_convolutions_share_one_key(spelling):
    shapes, dtypes = [(1, 4, 8, 8), (6, 4, 3, 3)], ["float32", "float32"]
    assert OPERATOR.problem(shapes, dtypes, **spelling).key == (
        "float32[1x4x8x8],float32[6x4x3x3];dilations=(1,1),group=1,pads=(1,1,1,1),strides=(1,1)")


def test_auto_pad_same_lower_puts_the_odd_pad_first():
    problem = OPERATOR.problem([(1, 1, 6, 6), (1, 1, 4, 4)], ["float32"] * 2,
                               auto_pad="SAME_LOWER")
    assert problem.param("pads") == (2, 2, 1, 1)
    upper = OPERATOR.problem([(1, 1, 6, 6), (1, 1, 4, 4)], ["float32"] * 2,
                             auto_pad="SAME_UPPER")
    assert upper.param("pads") == (1, 1, 2, 2)


def test_one_d_is_two_d_with_height_one():
    problem = OPERATOR.problem([(2, 3, 10), (4, 3, 3)], ["float64"] * 2, strides=[2],
                               pads=[1, 0])
    assert problem.param("strides") == (1, 2) and problem.param("pads") == (0, 1, 0, 0)
    assert OPERATOR.output_shape(problem) == (2, 4, 5)  # (10 + 1 - 3) // 2 + 1


def test_epilogue_parameters():
    shapes = [(1, 2, 5, 5), (2, 2, 3, 3), (2,)]
    relu6 = OPERATOR.problem(shapes, ["float32"] * 3, activation="relu6")
    assert relu6.key.endswith("activation=clip,clip_max=6.0,clip_min=0.0,dilations=(1,1),"
                              "group=1,pads=(0,0,0,0),strides=(1,1)")
    rng = np.random.default_rng(0)
    x, w, b = (rng.uniform(-3, 3, s) for s in shapes)
    out = OPERATOR.reference(relu6, [x, w, b])
    plain = OPERATOR.reference(OPERATOR.problem(shapes, ["float64"] * 3), [x, w, b])
    np.testing.assert_allclose(out, np.clip(plain, 0, 6))
    gate = OPERATOR.problem(shapes, ["float32"] * 3, activation="hard_sigmoid", alpha=1 / 6)
    assert "activation=hard_sigmoid,alpha=0.1666" in gate.key and "beta=0.5" in gate.key
    np.testing.assert_allclose(OPERATOR.reference(gate, [x, w, b]),
                               np.clip(plain / 6 + 0.5, 0, 1))


@pytest.mark.parametrize("shapes, params, message", [
    ([(1, 1, 8, 8), (2, 1, 3, 3)], {"alpha": 0.2}, "alpha/beta need activation='hard_sigmoid'"),
    ([(1, 3, 8, 8), (4, 3, 3, 3)], {"group": 2}, "C=3 are not divisible by group=2"),
    ([(1, 4, 8, 8), (3, 2, 3, 3)], {"group": 2}, "K=3 are not divisible by group=2"),
    ([(1, 4, 8, 8), (4, 4, 3, 3)], {"group": 2}, "W must have C/group=2 channels, has 4"),
    ([(1, 1, 3, 3), (1, 1, 5, 5)], {}, "output would be empty"),
    ([(1, 1, 8, 8), (2, 1, 3, 3), (3,)], {}, "bias must have shape (2,)"),
    ([(1, 1, 8, 8), (2, 1, 3, 3)], {"auto_pad": "SAME"}, "auto_pad must be one of"),
    ([(1, 1, 8, 8), (2, 1, 3, 3)], {"pads": [1, 1]}, "pads needs 4 values"),
    ([(1, 1, 8, 8), (2, 1, 3, 3)], {"strides": [0, 1]}, "strides must be positive"),
    ([(1, 1, 8, 8), (2, 1, 3, 3)], {"kernel_shape": [5, 5]}, "does not match"),
    ([(1, 1, 8, 8), (2, 1, 3, 3)], {"activation": "gelu"}, "activation must be one of"),
    ([(1, 1, 8, 8), (2, 1, 3, 3)], {"padding": 1}, "no parameter(s) padding"),
    ([(1, 1, 4, 8, 8), (2, 1, 3, 3, 3)], {}, "1-D and 2-D convolutions"),
    ([(1, 1, 8, 8), (2, 1, 3)], {}, "rank of X"),
])
def test_invalid_parameters_are_named(shapes, params, message):
    with pytest.raises(ValueError) as info:
        OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)
    assert message in str(info.value)


def test_mixed_dtypes_are_refused():
    with pytest.raises(ValueError, match="one dtype, float32 or float64"):
        OPERATOR.problem([(1, 1, 4, 4), (1, 1, 3, 3)], ["float32", "float64"])


def test_search_through_the_framework_with_sub_problems_in_the_policy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    with fastrun.session(strategy="fast-run", cache=InMemoryCache(), registry=REGISTRY,
                         budget_s=0.002, progress=False) as session:
        out = fastrun.call("conv", x, w, pads=[1, 1, 1, 1])
        problem = session.problem("conv", [x.shape, w.shape], ["float32"] * 2, pads=[1, 1, 1, 1])
        decision = session.decide(problem)
        reference = OPERATOR.reference(problem, [x, w])
        assert OPERATOR.error(problem, out, reference) < 1e-4
        timed = {e.algorithm.split("(")[0] for e in decision.entries}
        assert {"im2col", "direct"} <= timed and "naive" not in timed
        # a candidate with matmul sub-problems had them decided first
        im2col = next(a for a in ALGORITHMS if a.desc.text == "im2col")
        for sub in im2col.sub_problems(problem):
            assert session.decide(sub).source == "profiled"
        category = session.chooser.category(REGISTRY.operator("conv"))
    # and they show in the execution policy once im2col is the choice
    cache = InMemoryCache()
    cache.put(category, problem.key, [Entry("im2col", AlgoAttribute.REPRODUCIBLE, 1e-9, 0.0, 0,
                                            0.0, 9, 0.0, "test")])
    policy = fastrun.session(cache=cache, registry=REGISTRY, progress=False).decide(problem).policy
    assert policy.algorithm == "im2col" and policy.source == "cache"
    assert policy.children and all(child.operator == "matmul" for child in policy.children)
