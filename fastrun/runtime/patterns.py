"""Multi-step patterns that one operator computes, replaced by that operator's step.

Exporters spell some layers as several nodes: GELU as five steps around an Erf, or ten around a
Tanh (a transformer's MLP runs them on its widest activation), a LayerNorm before opset 17 as
nine, attention's scale as a Div before its Softmax, and a projection as a MatMul, a bias Add
and an activation.  Each step is a pass over
memory and a parallel region; the operator that computes the whole pattern makes one.  The
passes here run on the lowered steps before :func:`fastrun.runtime.fusion.fuse` folds
epilogues, and only where an algorithm of the session's device kind computes the operator
(:func:`operator_on`).

Every pass keeps the graph's meaning: a value the pattern would skip must have all its readers
inside the pattern and be no graph output, or the pattern is left as it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from fastrun.operator import Operator
from fastrun.registry import Registry
from fastrun.runtime.lowering import Step, Value, pose


def replace(steps: list[Step], outputs: Iterable[Value], registry: Registry,
            device_kind: str) -> list[Step]:
    """The steps with every pattern below replaced, GELUs first (a projection then takes its
    GELU as its activation)."""
    outputs = list(outputs)
    steps = _gelus(steps, outputs, registry, device_kind)
    steps = _split_layer_norms(steps, outputs, registry, device_kind)
    steps = _scaled_softmaxes(steps, outputs, registry, device_kind)
    return _linear_layers(steps, outputs, registry, device_kind)


def operator_on(registry: Registry, name: str, device_kind: str) -> Operator | None:
    """Operator ``name`` where an algorithm of ``device_kind`` computes it, else None: a
    pattern fuses into an operator only where its steps can then run."""
    if name not in registry.operators() or not any(
            a.device_kind == device_kind for a in registry.algorithms(name)):
        return None
    return registry.operator(name)


class Readers:
    """Who reads each value of the steps: the distinct steps (one that reads a value twice,
    ``x * x``, counts once), and None for a graph output."""

    def __init__(self, steps: list[Step], outputs: Iterable[Value]):
        self._found: dict[int, list[Step | None]] = {}
        for step in steps:
            for value in dict.fromkeys(id(v) for v in step.inputs):
                self._found.setdefault(value, []).append(step)
        for value in outputs:
            self._found.setdefault(id(value), []).append(None)

    def of(self, value: Value) -> list[Step | None]:
        return self._found.get(id(value), [])

    def only(self, value: Value) -> Step | None:
        """The one step that reads ``value``, or None when it has several readers, none, or
        is a graph output."""
        found = self.of(value)
        return found[0] if len(found) == 1 else None


def _scalar_of(step: Step, value: Value) -> float | None:
    """The other input of a two-input ``step`` when it is a one-element constant, else None."""
    if len(step.inputs) != 2 or not any(v is value for v in step.inputs):
        return None
    other = step.inputs[1] if step.inputs[0] is value else step.inputs[0]
    if not other.is_const or other.const.size != 1 or step.output.shape != value.shape:
        return None
    return float(other.const.reshape(-1)[0])


def _near(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) <= 1e-6 * abs(expected)


def _erf_head(gate: Step, only_reader, producer) -> tuple[Value, list[Step]] | None:
    """(x, the steps before the Erf) when ``gate`` is ``erf(x / sqrt 2)`` (a Div by sqrt 2 or
    a Mul by its inverse)."""
    scaled = producer.get(id(gate.inputs[0]))
    if scaled is None or only_reader(scaled.output) is not gate:
        return None
    x = next((v for v in scaled.inputs if not v.is_const), None)
    factor = _scalar_of(scaled, x) if x is not None else None
    if (scaled.operator == "div" and scaled.inputs[0] is x and _near(factor, math.sqrt(2))) \
            or (scaled.operator == "mul" and _near(factor, 1 / math.sqrt(2))):
        return x, [scaled]
    return None


def _tanh_head(gate: Step, only_reader, producer) -> tuple[Value, list[Step]] | None:
    """(x, the steps before the Tanh) when ``gate`` is ``tanh(sqrt(2 / pi) * (x + 0.044715 *
    x * x * x))``, the cube as the lowering writes Pow 3 (``(x * x) * x``)."""
    def sole_producer(value: Value, operator: str, reader: Step) -> Step | None:
        step = producer.get(id(value))
        return step if step is not None and step.operator == operator \
            and only_reader(step.output) is reader else None

    scaled = sole_producer(gate.inputs[0], "mul", gate)
    if scaled is None:
        return None
    inner = next((v for v in scaled.inputs if not v.is_const), None)
    total = sole_producer(inner, "add", scaled) if inner is not None else None
    if total is None or not _near(_scalar_of(scaled, inner), math.sqrt(2 / math.pi)):
        return None
    for x, term in (total.inputs, total.inputs[::-1]):
        cubic = sole_producer(term, "mul", total)
        cube_value = next((v for v in cubic.inputs if not v.is_const), None) if cubic else None
        cube = sole_producer(cube_value, "mul", cubic) if cube_value is not None else None
        if cube is None or not _near(_scalar_of(cubic, cube_value), 0.044715) \
                or not any(v is x for v in cube.inputs):
            continue
        square_value = cube.inputs[1] if cube.inputs[0] is x else cube.inputs[0]
        square = sole_producer(square_value, "mul", cube)
        if square is not None and all(v is x for v in square.inputs):
            return x, [square, cube, cubic, total, scaled]
    return None


#: the gate operator of each GELU form, how its head is found, and the form's name
_GELU_FORMS = {"erf": (_erf_head, "none"), "tanh": (_tanh_head, "tanh")}


def _gelus(steps: list[Step], outputs: Iterable[Value], registry: Registry,
           device_kind: str) -> list[Step]:
    """GELU spelled out, ``x * (1 + gate) / 2`` with the gate ``erf(x / sqrt(2))`` or ``tanh(
    sqrt(2 / pi) * (x + 0.044715 x^3))``, as one ``gelu`` step (``approximate`` none or tanh),
    where an algorithm of ``device_kind`` computes gelu.  Two spellings of the tail: torch's
    export (``... -> Add 1 -> Mul x -> Mul 0.5``) and the runtime's own lowering of ONNX's
    Gelu (``Mul(x, 0.5)`` first).  Each intermediate value must have its one reader in the
    pattern and be no graph output.  The fused step runs where the pattern's last step ran."""
    gelu = operator_on(registry, "gelu", device_kind)
    if gelu is None:
        return steps
    outputs = list(outputs)
    only_reader = Readers(steps, outputs).only
    producer = {id(step.output): step for step in steps if step.problem is not None}
    replaced: dict[int, Step] = {}  # id of the pattern's last step -> the gelu step
    dropped: set[int] = set()
    for gate in steps:
        form = _GELU_FORMS.get(gate.operator)
        if form is None or id(gate) in dropped:
            continue
        found = form[0](gate, only_reader, producer)
        if found is None:
            continue
        x, head = found
        plus_one = only_reader(gate.output)
        if plus_one is None or plus_one.operator != "add" \
                or not _near(_scalar_of(plus_one, gate.output), 1.0):
            continue
        product = only_reader(plus_one.output)
        if product is None or product.operator != "mul" or len(product.inputs) != 2:
            continue
        other = product.inputs[1] if product.inputs[0] is plus_one.output else product.inputs[0]
        halved = producer.get(id(other))
        if other is x:
            last = only_reader(product.output)
            if last is None or last.operator != "mul" \
                    or not _near(_scalar_of(last, product.output), 0.5):
                continue
            pattern = [*head, gate, plus_one, product, last]
        elif (halved is not None and halved.operator == "mul"
              and any(v is x for v in halved.inputs)
              and only_reader(halved.output) is product and _near(_scalar_of(halved, x), 0.5)):
            pattern = [halved, *head, gate, plus_one, product]
        else:
            continue
        last = pattern[-1]
        if last.output.shape != x.shape or last.output.dtype != x.dtype:
            continue
        params = {"approximate": form[1]}
        replaced[id(last)] = Step(
            node="+".join(s.node for s in pattern),
            op_type="+".join(dict.fromkeys(s.op_type for s in pattern)), inputs=[x],
            output=last.output, problem=gelu.problem([x.shape], [x.dtype], **params),
            params=params)
        dropped.update(id(s) for s in pattern[:-1])
    return [replaced.get(id(step), step) for step in steps if id(step) not in dropped]


def _last_axis_constant(step: Step | None, value: Value, operator: str) -> np.ndarray | None:
    """The constant ``step`` (an ``operator`` of ``value`` and a constant) combines with
    ``value``, as one value per element of the last axis, when it has that form."""
    if step is None or step.operator != operator or len(step.inputs) != 2 \
            or step.inputs[0] is not value or not step.inputs[1].is_const \
            or step.output.shape != value.shape or not value.shape:
        return None
    const = np.asarray(step.inputs[1].const)
    width = value.shape[-1]
    if const.size == 1:
        return np.full(width, const.reshape(-1)[0], value.dtype)
    if const.size != width or const.shape[-1] != width:
        return None
    return const.reshape(width).astype(value.dtype)


def _split_layer_norms(steps: list[Step], outputs: Iterable[Value], registry: Registry,
                       device_kind: str) -> list[Step]:
    """LayerNorm over the last axis as exporters before opset 17 spell it, ``ReduceMean ->
    Sub -> Pow 2 (or Mul) -> ReduceMean -> Add eps -> Sqrt -> Div [-> Mul gamma] [-> Add
    beta]``, as one ``layer_norm`` step where an algorithm of ``device_kind`` computes it:
    nine passes over the activation become one.  Every intermediate value must have its
    readers in the pattern and be no graph output; the fused step runs where the pattern's
    last step ran."""
    layer_norm = operator_on(registry, "layer_norm", device_kind)
    if layer_norm is None:
        return steps
    outputs = list(outputs)
    reading = Readers(steps, outputs)
    sole = reading.only

    def mean_over_last(step: Step | None, value: Value) -> bool:
        return (step is not None and step.operator == "reduce" and step.inputs[0] is value
                and step.problem.param("mode") == "mean"
                and tuple(step.problem.param("axes")) == (len(value.shape) - 1,)
                and bool(step.problem.param("keepdims")))

    replaced: dict[int, Step] = {}
    dropped: set[int] = set()
    for mean in steps:
        if mean.operator != "reduce" or id(mean) in dropped or not mean.inputs:
            continue
        x = mean.inputs[0]
        if not mean_over_last(mean, x) or x.dtype.kind != "f":
            continue
        centered = sole(mean.output)
        if centered is None or centered.operator != "sub" \
                or [id(v) for v in centered.inputs] != [id(x), id(mean.output)]:
            continue
        users = reading.of(centered.output)
        square = next((u for u in users if u is not None and u.operator == "mul"
                       and all(v is centered.output for v in u.inputs)), None)
        divide = next((u for u in users if u is not None and u.operator == "div"
                       and u.inputs[0] is centered.output), None)
        if len(users) != 2 or square is None or divide is None:
            continue
        variance = sole(square.output)
        if not mean_over_last(variance, square.output):
            continue
        shifted = sole(variance.output)
        epsilon = _last_axis_constant(shifted, variance.output, "add")
        if epsilon is None or len(set(epsilon.tolist())) != 1:
            continue
        root = sole(shifted.output)
        if root is None or root.operator != "sqrt" or sole(root.output) is not divide \
                or divide.inputs[1] is not root.output:
            continue
        pattern = [mean, centered, square, variance, shifted, root, divide]
        width = x.shape[-1]
        scale, bias = np.ones(width, x.dtype), np.zeros(width, x.dtype)
        scaled = sole(divide.output)
        found = _last_axis_constant(scaled, divide.output, "mul")
        if found is not None:
            scale = found
            pattern.append(scaled)
            biased = sole(scaled.output)
            found = _last_axis_constant(biased, scaled.output, "add")
            if found is not None:
                bias = found
                pattern.append(biased)
        last = pattern[-1]
        if last.output.shape != x.shape or last.output.dtype != x.dtype:
            continue
        gamma = Value(f"{last.node}.scale", (width,), x.dtype, scale)
        beta = Value(f"{last.node}.bias", (width,), x.dtype, bias)
        params = {"axis": len(x.shape) - 1, "epsilon": float(epsilon[0])}
        replaced[id(last)] = Step(
            node="+".join(dict.fromkeys(s.node for s in pattern)),
            op_type="+".join(dict.fromkeys(s.op_type for s in pattern)),
            inputs=[x, gamma, beta], output=last.output,
            problem=layer_norm.problem([x.shape, (width,), (width,)], [x.dtype] * 3, **params),
            params=params)
        dropped.update(id(s) for s in pattern[:-1])
    return [replaced.get(id(step), step) for step in steps if id(step) not in dropped]


#: Fewest rows of a product fused into ``linear``: below it the bias and activation pass is a
#: few microseconds, and the matmul keeps the algorithms made for few rows (``gemv`` for a
#: classifier at batch 1), which linear's do not have.
MIN_LINEAR_ROWS = 16


def _linear_layers(steps: list[Step], outputs: Iterable[Value], registry: Registry,
                   device_kind: str) -> list[Step]:
    """A 2-D matmul by a constant weight, the add of a constant bias over its columns (seen
    through the view that restores a batched shape, as the lowering writes a transformer's
    projections), and a following Relu or exact GELU, as one ``linear`` step where an
    algorithm of ``device_kind`` computes it and the product has :data:`MIN_LINEAR_ROWS` rows
    or more.  The bias and the activation then cost no pass over the output of their own.
    The view, if any, stays, reading the linear step's output; the matmul's output and the
    add's must have no other reader and be no graph output.

    Without an activation, an Add of that result and another tensor of its shape (a
    transformer's residual connection after its output projection and its MLP) joins the
    step as linear's residual Z; the step and the view then run where that Add ran, when Z
    has been computed."""
    linear = operator_on(registry, "linear", device_kind)
    if linear is None:
        return steps
    outputs = list(outputs)
    only_reader = Readers(steps, outputs).only
    replaced: dict[int, Step] = {}
    dropped: set[int] = set()
    for product in steps:
        if (product.operator != "matmul" or len(product.inputs) != 2
                or product.inputs[0].is_const or not product.inputs[1].is_const
                or len(product.inputs[0].shape) != 2 or len(product.inputs[1].shape) != 2
                or product.inputs[0].shape[0] < MIN_LINEAR_ROWS):
            continue
        x, weight = product.inputs
        view = only_reader(product.output)
        if view is not None and view.problem is None and not view.host_only:
            add, value = only_reader(view.output), view.output
        else:
            view, add, value = None, view, product.output
        if add is None or add.operator != "add" or len(add.inputs) != 2 \
                or id(add) in dropped:
            continue
        ordered = Step(add.node, add.op_type, sorted(add.inputs, key=lambda v: v.is_const),
                       add.output, add.problem)
        bias = _last_axis_constant(ordered, value, "add")
        if bias is None or add.output.dtype != x.dtype:
            continue
        pattern, activation = [add], "none"
        follower = only_reader(add.output)
        if follower is not None and (follower.operator == "relu" or (
                follower.operator == "gelu" and follower.params.get("approximate") == "none")):
            pattern.append(follower)
            activation = follower.operator
        params: dict[str, object] = {"activation": activation}
        inputs = [x, weight, Value(f"{add.node}.bias", bias.shape, x.dtype, bias)]
        residual = only_reader(pattern[-1].output) if activation == "none" else None
        z = _residual_operand(residual, pattern[-1].output)
        # an Add another projection has taken already (a sum of two) stays that one's
        if z is not None and id(residual) not in dropped and id(residual) not in replaced:
            pattern.append(residual)
            params["residual"] = True
            inputs.append(z)
        else:
            residual = None
        final = pattern[-1].output
        fused = Step(
            node="+".join(dict.fromkeys(s.node for s in (product, *pattern))),
            op_type="+".join(dict.fromkeys(s.op_type for s in (product, *pattern))),
            inputs=inputs, output=product.output if view is not None else final,
            problem=pose(linear, inputs, **params), params=params)
        if view is not None:
            view.output = final  # the same reshape, now of the finished product
        if residual is None:
            replaced[id(product)] = [fused]
        else:  # Z may be computed after the matmul: run where the residual add ran
            moved = [fused] if view is None else [fused, view]
            replaced[id(residual)] = moved
            dropped.update(id(s) for s in (product, *moved[1:]))
        dropped.update(id(s) for s in pattern)
    return [kept for step in steps
            for kept in replaced.get(id(step), [] if id(step) in dropped else [step])]


def _residual_operand(step: Step | None, value: Value) -> Value | None:
    """The other operand when ``step`` adds ``value`` and a computed tensor of the same shape
    and dtype (no broadcast), else None."""
    if step is None or step.operator != "add" or len(step.inputs) != 2 \
            or step.inputs[0] is step.inputs[1]:
        return None
    other = step.inputs[1] if step.inputs[0] is value else step.inputs[0]
    if other.is_const or other.shape != value.shape or other.dtype != value.dtype \
            or step.output.shape != value.shape:
        return None
    return other


def _scaled_softmaxes(steps: list[Step], outputs: Iterable[Value], registry: Registry,
                      device_kind: str) -> list[Step]:
    """A Div or Mul by a positive scalar constant whose only reader is a Softmax (attention's
    scores divided by sqrt(d)) becomes the softmax's ``scale``: one pass over the scores
    instead of two.  Only where an algorithm of the device kind computes the scaled softmax."""
    softmax = operator_on(registry, "softmax", device_kind)
    if softmax is None:
        return steps
    readers = Readers(steps, outputs)
    dropped: set[int] = set()
    for step in steps:
        if step.operator not in ("div", "mul") or step.problem is None:
            continue
        x = step.inputs[0]
        if step.operator == "mul" and x.is_const and len(step.inputs) == 2:
            x = step.inputs[1]  # the constant first: c * x
        factor = _scalar_of(step, x)
        if step.operator == "div" and factor is not None:
            factor = 1.0 / factor if factor else None
        if factor is None or not 0 < factor < math.inf or x.is_const:
            continue
        reader = readers.only(step.output)
        if reader is None or reader.operator != "softmax" or reader.inputs[0] is not step.output:
            continue
        params = {**reader.params, "scale": factor * reader.problem.param("scale", 1.0)}
        try:
            problem = pose(softmax, [x], **params)
        except ValueError:
            continue
        if not any(a.device_kind == device_kind and a.usable(problem)
                   for a in registry.algorithms("softmax")):
            continue
        reader.inputs = [x]
        reader.params = params
        reader.problem = problem
        reader.node = f"{step.node}+{reader.node}"
        reader.op_type = f"{step.op_type}+{reader.op_type}"
        dropped.add(id(step))
    return [step for step in steps if id(step) not in dropped]

