"""Named problem suites: the problems a ranking run (``fastrun rank``) or a benchmark measures.

A suite is plain data (operator name, shapes, dtypes, parameters, a label and a weight), not
Problems: Problems are built through the registry (``registry.operator(name).problem(...)``)
only when a suite is used, so that this module, like the rest of the framework, never imports
the compute library and a suite naming an operator no plugin registered fails with the
registry's clear error at that point.

Built-in suites:

* ``resnet18``: its convolutions at batch 1, 224x224, with bias and the ReLU the ONNX runtime
  fuses into them (the second conv of a residual block is followed by the add, so it has no
  fused ReLU) and their weights transformed once, as the runtime poses them
  (``weight_preprocess``); ``weight`` counts how often the layer occurs.
* ``mobilenet_v2``: its first conv and the distinct depthwise and pointwise layers, with bias
  and the fused ReLU6 (clip 0..6) wherever the network has one (not on the projections).
* ``matmul``: a spread of matmul shapes, from tiny to 2048, skinny, batched and broadcast.
* ``ci``: a handful of cheap problems on which *different* algorithms win, so a change to any
  algorithm family moves some ranking; profiled in seconds with a small budget.
* ``model:PATH`` / ``zoo:NAME``: the distinct problems of an ONNX model as the runtime lowers
  it, keeping only those whose operator has more than one registered algorithm (a lone
  algorithm has no ranking to regress).

The layer tables are also what ``benchmarks/bench_conv_layers.py`` and
``benchmarks/bench_selection.py`` measure: one copy, here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastrun.operator import Problem
from fastrun.registry import Registry, default_registry


@dataclass(frozen=True)
class SuiteProblem:
    """One problem of a suite, as data; :meth:`problem` builds it through a registry."""

    operator: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()
    label: str = ""
    #: How often the problem occurs where the suite comes from (layers of a network), so that
    #: summed figures weigh problems the way the workload does.
    weight: int = 1

    @classmethod
    def create(cls, operator: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str],
               label: str = "", weight: int = 1, **params: Any) -> SuiteProblem:
        return cls(operator, tuple(tuple(int(d) for d in s) for s in shapes), tuple(dtypes),
                   tuple(sorted(params.items())), label, weight)

    def problem(self, registry: Registry | None = None) -> Problem:
        registry = registry or default_registry()
        return registry.operator(self.operator).problem(self.shapes, self.dtypes,
                                                        **dict(self.params))


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    problems: tuple[SuiteProblem, ...] = field(default_factory=tuple)

    def build(self, registry: Registry | None = None) -> list[tuple[SuiteProblem, Problem]]:
        """Every problem built and validated through ``registry`` (default: the plugins')."""
        registry = registry or default_registry()
        return [(item, item.problem(registry)) for item in self.problems]


# --------------------------------------------------------------------------------------------
# Convolution layers of well-known networks


@dataclass(frozen=True)
class Layer:
    """A 2-D convolution layer at 224x224 input; ``count`` is how often the network has it."""

    name: str
    count: int
    c: int
    hw: int
    k: int
    kernel: int
    stride: int = 1
    pad: int = 0
    group: int = 1
    #: The activation the runtime fuses into the conv epilogue: 'relu', 'relu6' or None.
    activation: str | None = None
    #: The block's shortcut is added to the output before the activation (the runtime fuses
    #: a residual Add into the conv that ends the block).
    residual: bool = False

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * self.pad - self.kernel) // self.stride + 1

    def shapes(self, batch: int = 1, epilogue: bool = True) -> list[tuple[int, ...]]:
        """Input, weight and bias shapes; with ``epilogue``, the residual's (the output's) too
        if the layer has one."""
        shapes = [(batch, self.c, self.hw, self.hw),
                  (self.k, self.c // self.group, self.kernel, self.kernel), (self.k,)]
        if epilogue and self.residual:
            shapes.append((batch, self.k, self.out_hw, self.out_hw))
        return shapes

    def params(self, epilogue: bool = True) -> dict[str, Any]:
        """Conv parameters; with ``epilogue`` the fused residual and activation too."""
        params: dict[str, Any] = {"strides": (self.stride, self.stride),
                                  "pads": (self.pad,) * 4, "group": self.group}
        if epilogue and self.activation:
            params["activation"] = self.activation
        if epilogue and self.residual:
            params["residual"] = True
        return params

    def suite_problem(self, batch: int = 1) -> SuiteProblem:
        """The layer as the runtime poses it: with its weights transformed once
        (``weight_preprocess``, the runtime's default), so that a ranking of the suite and a
        search of the model measure, and cache, the same problems."""
        shapes = self.shapes(batch)
        return SuiteProblem.create("conv", shapes, ["float32"] * len(shapes), self.name,
                                   self.count, **self.params(), weight_preprocess=True)


R, R6 = "relu", "relu6"

# ResNet-18 as the runtime lowers it: a basic block's first conv carries the ReLU; its second
# conv takes the block's shortcut as a residual and the ReLU after the add; the 1x1
# downsamples (the shortcut of a block's first conv) have no activation.
RESNET18_LAYERS = [
    Layer("conv1 7x7/2 3->64 @224 +relu", 1, 3, 224, 64, 7, 2, 3, activation=R),
    Layer("layer1 3x3 64->64 @56 +relu", 2, 64, 56, 64, 3, 1, 1, activation=R),
    Layer("layer1 3x3 64->64 @56 +res+relu", 2, 64, 56, 64, 3, 1, 1, activation=R,
          residual=True),
    Layer("layer2.0 3x3/2 64->128 @56 +relu", 1, 64, 56, 128, 3, 2, 1, activation=R),
    Layer("layer2.ds 1x1/2 64->128 @56", 1, 64, 56, 128, 1, 2, 0),
    Layer("layer2 3x3 128->128 @28 +relu", 1, 128, 28, 128, 3, 1, 1, activation=R),
    Layer("layer2 3x3 128->128 @28 +res+relu", 2, 128, 28, 128, 3, 1, 1, activation=R,
          residual=True),
    Layer("layer3.0 3x3/2 128->256 @28 +relu", 1, 128, 28, 256, 3, 2, 1, activation=R),
    Layer("layer3.ds 1x1/2 128->256 @28", 1, 128, 28, 256, 1, 2, 0),
    Layer("layer3 3x3 256->256 @14 +relu", 1, 256, 14, 256, 3, 1, 1, activation=R),
    Layer("layer3 3x3 256->256 @14 +res+relu", 2, 256, 14, 256, 3, 1, 1, activation=R,
          residual=True),
    Layer("layer4.0 3x3/2 256->512 @14 +relu", 1, 256, 14, 512, 3, 2, 1, activation=R),
    Layer("layer4.ds 1x1/2 256->512 @14", 1, 256, 14, 512, 1, 2, 0),
    Layer("layer4 3x3 512->512 @7 +relu", 1, 512, 7, 512, 3, 1, 1, activation=R),
    Layer("layer4 3x3 512->512 @7 +res+relu", 2, 512, 7, 512, 3, 1, 1, activation=R,
          residual=True),
]

# MobileNetV2 (width 1.0): the first conv, then for each inverted-residual stage its distinct
# expand (pointwise, ReLU6), depthwise (ReLU6) and project (pointwise, linear) layers; a
# block whose input and output match adds its input to the projection (+res).
MOBILENET_V2_LAYERS = [
    Layer("conv0 3x3/2 3->32 @224", 1, 3, 224, 32, 3, 2, 1, activation=R6),
    Layer("dw 3x3 32 @112", 1, 32, 112, 32, 3, 1, 1, 32, R6),
    Layer("pw 32->16 @112", 1, 32, 112, 16, 1),
    Layer("pw 16->96 @112", 1, 16, 112, 96, 1, activation=R6),
    Layer("dw 3x3/2 96 @112", 1, 96, 112, 96, 3, 2, 1, 96, R6),
    Layer("pw 96->24 @56", 1, 96, 56, 24, 1),
    Layer("pw 24->144 @56", 2, 24, 56, 144, 1, activation=R6),
    Layer("dw 3x3 144 @56", 1, 144, 56, 144, 3, 1, 1, 144, R6),
    Layer("pw 144->24 @56 +res", 1, 144, 56, 24, 1, residual=True),
    Layer("dw 3x3/2 144 @56", 1, 144, 56, 144, 3, 2, 1, 144, R6),
    Layer("pw 144->32 @28", 1, 144, 28, 32, 1),
    Layer("pw 32->192 @28", 3, 32, 28, 192, 1, activation=R6),
    Layer("dw 3x3 192 @28", 2, 192, 28, 192, 3, 1, 1, 192, R6),
    Layer("pw 192->32 @28 +res", 2, 192, 28, 32, 1, residual=True),
    Layer("dw 3x3/2 192 @28", 1, 192, 28, 192, 3, 2, 1, 192, R6),
    Layer("pw 192->64 @14", 1, 192, 14, 64, 1),
    Layer("pw 64->384 @14", 4, 64, 14, 384, 1, activation=R6),
    Layer("dw 3x3 384 @14", 4, 384, 14, 384, 3, 1, 1, 384, R6),
    Layer("pw 384->64 @14 +res", 3, 384, 14, 64, 1, residual=True),
    Layer("pw 384->96 @14", 1, 384, 14, 96, 1),
    Layer("pw 96->576 @14", 3, 96, 14, 576, 1, activation=R6),
    Layer("dw 3x3 576 @14", 2, 576, 14, 576, 3, 1, 1, 576, R6),
    Layer("pw 576->96 @14 +res", 2, 576, 14, 96, 1, residual=True),
    Layer("dw 3x3/2 576 @14", 1, 576, 14, 576, 3, 2, 1, 576, R6),
    Layer("pw 576->160 @7", 1, 576, 7, 160, 1),
    Layer("pw 160->960 @7", 3, 160, 7, 960, 1, activation=R6),
    Layer("dw 3x3 960 @7", 3, 960, 7, 960, 3, 1, 1, 960, R6),
    Layer("pw 960->160 @7 +res", 2, 960, 7, 160, 1, residual=True),
    Layer("pw 960->320 @7", 1, 960, 7, 320, 1),
    Layer("pw 320->1280 @7", 1, 320, 7, 1280, 1, activation=R6),
]

#: Layer tables by network name (what ``bench_conv_layers --suite`` chooses from).
CONV_LAYERS = {"resnet18": RESNET18_LAYERS, "mobilenet_v2": MOBILENET_V2_LAYERS}

# --------------------------------------------------------------------------------------------
# Matmul shapes

#: (label, shape of A, shape of B, dtype)
MATMUL_SHAPES = [
    ("tiny 4", (4, 4), (4, 4), "float32"),
    ("small 16", (16, 16), (16, 16), "float32"),
    ("64", (64, 64), (64, 64), "float32"),
    ("128", (128, 128), (128, 128), "float32"),
    ("256", (256, 256), (256, 256), "float32"),
    ("512", (512, 512), (512, 512), "float32"),
    ("512 f64", (512, 512), (512, 512), "float64"),
    ("1024", (1024, 1024), (1024, 1024), "float32"),
    ("2048", (2048, 2048), (2048, 2048), "float32"),
    ("gemv-like 1x1024x1024", (1, 1024), (1024, 1024), "float32"),
    ("skinny 2048x64x2048", (2048, 64), (64, 2048), "float32"),
    ("skinny 4096x16x16", (4096, 16), (16, 16), "float32"),
    ("batched 32x(64x64)", (32, 64, 64), (32, 64, 64), "float32"),
    ("broadcast 8x(256x256)@256x256", (8, 256, 256), (256, 256), "float32"),
]


def _matmul(label: str, a: Sequence[int], b: Sequence[int], dtype: str = "float32",
            weight: int = 1) -> SuiteProblem:
    return SuiteProblem.create("matmul", [a, b], [dtype, dtype], label, weight)


def _conv(label: str, x: Sequence[int], w: Sequence[int], stride: int = 1, pad: int = 0,
          group: int = 1, activation: str | None = None) -> SuiteProblem:
    params: dict[str, Any] = {"strides": (stride, stride), "pads": (pad,) * 4, "group": group}
    if activation:
        params["activation"] = activation
    return SuiteProblem.create("conv", [x, w, (w[0],)], ["float32"] * 3, label, **params)


# The CI suite: cheap (each candidate runs in well under a millisecond) and varied, so that on
# a typical CPU different families win: a BLAS call, the blocked kernels, Strassen's
# sub-problems, im2col's matmul, winograd, the depthwise and 1x1 kernels, and the
# elementwise numpy/serial/parallel split.
CI_PROBLEMS = [
    _matmul("matmul tiny 8", (8, 8), (8, 8)),
    _matmul("matmul 96x64x80", (96, 64), (64, 80)),
    _matmul("matmul skinny 1024x16x16", (1024, 16), (16, 16)),
    _matmul("matmul batched 8x(32x32)", (8, 32, 32), (8, 32, 32)),
    _conv("conv 3x3 16->16 @16 +relu", (1, 16, 16, 16), (16, 16, 3, 3), pad=1,
          activation="relu"),
    _conv("conv 1x1 32->32 @14", (1, 32, 14, 14), (32, 32, 1, 1)),
    _conv("conv dw 3x3 32 @16 +relu6", (1, 32, 16, 16), (32, 1, 3, 3), pad=1, group=32,
          activation="relu6"),
    SuiteProblem.create("add", [(1, 32, 28, 28), (1, 32, 28, 28)], ["float32"] * 2,
                        "add 1x32x28x28"),
]

_BUILT_IN = {
    "resnet18": ("ResNet-18 conv layers, batch 1, 224x224, fused bias+relu",
                 lambda: [layer.suite_problem() for layer in RESNET18_LAYERS]),
    "mobilenet_v2": ("MobileNetV2 first, depthwise and pointwise conv layers, batch 1, "
                     "fused bias+relu6",
                     lambda: [layer.suite_problem() for layer in MOBILENET_V2_LAYERS]),
    "matmul": ("matmul shapes from tiny to 2048, skinny, batched, broadcast",
               lambda: [_matmul(*row) for row in MATMUL_SHAPES]),
    "ci": ("a few cheap problems where different algorithms win (the CI regression check)",
           lambda: list(CI_PROBLEMS)),
}


def suite_names() -> list[str]:
    """The built-in suites; ``model:PATH`` and ``zoo:NAME`` are accepted besides."""
    return sorted(_BUILT_IN)


def get_suite(name: str, registry: Registry | None = None, device_kind: str = "cpu") -> Suite:
    """A suite by name: a built-in one, ``model:PATH`` (an .onnx file) or ``zoo:NAME``
    (``device_kind``: whose algorithms make a model's problem one with a choice).

    Raises ValueError for an unknown name, naming the known ones.
    """
    if name in _BUILT_IN:
        description, make = _BUILT_IN[name]
        return Suite(name, description, tuple(make()))
    if name.startswith("zoo:"):
        return model_suite(name, registry, name=name, device_kind=device_kind)
    if name.startswith("model:"):
        path = name.removeprefix("model:")
        if not path:
            raise ValueError("suite 'model:' needs a path, e.g. model:resnet.onnx")
        return model_suite(path, registry, name=name, device_kind=device_kind)
    raise ValueError(f"unknown suite {name!r}; expected one of {', '.join(suite_names())}, "
                     "model:PATH or zoo:NAME")


def model_suite(model: Any, registry: Registry | None = None, name: str | None = None,
                batch: int | None = None,
                input_shapes: Mapping[str, Sequence[int]] | None = None,
                device_kind: str = "cpu") -> Suite:
    """The distinct problems of an ONNX model (path, bytes, ``zoo:NAME``) as the runtime lowers
    and fuses it, with the operators that have a choice (more than one registered algorithm
    for devices of ``device_kind``).

    The label is the first node that poses the problem; the weight counts its occurrences.
    Lowering runs on a heuristic session with a private in-memory cache: nothing is profiled
    and no user cache is touched.
    """
    from fastrun.api import Session
    from fastrun.cache import InMemoryCache
    from fastrun.runtime import layout, load

    registry = registry or default_registry()
    session = Session(cache=InMemoryCache(), strategy="heuristic", registry=registry,
                      progress=False)
    lowered = load(model, session, batch=batch, input_shapes=input_shapes)
    posed = [(step.problem, str(step.node)) for step in lowered.steps]
    if lowered.blocked_layout and device_kind == session.device.kind:
        # the layout plan's problems: a search of the model decides them too
        posed += [(problem, f"layout of {problem.operator}")
                  for problem in layout.layout_problems(lowered.steps, lowered.outputs, session)]
    found: dict[tuple[str, str], list[Any]] = {}
    for problem, node in posed:
        if problem is None or sum(a.device_kind == device_kind
                                  for a in registry.algorithms(problem.operator)) < 2:
            continue
        ident = (problem.operator, problem.key)
        if ident in found:
            found[ident][1] += 1
        else:
            found[ident] = [problem, 1, node]
    problems = tuple(
        SuiteProblem(p.operator, p.shapes, p.dtypes, p.params, label, count)
        for p, count, label in found.values())
    label = name or str(model)
    return Suite(label, f"distinct multi-algorithm problems of {label}", problems)
