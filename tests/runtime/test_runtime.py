"""The runtime in process: lowering, constant folding, fusion, errors, and how searches use the
cache (resume, sharing, cache-only, reproducible)."""

from __future__ import annotations

import collections
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import fastrun
from fastrun.attribute import AlgoAttribute
from fastrun.cache import FileCache, InMemoryCache, low_confidence
from fastrun.core.reasons import Source
from fastrun.runtime import ModelError, UnsupportedOperatorError, load
from tests.runtime import _models

FAST = {"budget_s": 0.005, "min_repeats": 1, "progress": False}


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_matches_onnxruntime(model_proto, model, feeds, rtol: float = 1e-4) -> None:
    expected = onnxruntime_outputs(model_proto, feeds)
    got = model.run(feeds)
    for name, reference in zip(model.graph.outputs, expected, strict=True):
        scale = max(float(np.max(np.abs(reference))), 1e-6)
        assert got[name].shape == reference.shape
        assert got[name].dtype == reference.dtype
        assert float(np.max(np.abs(got[name] - reference))) <= rtol * scale, name


def heuristic_session(**options) -> fastrun.Session:
    return fastrun.session(cache=InMemoryCache(), strategy="heuristic", progress=False,
                           **options)


# -- lowering, folding, fusion ---------------------------------------------------------------
def test_batch_norm_and_relu_fold_into_the_conv():
    proto = _models.conv_bn_relu()
    model = load(proto, heuristic_session())
    (step,) = model.steps
    assert step.op_type == "Conv+BatchNormalization+Relu"
    assert step.problem.param("activation") == "relu"
    assert len(step.inputs) == 3  # the folded bias
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_relu_after_a_batch_norm_with_no_conv_before_fuses_into_it():
    """DenseNet's pre-activation: the batch norm after a concat folds into no conv, and its
    Relu runs in the batch norm's pass; a batch norm after a conv folds into the conv as
    before, and nothing folds into a batch norm but an activation it takes (not Clip)."""
    proto = _models.dense_layer()
    model = load(proto, heuristic_session())
    ops = [(step.operator, step.op_type) for step in model.steps]
    assert ops == [("concat", "Concat"), ("batch_norm", "BatchNormalization+Relu"),
                   ("conv", "Conv+BatchNormalization+Clip")]
    assert model.steps[1].problem.param("activation") == "relu"
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_shape_arithmetic_is_folded_and_batch_is_free():
    proto = _models.small_cnn()
    for batch in (1, 3):
        model = load(proto, heuristic_session(), batch=batch)
        kinds = {step.op_type for step in model.steps}
        assert not kinds & {"Shape", "Gather", "Unsqueeze", "Concat"}
        assert {s.op_type for s in model.steps if s.operator == "conv"} == {"Conv+Relu"}
        assert model.inputs["x"].shape == (batch, 3, 12, 12)
        assert_matches_onnxruntime(proto, model, model.random_inputs(seed=batch))


def test_a_residual_add_and_its_relu_fuse_into_the_conv():
    """The residual Add reads a conv output and the block's input: the input becomes the
    conv's residual Z (``act(conv + Z)``) and the Relu after the add its activation, so the
    block is two steps."""
    proto = _models.residual_block()
    model = load(proto, heuristic_session())
    assert [s.op_type for s in model.steps] == ["Conv+Relu", "Conv+Add+Relu"]
    fused = model.steps[-1]
    assert fused.problem.param("residual") and fused.problem.param("activation") == "relu"
    assert fused.inputs[-1].name == "x"
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_the_shortcut_may_be_computed_after_the_conv_it_joins():
    """ResNet's downsampling block: Add(conv_b(...), conv_a(x)) where conv_a's output is the
    first operand and conv_b comes later in the graph: the fused conv runs where the add ran."""
    w = _models.GraphWriter()
    a = w.node("Conv", ["x", w.weight("wa", (6, 4, 1, 1))], "a")
    r = w.node("Relu", ["x"], "r")
    b = w.node("Conv", [r, w.weight("wb", (6, 4, 3, 3))], "b", pads=[1, 1, 1, 1])
    s = w.node("Add", [a, b], "sum")
    w.node("Relu", [s], "y")
    proto = w.model((1, 4, 7, 7), "y")
    model = load(proto, heuristic_session())
    assert [s.op_type for s in model.steps] == ["Relu", "Conv", "Conv+Add+Relu"]
    assert model.steps[-1].node == "a+sum+y"
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_fusion_and_weight_preprocessing_follow_the_operators_capabilities(monkeypatch):
    """The runtime asks the operator what its steps take (``epilogue``,
    ``preprocesses_weights``), never its name: a conv that declares no epilogue keeps its
    Relu and Add as steps of their own, and one that takes no weight preprocessing is left
    without it."""
    session = heuristic_session()
    conv = session.registry.operator("conv")
    assert conv.epilogue is not None and conv.epilogue.residual and conv.preprocesses_weights
    fused = load(_models.residual_block(), session, weight_preprocess=True)
    assert [s.op_type for s in fused.steps] == ["Conv+Relu", "Conv+Add+Relu"]
    assert all(s.problem.param("weight_preprocess") for s in fused.steps)
    monkeypatch.setattr(conv, "epilogue", None)
    monkeypatch.setattr(conv, "preprocesses_weights", False)
    plain = load(_models.residual_block(), heuristic_session(), weight_preprocess=True)
    assert [s.op_type for s in plain.steps] == ["Conv", "Relu", "Conv", "Add+Relu"]
    assert plain.steps[-1].operator == "add_relu"  # the relu still goes into the add
    assert not any(s.problem.param("weight_preprocess") for s in plain.steps
                   if s.operator == "conv")
    np.testing.assert_allclose(plain.run(plain.random_inputs(seed=3))["y"],
                               fused.run(fused.random_inputs(seed=3))["y"], rtol=1e-4,
                               atol=1e-5)


def test_without_an_algorithm_that_takes_a_residual_the_add_takes_the_relu():
    """Fusion asks the registry: where no conv algorithm of the device's kind takes a residual
    (here: a device kind with none), the add stays and the relu merges into it."""
    from fastrun.registry import Registry
    from fastrun.runtime import fusion
    from fastrun.runtime.lowering import lower
    from fastrun.runtime.model import _ConstantEvaluator, _input_values

    registry = Registry()
    graph = fastrun.runtime.graph.from_onnx(_models.residual_block())
    inputs = _input_values(graph, {}, None)
    session = heuristic_session()
    steps, values = lower(graph, inputs, registry, _ConstantEvaluator(session))
    steps = fusion.fuse(steps, [values["y"]], registry, device_kind="no-such-device")
    assert [s.op_type for s in steps] == ["Conv+Relu", "Conv", "Add+Relu"]
    assert steps[-1].operator == "add_relu"


def test_a_relu_whose_add_has_another_reader_stays_apart():
    w = _models.GraphWriter()
    w.node("Add", ["x", w.weight("b", (1, 3, 5, 5))], "s")
    w.node("Relu", ["s"], "r")
    w.node("Mul", ["s", "r"], "y")
    proto = w.model((1, 3, 5, 5), "y")
    model = load(proto, heuristic_session())
    assert [s.op_type for s in model.steps] == ["Add", "Relu", "Mul"]
    assert_matches_onnxruntime(proto, model, model.random_inputs())


@pytest.mark.parametrize("opset", [7, 13])
def test_clip_folds_into_the_conv_in_both_opset_spellings(opset):
    w = _models.GraphWriter()
    w.node("Conv", ["x", w.weight("w", (6, 3, 3, 3))], "c")
    if opset >= 11:
        w.node("Clip", ["c", w.const("lo", np.float32(0)), w.const("hi", np.float32(0.5))], "y")
    else:
        w.node("Clip", ["c"], "y", min=0.0, max=0.5)
    proto = w.model((1, 3, 9, 9), "y", opset=opset)
    model = load(proto, heuristic_session())
    (step,) = model.steps
    assert (step.problem.param("activation"), step.problem.param("clip_max")) == ("clip", 0.5)
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_weight_preprocessing_matches_onnxruntime():
    w = _models.GraphWriter()
    w.node("Conv", ["x", w.weight("w", (24, 16, 3, 3), 0.1)], "y", pads=[1, 1, 1, 1])
    proto = w.model((1, 16, 20, 20), "y")
    model = load(proto, heuristic_session(), weight_preprocess=True)
    (step,) = model.steps
    assert step.problem.weight_preprocess
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_mobilenet_v3_block_with_hard_activations_matches_onnxruntime():
    """HardSwish and HardSigmoid (the squeeze-excitation gate, torch's alpha 1/6) in the
    epilogues of the convs before them, searched and cached, then served from the cache by a
    run that profiles nothing."""
    proto = _models.mobilenet_v3_block()
    cache = InMemoryCache()
    model = load(proto, fastrun.session(cache=cache, strategy="fast-run", **FAST))
    assert "hard_sigmoid" not in {step.operator for step in model.steps}
    block = next(s for s in model.steps if s.operator == "squeeze_excite")
    assert block.problem.param("gate") == "hard_sigmoid" and block.problem.param("beta") == 0.5
    assert block.problem.param("alpha") == pytest.approx(1 / 6)
    assert block.problem.param("activation") == "relu"
    assert "hard_swish" in {step.params.get("activation") for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=3))
    served = fastrun.session(cache=cache, strategy="heuristic", progress=False)
    again = load(proto, served)
    assert_matches_onnxruntime(proto, again, again.random_inputs(seed=4))
    assert served.chooser.stats.profiled == 0


# -- errors ------------------------------------------------------------------------------------
def test_unsupported_ops_are_all_named_before_any_work():
    w = _models.GraphWriter()
    w.node("Relu", ["x"], "r")
    w.node("LpNormalization", ["r"], "e", name="my_lpnorm")
    w.node("Hardmax", ["e"], "y", name="the_hardmax")
    proto = w.model((2, 3), "y", output_rank=2)
    with pytest.raises(UnsupportedOperatorError) as caught:
        load(proto, heuristic_session())
    text = str(caught.value)
    assert "LpNormalization (node 'my_lpnorm')" in text and "Hardmax (node 'the_hardmax')" in text
    assert len(caught.value.problems) == 2


@pytest.mark.parametrize("opset", [13, 18])
def test_a_spatial_mean_as_mnasnet_and_shufflenet_export_it_matches_onnxruntime(opset):
    """x.mean([2, 3]) before the classifier: ReduceMean with axes as an attribute (opset 13)
    or as an input (opset 18), searched."""
    w = _models.GraphWriter()
    c = w.node("Conv", ["x", w.weight("w", (24, 3, 3, 3))], "c", pads=[1, 1, 1, 1])
    axes = {"axes": [2, 3]} if opset < 18 else {}
    inputs = [c] if opset < 18 else [c, w.const("axes", np.array([2, 3], np.int64))]
    m = w.node("ReduceMean", inputs, "m", keepdims=0, **axes)
    w.node("Gemm", [m, w.weight("fc", (5, 24)), w.weight("fcb", (5,))], "y", transB=1)
    proto = w.model((1, 3, 12, 12), "y", opset=opset, output_rank=2)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    assert "reduce" in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_transformer_feed_forward_with_layer_norm_and_erf_gelu_matches_onnxruntime():
    """LayerNormalization (opset 17) and GELU in its exact Erf form, as exporters write a
    ViT or BERT feed-forward block, searched."""
    w = _models.GraphWriter()
    n = w.node("LayerNormalization", ["x", w.weight("g", (32,)), w.weight("b", (32,))], "ln",
               axis=-1, epsilon=1e-6)
    h = w.node("MatMul", [n, w.weight("w1", (32, 64), 0.2)], "h")
    scaled = w.node("Div", [h, w.const("root2", np.array(np.sqrt(2), np.float32))], "scaled")
    e = w.node("Erf", [scaled], "erf")
    gate = w.node("Add", [e, w.const("one", np.array(1.0, np.float32))], "gate")
    g = w.node("Mul", [w.node("Mul", [h, gate], "hg"), w.const("half", np.array(0.5, np.float32))],
               "gelu")
    o = w.node("MatMul", [g, w.weight("w2", (64, 32), 0.2)], "o")
    w.node("Add", [o, "x"], "y")
    proto = w.model((1, 10, 32), "y", opset=17, output_rank=3)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    operators = [step.operator for step in model.steps]
    # the five GELU steps are one; each MatMul by a 2-D weight is one 2-D product
    assert {"layer_norm", "gelu"} <= set(operators) and "erf" not in operators
    gelu = next(step for step in model.steps if step.operator == "gelu")
    assert gelu.op_type == "Div+Erf+Add+Mul" and gelu.node.startswith("scaled+erf+gate+")
    assert all(len(shape) == 2 for step in model.steps if step.operator == "matmul"
               for shape in step.problem.shapes)
    assert_matches_onnxruntime(proto, model, model.random_inputs())


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_matches_onnxruntime_and_its_exact_form_is_one_step(approximate):
    """ONNX's Gelu (opset 20) lowers to the steps of its formula, which then fuse into one
    gelu step of the same form, as an exporter's spelling does."""
    w = _models.GraphWriter()
    h = w.node("MatMul", ["x", w.weight("w1", (16, 24), 0.5)], "h")
    w.node("Gelu", [h], "y", approximate=approximate)
    proto = w.model((2, 5, 16), "y", opset=20, output_rank=3)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    gelus = [step for step in model.steps if step.operator == "gelu"]
    assert len(gelus) == 1 and gelus[0].problem.param("approximate") == approximate
    assert not {"erf", "tanh"} & {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=3))


def test_the_tanh_gelu_as_torch_exports_it_is_one_step():
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` with Pow(x, 3), opset 17."""
    w = _models.GraphWriter()
    x = w.node("MatMul", ["x", w.weight("w1", (16, 24), 0.5)], "h")
    cube = w.node("Pow", [x, w.const("three", np.array(3.0, np.float32))], "cube")
    inner = w.node("Add", [x, w.node("Mul", [cube, w.const("c", np.array(0.044715, np.float32))],
                                     "cubic")], "inner")
    scaled = w.node("Mul", [inner, w.const("k", np.array(np.sqrt(2 / np.pi), np.float32))], "ks")
    gate = w.node("Add", [w.node("Tanh", [scaled], "tanh"),
                          w.const("one", np.array(1.0, np.float32))], "gate")
    w.node("Mul", [w.node("Mul", [x, w.const("half", np.array(0.5, np.float32))], "xh"), gate],
           "y")
    proto = w.model((2, 5, 16), "y", opset=17, output_rank=3)
    model = load(proto, heuristic_session())
    assert [s.operator for s in model.steps if s.problem is not None] == ["matmul", "gelu"]
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=4))


@pytest.mark.parametrize("spelling", ["div", "mul"])
def test_attention_scores_scaled_then_softmax_are_one_step(spelling):
    """Q @ K^T divided by sqrt(d) (or times its inverse), then Softmax, as exporters write
    attention: the scale becomes the softmax's, one pass over the scores instead of two."""
    w = _models.GraphWriter()
    q = w.node("MatMul", ["x", w.weight("wq", (16, 16), 0.5)], "q")
    k = w.node("MatMul", ["x", w.weight("wk", (16, 16), 0.5)], "k")
    scores = w.node("MatMul", [q, w.node("Transpose", [k], "kt", perm=[0, 2, 1])], "scores")
    if spelling == "div":
        scaled = w.node("Div", [scores, w.const("root", np.array(4.0, np.float32))], "scaled")
    else:
        scaled = w.node("Mul", [w.const("inv", np.array(0.25, np.float32)), scores], "scaled")
    w.node("Softmax", [scaled], "y", axis=-1)
    proto = w.model((2, 7, 16), "y", opset=17, output_rank=3)
    model = load(proto, heuristic_session())
    operators = [step.operator for step in model.steps if step.problem is not None]
    assert spelling not in operators
    softmax = next(step for step in model.steps if step.operator == "softmax")
    assert softmax.problem.param("scale") == 0.25 and softmax.node == "scaled+y"
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=5))


def test_a_scale_read_elsewhere_or_negative_stays_a_step():
    """The scaled scores also feed the output, or the factor is negative: no folding."""
    w = _models.GraphWriter()
    scaled = w.node("Div", ["x", w.const("root", np.array(4.0, np.float32))], "scaled")
    w.node("Add", [w.node("Softmax", [scaled], "p", axis=-1), scaled], "y")
    proto = w.model((2, 7, 16), "y", opset=17, output_rank=3)
    model = load(proto, heuristic_session())
    assert "div" in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())
    w = _models.GraphWriter()
    scaled = w.node("Mul", ["x", w.const("minus", np.array(-0.5, np.float32))], "scaled")
    w.node("Softmax", [scaled], "y", axis=-1)
    proto = w.model((2, 7, 16), "y", opset=17, output_rank=3)
    model = load(proto, heuristic_session())
    assert "mul" in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_an_erf_gelu_whose_parts_are_read_elsewhere_stays_apart():
    """The erf's output also feeds the graph's output: the pattern cannot be one step."""
    w = _models.GraphWriter()
    scaled = w.node("Div", ["x", w.const("root2", np.array(np.sqrt(2), np.float32))], "s")
    e = w.node("Erf", [scaled], "erf")
    gate = w.node("Add", [e, w.const("one", np.array(1.0, np.float32))], "gate")
    g = w.node("Mul", [w.node("Mul", ["x", gate], "xg"),
                       w.const("half", np.array(0.5, np.float32))], "g")
    w.node("Add", [g, e], "y")
    proto = w.model((1, 3, 8), "y", opset=17, output_rank=3)
    model = load(proto, heuristic_session())
    assert "gelu" not in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def _split_layer_norm(w, x: str, width: int, square: str, affine: bool) -> str:
    """LayerNorm over the last axis as torch exported it before opset 17."""
    mean = w.node("ReduceMean", [x], f"{x}.mean", axes=[-1], keepdims=1)
    centered = w.node("Sub", [x, mean], f"{x}.centered")
    if square == "pow":
        squared = w.node("Pow", [centered, w.const(f"{x}.two", np.array(2.0, np.float32))],
                         f"{x}.squared")
    else:
        squared = w.node("Mul", [centered, centered], f"{x}.squared")
    variance = w.node("ReduceMean", [squared], f"{x}.variance", axes=[-1], keepdims=1)
    shifted = w.node("Add", [variance, w.const(f"{x}.eps", np.array(1e-5, np.float32))],
                     f"{x}.shifted")
    y = w.node("Div", [centered, w.node("Sqrt", [shifted], f"{x}.root")], f"{x}.normed")
    if affine:
        y = w.node("Mul", [y, w.weight(f"{x}.gamma", (width,))], f"{x}.scaled")
        y = w.node("Add", [y, w.weight(f"{x}.beta", (width,))], f"{x}.ln")
    return y


@pytest.mark.parametrize(("square", "affine"), [("pow", True), ("mul", False)])
def test_a_layer_norm_spelled_out_before_opset_17_is_one_step(square, affine):
    w = _models.GraphWriter()
    h = w.node("MatMul", ["x", w.weight("w1", (16, 24), 0.5)], "h")
    normed = _split_layer_norm(w, h, 24, square, affine)
    w.node("MatMul", [normed, w.weight("w2", (24, 8), 0.5)], "y")
    proto = w.model((2, 5, 16), "y", opset=14, output_rank=3)
    model = load(proto, heuristic_session())
    operators = [step.operator for step in model.steps]
    assert operators.count("layer_norm") == 1
    assert not {"reduce", "sqrt", "div", "sub"} & set(operators)
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=2))


def test_a_spelled_out_layer_norm_whose_mean_is_read_elsewhere_stays_apart():
    w = _models.GraphWriter()
    normed = _split_layer_norm(w, "x", 12, "pow", True)
    w.node("Add", [normed, "x.mean"], "y")  # the mean has a second reader
    proto = w.model((1, 3, 12), "y", opset=14, output_rank=3)
    model = load(proto, heuristic_session())
    assert "layer_norm" not in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())


@pytest.mark.parametrize(("equation", "shapes"), [
    ("bhqd,bhkd->bhqk", [(1, 3, 5, 4), (1, 3, 6, 4)]),  # attention's scores
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("abc,cd->da", [(2, 3, 4), (4, 5)]),  # b only in the first operand: summed first
    ("ij->ji", [(3, 4)]),
    ("ijk->k", [(2, 3, 4)]),
    ("i,i", [(5,), (5,)]),
])
def test_einsum_of_the_common_patterns_matches_onnxruntime(equation, shapes):
    w = _models.GraphWriter()
    inputs = ["x"] + [w.weight(f"w{i}", shape) for i, shape in enumerate(shapes[1:])]
    w.node("Einsum", inputs, "y", equation=equation)
    expected_rank = np.einsum(equation, *(np.zeros(s) for s in shapes)).ndim
    proto = w.model(shapes[0], "y", opset=13, output_rank=expected_rank)
    model = load(proto, heuristic_session(), batch=shapes[0][0])
    assert "einsum" not in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_tile_of_a_computed_tensor_matches_onnxruntime():
    w = _models.GraphWriter()
    r = w.node("Relu", ["x"], "r")
    w.node("Tile", [r, w.const("repeats", np.array([1, 2, 3], np.int64))], "y")
    proto = w.model((1, 3, 4), "y", opset=13, output_rank=3)
    model = load(proto, heuristic_session())
    assert "expand" in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_an_einsum_diagonal_is_refused_by_name():
    w = _models.GraphWriter()
    w.node("Einsum", ["x"], "y", equation="ii->i")
    proto = w.model((4, 4), "y", opset=13, output_rank=1)
    with pytest.raises(UnsupportedOperatorError, match="diagonals are not lowered"):
        load(proto, heuristic_session(), batch=4)


def test_a_scalar_input_stays_a_scalar():
    """numpy's ascontiguousarray makes a 0-d array 1-d; a scalar fed through stays 0-d."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "scalar",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out = load(proto, heuristic_session()).run({"x": np.array(5.0, np.float32)})["y"]
    assert out.shape == () and float(out) == 5.0


@pytest.mark.parametrize("power", [1.0, 2.0, 3.0, 0.5, -0.5, -1.0])
def test_pow_of_a_constant_exponent_matches_onnxruntime(power):
    w = _models.GraphWriter()
    w.node("Abs", ["x"], "positive")
    w.node("Pow", ["positive", w.const("p", np.array(power, np.float32))], "y")
    proto = w.model((2, 5), "y", opset=17, output_rank=2)
    model = load(proto, heuristic_session())
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_pow_with_another_exponent_is_refused_by_name():
    w = _models.GraphWriter()
    w.node("Pow", ["x", w.const("p", np.array(1.7, np.float32))], "y", name="odd_pow")
    with pytest.raises(UnsupportedOperatorError, match=r"odd_pow.*exponent 1\.7"):
        load(w.model((2, 5), "y", opset=17, output_rank=2), heuristic_session())


def test_instance_normalization_matches_onnxruntime():
    """InstanceNormalization as style-transfer and segmentation models use it after a conv:
    a layer_norm over each channel's plane, then the channel's scale and bias."""
    w = _models.GraphWriter()
    w.node("Conv", ["x", w.weight("w", (5, 3, 3, 3))], "c", pads=[1] * 4)
    w.node("InstanceNormalization", ["c", w.weight("scale", (5,)), w.weight("bias", (5,))],
           "y", epsilon=1e-3)
    proto = w.model((2, 3, 7, 6), "y", opset=17)
    model = load(proto, heuristic_session())
    assert [step.operator for step in model.steps] == ["conv", "layer_norm", "mul", "add"]
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_silu_hard_swish_and_sigmoid_fold_into_the_conv():
    """EfficientNet's SiLU (a Sigmoid and a Mul reading the conv), MobileNetV3's HardSwish and
    a squeeze-excitation gate's Sigmoid each run in the conv's epilogue: one step per conv."""
    w = _models.GraphWriter()
    w.node("Conv", ["x", w.weight("w1", (6, 3, 3, 3)), w.weight("b1", (6,))], "c1",
           pads=[1] * 4)
    w.node("Sigmoid", ["c1"], "s1")
    w.node("Mul", ["c1", "s1"], "silu")
    w.node("Conv", ["silu", w.weight("w2", (6, 6, 1, 1))], "c2")
    w.node("HardSwish", ["c2"], "hs")
    w.node("Conv", ["hs", w.weight("w3", (6, 6, 1, 1)), w.weight("b3", (6,))], "c3")
    w.node("Sigmoid", ["c3"], "y")
    proto = w.model((1, 3, 9, 9), "y", opset=17)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    assert [(step.operator, step.params.get("activation")) for step in model.steps] == [
        ("conv", "silu"), ("conv", "hard_swish"), ("conv", "sigmoid")]
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_squeeze_excitation_block_is_one_step():
    """MobileNetV3's block (Relu, then a HardSigmoid gate) and EfficientNet's (SiLU, then a
    Sigmoid gate; here its first conv without a bias, the gate multiplied from the left): the
    pool, the two 1x1 convs, their activations and the Mul become one squeeze_excite step."""
    proto = _models.mobilenet_v3_block()
    model = load(proto, heuristic_session())
    assert [step.operator for step in model.steps] == ["conv", "conv", "squeeze_excite", "conv"]
    block = model.steps[2]
    assert block.op_type == "GlobalAveragePool+Conv+Relu+Conv+HardSigmoid+Mul"
    assert [v.shape for v in block.inputs] == [(1, 48, 10, 10), (48, 8), (8,), (8, 48), (48,)]
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=2))

    w = _models.GraphWriter(3)
    x = w.node("Conv", ["x", w.weight("w", (12, 3, 3, 3))], "c", pads=[1] * 4)
    pooled = w.node("GlobalAveragePool", [x], "pool")
    h = w.node("Conv", [pooled, w.weight("w1", (4, 12, 1, 1))], "reduce")
    h = w.node("Mul", [h, w.node("Sigmoid", [h], "reduce_sigmoid")], "reduce_silu")
    g = w.node("Conv", [h, w.weight("w2", (12, 4, 1, 1)), w.weight("b2", (12,))], "expand")
    w.node("Mul", [w.node("Sigmoid", [g], "gate"), x], "y")
    proto = w.model((2, 3, 9, 9), "y", opset=17)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    assert [step.operator for step in model.steps] == ["conv", "squeeze_excite"]
    block = model.steps[1].problem
    assert (block.param("activation"), block.param("gate", "sigmoid")) == ("silu", "sigmoid")
    np.testing.assert_array_equal(model.steps[1].inputs[2].const, np.zeros(4, np.float32))
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=3))


def test_a_squeeze_excitation_whose_values_have_other_readers_stays_apart():
    """The pooled vector read again (an Add after the block): the chain's steps are kept."""
    w = _models.GraphWriter(4)
    x = w.node("Conv", ["x", w.weight("w", (8, 3, 1, 1))], "c")
    pooled = w.node("GlobalAveragePool", [x], "pool")
    h = w.node("Relu", [w.node("Conv", [pooled, w.weight("w1", (2, 8, 1, 1))], "r")], "rr")
    g = w.node("Sigmoid", [w.node("Conv", [h, w.weight("w2", (8, 2, 1, 1))], "e")], "g")
    w.node("Add", [w.node("Mul", [x, g], "scaled"), pooled], "y")
    proto = w.model((1, 3, 6, 6), "y", opset=17)
    model = load(proto, heuristic_session())
    assert "squeeze_excite" not in {step.operator for step in model.steps}
    assert "global_avgpool" in {step.operator for step in model.steps}
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_silu_whose_conv_output_has_another_reader_stays_apart():
    w = _models.GraphWriter()
    w.node("Conv", ["x", w.weight("w1", (4, 3, 1, 1))], "c1")
    w.node("Sigmoid", ["c1"], "s1")
    w.node("Mul", ["c1", "s1"], "silu")
    w.node("Add", ["silu", "c1"], "y")  # c1 read a third time
    proto = w.model((1, 3, 5, 5), "y", opset=17)
    model = load(proto, heuristic_session())
    assert [step.operator for step in model.steps] == ["conv", "sigmoid", "mul", "add"]
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_constant_added_first_and_broadcast_matches_onnxruntime():
    """Add(bias, MatMul(x, W)) as torch exports a Linear on 3-D input (ConvNeXt's blocks):
    the runtime puts the constant second, and the step's problem must follow, or a kernel
    reads the operands by the other's shape."""
    w = _models.GraphWriter()
    w.node("MatMul", ["x", w.weight("w", (8, 24))], "h")
    w.node("Add", [w.weight("bias", (24,)), "h"], "hb")
    w.node("Mul", ["hb", "h"], "y")  # a second reader of h: the add stays a step
    proto = w.model((1, 5, 7, 8), "y", opset=17)
    model = load(proto, heuristic_session())
    add = next(step for step in model.steps if step.operator == "add")
    assert add.problem.shapes == tuple(v.shape for v in add.inputs) == ((1, 5, 7, 24), (24,))
    assert_matches_onnxruntime(proto, model, model.random_inputs())


@pytest.mark.parametrize("activation", ["Relu", "Gelu", None])
def test_a_projection_its_bias_and_activation_are_one_linear_step(activation):
    """MatMul of (1, 5, 7, 8) by a constant, its bias added first (torch's order), then a
    Relu or an exported exact GELU: one linear step and the view back to 4-D."""
    w = _models.GraphWriter()
    w.node("MatMul", ["x", w.weight("w", (8, 24))], "h")
    y = w.node("Add", [w.weight("bias", (24,)), "h"], "hb")
    if activation == "Relu":
        y = w.node("Relu", [y], "act")
    elif activation == "Gelu":
        scaled = w.node("Div", [y, w.const("root2", np.array(np.sqrt(2), np.float32))], "s")
        gate = w.node("Add", [w.node("Erf", [scaled], "erf"),
                              w.const("one", np.array(1.0, np.float32))], "gate")
        y = w.node("Mul", [w.node("Mul", [y, gate], "yg"),
                           w.const("half", np.array(0.5, np.float32))], "act")
    w.node("Transpose", [y], "y", perm=[0, 3, 1, 2])
    proto = w.model((1, 5, 7, 8), "y", opset=17)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    assert [s.operator for s in model.steps] == ["view", "linear", "view", "transpose"]
    linear = model.steps[1]
    expected = {"Relu": "relu", "Gelu": "gelu", None: "none"}[activation]
    assert linear.problem.param("activation") == expected
    assert linear.problem.shapes == ((35, 8), (8, 24), (24,))
    assert_matches_onnxruntime(proto, model, model.random_inputs())


@pytest.mark.parametrize("residual_later", [False, True])
def test_a_residual_add_after_a_projection_joins_its_linear_step(residual_later):
    """x + MatMul(x, W) + bias, the residual of a transformer block: one linear step with Z.
    Where Z is computed after the matmul, the step runs where the add ran, and the view back
    to 3-D after it."""
    w = _models.GraphWriter()
    w.node("MatMul", ["x", w.weight("w", (8, 8))], "h")
    hb = w.node("Add", ["h", w.weight("bias", (8,))], "hb")
    z = w.node("Relu", ["x"], "z") if residual_later else "x"
    w.node("Add", [z, hb], "y")
    proto = w.model((1, 20, 8), "y", opset=17)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    expected = ["view", "linear", "view"]
    assert [s.operator for s in model.steps] == (["view", "relu", "linear", "view"]
                                                 if residual_later else expected)
    linear = next(s for s in model.steps if s.operator == "linear")
    assert linear.problem.param("residual") and linear.problem.shapes[-1] == (1, 20, 8)
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_sum_of_two_projections_takes_one_as_the_others_residual():
    """(x W1 + b1) + (x W2 + b2): the first projection takes the second's output as its Z,
    and the second stays a linear step of its own that runs before it."""
    w = _models.GraphWriter()
    first = w.node("Add", [w.node("MatMul", ["x", w.weight("w1", (8, 8))], "h1"),
                           w.weight("b1", (8,))], "p1")
    second = w.node("Add", [w.node("MatMul", ["x", w.weight("w2", (8, 8))], "h2"),
                            w.weight("b2", (8,))], "p2")
    w.node("Add", [first, second], "y")
    proto = w.model((1, 20, 8), "y", opset=17)
    model = load(proto, heuristic_session())
    linears = [s for s in model.steps if s.operator == "linear"]
    assert [s.operator for s in model.steps if s.operator != "view"] == ["linear", "linear"]
    assert [bool(s.problem.param("residual")) for s in linears] == [False, True]
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_an_add_after_an_activation_or_broadcast_stays_a_step():
    """act(X W + B) + Z is not linear's act(X W + B + Z), and a Z that broadcasts is no
    residual: both adds stay steps."""
    w = _models.GraphWriter()
    w.node("MatMul", ["x", w.weight("w", (8, 8))], "h")
    hb = w.node("Relu", [w.node("Add", ["h", w.weight("bias", (8,))], "hb")], "r")
    w.node("Add", ["x", hb], "y1")
    w.node("MatMul", ["y1", w.weight("w2", (8, 8))], "h2")
    h2b = w.node("Add", ["h2", w.weight("bias2", (8,))], "h2b")
    w.node("Add", [w.node("ReduceMean", ["x"], "m", axes=[1]), h2b], "y")
    proto = w.model((1, 20, 8), "y", opset=17)
    model = load(proto, heuristic_session())
    assert [s.operator for s in model.steps].count("add") == 2
    assert not any(s.problem.param("residual") for s in model.steps if s.operator == "linear")
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_a_segmentation_head_with_resize_matches_onnxruntime():
    """An FCN-style head as torchvision exports it: a conv, then a bilinear Resize to a fixed
    size (sizes, half_pixel), and an FPN-style nearest x2 upsample by scales, searched."""
    w = _models.GraphWriter()
    w.node("Conv", ["x", w.weight("w", (6, 3, 3, 3)), w.weight("b", (6,))], "c", pads=[1] * 4)
    w.node("Resize", ["c", w.const("roi", np.zeros(0, np.float32)), "",
                      w.const("sizes", np.array([1, 6, 23, 29], np.int64))], "up",
           mode="linear", coordinate_transformation_mode="pytorch_half_pixel")
    w.node("Resize", ["up", "", w.const("scales", np.array([1, 1, 2, 2], np.float32))], "y",
           mode="nearest", nearest_mode="floor", coordinate_transformation_mode="asymmetric")
    proto = w.model((1, 3, 10, 12), "y", opset=17)
    model = load(proto, fastrun.session(cache=InMemoryCache(), strategy="fast-run", **FAST))
    assert [step.operator for step in model.steps] == ["conv", "resize", "resize"]
    assert_matches_onnxruntime(proto, model, model.random_inputs())


@pytest.mark.parametrize("opset", [9, 10, 13])
def test_upsample_and_early_resize_match_onnxruntime(opset):
    """Upsample (opset 9) and opset 10's Resize: scales as an input, asymmetric nearest."""
    w = _models.GraphWriter()
    op_type = "Upsample" if opset == 9 else "Resize"
    inputs = ["x", w.const("scales", np.array([1, 1, 2, 3], np.float32))]
    if opset >= 11:
        inputs.insert(1, w.const("roi", np.zeros(0, np.float32)))
    w.node(op_type, inputs, "y", mode="nearest")
    proto = w.model((1, 2, 5, 4), "y", opset=opset)
    model = load(proto, heuristic_session())
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_resize_with_scales_computed_at_run_time_is_refused_by_name():
    w = _models.GraphWriter()
    w.node("Abs", [w.const("s", np.array([1, 1, 2, 2], np.float32))], "scales")
    w.node("Mul", ["scales", "x"], "mixed")  # not constant: depends on x
    w.node("ReduceMax", ["mixed"], "top", axes=[0, 2, 3], keepdims=0)
    w.node("Resize", ["x", "", "top"], "y", name="odd_resize", mode="nearest")
    with pytest.raises(UnsupportedOperatorError, match=r"odd_resize.*scales.*computed at run"):
        load(w.model((1, 4, 4, 4), "y", opset=13), heuristic_session())


def test_ops_with_no_lowering_are_computed_when_their_inputs_are_constants():
    """Shape arithmetic as exporters write it: a mask built from the input's static shape
    with Range, Mod, Equal and Where, and a Sqrt of a constant; none of them is lowered, all
    are computed at load, and the model runs only the Mul and the Add."""
    w = _models.GraphWriter()
    w.node("Shape", ["x"], "shape")
    width = w.node("Gather", ["shape", w.const("two", np.array(2, np.int64))], "width", axis=0)
    w.node("Range", [w.const("start", np.array(0, np.int64)), width,
                     w.const("step", np.array(1, np.int64))], "columns")
    w.node("Mod", ["columns", w.const("three", np.array(3, np.int64))], "phase")
    w.node("Equal", ["phase", w.const("zero", np.array(0, np.int64))], "mask")
    w.node("Where", ["mask", w.const("one", np.array(1.0, np.float32)),
                     w.const("half", np.array(0.5, np.float32))], "scale")
    w.node("Sqrt", [w.const("four", np.array([4.0], np.float32))], "root")
    w.node("Mul", ["x", "scale"], "scaled")
    w.node("Add", ["scaled", "root"], "y")
    proto = w.model((2, 4, 7), "y", opset=17, output_rank=3)
    model = load(proto, heuristic_session())
    assert [step.operator for step in model.steps] == ["mul", "add"]
    assert_matches_onnxruntime(proto, model, model.random_inputs())


def test_an_unsupported_op_on_a_computed_tensor_is_named_and_the_list_said_once():
    w = _models.GraphWriter()
    w.node("Relu", ["x"], "r")
    w.node("Hardmax", ["r"], "e", name="the_hardmax")
    w.node("Relu", ["e"], "after")  # downstream of the Hardmax: skipped, not reported
    w.node("Hardmax", ["after"], "y", name="second_hardmax")
    proto = w.model((2, 3), "y", output_rank=2)
    with pytest.raises(UnsupportedOperatorError) as caught:
        load(proto, heuristic_session())
    text = str(caught.value)
    assert [name for _, name, _ in caught.value.problems] == ["the_hardmax", "second_hardmax"]
    assert text.count("fastrun lowers these op types:") == 1
    assert len(re.findall(r"\bConv\b", text)) == 1
    assert "Hardmax (node 'the_hardmax'): no lowering for this op type\n" in text


@pytest.mark.parametrize("spec, message", [
    (b"not a model", "cannot parse"),
    ("/nonexistent/model.onnx", "does not exist"),
    ("zoo:nosuchmodel", "nosuchmodel"),
])
def test_unreadable_models_fail_clearly(spec, message):
    with pytest.raises((ModelError, ValueError), match=message):
        load(spec, heuristic_session())


def test_a_dangling_input_is_a_model_error():
    w = _models.GraphWriter()
    w.node("Relu", ["nowhere"], "y", name="lost")
    graph = helper.make_graph(w.nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ModelError, match="nowhere"):
        load(proto, heuristic_session(), check=False)


def test_an_opset_newer_than_onnx_knows_is_refused():
    proto = _models.conv_bn_relu()
    proto.opset_import[0].version = 99
    with pytest.raises(ModelError, match="opset 99"):
        load(proto, heuristic_session(), check=False)


def test_models_older_than_opset_7_are_upgraded():
    w = _models.GraphWriter()
    w.node("Relu", ["x"], "y")
    proto = w.model((1, 4), "y", opset=6, output_rank=2)
    model = load(proto, heuristic_session())
    x = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_array_equal(model.run({"x": x})["y"], np.maximum(x, 0))


def test_wrong_inputs_at_run_time_are_named():
    model = load(_models.conv_bn_relu(), heuristic_session())
    with pytest.raises(ValueError, match="prepared for"):
        model.run({"x": np.zeros((2, 3, 10, 10), np.float32)})
    with pytest.raises(ValueError, match="unknown input"):
        model.run({"x": np.zeros((1, 3, 10, 10), np.float32), "z": np.zeros(1)})
    with pytest.raises(ValueError, match="missing"):
        model.run({})


# -- searches and the cache --------------------------------------------------------------------
def test_second_run_with_the_same_cache_profiles_nothing(tmp_path):
    path = tmp_path / "cache.bin"
    proto = _models.small_cnn()
    first = fastrun.session(cache=path, strategy="fast-run", **FAST)
    load(proto, first).search()
    assert first.stats.profiled > 0
    second = fastrun.session(cache=path, strategy="fast-run", **FAST)
    load(proto, second).search()
    # only a pick a loaded machine timed unstably (low-confidence) is measured again
    assert second.stats.profiled == second.stats.remeasured and second.stats.cache_hits > 0
    assert {d.source for d in second.chooser.decisions()} <= {"cache", "only", "profiled"}


def test_a_search_opens_one_parallel_build_context_for_all_its_steps(monkeypatch):
    """A model's search keeps one pool of build helpers for every step (a device that compiles
    programs starts its helpers once, not per step); deciding from a heuristic builds nothing
    ahead and opens none."""
    opened = []
    proto = _models.small_cnn()
    for strategy, expected in (("fast-run", 1), ("heuristic", 0)):
        session = fastrun.session(cache=InMemoryCache(), strategy=strategy, **FAST)
        device = type(session.device)
        real = device.parallel_builds

        def counted(self, real=real, strategy=strategy):
            opened.append(strategy)
            return real(self)

        monkeypatch.setattr(device, "parallel_builds", counted)
        load(proto, session).search()
        # once for the whole search: the CPU's candidates have no build hook, so no
        # build-ahead opens one of its own (on OpenCL those nest inside the model's)
        assert opened.count(strategy) == expected
        monkeypatch.setattr(device, "parallel_builds", real)


def test_two_models_share_one_cache_file(tmp_path):
    """The second model's search reuses what the first measured, and a second load of each
    measures nothing, except a pick whose timing was unstable (low-confidence): searches
    measure those again (a loaded test machine makes some)."""
    path = tmp_path / "shared.bin"
    protos = [_models.small_cnn(), _models.conv_bn_relu()]
    searched: set[tuple[str, str]] = set()
    for proto in protos:
        session = fastrun.session(cache=path, strategy="fast-run", **FAST)
        load(proto, session).search()
        searched |= _profiled_keys(session)
    assert searched and len(FileCache(path)) == len(searched)
    for proto in protos:
        shaky = {(category, key) for category, key, entries in FileCache(path)
                 if low_confidence(entries) is not None}
        session = fastrun.session(cache=path, strategy="fast-run", **FAST)
        load(proto, session).search()
        assert _profiled_keys(session) <= shaky and session.stats.cache_hits > 0


def _profiled_keys(session) -> set[tuple[str, str]]:
    return {(d.category, d.problem.key) for d in session.chooser.decisions()
            if d.source is Source.PROFILED}


def test_cache_only_mode_never_profiles(tmp_path):
    path = tmp_path / "cache.bin"
    searched = fastrun.session(cache=path, strategy="fast-run", **FAST)
    load(_models.small_cnn(), searched).search()
    reader = fastrun.session(cache=path, strategy="heuristic", progress=False)
    load(_models.small_cnn(), reader).search()
    load(_models.conv_bn_relu(), reader).search()  # not in the cache: heuristics
    assert reader.stats.profiled == 0
    assert reader.stats.cache_hits > 0 and reader.stats.heuristic >= 1


def test_reproducible_search_chooses_only_reproducible_algorithms():
    session = fastrun.session(cache=InMemoryCache(), strategy="fast-run+reproducible", **FAST)
    model = load(_models.small_cnn(widths=(16, 16)), session)
    model.search()
    for decision in session.chooser.decisions():
        assert decision.algorithm.attributes & AlgoAttribute.REPRODUCIBLE, decision.algorithm
    assert model.run(model.random_inputs())["y"].shape == (1, 5)


# -- the built-in models ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def zoo_models():
    from fastrun.runtime import zoo

    return {name: zoo.build(name) for name in zoo.names()}


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "vgg16", "squeezenet",
                                  "vit_ti16", "bert_base", "mobilenet_v3_large",
                                  "convnext_tiny", "fcn_resnet18"])
def test_zoo_models_match_onnxruntime(zoo_models, name):
    model = load(zoo_models[name], heuristic_session())
    assert_matches_onnxruntime(zoo_models[name], model, model.random_inputs(seed=3), rtol=1e-4)


def test_the_transformers_run_as_few_wide_steps(zoo_models):
    """Every projection is one ``linear`` step with its bias (the MLP's first with its GELU,
    the output projection and the MLP's second with the residual add after them), the
    attention's products stay batched matmuls, and the only adds left are ViT's position
    embedding and its classifier's bias."""
    for name, layers in (("vit_ti16", 12), ("vit_b16", 12), ("bert_base", 12)):
        model = load(zoo_models[name], heuristic_session())
        operators = collections.Counter(step.operator for step in model.steps)
        head = name != "bert_base"  # a ViT's classifier: one row at batch 1, a matmul and an add
        assert operators["linear"] == 6 * layers, name
        activations = collections.Counter(step.problem.param("activation")
                                          for step in model.steps if step.operator == "linear")
        assert activations["gelu"] == layers, name
        assert sum(bool(step.problem.param("residual")) for step in model.steps
                   if step.operator == "linear") == 2 * layers, name
        assert operators["matmul"] == 2 * layers + head
        assert operators["add"] == 2 * head  # ViT's position embedding, its classifier's bias
        assert operators["layer_norm"] == 2 * layers + head
        assert not {"gelu", "erf", "mul"} & set(operators), name


def test_a_zoo_model_at_batch_2_with_weight_preprocessing(zoo_models):
    proto = zoo_models["resnet18"]
    model = load(proto, heuristic_session(), batch=2, weight_preprocess=True)
    assert any(s.problem.weight_preprocess for s in model.steps if s.operator == "conv")
    assert_matches_onnxruntime(proto, model, model.random_inputs(seed=4), rtol=1e-4)


def test_resnet_graph_passes(zoo_models):
    """resnet50's Conv+BN+Relu triples fold into single convs, each residual Add and the Relu
    after it into the conv that ends the block, its Shape/Gather/Unsqueeze/Concat flatten folds
    to a constant, and nothing but computing steps remain."""
    model = load(zoo_models["resnet50"], heuristic_session())
    operators = [step.operator for step in model.steps]
    assert "batch_norm" not in operators
    assert operators.count("conv") == 53
    assert "relu" not in operators
    assert "add_relu" not in operators
    residual = [s for s in model.steps if s.operator == "conv" and s.problem.param("residual")]
    assert len(residual) == 16  # one per residual block
    assert operators.count("add") == 1  # the classifier's bias
    assert {step.op_type for step in model.steps}.isdisjoint(
        {"Shape", "Gather", "Unsqueeze", "Concat", "Identity", "Dropout"})


def test_mobilenet_relu6_folds_into_the_conv_epilogue(zoo_models):
    model = load(zoo_models["mobilenet_v2"], heuristic_session())
    operators = [step.operator for step in model.steps]
    assert "clip" not in operators and "batch_norm" not in operators
    clipped = [s for s in model.steps if s.problem is not None
               and s.problem.param("activation") == "clip"]
    assert clipped and all(s.problem.param("clip_max") == 6.0 for s in clipped)


# -- a model's random inputs never need more memory than themselves (issue 32, D9) -----------

@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64])
def test_random_inputs_are_drawn_without_a_temporary_larger_than_the_input(dtype):
    """A 16 GiB float32 input under the memory limit once needed a 32 GiB float64 temporary,
    and load_and_run showed a traceback; here the peak of the draw is the input itself."""
    import tracemalloc

    shape = [1, 2048, 1024]
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph([node], "big", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("y", dtype, shape)])
    model = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                 session=fastrun.Session(cache=InMemoryCache(), progress=False))
    tracemalloc.start()
    try:
        feeds = model.random_inputs()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    nbytes = feeds["x"].nbytes
    assert peak < nbytes + (9 << 20), (peak, nbytes)  # the array and one 8 MiB chunk at most


def test_a_model_input_over_the_memory_limit_is_refused_before_it_is_drawn(monkeypatch):
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1 << 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1 << 20])])
    model = load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                 session=fastrun.Session(cache=InMemoryCache(), progress=False))
    monkeypatch.setenv("FASTRUN_MEMORY_LIMIT", "8MiB")
    with pytest.raises(ValueError, match=r"model input 'x'.*FASTRUN_MEMORY_LIMIT"):
        model.random_inputs()


def test_a_traced_run_accounts_for_the_whole_wall_time():
    """The wall time of an inference, split into its steps and what lies between them
    (issue 33, item 1): every step once, in order, and nothing counted twice or left out."""
    session = fastrun.session(cache=InMemoryCache(), **FAST)
    model = load(_models.small_cnn(widths=(8, 8)), session)
    feeds = model.random_inputs(seed=2)
    outputs, trace = model.run_traced(feeds)
    np.testing.assert_array_equal(outputs["y"], model.run(feeds)["y"])
    assert len(trace.steps) == model.step_count and len(trace.gap_ns) == model.step_count + 1
    assert all(start <= end for start, end in trace.steps)
    assert all(gap >= 0 for gap in trace.gap_ns)
    assert sum(trace.step_ns) + sum(trace.gap_ns) + (trace.ended - trace.issued) \
        == trace.total_ns
