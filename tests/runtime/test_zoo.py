"""The built-in zoo models are valid ONNX, deterministic, numerically sane under onnxruntime, and
contain the exporter patterns the runtime's graph passes are written for.

Models are built once per module (vgg16 alone is 553 MB), and every model runs under onnxruntime
exactly once at batch 1.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import fastrun
from fastrun.runtime import zoo

ALL = ["bert_base", "convnext_tiny", "fcn_resnet18", "mobilenet_v2", "mobilenet_v3_large",
       "resnet18", "resnet50", "squeezenet", "vgg16", "vit_b16", "vit_ti16"]
SMALL = [n for n in ALL if n not in ("vgg16", "bert_base", "vit_b16", "convnext_tiny")]
TRANSFORMERS = ("bert_base", "vit_b16", "vit_ti16")
#: the models written at opset 17 unless told otherwise (LayerNormalization, HardSwish)
OPSET_17 = (*TRANSFORMERS, "convnext_tiny", "fcn_resnet18", "mobilenet_v3_large")

# trainable parameter counts of the models they follow (BN running statistics excluded):
# torchvision's (vit_b_16 too), timm's vit_tiny_patch16_224, BERT-base's encoder layers, and
# for fcn_resnet18 torchvision's resnet18 without its fc plus torchvision's FCNHead (21 classes)
TORCHVISION_PARAMS = {
    "bert_base": 85_054_464,
    "convnext_tiny": 28_589_128,
    "fcn_resnet18": 11_769_301,
    "mobilenet_v3_large": 5_483_032,
    "mobilenet_v2": 3_504_872,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "squeezenet": 1_235_496,
    "vgg16": 138_357_544,
    "vit_b16": 86_567_656,
    "vit_ti16": 5_717_416,
}
_NOT_PARAMS = ("running_mean", "running_var", ".min", ".max", ".ratio", ".root2", ".one",
               ".half", ".scale")


@pytest.fixture(scope="module")
def models():
    cache: dict[str, onnx.ModelProto] = {}

    def get(name: str) -> onnx.ModelProto:
        if name not in cache:
            cache[name] = zoo.build(name)
        return cache[name]

    yield get
    cache.clear()


def _image(batch: int) -> np.ndarray:
    return np.random.default_rng(1234).standard_normal((batch, 3, 224, 224), dtype=np.float32)


def _session(model: onnx.ModelProto, extra_outputs: tuple[str, ...] = ()):
    if extra_outputs:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in extra_outputs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


# -- API --------------------------------------------------------------------------------------
def test_names_and_describe():
    assert zoo.names() == ALL
    for name in ALL:
        line = zoo.describe(name)
        assert line and "\n" not in line
        assert ("torchvision" in line) == (name not in TRANSFORMERS)


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown zoo model 'resnet19'.*resnet18.*vgg16"):
        zoo.build("resnet19")
    with pytest.raises(ValueError, match="known models"):
        zoo.describe("alexnet")
    with pytest.raises(ValueError, match="unknown zoo model"):
        zoo.resolve("zoo:alexnet")
    with pytest.raises(ValueError, match="not a zoo model spec"):
        zoo.resolve("resnet18.onnx")


@pytest.mark.parametrize("opset", [zoo.MIN_OPSET - 1, zoo.MAX_OPSET + 1])
def test_unsupported_opset_is_rejected(opset):
    with pytest.raises(ValueError, match=f"opsets {zoo.MIN_OPSET}..{zoo.MAX_OPSET}"):
        zoo.build("squeezenet", opset=opset)


def test_transformers_default_to_opset_17_and_spell_layer_norm_out_before_it(models):
    """LayerNormalization exists from opset 17 on; before it the model has torch's nine
    nodes per LayerNorm, which compute the same, and which the runtime makes one step again."""
    assert [o.version for o in models("vit_ti16").opset_import] == [17]
    old = zoo.build("vit_ti16", opset=13)
    onnx.checker.check_model(old, full_check=True)
    kinds = {n.op_type for n in old.graph.node}
    assert "LayerNormalization" not in kinds and {"ReduceMean", "Pow", "Sqrt"} <= kinds
    image = _image(1)
    np.testing.assert_allclose(_session(old).run(None, {"input": image})[0],
                               _session(models("vit_ti16")).run(None, {"input": image})[0],
                               rtol=1e-4, atol=1e-5)
    from fastrun.runtime import load

    model = load(old, fastrun.Session(strategy="heuristic", progress=False))
    operators = [step.operator for step in model.steps]
    assert operators.count("layer_norm") == 25 and "reduce" not in operators


def test_other_image_sizes_keep_the_weights_and_run():
    small = zoo.resolve("zoo:mobilenet_v2@96")
    dims = [d.dim_value or d.dim_param for d in small.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 3, 96, 96]
    default = zoo.build("mobilenet_v2")
    assert [t.raw_data for t in small.graph.initializer] == \
        [t.raw_data for t in default.graph.initializer]
    from fastrun.runtime import load

    model = load(small, fastrun.Session(strategy="heuristic", progress=False))
    out = model.run(model.random_inputs(0))["output"]
    assert out.shape == (1, 1000) and np.isfinite(out).all()


@pytest.mark.parametrize(("spec", "message"), [
    ("zoo:vgg16@160", "224x224 images only"),
    ("zoo:resnet18@16", "below the smallest"),
    ("zoo:resnet18@big", "whole number of pixels"),
])
def test_bad_image_sizes_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        zoo.resolve(spec)


def test_resolve_and_export(tmp_path):
    built = zoo.build("squeezenet").SerializeToString()
    assert zoo.resolve("zoo:squeezenet").SerializeToString() == built
    path = tmp_path / "squeezenet.onnx"
    zoo.export("squeezenet", path)
    assert onnx.load(path).SerializeToString() == built


# -- structure --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_model_is_valid_onnx(models, name):
    model = models(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.producer_name == "fastrun.zoo"
    opset = 17 if name in OPSET_17 else zoo.DEFAULT_OPSET
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]

    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == "input" and out.name == "output"
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    out_dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    if name == "bert_base":
        assert dims == out_dims == ["N", 128, 768]
    elif name == "fcn_resnet18":
        assert dims == ["N", 3, 224, 224] and out_dims == ["N", 21, 224, 224]
    else:
        assert dims == ["N", 3, 224, 224] and out_dims == ["N", 1000]

    node_names = [n.name for n in model.graph.node]
    assert all(node_names) and len(set(node_names)) == len(node_names)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                 if not t.name.endswith(_NOT_PARAMS))
    assert params == TORCHVISION_PARAMS[name]


@pytest.mark.parametrize("name", SMALL)
def test_weights_are_deterministic(models, name):
    assert zoo.build(name, seed=0).SerializeToString() == models(name).SerializeToString()
    other = zoo.build(name, seed=1)
    assert [n.SerializeToString() for n in other.graph.node] == \
        [n.SerializeToString() for n in models(name).graph.node]
    a, b = _initializers(models(name)), _initializers(other)
    assert a.keys() == b.keys()
    weights = [k for k in a if k.endswith(".weight")]
    assert weights and all(not np.array_equal(a[k], b[k]) for k in weights)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnets_have_unfused_conv_bn(models, name):
    model = models(name)
    producers = _producers(model)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(bns) == len(convs) == {"resnet18": 20, "resnet50": 53}[name]
    assert all(producers[bn.input[0]].op_type == "Conv" for bn in bns)
    assert all(len(c.input) == 2 for c in convs)  # bias-free, as torchvision
    adds = [n for n in model.graph.node if n.op_type == "Add"]
    assert len(adds) == {"resnet18": 8, "resnet50": 16}[name]
    gemm = producers["output"]
    assert gemm.op_type == "Gemm" and onnx.helper.get_node_attr_value(gemm, "transB") == 1


def test_resnet18_flattens_with_flatten(models):
    producers = _producers(models("resnet18"))
    assert producers[producers["output"].input[0]].op_type == "Flatten"


def test_resnet50_flattens_like_old_view(models):
    model = models("resnet50")
    producers = _producers(model)
    reshape = producers[producers["output"].input[0]]
    assert reshape.op_type == "Reshape"
    concat = producers[reshape.input[1]]
    assert concat.op_type == "Concat"
    unsqueeze, minus_one = (producers[i] for i in concat.input)
    assert unsqueeze.op_type == "Unsqueeze" and minus_one.op_type == "Constant"
    assert len(unsqueeze.input) == 2  # axes as an input from opset 13
    gather = producers[unsqueeze.input[0]]
    assert gather.op_type == "Gather"
    assert producers[gather.input[0]].op_type == "Shape"
    assert producers[gather.input[1]].op_type == "Constant"


def test_mobilenet_v2_patterns(models):
    model = models("mobilenet_v2")
    inits = _initializers(model)
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert len(clips) == 35
    for clip in clips:
        assert float(inits[clip.input[1]]) == 0.0 and float(inits[clip.input[2]]) == 6.0
    depthwise = [n for n in model.graph.node if n.op_type == "Conv"
                 and onnx.helper.get_node_attr_value(n, "group") > 1]
    assert len(depthwise) == 17
    for conv in depthwise:
        group = onnx.helper.get_node_attr_value(conv, "group")
        assert inits[conv.input[1]].shape == (group, 1, 3, 3)
    assert sum(n.op_type == "Add" for n in model.graph.node) == 10
    (dropout,) = [n for n in model.graph.node if n.op_type == "Dropout"]
    assert len(dropout.input) == 2 and float(inits[dropout.input[1]]) == pytest.approx(0.2)


def test_mobilenet_v3_convnext_and_fcn_patterns(models):
    """What the three bring that the older models do not: Hardswish and squeeze-excitation
    gates, LayerNorm over the channels between transposes with a GELU MLP and a layer
    scale, and a bilinear Resize whose sizes come from the tensor's shape."""
    kinds = {name: collections.Counter(n.op_type for n in models(name).graph.node)
             for name in ("mobilenet_v3_large", "convnext_tiny", "fcn_resnet18")}
    v3 = kinds["mobilenet_v3_large"]
    assert v3["HardSwish"] == 21 and v3["HardSigmoid"] == 8 and v3["GlobalAveragePool"] == 9
    convnext = kinds["convnext_tiny"]
    assert convnext["LayerNormalization"] == 18 + 3 + 2 and convnext["Erf"] == 18
    assert convnext["Transpose"] == 2 * (18 + 3 + 2)
    resize = next(n for n in models("fcn_resnet18").graph.node if n.op_type == "Resize")
    attrs = {a.name: a for a in resize.attribute}
    assert attrs["mode"].s == b"linear"
    assert attrs["coordinate_transformation_mode"].s == b"pytorch_half_pixel"
    older = zoo.build("mobilenet_v3_large", opset=13)
    assert "HardSwish" not in {n.op_type for n in older.graph.node}
    image = _image(1)
    np.testing.assert_allclose(_session(older).run(None, {"input": image})[0],
                               _session(models("mobilenet_v3_large")).run(
                                   None, {"input": image})[0], rtol=1e-4, atol=1e-5)


def test_vgg16_and_squeezenet_patterns(models):
    vgg = [n.op_type for n in models("vgg16").graph.node]
    assert vgg.count("Dropout") == 2 and vgg.count("Gemm") == 3 and vgg.count("Conv") == 13
    squeeze = models("squeezenet")
    ops = [n.op_type for n in squeeze.graph.node]
    assert ops.count("Dropout") == 1 and ops.count("Concat") == 8
    assert ops[-1] == "Softmax"
    ceil = [onnx.helper.get_node_attr_value(n, "ceil_mode") for n in squeeze.graph.node
            if n.op_type == "MaxPool"]
    assert ceil == [1, 1, 1]


# -- numerics ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_runs_under_onnxruntime(models, name):
    # squeezenet outputs probabilities: check the spread of the logits before its Softmax
    extra = ("flatten",) if name == "squeezenet" else ()
    if name == "bert_base":
        tokens = np.random.default_rng(1234).standard_normal((1, 128, 768), dtype=np.float32)
        out = _session(models(name)).run(None, {"input": tokens})[0]
        assert out.shape == (1, 128, 768) and np.isfinite(out).all()
        # each token's row is layer-normalised: mean about beta's, spread about gamma's
        assert 0.7 < float(out.std()) < 1.3 and abs(float(out.mean())) < 0.1
        return
    outputs = _session(models(name), extra).run(None, {"input": _image(1)})
    out = outputs[0]
    assert out.shape == ((1, 21, 224, 224) if name == "fcn_resnet18" else (1, 1000))
    assert out.dtype == np.float32
    assert np.isfinite(out).all()
    logits = outputs[-1]
    assert np.isfinite(logits).all()
    assert 1e-2 < float(logits.std()) < 1e3
    if name == "squeezenet":
        assert float(out.sum()) == pytest.approx(1.0, abs=1e-4)
        assert float(out.max()) < 0.9  # not saturated to one class


def test_resnet18_symbolic_batch(models):
    session = _session(models("resnet18"))
    images = _image(2)
    both = session.run(None, {"input": images})[0]
    first = session.run(None, {"input": images[:1]})[0]
    assert both.shape == (2, 1000) and np.isfinite(both).all()
    assert not np.allclose(both[0], both[1])
    np.testing.assert_allclose(both[:1], first, rtol=1e-4, atol=1e-4 * float(np.abs(first).max()))


@pytest.mark.parametrize("opset", [11, 12, 17, zoo.MAX_OPSET])
def test_other_opsets(models, opset):
    """Opset-dependent spellings (Unsqueeze axes, Dropout ratio) compute the same thing."""
    image = _image(1)
    for name in ("resnet50", "mobilenet_v2"):
        model = zoo.build(name, opset=opset)
        onnx.checker.check_model(model, full_check=True)
        nodes = {n.op_type: n for n in model.graph.node}
        if name == "resnet50":
            assert len(nodes["Unsqueeze"].input) == (1 if opset < 13 else 2)
        else:
            assert len(nodes["Dropout"].input) == (1 if opset < 12 else 2)
        got = _session(model).run(None, {"input": image})[0]
        want = _session(models(name)).run(None, {"input": image})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_the_command_line_exports_at_each_models_own_default_opset(tmp_path, capsys):
    from fastrun.cli.main import main

    for name, opset in (("vit_ti16", 17), ("squeezenet", zoo.DEFAULT_OPSET)):
        path = tmp_path / f"{name}.onnx"
        assert main(["zoo", "export", name, "-o", str(path)]) == 0
        assert [o.version for o in onnx.load(path).opset_import] == [opset]
        assert f"opset {opset}" in capsys.readouterr().out
    assert main(["zoo", "export", "vit_ti16", "-o", str(tmp_path / "v.onnx"),
                 "--opset", "13"]) == 0
    assert "opset 13" in capsys.readouterr().out
