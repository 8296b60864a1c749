"""Small ONNX models built in the tests: fast to search, and shaped to hit one runtime feature."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphWriter:
    """Nodes and initializers, then a model with input 'x' (symbolic batch) and output 'y'."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def weight(self, name: str, shape, scale: float = 0.3) -> str:
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def const(self, name: str, array) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, inputs, output: str, name: str | None = None, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [output],
                                           name=name or output, **attrs))
        return output

    def model(self, input_shape, output: str, opset: int = 13,
              output_rank: int = 4) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "test",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *input_shape[1:]])],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, [None] * output_rank)],
            self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def conv_bn_relu(channels: int = 8, size: int = 10) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu: all three fold into one conv."""
    w = GraphWriter()
    w.node("Conv", ["x", w.weight("w", (channels, 3, 3, 3))], "c", pads=[1, 1, 1, 1])
    gamma = w.const("gamma", np.linspace(0.5, 1.5, channels, dtype=np.float32))
    beta = w.const("beta", np.linspace(-0.2, 0.2, channels, dtype=np.float32))
    mean = w.const("mean", np.linspace(-0.1, 0.1, channels, dtype=np.float32))
    var = w.const("var", np.linspace(0.5, 2.0, channels, dtype=np.float32))
    w.node("BatchNormalization", ["c", gamma, beta, mean, var], "bn", epsilon=1e-3)
    w.node("Relu", ["bn"], "y")
    return w.model((1, 3, size, size), "y")


def dense_layer(channels: int = 8, size: int = 6) -> onnx.ModelProto:
    """DenseNet's pre-activation: Concat -> BatchNormalization -> Relu -> Conv 1x1, with a
    second Relu reading the concat's batch norm through a Clip (which does not fuse)."""
    w = GraphWriter()
    w.node("Concat", ["x", "x"], "cat", axis=1)
    stats = [w.const(name, np.linspace(low, high, 2 * channels, dtype=np.float32))
             for name, low, high in (("gamma", 0.5, 1.5), ("beta", -0.2, 0.2),
                                     ("mean", -0.1, 0.1), ("var", 0.5, 2.0))]
    w.node("BatchNormalization", ["cat", *stats], "bn", epsilon=1e-5)
    w.node("Relu", ["bn"], "act")
    w.node("Conv", ["act", w.weight("w", (channels, 2 * channels, 1, 1))], "conv")
    w.node("BatchNormalization", ["conv", *[w.const(f"{name}2", np.asarray(
        np.linspace(0.5, 1.5, channels), np.float32)) for name in ("g", "b", "m", "v")]],
        "bn2")
    w.node("Clip", ["bn2", w.const("low", np.float32(0)), w.const("high", np.float32(6))], "y")
    return w.model((1, channels, size, size), "y")


def small_cnn(widths=(4, 8, 12), size: int = 12, seed: int = 0) -> onnx.ModelProto:
    """A chain of conv blocks of different shapes (several distinct problems to search), then
    global pooling, a Shape->Gather->Unsqueeze->Concat->Reshape flatten and a Gemm."""
    w = GraphWriter(seed)
    x, cin = "x", 3
    for i, cout in enumerate(widths):
        x = w.node("Conv", [x, w.weight(f"w{i}", (cout, cin, 3, 3)),
                            w.weight(f"b{i}", (cout,))], f"conv{i}", pads=[1, 1, 1, 1],
                   strides=[1 + i % 2, 1 + i % 2])
        x = w.node("Relu", [x], f"relu{i}")
        cin = cout
    x = w.node("GlobalAveragePool", [x], "gap")
    w.node("Shape", [x], "shape")
    w.node("Gather", ["shape", w.const("zero", np.array(0, np.int64))], "batch", axis=0)
    w.node("Unsqueeze", ["batch", w.const("axes", np.array([0], np.int64))], "batch1")
    w.node("Concat", ["batch1", w.const("minus1", np.array([-1], np.int64))], "target", axis=0)
    x = w.node("Reshape", [x, "target"], "flat")
    w.node("Gemm", [x, w.weight("fc", (5, cin)), w.weight("fcb", (5,))], "y", transB=1)
    return w.model((1, 3, size, size), "y", output_rank=2)


def residual_block(channels: int = 8, size: int = 8) -> onnx.ModelProto:
    """conv -> relu -> conv, + x, relu: the second conv's output has a second reader (the
    Add), so Add(conv, x) is not a bias and must not be folded."""
    w = GraphWriter()
    c1 = w.node("Conv", ["x", w.weight("w1", (channels, channels, 3, 3))], "c1",
                pads=[1, 1, 1, 1])
    r1 = w.node("Relu", [c1], "r1")
    c2 = w.node("Conv", [r1, w.weight("w2", (channels, channels, 3, 3))], "c2",
                pads=[1, 1, 1, 1])
    s = w.node("Add", [c2, "x"], "sum")
    w.node("Relu", [s], "y")
    return w.model((1, channels, size, size), "y")


def layout_mix(size: int = 9) -> onnx.ModelProto:
    """What the blocked-layout choice meets: convs of channel counts that are not a multiple
    of 16 (3 -> 20), a depthwise conv, a residual Add+Relu, a Sigmoid, a concat along the
    channels (16 + 20), a MaxPool (which stays NCHW), a Mul by a scalar, and a global pool,
    flatten and Gemm at the end."""
    w = GraphWriter(3)
    c0 = w.node("Conv", ["x", w.weight("w0", (20, 3, 3, 3)), w.weight("b0", (20,))], "c0",
                pads=[1, 1, 1, 1])
    r0 = w.node("Relu", [c0], "r0")
    dw = w.node("Conv", [r0, w.weight("wd", (20, 1, 3, 3)), w.weight("bd", (20,))], "dw",
                pads=[1, 1, 1, 1], group=20)
    c1 = w.node("Conv", [dw, w.weight("w1", (20, 20, 1, 1))], "c1")
    r1 = w.node("Relu", [w.node("Add", [c1, r0], "sum")], "r1")
    s1 = w.node("Sigmoid", [r1], "s1")
    c2 = w.node("Conv", [s1, w.weight("w2", (16, 20, 3, 3))], "c2", pads=[1, 1, 1, 1])
    cat = w.node("Concat", [c2, r1], "cat", axis=1)
    pool = w.node("MaxPool", [cat], "pool", kernel_shape=[2, 2], strides=[2, 2])
    c3 = w.node("Conv", [pool, w.weight("w3", (24, 36, 3, 3))], "c3", pads=[1, 1, 1, 1])
    scaled = w.node("Mul", [c3, w.const("half", np.array(0.5, np.float32))], "scaled")
    gap = w.node("GlobalAveragePool", [scaled], "gap")
    flat = w.node("Flatten", [gap], "flat")
    w.node("Gemm", [flat, w.weight("fc", (5, 24)), w.weight("fcb", (5,))], "y", transB=1)
    return w.model((1, 3, size, size), "y", output_rank=2)


def mobilenet_v3_block(channels: int = 16, size: int = 10) -> onnx.ModelProto:
    """MobileNetV3's inverted residual with squeeze-excitation, as torchvision exports it:
    expand 1x1 -> HardSwish -> depthwise 3x3 -> HardSwish -> SE (GlobalAveragePool -> 1x1 ->
    Relu -> 1x1 -> HardSigmoid -> Mul) -> project 1x1, + x."""
    w = GraphWriter(5)
    wide = 3 * channels
    e = w.node("Conv", ["x", w.weight("we", (wide, channels, 1, 1)), w.weight("be", (wide,))],
               "expand")
    e = w.node("HardSwish", [e], "expand_act")
    d = w.node("Conv", [e, w.weight("wd", (wide, 1, 3, 3)), w.weight("bd", (wide,))], "dw",
               pads=[1, 1, 1, 1], group=wide)
    d = w.node("HardSwish", [d], "dw_act")
    squeezed = w.node("GlobalAveragePool", [d], "se_pool")
    s = w.node("Conv", [squeezed, w.weight("ws1", (8, wide, 1, 1)), w.weight("bs1", (8,))],
               "se_reduce")
    s = w.node("Relu", [s], "se_relu")
    s = w.node("Conv", [s, w.weight("ws2", (wide, 8, 1, 1)), w.weight("bs2", (wide,))],
               "se_expand")
    s = w.node("HardSigmoid", [s], "se_gate", alpha=1 / 6, beta=0.5)
    d = w.node("Mul", [d, s], "se_scaled")
    p = w.node("Conv", [d, w.weight("wp", (channels, wide, 1, 1)), w.weight("bp", (channels,))],
               "project")
    w.node("Add", [p, "x"], "y")
    return w.model((1, channels, size, size), "y", opset=17)  # HardSwish: opset 14
