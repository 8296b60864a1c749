"""Lowering ONNX nodes onto the registry's operators, folding constants on the way.

Each ONNX op type has one lowering function that reads the node's attributes (in every opset
spelling from 7 on) and emits calls of registry operators by name (``conv``, ``matmul``,
``add``, ``maxpool``, ...) through a :class:`Builder`.  The framework does not know the compute
library: it knows operator *names*, and a missing one is reported like any unsupported op.

All shapes are static once the model's input shapes are fixed, so every value's shape is known
while lowering, ``Shape`` is a constant, and a call whose inputs are all constants is evaluated
at once (constant folding) instead of becoming a step.

Reshape-like nodes (Reshape, Flatten, Squeeze, Unsqueeze), Identity, Dropout and Cast compute
nothing worth choosing an algorithm for; they become *view* steps (a numpy reshape or cast)
instead of registry operators.  See docs/architecture.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastrun.core import limits
from fastrun.operator import Operator, Problem
from fastrun.registry import Registry, RegistryError
from fastrun.runtime.errors import ModelError, UnsupportedOperatorError
from fastrun.runtime.graph import Graph, Node, evaluate_constant_node


class NonConstantInputError(UnsupportedOperatorError):
    """A node input that must be known while lowering (a Reshape's shape, a Slice's starts) is
    computed at run time.  ``value`` names it, so that a caller that knows the data (the ONNX
    backend, which is handed every input array) can bind it as a constant and lower again."""

    def __init__(self, problems: list[tuple[str, str, str]], value: str):
        super().__init__(problems)
        self.value = value


@dataclass(eq=False)
class Value:
    """One tensor of the lowered program: static shape and dtype, and its data if constant."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    const: np.ndarray | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def __repr__(self) -> str:
        kind = "const " if self.is_const else ""
        return f"<{kind}{self.name} {self.dtype}{list(self.shape)}>"


def pose(operator: Operator, inputs: Sequence[Value], **params: Any) -> Problem:
    """The problem ``operator`` poses on these values: their shapes and dtypes, and ``params``
    (every pass that makes or changes a step builds its problem here)."""
    return operator.problem([v.shape for v in inputs], [v.dtype for v in inputs], **params)


@dataclass(eq=False)
class Step:
    """One executed operation: a registry operator call, or a view (reshape/cast)."""

    #: ONNX node name(s) it came from, '+'-joined after fusion
    node: str
    #: ONNX op type(s), '+'-joined after fusion, e.g. "Conv+BatchNormalization+Relu"
    op_type: str
    inputs: list[Value]
    output: Value
    #: the registry problem, for operator steps
    problem: Problem | None = None
    #: the parameters the problem was built from, as lowering wrote them (fusion rebuilds the
    #: problem from these: canonical forms are not always valid input, e.g. a 1-D conv's)
    params: dict[str, Any] = field(default_factory=dict)
    #: array -> array, for view steps
    view: Callable[[np.ndarray], np.ndarray] | None = None
    #: a view step computed by an arbitrary numpy function (``Builder.apply``), which has no
    #: device form: on a device without host memory it runs on a host copy
    host_only: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def operator(self) -> str:
        return self.problem.operator if self.problem is not None else "view"

    def rebuild(self, operator: Operator) -> None:
        """Pose the problem again from the step's inputs and parameters, after a pass
        (fusion, a layout) changed them."""
        self.problem = pose(operator, self.inputs, **self.params)


Evaluator = Callable[[Problem, Sequence[np.ndarray]], np.ndarray]


class Builder:
    """Collects steps while lowering; evaluates calls on constants immediately."""

    def __init__(self, registry: Registry, evaluate: Evaluator, opset: int):
        self.registry = registry
        self.evaluate = evaluate
        self.opset = opset
        self.steps: list[Step] = []
        self.node: Node | None = None
        self._counter = 0

    def _name(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}#{self._counter}"

    # -- emitting ------------------------------------------------------------------------------
    def const(self, array: Any, name: str = "const") -> Value:
        array = np.asarray(array)
        return Value(name, tuple(array.shape), array.dtype, array)

    def op(self, operator: str, inputs: Sequence[Value], **params: Any) -> Value:
        """A call of registry operator ``operator``: folded now if every input is constant."""
        node = self.node
        try:
            definition = self.registry.operator(operator)
        except RegistryError as error:
            raise UnsupportedOperatorError(
                [(node.op_type, node.name, f"needs operator {operator!r}: {error}")]) from None
        try:
            problem = pose(definition, inputs, **params)
            shape = tuple(definition.output_shape(problem))
            dtype = np.dtype(definition.output_dtype(problem))
        except ValueError as error:
            raise UnsupportedOperatorError([(node.op_type, node.name, str(error))]) from None
        self.check_size(shape, dtype)
        if all(v.is_const for v in inputs):
            result = np.asarray(self.evaluate(problem, [v.const for v in inputs]))
            return self.const(result, self._name(node.outputs[0] if node.outputs else "folded"))
        output = Value(self._name(node.name), shape, dtype)
        self.steps.append(Step(node.name, node.op_type, list(inputs), output, problem=problem,
                               params=params))
        return output

    def view(self, value: Value, shape: Sequence[int] | None = None,
             dtype: Any = None) -> Value:
        """``value`` reshaped and/or cast: computed now for constants, else a view step."""
        shape = tuple(int(d) for d in (value.shape if shape is None else shape))
        dtype = np.dtype(value.dtype if dtype is None else dtype)
        if math.prod(shape) != math.prod(value.shape):
            raise ModelError(f"{self.node}: cannot reshape {list(value.shape)} to {list(shape)}")
        if shape == value.shape and dtype == value.dtype:
            return value

        def apply(array: np.ndarray, shape=shape, dtype=dtype) -> np.ndarray:
            return array.reshape(shape).astype(dtype, copy=False)

        if value.is_const:
            return self.const(apply(value.const), value.name)
        output = Value(self._name(self.node.name), shape, dtype)
        self.steps.append(Step(self.node.name, self.node.op_type, [value], output, view=apply))
        return output

    def apply(self, value: Value, function: Callable[[np.ndarray], np.ndarray],
              dtype: Any) -> Value:
        """``function(value)``, an elementwise numpy function of the same shape (a saturating
        cast, an integer truncation): computed now for constants, else a view step.  For
        conversions the compute library has no operator for, and which cost one pass."""
        dtype = np.dtype(dtype)

        def run(array: np.ndarray, function=function, dtype=dtype) -> np.ndarray:
            return np.asarray(function(array)).astype(dtype, copy=False)

        if value.is_const:
            return self.const(run(value.const), value.name)
        output = Value(self._name(self.node.name), value.shape, dtype)
        self.steps.append(Step(self.node.name, self.node.op_type, [value], output, view=run,
                               host_only=True))
        return output

    # -- reading node inputs -------------------------------------------------------------------
    def constant_input(self, value: Value | None, what: str) -> np.ndarray | None:
        """A node input that must be known before running (Reshape's shape, Slice's starts)."""
        if value is None:
            return None
        if not value.is_const:
            raise NonConstantInputError([(
                self.node.op_type, self.node.name,
                f"its {what} input {value.name!r} is computed at run time; fastrun needs it to "
                "be constant (an initializer, a Constant or foldable from static shapes)")],
                value.name)
        return value.const

    def check_size(self, shape: Sequence[int], dtype: Any) -> None:
        """Refuse, before allocating, a tensor larger than the memory limit
        (:mod:`fastrun.core.limits`), naming the node."""
        try:
            limits.check_tensor(shape, dtype, f"node {self.node.name!r} ({self.node.op_type})")
        except limits.TensorTooLargeError as error:
            raise ModelError(str(error)) from None

    def unsupported(self, why: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError([(self.node.op_type, self.node.name, why)])


Lowering = Callable[[Builder, Node, list[Value | None]], list[Value | None]]
LOWERINGS: dict[str, Lowering] = {}


def lowers(*op_types: str) -> Callable[[Lowering], Lowering]:
    def register(function: Lowering) -> Lowering:
        for op_type in op_types:
            LOWERINGS[op_type] = function
        return function
    return register


def supported_op_types() -> list[str]:
    return sorted(LOWERINGS)


# -- helpers ---------------------------------------------------------------------------------
def _ints(array: Any) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _axis(axis: int, rank: int, b: Builder) -> int:
    if not -rank <= axis < max(rank, 1):
        raise b.unsupported(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def _scalar(b: Builder, value: float, dtype: np.dtype) -> Value:
    return b.const(np.asarray(value, dtype=dtype))


# -- no-ops and constants ---------------------------------------------------------------------
@lowers("Identity")
def _identity(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [ins[0]]


@lowers("Dropout")
def _dropout(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """Inference: the identity; the optional mask output is all true.  Training mode is random
    unless its ratio is 0, when it is the identity too (opset 12+ takes both as inputs)."""
    training = b.constant_input(ins[2], "training_mode") if len(ins) > 2 else None
    if training is not None and bool(np.asarray(training).reshape(-1)[0]):
        ratio = b.constant_input(ins[1], "ratio") if len(ins) > 1 else None
        if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
            raise b.unsupported("training_mode=true with a nonzero ratio drops at random; "
                                "fastrun runs inference only")
    x = ins[0]
    outputs: list[Value | None] = [x]
    if len(node.outputs) > 1 and node.outputs[1]:
        outputs.append(b.const(np.ones(x.shape, dtype=bool)))
    return outputs


@lowers("Constant")
def _constant(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    for name, dtype in (("value", None), ("value_float", np.float32),
                        ("value_floats", np.float32), ("value_int", np.int64),
                        ("value_ints", np.int64)):
        if name in node.attrs:
            return [b.const(np.asarray(node.attrs[name], dtype=dtype))]
    raise b.unsupported(f"only numeric tensor values are supported, got {sorted(node.attrs)}")


@lowers("ConstantOfShape")
def _constant_of_shape(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    shape = _ints(b.constant_input(ins[0], "shape"))
    fill = node.attr("value")
    fill = np.zeros(1, np.float32) if fill is None else np.asarray(fill)
    b.check_size(shape, fill.dtype)
    return [b.const(np.full(shape, fill.reshape(-1)[0], dtype=fill.dtype))]


@lowers("Shape")
def _shape(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    dims = list(ins[0].shape)
    start, end = node.attr("start", 0), node.attr("end")
    return [b.const(np.asarray(dims[start:end], dtype=np.int64))]


@lowers("Size")
def _size(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.const(np.asarray(math.prod(ins[0].shape), dtype=np.int64))]


#: ONNX's 8-bit float types, whose casts saturate by default (``saturate=1``, opset 19+):
#: out-of-range values, infinities included, become the largest finite value of the sign.
_FLOAT8 = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")


@lowers("Cast")
def _cast(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    from onnx import TensorProto, helper

    to = int(node.attr("to"))
    if to == getattr(TensorProto, "FLOAT8E8M0", None):
        raise b.unsupported("casts to FLOAT8E8M0 (a power-of-two scale type with its own "
                            "rounding modes) are not supported")
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(to))
    except Exception:
        raise b.unsupported(f"cast to element type {to} is not supported") from None
    x = ins[0]
    saturating = {getattr(TensorProto, name, None) for name in _FLOAT8} - {None}
    if to in saturating and int(node.attr("saturate", 1)) and x.dtype.kind in "fiu":
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
        low, high = float(info.min), float(info.max)
        return [b.apply(x, lambda a: np.clip(a, low, high), dtype)]
    return [b.view(x, dtype=dtype)]


# -- reshapes ---------------------------------------------------------------------------------
@lowers("Reshape")
def _reshape(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    x = ins[0]
    target = _ints(b.constant_input(ins[1], "shape"))
    allow_zero = bool(node.attr("allowzero", 0))
    shape = [x.shape[i] if d == 0 and not allow_zero else d for i, d in enumerate(target)]
    if shape.count(-1) > 1:
        raise ModelError(f"{node}: shape {target} has more than one -1")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or math.prod(x.shape) % known:
            raise ModelError(f"{node}: cannot reshape {list(x.shape)} to {target}")
        shape[shape.index(-1)] = math.prod(x.shape) // known
    return [b.view(x, shape)]


@lowers("Flatten")
def _flatten(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    x = ins[0]
    rank = len(x.shape)
    axis = int(node.attr("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        raise b.unsupported(f"axis {node.attr('axis')} is out of range for rank {rank}")
    return [b.view(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


def _axes_input(b: Builder, node: Node, ins: list[Value | None]) -> list[int] | None:
    if b.opset >= 13:
        axes = b.constant_input(ins[1], "axes") if len(ins) > 1 else None
        return None if axes is None else _ints(axes)
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


@lowers("Squeeze")
def _squeeze(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    x = ins[0]
    axes = _axes_input(b, node, ins)
    rank = len(x.shape)
    if axes is None:
        keep = [d for d in x.shape if d != 1]
    else:
        drop = {_axis(a, rank, b) for a in axes}
        if any(x.shape[a] != 1 for a in drop):
            raise ModelError(f"{node}: cannot squeeze axes {axes} of shape {list(x.shape)}")
        keep = [d for i, d in enumerate(x.shape) if i not in drop]
    return [b.view(x, keep)]


@lowers("Unsqueeze")
def _unsqueeze(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    x = ins[0]
    axes = _axes_input(b, node, ins)
    if axes is None:
        raise b.unsupported("axes are missing")
    rank = len(x.shape) + len(axes)
    positions = sorted(_axis(a, rank, b) for a in axes)
    shape = list(x.shape)
    for position in positions:
        shape.insert(position, 1)
    return [b.view(x, shape)]


# -- elementwise ------------------------------------------------------------------------------
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


#: Integer types the elementwise operators do not take: computed in int64 and narrowed back,
#: which wraps around exactly as arithmetic in the narrow type does (uint64 goes through int64
#: by two's complement, so add/sub/mul are exact too).
_WIDENED_INTEGERS = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.uint8, np.uint16,
                                                    np.uint32, np.uint64))


def _same_type_operands(b: Builder, node: Node, ins: list[Value | None]
                        ) -> tuple[Value, Value]:
    """The two operands of an arithmetic or comparison node, which ONNX gives one type;
    integer types the elementwise operators do not take as int64 views."""
    a, c = ins[0], ins[1]
    if a.dtype != c.dtype:
        raise ModelError(f"{node}: operands have different types {a.dtype} and {c.dtype}")
    if a.dtype in _WIDENED_INTEGERS:
        a, c = b.view(a, dtype=np.int64), b.view(c, dtype=np.int64)
    return a, c


@lowers(*_BINARY)
def _binary(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    dtype = ins[0].dtype
    a, c = _same_type_operands(b, node, ins)
    result = b.op(_BINARY[node.op_type], [a, c])
    if node.op_type == "Div" and dtype.kind in "iu":
        # ONNX integer division truncates toward zero; the div operator is true division in
        # float64, whose cast back to an integer type truncates.  Exact while |a| < 2**53.
        return [b.apply(result, np.trunc, dtype)]
    return [b.view(result, dtype=dtype)]


@lowers("Sum")
def _sum(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    total = ins[0]
    for other in ins[1:]:
        total = b.op("add", [total, other])
    return [total]


# -- activations ------------------------------------------------------------------------------
_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish",
          "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "neg", "Abs": "abs",
          "Reciprocal": "reciprocal", "Erf": "erf"}


@lowers(*_UNARY)
def _unary(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op(_UNARY[node.op_type], [ins[0]])]


@lowers("LeakyRelu")
def _leaky_relu(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("leaky_relu", [ins[0]], alpha=float(node.attr("alpha", 0.01)))]


@lowers("HardSigmoid")
def _hard_sigmoid(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("hard_sigmoid", [ins[0]], alpha=float(node.attr("alpha", 0.2)),
                 beta=float(node.attr("beta", 0.5)))]


@lowers("Clip")
def _clip(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    if b.opset < 11:
        low, high = node.attr("min"), node.attr("max")
    else:
        low = b.constant_input(ins[1] if len(ins) > 1 else None, "min")
        high = b.constant_input(ins[2] if len(ins) > 2 else None, "max")
    params = {}
    if low is not None:
        params["min"] = float(np.asarray(low).reshape(-1)[0])
    if high is not None:
        params["max"] = float(np.asarray(high).reshape(-1)[0])
    return [b.op("clip", [ins[0]], **params)]


@lowers("Gelu")
def _gelu(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """GELU (opset 20) as the steps its two forms are made of: ``x / 2 * (1 + erf(x /
    sqrt(2)))``, or with ``approximate="tanh"``, ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x +
    0.044715 x^3)))``; older exports spell these out themselves."""
    x = ins[0]
    approximate = node.attr("approximate", "none")  # string attributes arrive decoded
    if approximate == "tanh":
        cube = b.op("mul", [b.op("mul", [x, x]), x])
        inner = b.op("add", [x, b.op("mul", [cube, _scalar(b, 0.044715, x.dtype)])])
        gate = b.op("tanh", [b.op("mul", [inner, _scalar(b, math.sqrt(2 / math.pi), x.dtype)])])
    elif approximate == "none":
        gate = b.op("erf", [b.op("mul", [x, _scalar(b, 1 / math.sqrt(2), x.dtype)])])
    else:
        raise b.unsupported(f"approximate={approximate!r}: ONNX defines 'none' and 'tanh'")
    half = b.op("mul", [x, _scalar(b, 0.5, x.dtype)])
    return [b.op("mul", [half, b.op("add", [gate, _scalar(b, 1.0, x.dtype)])])]


@lowers("LayerNormalization")
def _layer_norm(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    x = ins[0]
    rank = len(x.shape)
    axis = _axis(int(node.attr("axis", -1)), rank, b)
    normalized = x.shape[axis:]
    epsilon = float(node.attr("epsilon", 1e-5))

    def full(value: Value | None, fill: float) -> Value:
        """Scale or bias of X's normalised shape: a constant broadcast (zeros for an absent
        bias), a computed one as it is (the operator checks its shape)."""
        if value is None:
            return b.const(np.full(normalized, fill, x.dtype))
        if value.is_const:
            return b.const(np.ascontiguousarray(np.broadcast_to(
                np.asarray(value.const, x.dtype), normalized)))
        return value

    y = b.op("layer_norm", [x, full(ins[1], 1.0), full(ins[2] if len(ins) > 2 else None, 0.0)],
             axis=axis, epsilon=epsilon)
    if not any(node.outputs[1:]):
        return [y]
    # Mean and InvStdDev, asked for: built from other operators (the layer_norm step keeps its
    # one output)
    axes = tuple(range(axis, rank))
    mean = b.op("reduce", [x], mode="mean", axes=axes, keepdims=True)
    diff = b.op("sub", [x, mean])
    var = b.op("reduce", [b.op("mul", [diff, diff])], mode="mean", axes=axes, keepdims=True)
    spread = b.op("sqrt", [b.op("add", [var, _scalar(b, epsilon, x.dtype)])])
    return [y, mean, b.op("reciprocal", [spread])]


@lowers("InstanceNormalization")
def _instance_norm(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """``scale[c] * (x - mean) / sqrt(var + epsilon) + B[c]`` over each (image, channel)'s
    spatial values: a ``layer_norm`` from axis 2 (unit scale, zero bias), then the channel's
    scale and bias as broadcast ``mul`` and ``add`` steps."""
    x = ins[0]
    rank = len(x.shape)
    if rank < 3 or len(ins) < 3 or ins[1] is None or ins[2] is None:
        raise b.unsupported("needs X of rank 3 or more, a scale and a bias")
    spatial = x.shape[2:]
    normed = b.op("layer_norm", [x, b.const(np.ones(spatial, x.dtype)),
                                 b.const(np.zeros(spatial, x.dtype))],
                  axis=2, epsilon=float(node.attr("epsilon", 1e-5)))
    per_channel = (x.shape[1],) + (1,) * (rank - 2)
    scale, bias = b.view(ins[1], per_channel), b.view(ins[2], per_channel)
    return [b.op("add", [b.op("mul", [normed, scale]), bias])]


@lowers("Pow")
def _pow(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """A constant scalar exponent of the forms models use, as the steps it amounts to: 1, 2
    and 3 as products (a LayerNorm spelled out squares, GELU's tanh form cubes), 0.5 and -0.5
    as sqrt and its reciprocal, -1 as reciprocal.  Other exponents are refused, named."""
    x, exponent = ins[0], ins[1]
    if x.dtype.kind != "f":
        raise b.unsupported(f"Pow of {x.dtype}: fastrun lowers float bases only")
    if not exponent.is_const or np.asarray(exponent.const).size != 1:
        raise b.unsupported("Pow needs a constant scalar exponent")
    power = float(np.asarray(exponent.const).reshape(-1)[0])
    if power == 1:
        return [x]
    if power in (2, 3):
        square = b.op("mul", [x, x])
        return [square if power == 2 else b.op("mul", [square, x])]
    if power in (0.5, -0.5):
        root = b.op("sqrt", [x])
        return [root if power > 0 else b.op("reciprocal", [root])]
    if power == -1:
        return [b.op("reciprocal", [x])]
    raise b.unsupported(f"exponent {power:g}: fastrun lowers 1, 2, 3, 0.5, -0.5 and -1")


@lowers("Expand")
def _expand(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    shape = b.constant_input(ins[1], "shape")
    return [b.op("expand", [ins[0]], shape=tuple(_ints(shape)))]


@lowers("Tile")
def _tile(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """``repeats`` copies along each axis, as an ``expand`` between two views: (d0, d1) is
    viewed as (1, d0, 1, d1), expanded to (r0, d0, r1, d1) and viewed as (r0*d0, r1*d1)."""
    x = ins[0]
    repeats = tuple(_ints(b.constant_input(ins[1], "repeats")))
    if len(repeats) != len(x.shape) or any(r < 0 for r in repeats):
        raise b.unsupported(f"repeats {list(repeats)} for an input of rank {len(x.shape)}: one "
                            "non-negative count per axis")
    if all(r == 1 for r in repeats):
        return [x]
    spread = b.view(x, [d for size in x.shape for d in (1, size)])
    tiled = b.op("expand", [spread], shape=tuple(d for r, size in zip(repeats, x.shape,
                                                                      strict=True)
                                                 for d in (r, size)))
    return [b.view(tiled, [r * size for r, size in zip(repeats, x.shape, strict=True)])]


@lowers("Where")
def _where(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("where", [ins[0], ins[1], ins[2]])]


_COMPARISONS = {"Equal": "equal", "Less": "less", "Greater": "greater",
                "LessOrEqual": "less_equal", "GreaterOrEqual": "greater_equal"}


@lowers(*_COMPARISONS)
def _comparison(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """A bool tensor; narrow integer operands compare in int64, exactly (bool operands, which
    Equal allows, are not lowered)."""
    return [b.op(_COMPARISONS[node.op_type], list(_same_type_operands(b, node, ins)))]


# -- reductions -------------------------------------------------------------------------------
_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2",
           "ReduceSumSquare": "sum_square"}


@lowers(*_REDUCE)
def _reduce(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    # axes became an input in opset 13 for ReduceSum and in opset 18 for the others
    if b.opset >= (13 if node.op_type == "ReduceSum" else 18):
        axes = b.constant_input(ins[1] if len(ins) > 1 else None, "axes")
    else:
        axes = node.attr("axes")
    axes = () if axes is None else tuple(_ints(axes))
    if not axes and node.attr("noop_with_empty_axes", 0):
        return [ins[0]]  # no axes and told not to reduce: the input itself
    return [b.op("reduce", [ins[0]], mode=_REDUCE[node.op_type], axes=axes or None,
                 keepdims=bool(node.attr("keepdims", 1)))]


@lowers("ArgMax", "ArgMin")
def _arg_reduce(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("arg_reduce", [ins[0]], mode="max" if node.op_type == "ArgMax" else "min",
                 axis=int(node.attr("axis", 0)), keepdims=bool(node.attr("keepdims", 1)),
                 select_last_index=bool(node.attr("select_last_index", 0)))]


@lowers("Softmax")
def _softmax(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    x = ins[0]
    rank = len(x.shape)
    if b.opset >= 13:
        return [b.op("softmax", [x], axis=_axis(int(node.attr("axis", -1)), rank, b))]
    # Before opset 13 the input is coerced to 2-D at ``axis`` and normalised per row.
    axis = _axis(int(node.attr("axis", 1)), rank, b) if rank else 0
    flat = b.view(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return [b.view(b.op("softmax", [flat], axis=1), x.shape)]


@lowers("BatchNormalization")
def _batch_norm(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    if node.attr("training_mode", 0):
        raise b.unsupported("training_mode=1; fastrun runs inference only")
    if int(node.attr("spatial", 1)) != 1:
        raise b.unsupported("spatial=0 (per-activation statistics) is not supported")
    if any(node.outputs[1:]):
        raise b.unsupported("the running mean/var outputs are training-only")
    return [b.op("batch_norm", ins[:5], epsilon=float(node.attr("epsilon", 1e-5)))]


# -- tunable ----------------------------------------------------------------------------------
@lowers("Conv")
def _conv(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    params = {name: node.attrs[name] for name in
              ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
              if name in node.attrs}
    inputs = [v for v in ins if v is not None]
    return [b.op("conv", inputs, **params)]


@lowers("ConvTranspose")
def _conv_transpose(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    params = {name: node.attrs[name] for name in
              ("auto_pad", "dilations", "group", "kernel_shape", "output_padding",
               "output_shape", "pads", "strides") if name in node.attrs}
    return [b.op("conv_transpose", [v for v in ins if v is not None], **params)]


@lowers("MatMul")
def _matmul(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """A batched left operand against a 2-D right one (a transformer's projections, spelled
    (tokens, 1, hidden) @ (hidden, out) by some exporters) is one 2-D product with the batch
    folded into its rows: numpy's batched matmul would multiply each row by the whole weight
    matrix in turn, reading it once per row (197 times for ViT-B/16's QKV projection)."""
    a, w = ins[0], ins[1]
    if len(a.shape) > 2 and len(w.shape) == 2:
        rows = b.view(a, (math.prod(a.shape[:-1]), a.shape[-1]))
        product = b.op("matmul", [rows, w])
        return [b.view(product, (*a.shape[:-1], w.shape[-1]))]
    return [b.op("matmul", [a, w])]


@lowers("Einsum")
def _einsum(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """One or two operands, each letter at most once per operand (no diagonals), with or
    without an output and with an ellipsis of the same rank wherever it appears: the common
    matmul patterns (``bij,bjk->bik``, ``bhqd,bhkd->bhqk``, transposes and sums).  Letters only
    one operand has and the output lacks are summed first; the operands are then transposed
    and viewed as (batch, rows, K) and (batch, K, columns) for one batched ``matmul``, whose
    result is viewed and transposed into the output's order."""
    equation = node.attr("equation", "").replace(" ", "")  # string attributes arrive decoded
    operands = [v for v in ins if v is not None]
    lhs, arrow, output = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands) or not 1 <= len(terms) <= 2:
        raise b.unsupported(f"equation {equation!r}: fastrun lowers one or two operands")
    unused = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
              if c not in equation]
    ellipsis_rank = {len(v.shape) - (len(t) - 3) for t, v in zip(terms, operands, strict=True)
                     if "..." in t}
    if len(ellipsis_rank) > 1:
        raise b.unsupported(f"equation {equation!r}: ellipses of different ranks")
    dots = "".join(unused[:ellipsis_rank.pop()]) if ellipsis_rank else ""
    terms = [t.replace("...", dots) for t in terms]
    if not arrow:  # implicit output: the letters seen once, in order (the ellipsis first)
        once = [c for c in sorted(set("".join(terms))) if "".join(terms).count(c) == 1]
        output = dots + "".join(c for c in once if c not in dots)
    output = output.replace("...", dots)
    sizes: dict[str, int] = {}
    for term, value in zip(terms, operands, strict=True):
        if len(term) != len(value.shape) or len(set(term)) != len(term):
            raise b.unsupported(f"equation {equation!r}: each operand needs one distinct "
                                f"letter per dimension (diagonals are not lowered)")
        for letter, size in zip(term, value.shape, strict=True):
            if sizes.setdefault(letter, size) != size:
                raise b.unsupported(f"equation {equation!r}: {letter!r} is {sizes[letter]} "
                                    f"and {size}")
    if operands[0].dtype.kind != "f" or any(v.dtype != operands[0].dtype for v in operands):
        raise b.unsupported("Einsum of float32 or float64 operands of one type only")

    def summed(term: str, value: Value, keep: str) -> tuple[str, Value]:
        """``value`` summed over the letters of ``term`` not in ``keep``."""
        axes = tuple(i for i, c in enumerate(term) if c not in keep)
        if not axes:
            return term, value
        return ("".join(c for c in term if c in keep),
                b.op("reduce", [value], mode="sum", axes=axes, keepdims=False))

    def arranged(term: str, value: Value, order: str) -> Value:
        perm = tuple(term.index(c) for c in order)
        return value if perm == tuple(range(len(perm))) else \
            b.op("transpose", [value], perm=perm)

    if len(terms) == 1:
        term, value = summed(terms[0], operands[0], output)
        return [arranged(term, value, output)]
    (ta, a), (tb, w) = (summed(t, v, output + other) for t, v, other in
                        ((terms[0], operands[0], terms[1]), (terms[1], operands[1], terms[0])))
    batch = "".join(c for c in output if c in ta and c in tb)
    inner = "".join(c for c in ta if c in tb and c not in output)
    rows = "".join(c for c in output if c in ta and c not in tb)
    columns = "".join(c for c in output if c in tb and c not in ta)

    def size(letters: str) -> int:
        return math.prod(sizes[c] for c in letters)

    left = b.view(arranged(ta, a, batch + rows + inner), (size(batch), size(rows), size(inner)))
    right = b.view(arranged(tb, w, batch + inner + columns),
                   (size(batch), size(inner), size(columns)))
    product = b.view(b.op("matmul", [left, right]),
                     tuple(sizes[c] for c in batch + rows + columns))
    return [arranged(batch + rows + columns, product, output)]


@lowers("Gemm")
def _gemm(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """Y = alpha * A' @ B' + beta * C: transposes of constant weights fold away."""
    a, w = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if node.attr("transA", 0):
        a = b.op("transpose", [a], perm=(1, 0))
    if node.attr("transB", 0):
        w = b.op("transpose", [w], perm=(1, 0))
    y = b.op("matmul", [a, w])
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = b.op("mul", [y, _scalar(b, alpha, y.dtype)])
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = b.op("mul", [c, _scalar(b, beta, c.dtype)])
        y = b.op("add", [y, c])
    return [y]


# -- pooling ----------------------------------------------------------------------------------
_POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")


@lowers("MaxPool")
def _maxpool(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """The maxpool operator takes floats: integer inputs are pooled in a float type that holds
    every value exactly (a max only compares and picks) and cast back."""
    if len(node.outputs) > 1 and node.outputs[1]:
        raise b.unsupported("the Indices output is not supported")
    params = {k: node.attrs[k] for k in (*_POOL_ATTRS, "storage_order") if k in node.attrs}
    x = ins[0]
    if x.dtype.kind in "iu" and x.dtype.itemsize <= 4:
        exact = np.float32 if x.dtype.itemsize <= 2 else np.float64
        pooled = b.op("maxpool", [b.view(x, dtype=exact)], **params)
        return [b.view(pooled, dtype=x.dtype)]
    return [b.op("maxpool", [x], **params)]


@lowers("AveragePool")
def _avgpool(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    params = {k: node.attrs[k] for k in (*_POOL_ATTRS, "count_include_pad") if k in node.attrs}
    return [b.op("avgpool", [ins[0]], **params)]


@lowers("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    name = "global_avgpool" if node.op_type == "GlobalAveragePool" else "global_maxpool"
    return [b.op(name, [ins[0]])]


@lowers("LRN")
def _lrn(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("lrn", [ins[0]], size=int(node.attr("size")),
                 alpha=float(node.attr("alpha", 1e-4)), beta=float(node.attr("beta", 0.75)),
                 bias=float(node.attr("bias", 1.0)))]


# -- data movement ----------------------------------------------------------------------------
@lowers("Transpose")
def _transpose(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    perm = node.attr("perm")
    params = {} if perm is None else {"perm": tuple(int(p) for p in perm)}
    return [b.op("transpose", [ins[0]], **params)]


@lowers("Concat")
def _concat(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    inputs = [v for v in ins if v is not None]
    return [b.op("concat", inputs, axis=int(node.attr("axis")))]


@lowers("Gather")
def _gather(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("gather", ins[:2], axis=int(node.attr("axis", 0)))]


@lowers("GatherElements")
def _gather_elements(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("gather_elements", ins[:2], axis=int(node.attr("axis", 0)))]


@lowers("ScatterND")
def _scatter_nd(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    return [b.op("scatter_nd", ins[:3], reduction=node.attr("reduction", "none"))]


@lowers("TopK")
def _topk(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """TopK as the ``topk`` operator's indices and a ``gather_elements`` of X by them (the
    values): two single-output steps.  K must be constant (the outputs' shapes depend on it);
    before opset 10 it is an attribute."""
    x = ins[0]
    if b.opset < 10:
        k = int(node.attr("k"))
    else:
        k = int(np.asarray(b.constant_input(ins[1], "K")).reshape(-1)[0])
    axis = _axis(int(node.attr("axis", -1)), len(x.shape), b)
    indices = b.op("topk", [x], k=k, axis=axis, largest=bool(node.attr("largest", 1)))
    return [b.op("gather_elements", [x, indices], axis=axis), indices]


@lowers("Slice")
def _slice(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    if b.opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
        steps = None
    else:
        def read(index: int, what: str):
            return b.constant_input(ins[index] if len(ins) > index else None, what)
        starts, ends, axes, steps = (read(1, "starts"), read(2, "ends"), read(3, "axes"),
                                     read(4, "steps"))
    params: dict[str, Any] = {"starts": tuple(_ints(starts)), "ends": tuple(_ints(ends))}
    if axes is not None:
        params["axes"] = tuple(_ints(axes))
    if steps is not None:
        params["steps"] = tuple(_ints(steps))
    return [b.op("slice", [ins[0]], **params)]


@lowers("Split")
def _split(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """Split as one ``slice`` per output."""
    x = ins[0]
    axis = _axis(int(node.attr("axis", 0)), len(x.shape), b)
    count = len(node.outputs)
    if b.opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = _ints(b.constant_input(ins[1], "split"))
    elif node.attr("split") is not None:
        sizes = [int(s) for s in node.attr("split")]
    else:
        parts = int(node.attr("num_outputs", count))
        chunk = -(-x.shape[axis] // parts)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
    if sum(sizes) != x.shape[axis] or len(sizes) != count:
        raise ModelError(f"{node}: split sizes {sizes} do not divide axis {axis} of "
                         f"{list(x.shape)} into {count} outputs")
    outputs: list[Value | None] = []
    start = 0
    for size in sizes:
        outputs.append(b.op("slice", [x], starts=(start,), ends=(start + size,), axes=(axis,)))
        start += size
    return outputs


@lowers("Pad")
def _pad(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    mode = node.attr("mode", "constant")
    if b.opset < 11:
        pads, value, axes = node.attr("pads"), node.attr("value", 0.0), None
    else:
        pads = b.constant_input(ins[1], "pads")
        value = b.constant_input(ins[2] if len(ins) > 2 else None, "constant_value")
        axes = b.constant_input(ins[3] if len(ins) > 3 else None, "axes")
    params: dict[str, Any] = {"pads": tuple(_ints(pads)), "mode": mode}
    if value is not None:
        scalar = np.asarray(value).reshape(-1)
        if scalar.size:
            params["value"] = scalar[0].item()
    if axes is not None:
        params["axes"] = tuple(_ints(axes))
    return [b.op("pad", [ins[0]], **params)]


# -- resizing ---------------------------------------------------------------------------------
def _optional_constant(b: Builder, value: Value | None, what: str) -> np.ndarray | None:
    """An optional constant input; an empty tensor counts as absent (exporters pass an empty
    roi or scales where they mean none)."""
    array = b.constant_input(value, what)
    return None if array is None or np.asarray(array).size == 0 else np.asarray(array)


def _resize_sizes(node: Node, shape: Sequence[int], scales: Any, sizes: Any,
                  axes: Sequence[int] | None, policy: str
                  ) -> tuple[tuple[int, ...], tuple[float, ...] | None]:
    """ONNX Resize's output shape, and the scale of every axis when they are not
    ``sizes / input``: scales given make floor(input * scale) and are kept as given; sizes given
    are kept (``stretch``) or fitted inside (``not_larger``) or around (``not_smaller``) them
    with one scale, rounded to the nearest size."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    out, full = list(shape), [1.0] * rank
    if sizes is not None:
        sizes = _ints(sizes)
        if len(sizes) != len(axes):
            raise ModelError(f"{node}: sizes {sizes} do not give one size per axis {axes}")
        if policy == "stretch":
            for axis, size in zip(axes, sizes, strict=True):
                out[axis] = size
            return tuple(out), None
        ratios = [size / shape[axis] for axis, size in zip(axes, sizes, strict=True)]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        for axis in axes:
            out[axis], full[axis] = math.floor(scale * shape[axis] + 0.5), scale
        return tuple(out), tuple(full)
    if scales is None:
        raise ModelError(f"{node}: needs scales or sizes")
    scales = [float(v) for v in np.asarray(scales).reshape(-1)]
    if len(scales) != len(axes):
        raise ModelError(f"{node}: scales {scales} do not give one scale per axis {axes}")
    for axis, scale in zip(axes, scales, strict=True):
        out[axis], full[axis] = math.floor(shape[axis] * scale), scale
    return tuple(out), tuple(full)


@lowers("Resize", "Upsample")
def _resize(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """Every mode, coordinate transform and option of opsets 10-19.  Upsample and opset 10's
    Resize are the asymmetric transform, rounding nearest down (what they computed)."""
    x = ins[0]
    mode = node.attr("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode  # Upsample-7's spelling
    roi = sizes = axes = None
    if node.op_type == "Upsample" or b.opset < 11:
        scales = node.attr("scales") if node.op_type == "Upsample" and b.opset < 9 else \
            _optional_constant(b, ins[1] if len(ins) > 1 else None, "scales")
        params: dict[str, Any] = {"coordinate_transformation_mode": "asymmetric",
                                  "nearest_mode": "floor"}
    else:
        roi = _optional_constant(b, ins[1] if len(ins) > 1 else None, "roi")
        scales = _optional_constant(b, ins[2] if len(ins) > 2 else None, "scales")
        sizes = _optional_constant(b, ins[3] if len(ins) > 3 else None, "sizes")
        axes = node.attr("axes")
        params = {"coordinate_transformation_mode": node.attr(
                      "coordinate_transformation_mode", "half_pixel"),
                  "nearest_mode": node.attr("nearest_mode", "round_prefer_floor"),
                  "exclude_outside": bool(node.attr("exclude_outside", 0)),
                  "antialias": bool(node.attr("antialias", 0))}
        if mode == "cubic":
            params["cubic_coeff_a"] = float(node.attr("cubic_coeff_a", -0.75))
    out, full = _resize_sizes(node, x.shape, scales, sizes, axes,
                              node.attr("keep_aspect_ratio_policy", "stretch"))
    params.update(mode=mode, sizes=out)
    if full is not None:
        params["scales"] = full
    if params["coordinate_transformation_mode"] == "tf_crop_and_resize":
        rank = len(x.shape)
        chosen = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        box = [0.0] * rank + [1.0] * rank
        given = [] if roi is None else [float(v) for v in roi.reshape(-1)]
        if len(given) != 2 * len(chosen):
            raise b.unsupported(f"tf_crop_and_resize needs a roi of {2 * len(chosen)} values, "
                                f"got {len(given)}")
        for i, axis in enumerate(chosen):
            box[axis], box[axis + rank] = given[i], given[i + len(chosen)]
        params.update(roi=tuple(box),
                      extrapolation_value=float(node.attr("extrapolation_value", 0.0)))
    return [b.op("resize", [x], **params)]


# -- the whole graph --------------------------------------------------------------------------
#: Why a node of an op type with no lowering cannot run.
NO_LOWERING = "no lowering for this op type"


def lower(graph: Graph, input_values: dict[str, Value], registry: Registry,
          evaluate: Evaluator) -> tuple[list[Step], dict[str, Value]]:
    """Lower every node in order; returns the steps and the value of every ONNX name.

    A node of an op type with no lowering is computed now when every input is a constant
    (:func:`fastrun.runtime.graph.evaluate_constant_node`: shape arithmetic and masks of
    exported transformers).  Otherwise it is collected, with every node that cannot be
    lowered, and all of them are named in one :class:`UnsupportedOperatorError` at the end,
    before any search: what depends on an unrunnable value is skipped, not reported."""
    builder = Builder(registry, evaluate, graph.opset)
    values: dict[str, Value] = dict(input_values)
    for name, array in graph.initializers.items():
        values[name] = builder.const(array, name)
    problems: list[tuple[str, str, str]] = []
    unknown: set[str] = set()  # names downstream of a node that cannot run
    for node in graph.nodes:
        builder.node = node
        if any(name in unknown for name in node.inputs if name):
            if node.op_type not in LOWERINGS:
                problems.append((node.op_type, node.name, NO_LOWERING))
            unknown.update(name for name in node.outputs if name)
            continue
        ins = [values[name] if name else None for name in node.inputs]
        try:
            if node.op_type in LOWERINGS:
                if any(v is None for v in ins[:1]):
                    raise ModelError(f"{node}: its first input is missing")
                outputs = LOWERINGS[node.op_type](builder, node, ins)
            else:
                outputs = _constant_node(builder, node, ins)
        except NonConstantInputError:
            raise  # its caller may bind the value as a constant and lower again
        except UnsupportedOperatorError as error:
            # a form the operators refuse (Neg of int64 shape values) is still computed when
            # every input is a constant
            outputs = _constant_fallback(builder, node, ins)
            if outputs is None:
                problems.extend(error.problems)
                unknown.update(name for name in node.outputs if name)
                continue
        for name, value in zip(node.outputs, outputs, strict=False):
            if name and value is not None:
                values[name] = value
        missing = [name for name in node.outputs[len(outputs):] if name]
        if missing:
            problems.append((node.op_type, node.name,
                             f"output(s) {missing} are not supported"))
            unknown.update(missing)
    if problems:
        raise UnsupportedOperatorError(problems, supported_op_types())
    return builder.steps, values


def _constant_fallback(b: Builder, node: Node, ins: list[Value | None]
                       ) -> list[Value | None] | None:
    """A lowered op type's node that its lowering refused, computed by ONNX's reference when
    all its inputs are constants; None when it cannot be."""
    if node.op_type not in LOWERINGS or not all(v is None or v.is_const for v in ins):
        return None
    try:
        return _constant_node(b, node, ins)
    except UnsupportedOperatorError:
        return None


def _constant_node(b: Builder, node: Node, ins: list[Value | None]) -> list[Value | None]:
    """A node with no lowering, computed now if all its inputs are constants."""
    if not all(v is None or v.is_const for v in ins):
        raise b.unsupported(NO_LOWERING)
    try:
        results = evaluate_constant_node(node, [v.const if v is not None else None
                                                for v in ins], b.opset)
    except ValueError as error:
        raise b.unsupported(f"{NO_LOWERING}, and computing it from its constant inputs "
                            f"failed ({error})") from None
    computed = iter(results)  # the reference returns the named outputs, in order
    outputs: list[Value | None] = []
    for name in node.outputs:
        array = next(computed) if name else None
        if array is not None:
            b.check_size(array.shape, array.dtype)
        outputs.append(b.const(array, name) if array is not None else None)
    return outputs
