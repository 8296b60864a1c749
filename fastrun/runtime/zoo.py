"""Built-in ONNX models, generated in code: the runtime's quickstart, tests and benchmarks need real
network shapes without downloading anything.

Each model reproduces the torchvision architecture of the same name, written the way PyTorch's ONNX
exporter writes it (Conv -> BatchNormalization -> Relu unfused, Clip with min/max inputs for
ReLU6, Dropout nodes, the ``x.view(x.size(0), -1)`` flatten chain of older exporters, ...), so that
loading one of them exercises the graph passes a downloaded model would.  The weights are random
but deterministic (``numpy.random.default_rng(seed)``) and scaled so that activations keep a sane
range through the whole network: outputs are finite and spread enough to compare against another
runtime with a relative tolerance.  They are not trained: the "classes" mean nothing.

Every model has one input ``"input"`` (float32, ``["N", 3, 224, 224]``, symbolic batch ``N``)
and one output ``"output"`` (float32, ``["N", 1000]``), except ``bert_base`` (embedded tokens
in and out, ``["N", 128, 768]``) and the segmentation model ``fcn_resnet18`` (``["N", 21,
224, 224]``).  The models that end in a global pool (all but
vgg16, whose classifier fixes 7x7 features) are also built for other square images:
``build("resnet18", image_size=160)``, or the spec ``zoo:resnet18@160``, with the same weights (the
weights do not depend on the image size), for a deployment whose inputs vary in size.
``squeezenet`` ends in a Softmax, so its output holds probabilities; the others output logits.

API::

    names()                                   # ["mobilenet_v2", "resnet18", ...]
    describe("resnet18")                      # one line, e.g. for `fastrun zoo list`
    build("resnet50", seed=0, opset=13)       # onnx.ModelProto
    build("mobilenet_v2", image_size=160)     # the same weights, for 160x160 images
    export("vgg16", "vgg16.onnx", seed=0)     # writes the file
    resolve("zoo:resnet18")                   # what the runtime calls for a "zoo:" model spec
    resolve("zoo:resnet18@288")               # ... at another image size
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "DEFAULT_OPSET",
    "INPUT_NAME",
    "MAX_OPSET",
    "MIN_OPSET",
    "OUTPUT_NAME",
    "PREFIX",
    "build",
    "describe",
    "export",
    "names",
    "resolve",
]

#: Model specs the runtime hands to :func:`resolve` start with this.
PREFIX = "zoo:"

DEFAULT_OPSET = 13
#: Clip takes min/max as inputs only from opset 11; everything used here is expressible up to 21
#: (later opsets only widen type lists, but need an IR version older onnxruntimes reject).
MIN_OPSET = 11
MAX_OPSET = 21

#: IR 8 is what the exporter wrote for opsets 13..17 and every supported onnxruntime loads it;
#: newer opsets require a newer IR (taken from onnx's version table).
_BASE_IR_VERSION = 8

PRODUCER_NAME = "fastrun.zoo"

INPUT_NAME = "input"
OUTPUT_NAME = "output"
IMAGE_SIZE = 224
#: Smallest image: every model downsamples by 32 before its global pool.
MIN_IMAGE_SIZE = 32
NUM_CLASSES = 1000
_BN_EPS = 1e-5


# --------------------------------------------------------------------------------------------
# graph writer
# --------------------------------------------------------------------------------------------
class _Writer:
    """Appends nodes and initializers straight into a ModelProto.

    Writing into ``model.graph`` in place (rather than collecting protos for ``helper.make_graph``
    / ``make_model``, which copy them) matters for vgg16: its 550 MB of weights are copied once,
    from the numpy array into the proto, and never again.

    Tensor names equal the name of the node producing them (ONNX keeps node and tensor names in
    separate namespaces), which keeps the graph readable in Netron and in error messages.
    """

    def __init__(self, seed: int, opset: int, image_size: int = IMAGE_SIZE):
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.image_size = image_size
        self.model = onnx.ModelProto()
        self.graph = self.model.graph
        self._node_names: set[str] = set()
        self._tensor_names: set[str] = {INPUT_NAME}

    # -- bookkeeping ---------------------------------------------------------------------------
    def _claim_tensor(self, name: str) -> str:
        if name in self._tensor_names:
            raise AssertionError(f"zoo: tensor name {name!r} used twice")
        self._tensor_names.add(name)
        return name

    def node(self, op: str, inputs: list[str], name: str, *, output: str | None = None,
             **attrs) -> str:
        """Adds one node with a single output; returns the output's name."""
        if name in self._node_names:
            raise AssertionError(f"zoo: node name {name!r} used twice")
        self._node_names.add(name)
        out = self._claim_tensor(output or name)
        self.graph.node.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def initializer(self, name: str, array: np.ndarray) -> str:
        """Stores ``array`` as an initializer (raw little-endian data, as the exporter does)."""
        self._claim_tensor(name)
        array = np.asarray(array)  # not ascontiguousarray: it turns scalars into shape [1]
        tensor = self.graph.initializer.add()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        tensor.raw_data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        return name

    def constant(self, name: str, array: np.ndarray) -> str:
        """A ``Constant`` node, as the exporter emits for the shape arithmetic of ``view``."""
        value = numpy_helper.from_array(np.asarray(array), name=name)
        return self.node("Constant", [], name, value=value)

    # -- random weights -----------------------------------------------------------------------
    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        out = self.rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(std)
        return out

    def uniform(self, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
        out = self.rng.random(shape, dtype=np.float32)
        out *= np.float32(high - low)
        out += np.float32(low)
        return out

    # -- layers -------------------------------------------------------------------------------
    def conv(self, name: str, x: str, cin: int, cout: int, kernel: int, *, stride: int = 1,
             pad: int = 0, group: int = 1, bias: bool = False, gain: float = 2.0) -> str:
        """Conv with Kaiming-normal weights over fan-in.

        Fan-in (not torchvision's fan-out) because the BatchNormalizations here run in inference
        mode with fixed statistics and cannot renormalise: with fan-out a depthwise conv would
        shrink its output by the channel count.  ``gain`` 2 keeps the second moment through a
        following Relu, 1 through a linear layer.
        """
        fan_in = cin // group * kernel * kernel
        inputs = [x, self.initializer(f"{name}.weight",
                                      self.normal((cout, cin // group, kernel, kernel),
                                                  (gain / fan_in) ** 0.5))]
        if bias:
            inputs.append(self.initializer(f"{name}.bias", self.normal((cout,), 0.01)))
        return self.node("Conv", inputs, name, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[pad] * 4, group=group,
                         dilations=[1, 1])

    def batchnorm(self, name: str, x: str, channels: int, *, scale: float = 1.0) -> str:
        """Inference-mode BatchNormalization with plausible statistics.

        running_var ~ U(0.5, 1.5), running_mean and beta small; gamma is drawn relative to
        sqrt(running_var) so that gamma / sqrt(var) ~ U(0.8, 1.2) * ``scale``: independent draws
        would shrink activations by ~0.8 per layer, which vanishes through mobilenet_v2's 52
        layers.
        """
        var = self.uniform((channels,), 0.5, 1.5)
        gamma = self.uniform((channels,), 0.8 * scale, 1.2 * scale) * np.sqrt(var + _BN_EPS)
        beta = self.normal((channels,), 0.05)
        mean = self.normal((channels,), 0.05)
        inputs = [x, self.initializer(f"{name}.weight", gamma),
                  self.initializer(f"{name}.bias", beta),
                  self.initializer(f"{name}.running_mean", mean),
                  self.initializer(f"{name}.running_var", var)]
        return self.node("BatchNormalization", inputs, name, epsilon=_BN_EPS, momentum=0.9)

    def gemm(self, name: str, x: str, fan_in: int, fan_out: int, *, output: str | None = None,
             relu_follows: bool = False) -> str:
        """Linear layer as the exporter writes it: Gemm(x, W[out, in], b, transB=1).

        Uniform weights (PyTorch's default Linear init is uniform too); the bound keeps the
        second moment through a following Relu when there is one, otherwise it is PyTorch's
        1/sqrt(fan_in).
        """
        bound = (6.0 / fan_in) ** 0.5 if relu_follows else fan_in ** -0.5
        weight = self.uniform((fan_out, fan_in), -bound, bound)
        bias = self.uniform((fan_out,), -fan_in ** -0.5, fan_in ** -0.5)
        return self.node("Gemm", [x, self.initializer(f"{name}.weight", weight),
                                  self.initializer(f"{name}.bias", bias)],
                         name, output=output, alpha=1.0, beta=1.0, transB=1)

    def relu(self, name: str, x: str) -> str:
        return self.node("Relu", [x], name)

    def relu6(self, name: str, x: str) -> str:
        """ReLU6 as Clip with min/max initializer inputs (the opset >= 11 form)."""
        lo = f"{name}.min"
        hi = f"{name}.max"
        self.initializer(lo, np.array(0.0, dtype=np.float32))
        self.initializer(hi, np.array(6.0, dtype=np.float32))
        return self.node("Clip", [x, lo, hi], name)

    def maxpool(self, name: str, x: str, kernel: int, stride: int, pad: int = 0,
                ceil_mode: int = 0) -> str:
        return self.node("MaxPool", [x], name, kernel_shape=[kernel, kernel],
                         strides=[stride, stride], pads=[pad] * 4, ceil_mode=ceil_mode)

    def dropout(self, name: str, x: str, ratio: float) -> str:
        """Dropout (an identity at inference): ratio is an attribute before opset 12, an input
        after; no training_mode input, as in an exporter's eval-mode graph."""
        if self.opset < 12:
            return self.node("Dropout", [x], name, ratio=ratio)
        r = self.initializer(f"{name}.ratio", np.array(ratio, dtype=np.float32))
        return self.node("Dropout", [x, r], name)

    def unsqueeze(self, name: str, x: str, axes: list[int]) -> str:
        """Unsqueeze: axes are an attribute before opset 13, a (Constant) input from 13 on."""
        if self.opset < 13:
            return self.node("Unsqueeze", [x], name, axes=axes)
        a = self.constant(f"{name}.axes", np.array(axes, dtype=np.int64))
        return self.node("Unsqueeze", [x, a], name)

    def hardsigmoid(self, name: str, x: str) -> str:
        """torch's Hardsigmoid: relu6(x + 3) / 6, HardSigmoid with alpha 1/6."""
        return self.node("HardSigmoid", [x], name, alpha=1.0 / 6.0, beta=0.5)

    def hardswish(self, name: str, x: str) -> str:
        """HardSwish from opset 14 on; before it torch exported x * HardSigmoid(x)."""
        if self.opset >= 14:
            return self.node("HardSwish", [x], name)
        return self.node("Mul", [x, self.hardsigmoid(f"{name}.gate", x)], name)

    def squeeze_excitation(self, name: str, x: str, channels: int, squeezed: int) -> str:
        """torchvision's SqueezeExcitation with MobileNetV3's gate: the global mean, a 1x1
        conv down with Relu, a 1x1 conv up with Hardsigmoid, the input scaled by it."""
        s = self.node("GlobalAveragePool", [x], f"{name}.avgpool")
        s = self.relu(f"{name}.relu", self.conv(f"{name}.fc1", s, channels, squeezed, 1,
                                                bias=True))
        s = self.conv(f"{name}.fc2", s, squeezed, channels, 1, bias=True, gain=1.0)
        return self.node("Mul", [x, self.hardsigmoid(f"{name}.hardsigmoid", s)], f"{name}.scale")

    def channel_layer_norm(self, name: str, x: str, channels: int, epsilon: float) -> str:
        """torchvision's LayerNorm2d: an NCHW tensor permuted to NHWC, normalised over the
        channels, permuted back."""
        nhwc = self.node("Transpose", [x], f"{name}.to_nhwc", perm=[0, 2, 3, 1])
        normed = self.layer_norm(name, nhwc, channels, epsilon)
        return self.node("Transpose", [normed], f"{name}.to_nchw", perm=[0, 3, 1, 2])

    # -- transformer layers -------------------------------------------------------------------
    def linear(self, name: str, x: str, fan_in: int, fan_out: int) -> str:
        """nn.Linear on a (N, S, fan_in) tensor as torch exports it: MatMul by W^T (in, out),
        then Add of the bias.  PyTorch's uniform init, bound 1/sqrt(fan_in)."""
        bound = fan_in ** -0.5
        weight = self.initializer(f"{name}.weight", self.uniform((fan_in, fan_out), -bound, bound))
        bias = self.initializer(f"{name}.bias", self.uniform((fan_out,), -bound, bound))
        return self.node("Add", [self.node("MatMul", [x, weight], f"{name}.matmul"), bias], name)

    def layer_norm(self, name: str, x: str, width: int, epsilon: float,
                   output: str | None = None) -> str:
        """LayerNorm over the last axis, gamma near 1 and beta small: LayerNormalization from
        opset 17 on, before it the nine nodes torch exported (ReduceMean, Sub, Pow, ReduceMean,
        Add, Sqrt, Div, Mul, Add)."""
        gamma = self.initializer(f"{name}.weight", self.uniform((width,), 0.8, 1.2))
        beta = self.initializer(f"{name}.bias", self.normal((width,), 0.05))
        if self.opset >= 17:
            return self.node("LayerNormalization", [x, gamma, beta], name, output=output,
                             axis=-1, epsilon=epsilon)

        def mean(source: str, node: str) -> str:
            if self.opset >= 18:
                axes = self.constant(f"{node}.axes", np.array([-1], np.int64))
                return self.node("ReduceMean", [source, axes], node, keepdims=1)
            return self.node("ReduceMean", [source], node, axes=[-1], keepdims=1)

        centered = self.node("Sub", [x, mean(x, f"{name}.mean")], f"{name}.centered")
        two = self.initializer(f"{name}.two", np.array(2.0, np.float32))
        variance = mean(self.node("Pow", [centered, two], f"{name}.squared"), f"{name}.variance")
        shifted = self.node("Add", [variance, self.initializer(
            f"{name}.epsilon", np.array(epsilon, np.float32))], f"{name}.shifted")
        normed = self.node("Div", [centered, self.node("Sqrt", [shifted], f"{name}.root")],
                           f"{name}.normed")
        return self.node("Add", [self.node("Mul", [normed, gamma], f"{name}.scaled"), beta],
                         name, output=output)

    def gelu(self, name: str, x: str) -> str:
        """GELU's exact form as torch exports it: x * (1 + erf(x / sqrt 2)) * 0.5."""
        root2 = self.initializer(f"{name}.root2", np.array(np.sqrt(2.0), np.float32))
        one = self.initializer(f"{name}.one", np.array(1.0, np.float32))
        half = self.initializer(f"{name}.half", np.array(0.5, np.float32))
        erf = self.node("Erf", [self.node("Div", [x, root2], f"{name}.div")], f"{name}.erf")
        gate = self.node("Add", [erf, one], f"{name}.add")
        return self.node("Mul", [self.node("Mul", [x, gate], f"{name}.mul"), half], name)

    def attention(self, name: str, x: str, hidden: int, heads: int) -> str:
        """Multi-head self-attention on (N, S, hidden), as a hand-written module exports:
        Q, K and V projections, heads split by Reshape and Transpose (K to (N, H, D, S)),
        MatMul, a Div by sqrt(D), Softmax, MatMul, heads merged, output projection."""
        depth = hidden // heads
        split = self.constant(f"{name}.split_shape", np.array([0, -1, heads, depth], np.int64))
        merge = self.constant(f"{name}.merge_shape", np.array([0, -1, hidden], np.int64))

        def heads_of(part: str, perm: list[int]) -> str:
            projected = self.linear(f"{name}.{part}", x, hidden, hidden)
            shaped = self.node("Reshape", [projected, split], f"{name}.{part}.split")
            return self.node("Transpose", [shaped], f"{name}.{part}.heads", perm=perm)

        q = heads_of("query", [0, 2, 1, 3])
        k = heads_of("key", [0, 2, 3, 1])
        v = heads_of("value", [0, 2, 1, 3])
        scale = self.initializer(f"{name}.scale", np.array(np.sqrt(depth), np.float32))
        scores = self.node("Div", [self.node("MatMul", [q, k], f"{name}.scores"), scale],
                           f"{name}.scaled")
        weights = self.node("Softmax", [scores], f"{name}.softmax", axis=-1)
        context = self.node("MatMul", [weights, v], f"{name}.context")
        merged = self.node("Reshape", [self.node("Transpose", [context], f"{name}.merge",
                                                 perm=[0, 2, 1, 3]), merge], f"{name}.merged")
        return self.linear(f"{name}.output", merged, hidden, hidden)

    # -- finishing ----------------------------------------------------------------------------
    def finish(self, model_name: str, output: str) -> onnx.ModelProto:
        if output != OUTPUT_NAME:
            raise AssertionError("zoo: the last node must write 'output'")
        g = self.graph
        g.name = model_name
        spec = _MODELS[model_name]
        g.input.append(helper.make_tensor_value_info(
            INPUT_NAME, TensorProto.FLOAT,
            ["N", *(spec.input_dims or (3, self.image_size, self.image_size))]))
        g.output.append(helper.make_tensor_value_info(
            OUTPUT_NAME, TensorProto.FLOAT, ["N", *(spec.output_dims or (NUM_CLASSES,))]))
        m = self.model
        opset_id = helper.make_opsetid("", self.opset)
        m.opset_import.append(opset_id)
        m.ir_version = max(_BASE_IR_VERSION, helper.find_min_ir_version_for([opset_id]))
        m.producer_name = PRODUCER_NAME
        m.producer_version = "1"
        m.doc_string = _MODELS[model_name].description
        return m


# --------------------------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------------------------
def _conv_bn(w: _Writer, prefix: str, idx: str, x: str, cin: int, cout: int, kernel: int,
             stride: int = 1, pad: int = 0, bn_scale: float = 1.0) -> str:
    x = w.conv(f"{prefix}conv{idx}", x, cin, cout, kernel, stride=stride, pad=pad)
    return w.batchnorm(f"{prefix}bn{idx}", x, cout, scale=bn_scale)


# The last BN of every residual branch is scaled down (a milder form of torchvision's
# zero_init_residual) so that the identity path dominates and the sum does not double per block.
_RESIDUAL_BN_SCALE = 0.4


def _basic_block(w: _Writer, p: str, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]:
    y = w.relu(f"{p}relu1", _conv_bn(w, p, "1", x, cin, planes, 3, stride, 1))
    y = _conv_bn(w, p, "2", y, planes, planes, 3, 1, 1, bn_scale=_RESIDUAL_BN_SCALE)
    if stride != 1 or cin != planes:
        x = w.conv(f"{p}downsample.0", x, cin, planes, 1, stride=stride)
        x = w.batchnorm(f"{p}downsample.1", x, planes)
    return w.relu(f"{p}relu2", w.node("Add", [y, x], f"{p}add")), planes


def _bottleneck(w: _Writer, p: str, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]:
    """torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3 conv)."""
    cout = planes * 4
    y = w.relu(f"{p}relu1", _conv_bn(w, p, "1", x, cin, planes, 1))
    y = w.relu(f"{p}relu2", _conv_bn(w, p, "2", y, planes, planes, 3, stride, 1))
    y = _conv_bn(w, p, "3", y, planes, cout, 1, bn_scale=_RESIDUAL_BN_SCALE)
    if stride != 1 or cin != cout:
        x = w.conv(f"{p}downsample.0", x, cin, cout, 1, stride=stride)
        x = w.batchnorm(f"{p}downsample.1", x, cout)
    return w.relu(f"{p}relu3", w.node("Add", [y, x], f"{p}add")), cout


def _resnet(w: _Writer, block: Callable, layers: list[int], expansion: int,
            view_flatten: bool) -> str:
    x = w.conv("conv1", INPUT_NAME, 3, 64, 7, stride=2, pad=3)
    x = w.relu("relu", w.batchnorm("bn1", x, 64))
    x = w.maxpool("maxpool", x, 3, 2, 1)
    channels = 64
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True), 1):
        for b in range(blocks):
            stride = 2 if i > 1 and b == 0 else 1
            x, channels = block(w, f"layer{i}.{b}.", x, channels, planes, stride)
    x = w.node("GlobalAveragePool", [x], "avgpool")
    if view_flatten:
        # x.view(x.size(0), -1) as exported by torch < 1.6: the batch size travels through
        # Shape/Gather/Unsqueeze/Concat into Reshape, all constant once the batch is fixed.
        shape = w.node("Shape", [x], "view.shape")
        index = w.constant("view.index", np.array(0, dtype=np.int64))
        batch = w.node("Gather", [shape, index], "view.gather", axis=0)
        batch = w.unsqueeze("view.unsqueeze", batch, [0])
        rest = w.constant("view.minus_one", np.array([-1], dtype=np.int64))
        target = w.node("Concat", [batch, rest], "view.concat", axis=0)
        x = w.node("Reshape", [x, target], "view.reshape")
    else:
        x = w.node("Flatten", [x], "flatten", axis=1)
    return w.gemm("fc", x, 512 * expansion, NUM_CLASSES, output=OUTPUT_NAME)


def _resnet18(w: _Writer) -> str:
    return _resnet(w, _basic_block, [2, 2, 2, 2], 1, view_flatten=False)


def _resnet50(w: _Writer) -> str:
    return _resnet(w, _bottleneck, [3, 4, 6, 3], 4, view_flatten=True)


def _mobilenet_v2(w: _Writer) -> str:
    def conv_bn_relu6(p: str, x: str, cin: int, cout: int, kernel: int, stride: int = 1,
                      group: int = 1) -> str:
        x = w.conv(f"{p}conv", x, cin, cout, kernel, stride=stride, pad=(kernel - 1) // 2,
                   group=group)
        return w.relu6(f"{p}relu6", w.batchnorm(f"{p}bn", x, cout))

    x = conv_bn_relu6("features.0.", INPUT_NAME, 3, 32, 3, stride=2)
    cin = 32
    index = 1
    # (expansion t, output channels c, repeats n, first stride s), torchvision's table
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for r in range(n):
            stride = s if r == 0 else 1
            p = f"features.{index}."
            hidden = cin * t
            y = x
            if t != 1:
                y = conv_bn_relu6(f"{p}expand.", y, cin, hidden, 1)
            y = conv_bn_relu6(f"{p}dw.", y, hidden, hidden, 3, stride=stride, group=hidden)
            # linear bottleneck: 1x1 projection + BN, no activation (gain 1 for no Relu)
            y = w.conv(f"{p}project.conv", y, hidden, c, 1, gain=1.0)
            residual = stride == 1 and cin == c
            y = w.batchnorm(f"{p}project.bn", y, c,
                            scale=_RESIDUAL_BN_SCALE if residual else 1.0)
            x = w.node("Add", [x, y], f"{p}add") if residual else y
            cin = c
            index += 1
    x = conv_bn_relu6(f"features.{index}.", x, cin, 1280, 1)
    x = w.node("GlobalAveragePool", [x], "avgpool")
    x = w.node("Flatten", [x], "flatten", axis=1)
    x = w.dropout("classifier.0", x, 0.2)
    return w.gemm("classifier.1", x, 1280, NUM_CLASSES, output=OUTPUT_NAME)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: to a multiple of ``divisor``, never below 90%."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _mobilenet_v3_large(w: _Writer) -> str:
    """torchvision's mobilenet_v3_large: Hardswish, squeeze-excitation with a Hardsigmoid
    gate, 3x3 and 5x5 depthwise convs, a Linear + Hardswish + Linear classifier."""
    def conv_bn(p: str, x: str, cin: int, cout: int, kernel: int, stride: int = 1,
                group: int = 1, activation: str | None = None, bn_scale: float = 1.0) -> str:
        x = w.conv(f"{p}0", x, cin, cout, kernel, stride=stride, pad=(kernel - 1) // 2,
                   group=group, gain=2.0 if activation else 1.0)
        x = w.batchnorm(f"{p}1", x, cout, scale=bn_scale)
        if activation == "RE":
            return w.relu(f"{p}2", x)
        return w.hardswish(f"{p}2", x) if activation == "HS" else x

    x = conv_bn("features.0.", INPUT_NAME, 3, 16, 3, stride=2, activation="HS")
    # (input, kernel, expanded, output, squeeze-excitation, activation, stride): torchvision's
    # table for the large model
    table = ((16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2),
             (24, 3, 72, 24, False, "RE", 1), (24, 5, 72, 40, True, "RE", 2),
             (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
             (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1),
             (80, 3, 184, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
             (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
             (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1),
             (160, 5, 960, 160, True, "HS", 1))
    for index, (cin, kernel, expanded, cout, se, act, stride) in enumerate(table, 1):
        p = f"features.{index}.block."
        y, part = x, 0
        if expanded != cin:
            y = conv_bn(f"{p}{part}.", y, cin, expanded, 1, activation=act)
            part += 1
        y = conv_bn(f"{p}{part}.", y, expanded, expanded, kernel, stride=stride, group=expanded,
                    activation=act)
        part += 1
        if se:
            y = w.squeeze_excitation(f"{p}{part}", y, expanded, _make_divisible(expanded // 4))
            part += 1
        residual = stride == 1 and cin == cout
        y = conv_bn(f"{p}{part}.", y, expanded, cout, 1,
                    bn_scale=_RESIDUAL_BN_SCALE if residual else 1.0)
        x = w.node("Add", [x, y], f"features.{index}.add") if residual else y
    x = conv_bn("features.16.", x, 160, 960, 1, activation="HS")
    x = w.node("Flatten", [w.node("GlobalAveragePool", [x], "avgpool")], "flatten", axis=1)
    x = w.hardswish("classifier.1", w.gemm("classifier.0", x, 960, 1280, relu_follows=True))
    x = w.dropout("classifier.2", x, 0.2)
    return w.gemm("classifier.3", x, 1280, NUM_CLASSES, output=OUTPUT_NAME)


def _convnext_tiny(w: _Writer) -> str:
    """torchvision's convnext_tiny: a 4x4 patchify stem, stages of (3, 3, 9, 3) blocks of 96
    to 768 channels (7x7 depthwise conv, LayerNorm over the channels in NHWC, Linear 4x
    up, exact GELU, Linear down, a per-channel layer scale, the residual), LayerNorm2d + 2x2
    convs between stages, and a LayerNorm2d + Linear head after the global pool."""
    dims, depths = (96, 192, 384, 768), (3, 3, 9, 3)
    x = w.conv("features.0.0", INPUT_NAME, 3, dims[0], 4, stride=4, bias=True, gain=1.0)
    x = w.channel_layer_norm("features.0.1", x, dims[0], 1e-6)
    for stage, (dim, depth) in enumerate(zip(dims, depths, strict=True)):
        index = 2 * stage + 1
        for b in range(depth):
            p = f"features.{index}.{b}.block"
            y = w.conv(f"{p}.0", x, dim, dim, 7, pad=3, group=dim, bias=True, gain=1.0)
            y = w.node("Transpose", [y], f"{p}.1", perm=[0, 2, 3, 1])
            y = w.layer_norm(f"{p}.2", y, dim, 1e-6)
            y = w.linear(f"{p}.5", w.gelu(f"{p}.4", w.linear(f"{p}.3", y, dim, 4 * dim)),
                         4 * dim, dim)
            y = w.node("Transpose", [y], f"{p}.6", perm=[0, 3, 1, 2])
            # torchvision starts the layer scale at 1e-6; 0.1 keeps each block's share visible
            scale = w.initializer(f"features.{index}.{b}.layer_scale",
                                  w.uniform((dim, 1, 1), 0.05, 0.15))
            y = w.node("Mul", [scale, y], f"features.{index}.{b}.scaled")
            x = w.node("Add", [y, x], f"features.{index}.{b}.add")
        if stage < 3:
            p = f"features.{index + 1}"
            x = w.channel_layer_norm(f"{p}.0", x, dim, 1e-6)
            x = w.conv(f"{p}.1", x, dim, dims[stage + 1], 2, stride=2, bias=True, gain=1.0)
    x = w.node("GlobalAveragePool", [x], "avgpool")
    x = w.channel_layer_norm("classifier.0", x, dims[-1], 1e-6)
    x = w.node("Flatten", [x], "classifier.1", axis=1)
    return w.gemm("classifier.2", x, dims[-1], NUM_CLASSES, output=OUTPUT_NAME)


#: The classes of the segmentation models (Pascal VOC's 20 and the background).
SEGMENTATION_CLASSES = 21


def _fcn_resnet18(w: _Writer) -> str:
    """torchvision's FCN head (3x3 conv to 128 channels, BN, Relu, Dropout, 1x1 conv to the
    classes) on a ResNet-18 backbone (its stride-32 features), then the logits upsampled
    bilinearly to the image, as F.interpolate(align_corners=False) exports: Resize in linear
    mode, pytorch_half_pixel, its sizes the input's batch and channels and the image's size."""
    x = w.conv("backbone.conv1", INPUT_NAME, 3, 64, 7, stride=2, pad=3)
    x = w.relu("backbone.relu", w.batchnorm("backbone.bn1", x, 64))
    x = w.maxpool("backbone.maxpool", x, 3, 2, 1)
    channels = 64
    for i, planes in enumerate((64, 128, 256, 512), 1):
        for b in range(2):
            stride = 2 if i > 1 and b == 0 else 1
            x, channels = _basic_block(w, f"backbone.layer{i}.{b}.", x, channels, planes,
                                       stride)
    x = w.relu("classifier.2", w.batchnorm("classifier.1", w.conv(
        "classifier.0", x, 512, 128, 3, pad=1), 128))
    x = w.dropout("classifier.3", x, 0.1)
    x = w.conv("classifier.4", x, 128, SEGMENTATION_CLASSES, 1, bias=True, gain=1.0)
    leading = w.node("Slice", [w.node("Shape", [x], "upsample.shape"),
                               w.constant("upsample.start", np.array([0], np.int64)),
                               w.constant("upsample.end", np.array([2], np.int64))],
                     "upsample.leading")
    sizes = w.node("Concat", [leading, w.constant(
        "upsample.image", np.array([w.image_size, w.image_size], np.int64))],
        "upsample.sizes", axis=0)
    return w.node("Resize", [x, "", "", sizes], "upsample", output=OUTPUT_NAME, mode="linear",
                  coordinate_transformation_mode="pytorch_half_pixel")


def _vgg16(w: _Writer) -> str:
    # torchvision's configuration "D"; its AdaptiveAvgPool2d((7, 7)) is the identity at 224x224
    # and is left out, as the exporter leaves it out when it can prove so.
    cfg = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
           512, 512, 512, "M")
    x = INPUT_NAME
    cin = 3
    for i, v in enumerate(cfg):
        if v == "M":
            x = w.maxpool(f"features.{i}", x, 2, 2)
        else:
            x = w.conv(f"features.{i}.conv", x, cin, v, 3, pad=1, bias=True)
            x = w.relu(f"features.{i}.relu", x)
            cin = v
    x = w.node("Flatten", [x], "flatten", axis=1)
    x = w.relu("classifier.1", w.gemm("classifier.0", x, 512 * 7 * 7, 4096, relu_follows=True))
    x = w.dropout("classifier.2", x, 0.5)
    x = w.relu("classifier.4", w.gemm("classifier.3", x, 4096, 4096, relu_follows=True))
    x = w.dropout("classifier.5", x, 0.5)
    return w.gemm("classifier.6", x, 4096, NUM_CLASSES, output=OUTPUT_NAME)


def _squeezenet(w: _Writer) -> str:
    """squeezenet1_1, plus a final Softmax(axis=1) so that Softmax is exercised."""
    def fire(i: int, x: str, cin: int, squeeze: int, expand: int) -> str:
        p = f"features.{i}."
        s = w.relu(f"{p}squeeze_activation",
                   w.conv(f"{p}squeeze", x, cin, squeeze, 1, bias=True))
        e1 = w.relu(f"{p}expand1x1_activation",
                    w.conv(f"{p}expand1x1", s, squeeze, expand, 1, bias=True))
        e3 = w.relu(f"{p}expand3x3_activation",
                    w.conv(f"{p}expand3x3", s, squeeze, expand, 3, pad=1, bias=True))
        return w.node("Concat", [e1, e3], f"{p}concat", axis=1)

    x = w.relu("features.1", w.conv("features.0", INPUT_NAME, 3, 64, 3, stride=2, bias=True))
    x = w.maxpool("features.2", x, 3, 2, ceil_mode=1)
    x = fire(3, x, 64, 16, 64)
    x = fire(4, x, 128, 16, 64)
    x = w.maxpool("features.5", x, 3, 2, ceil_mode=1)
    x = fire(6, x, 128, 32, 128)
    x = fire(7, x, 256, 32, 128)
    x = w.maxpool("features.8", x, 3, 2, ceil_mode=1)
    x = fire(9, x, 256, 48, 192)
    x = fire(10, x, 384, 48, 192)
    x = fire(11, x, 384, 64, 256)
    x = fire(12, x, 512, 64, 256)
    x = w.dropout("classifier.0", x, 0.5)
    # a small gain (torchvision draws this conv with std 0.01) keeps the Softmax from saturating
    x = w.relu("classifier.2", w.conv("classifier.1", x, 512, NUM_CLASSES, 1, bias=True,
                                      gain=0.2))
    x = w.node("GlobalAveragePool", [x], "classifier.3")
    x = w.node("Flatten", [x], "flatten", axis=1)
    return w.node("Softmax", [x], "softmax", output=OUTPUT_NAME, axis=1)


def _vit(w: _Writer, hidden: int, heads: int) -> str:
    """A ViT with 16x16 patches (timm's vit_*_patch16_224): the patches embedded by a Conv, a
    class token and position embeddings, 12 pre-norm encoder layers (MLP 4x hidden, exact
    GELU), the class token's LayerNorm and a Gemm head."""
    mlp, patch, layers = 4 * hidden, 16, 12
    tokens = (IMAGE_SIZE // patch) ** 2
    x = w.conv("patch_embed", INPUT_NAME, 3, hidden, patch, stride=patch, bias=True, gain=1.0)
    x = w.node("Reshape", [x, w.constant("patch_embed.shape",
                                         np.array([0, hidden, -1], np.int64))], "flatten")
    x = w.node("Transpose", [x], "tokens", perm=[0, 2, 1])
    batch = w.node("Slice", [w.node("Shape", [x], "tokens.shape"),
                             w.constant("batch.start", np.array([0], np.int64)),
                             w.constant("batch.end", np.array([1], np.int64))], "batch")
    cls_shape = w.node("Concat", [batch, w.constant("cls.dims", np.array([1, hidden], np.int64))],
                       "cls.shape", axis=0)
    cls = w.node("Expand", [w.initializer("cls_token", w.normal((1, 1, hidden), 0.02)),
                            cls_shape], "cls")
    x = w.node("Concat", [cls, x], "sequence", axis=1)
    x = w.node("Add", [x, w.initializer("pos_embed", w.normal((1, tokens + 1, hidden), 0.02))],
               "embedded")
    for i in range(layers):
        p = f"blocks.{i}"
        h = w.attention(f"{p}.attn", w.layer_norm(f"{p}.norm1", x, hidden, 1e-6), hidden, heads)
        x = w.node("Add", [x, h], f"{p}.residual1")
        h = w.linear(f"{p}.mlp.fc1", w.layer_norm(f"{p}.norm2", x, hidden, 1e-6), hidden, mlp)
        h = w.linear(f"{p}.mlp.fc2", w.gelu(f"{p}.mlp.gelu", h), mlp, hidden)
        x = w.node("Add", [x, h], f"{p}.residual2")
    x = w.layer_norm("norm", x, hidden, 1e-6)
    x = w.node("Gather", [x, w.constant("cls.index", np.array(0, np.int64))], "cls_out", axis=1)
    return w.gemm("head", x, hidden, NUM_CLASSES, output=OUTPUT_NAME)


def _vit_ti16(w: _Writer) -> str:
    """ViT-Ti/16 (timm's vit_tiny_patch16_224): hidden 192, 3 heads."""
    return _vit(w, 192, 3)


def _vit_b16(w: _Writer) -> str:
    """ViT-B/16 (torchvision's vit_b_16, timm's vit_base_patch16_224): hidden 768, 12 heads."""
    return _vit(w, 768, 12)


#: BERT-base's sequence length and width, the shape of its encoder's input
BERT_SEQUENCE, BERT_HIDDEN = 128, 768


def _bert_base(w: _Writer) -> str:
    """BERT-base's encoder: 12 post-norm layers (hidden 768, 12 heads, MLP 3072, exact GELU,
    LayerNorm epsilon 1e-12) over (N, 128, 768) embedded tokens (the embeddings' output; the
    token lookup and the pooler are left out)."""
    hidden, heads, mlp, layers = BERT_HIDDEN, 12, 3072, 12
    x = INPUT_NAME
    for i in range(layers):
        p = f"encoder.layer.{i}"
        h = w.attention(f"{p}.attention", x, hidden, heads)
        x = w.layer_norm(f"{p}.attention.norm", w.node("Add", [x, h], f"{p}.attention.residual"),
                         hidden, 1e-12)
        h = w.linear(f"{p}.intermediate", x, hidden, mlp)
        h = w.linear(f"{p}.output.dense", w.gelu(f"{p}.gelu", h), mlp, hidden)
        x = w.layer_norm(f"{p}.output.norm", w.node("Add", [x, h], f"{p}.output.residual"),
                         hidden, 1e-12, output=OUTPUT_NAME if i == layers - 1 else None)
    return x


@dataclass(frozen=True)
class _Model:
    builder: Callable[[_Writer], str]
    description: str
    #: its classifier takes the features of a 224x224 image only (no global pool)
    fixed_size: bool = False
    #: the opset it is written at unless told otherwise (the transformers: 17, the first
    #: with LayerNormalization; before it they spell their LayerNorms out, as torch did)
    default_opset: int = DEFAULT_OPSET
    #: the input's and the output's dimensions after the batch; None: an image, and logits
    input_dims: tuple[int, ...] | None = None
    output_dims: tuple[int, ...] | None = None


_MODELS: dict[str, _Model] = {
    "resnet18": _Model(_resnet18, "torchvision ResNet-18 (BasicBlock [2, 2, 2, 2], unfused "
                                  "Conv/BN, Flatten + Gemm), 11.7M parameters, 1000 logits"),
    "resnet50": _Model(_resnet50, "torchvision ResNet-50 v1.5 (Bottleneck [3, 4, 6, 3], unfused "
                                  "Conv/BN, Shape/Gather/Unsqueeze/Concat/Reshape flatten), "
                                  "25.6M parameters, 1000 logits"),
    "mobilenet_v2": _Model(_mobilenet_v2, "torchvision MobileNetV2 (inverted residuals, "
                                          "depthwise 3x3, Clip as ReLU6, Dropout), "
                                          "3.5M parameters, 1000 logits"),
    "vgg16": _Model(_vgg16, "torchvision VGG-16 (13 conv3x3 + Relu, 3 Gemm, Dropout), "
                            "138.4M parameters (553 MB), 1000 logits", fixed_size=True),
    "squeezenet": _Model(_squeezenet, "torchvision SqueezeNet 1.1 (Fire modules with Concat, "
                                      "ceil-mode MaxPool, Dropout), 1.2M parameters, "
                                      "1000 Softmax probabilities"),
    "mobilenet_v3_large": _Model(_mobilenet_v3_large, "torchvision MobileNetV3-Large "
                                 "(Hardswish, squeeze-excitation with Hardsigmoid, 5x5 "
                                 "depthwise), 5.5M parameters, 1000 logits",
                                 default_opset=17),
    "convnext_tiny": _Model(_convnext_tiny, "torchvision ConvNeXt-T (7x7 depthwise, "
                                            "LayerNorm over channels, GELU MLP, layer scale), "
                                            "28.6M parameters, 1000 logits", default_opset=17),
    "fcn_resnet18": _Model(_fcn_resnet18, "torchvision's FCN head on a ResNet-18 backbone, "
                                          "bilinear Resize to the image, 11.8M parameters, "
                                          "21 class planes", default_opset=17,
                           output_dims=(SEGMENTATION_CLASSES, IMAGE_SIZE, IMAGE_SIZE),
                           fixed_size=True),
    "vit_ti16": _Model(_vit_ti16, "ViT-Ti/16 (12 pre-norm layers, hidden 192, 3 heads, exact "
                                  "GELU, class token), 5.7M parameters, 1000 logits",
                       fixed_size=True, default_opset=17),
    "vit_b16": _Model(_vit_b16, "ViT-B/16 (12 pre-norm layers, hidden 768, 12 heads, exact "
                                "GELU, class token), 86.6M parameters, 1000 logits",
                      fixed_size=True, default_opset=17),
    "bert_base": _Model(_bert_base, "BERT-base encoder (12 post-norm layers, hidden 768, 12 "
                                    "heads, exact GELU) over (N, 128, 768) embedded tokens, "
                                    "85.1M parameters",
                        fixed_size=True, default_opset=17,
                        input_dims=(BERT_SEQUENCE, BERT_HIDDEN),
                        output_dims=(BERT_SEQUENCE, BERT_HIDDEN)),
}


# --------------------------------------------------------------------------------------------
# API
# --------------------------------------------------------------------------------------------
def names() -> list[str]:
    """The names :func:`build` accepts, sorted."""
    return sorted(_MODELS)


def _lookup(name: str) -> _Model:
    try:
        return _MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown zoo model {name!r}; known models: "
                         f"{', '.join(names())}") from None


def describe(name: str) -> str:
    """One line about model ``name``, without the name itself (listings print ``zoo:NAME``
    beside it); builds nothing, so listing vgg16 costs nothing."""
    return _lookup(name).description


def build(name: str, *, seed: int = 0, opset: int | None = None,
          image_size: int = IMAGE_SIZE) -> onnx.ModelProto:
    """Generates model ``name`` with weights drawn from ``numpy.random.default_rng(seed)``.

    The same (name, seed, opset, image_size) always gives a byte-identical model.  ``opset``
    selects how the opset-dependent nodes are written (Unsqueeze axes attribute/input, Dropout
    ratio attribute/input, LayerNormalization or its nine nodes); it must lie in
    ``MIN_OPSET..MAX_OPSET``, and defaults to ``DEFAULT_OPSET``, 17 for the transformers.
    ``image_size``: the input's height and width (the weights are the same at every size);
    vgg16 and the transformers take 224 only.
    """
    model = _lookup(name)
    if opset is None:
        opset = model.default_opset
    if isinstance(opset, bool) or not isinstance(opset, int | np.integer):
        raise TypeError(f"opset must be an int, not {type(opset).__name__}")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"zoo models are written for opsets {MIN_OPSET}..{MAX_OPSET}, "
                         f"not {opset}")
    if isinstance(image_size, bool) or not isinstance(image_size, int | np.integer):
        raise TypeError(f"image_size must be an int, not {type(image_size).__name__}")
    if image_size != IMAGE_SIZE and model.fixed_size:
        raise ValueError(f"zoo:{name} takes {IMAGE_SIZE}x{IMAGE_SIZE} images only (its "
                         f"classifier is fixed), not {image_size}")
    if image_size < MIN_IMAGE_SIZE:
        raise ValueError(f"image size {image_size} is below the smallest, {MIN_IMAGE_SIZE} "
                         "(the models downsample by 32)")
    writer = _Writer(seed, int(opset), int(image_size))
    return writer.finish(name, model.builder(writer))


def export(name: str, path: str | PathLike[str], *, seed: int = 0,
           opset: int | None = None) -> None:
    """Writes model ``name`` to ``path`` as one .onnx file (all models fit well under the 2 GiB
    protobuf limit, so weights stay inside the file)."""
    onnx.save_model(build(name, seed=seed, opset=opset), path)


def resolve(spec: str) -> onnx.ModelProto:
    """Builds the model named by a ``"zoo:NAME"`` or ``"zoo:NAME@SIZE"`` spec (SIZE: the image's
    height and width, default 224) with the default seed and opset.

    Paths are the runtime's business: anything not starting with ``zoo:`` is a ValueError.
    """
    if not isinstance(spec, str) or not spec.startswith(PREFIX):
        raise ValueError(f"not a zoo model spec: {spec!r} (expected '{PREFIX}NAME' with NAME "
                         f"one of {', '.join(names())})")
    name, at, size = spec[len(PREFIX):].partition("@")
    if not at:
        return build(name)
    if not size.isdigit():
        raise ValueError(f"zoo model spec {spec!r}: the image size after '@' must be a whole "
                         f"number of pixels, e.g. {PREFIX}{name}@160")
    return build(name, image_size=int(size))
