"""Fusion of lowered steps: into an operator's epilogue, and a residual ``Add -> Relu`` into one
step.  Which operators take what is their declared :class:`fastrun.operator.Epilogue` (conv's,
in the shipped library), never their names.

A CNN exported from a training framework writes ``Conv -> BatchNormalization -> Relu`` (or an
``Add`` of a bias, or ``Clip(0, 6)``): three passes over the activation memory.  With constant
weights the batch norm is an affine map per output channel, so it folds into the conv's weights
and bias, and the bias add and the activation run inside the conv's output loop (its fused
epilogue).  The passes work on steps, after lowering, so they see registry operators with
canonical parameters and constant folding has already turned ``Constant`` nodes into data.

A residual connection (ResNet's block output) writes ``Add(conv, shortcut) -> Relu``.  The
conv takes the shortcut as a residual input (conv's ``residual`` parameter: ``act(conv + B +
Z)``), so the sum and the relu happen where the conv writes its output: no pass over memory of
their own, no step of their own.  The fused conv runs where the add ran (the shortcut may be
computed after the conv, e.g. by a downsampling conv), which is safe because the add was the
conv output's only reader.  This happens only where an algorithm of the session's device kind
takes a residual; otherwise the relu goes into the add, which becomes the elementwise
``add_relu`` operator, one pass instead of two.

Activations fold the same way: Relu, Clip, HardSwish and Sigmoid after a conv, and SiLU
(``x * sigmoid(x)``, a Sigmoid and a Mul reading the conv's output) into one epilogue.

GELU's exact form, which exporters spell as five steps around an Erf (a transformer's MLP runs
them on its widest activation), becomes one ``gelu`` step: one pass instead of five; a
LayerNorm that an exporter before opset 17 spelled as nine steps, one ``layer_norm`` step; and
a 2-D MatMul by a constant with its bias Add and a Relu or GELU after it, one ``linear`` step
that finishes each block of its product in cache.

A step is only merged into the step that produces its input when that output has no other
reader and is not a graph output: otherwise the unfused value is still needed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np

from fastrun.operator import Operator
from fastrun.registry import Registry
from fastrun.runtime.lowering import Step, Value


def fuse(steps: list[Step], outputs: Iterable[Value], registry: Registry,
         device_kind: str = "cpu") -> list[Step]:
    """The steps with batch norms, bias adds, activations and residual adds merged into the
    steps before them whose operator declares an epilogue (conv's; a residual only where an
    algorithm of ``device_kind`` takes one), and relus into the (non-constant) adds left
    before them."""
    steps = _erf_gelus(steps, outputs, registry, device_kind)
    steps = _split_layer_norms(steps, outputs, registry, device_kind)
    steps = _linear_layers(steps, outputs, registry, device_kind)
    uses: Counter[int] = Counter(id(v) for step in steps for v in step.inputs)
    uses.update(id(v) for v in outputs)
    producer: dict[int, Step] = {}
    kept: list[Step] = []
    add_relu = registry.operator("add_relu") if "add_relu" in registry.operators() else None
    # the operators whose steps take an epilogue, looked up once for all the steps
    with_epilogue = {name: operator for name in registry.operators()
                     if (operator := registry.operator(name)).epilogue is not None}
    for step in steps:
        if step.operator == "add" and len(step.inputs) == 2 and step.inputs[0].is_const:
            step.inputs.reverse()  # c + f(x) is f(x) + c, the problem with them
            step.problem = registry.operator("add").problem(
                [v.shape for v in step.inputs], [v.dtype for v in step.inputs])
        if step.operator == "add":
            fused = _residual_into_producer(step, producer, uses, with_epilogue, registry,
                                            device_kind)
            if fused is not None:
                kept[:] = [s for s in kept if s is not fused]
                kept.append(fused)  # the fused step now runs where the add ran
                producer[id(step.output)] = fused
                continue
        if _silu_into_producer(step, producer, uses, with_epilogue, kept):
            continue
        source = producer.get(id(step.inputs[0])) if step.inputs else None
        sole_reader = source is not None and uses[id(step.inputs[0])] == 1
        operator = with_epilogue.get(source.operator) if sole_reader else None
        if sole_reader and (
                (operator is not None and _merge(source, step, operator))
                or (add_relu is not None and source.operator == "add"
                    and step.operator == "relu" and _merge_relu(source, add_relu))):
            source.node += "+" + step.node
            source.op_type += "+" + step.op_type
            source.output = step.output
            producer[id(step.output)] = source
            continue
        if step.problem is not None:
            producer[id(step.output)] = step
        kept.append(step)
    return _pool_linear_heads(kept, outputs, registry, device_kind)


def _pool_linear_heads(steps: list[Step], outputs: Iterable[Value], registry: Registry,
                       device_kind: str) -> list[Step]:
    """A classifier head, ``global_avgpool -> view (N, C) -> matmul by a constant [-> add of a
    constant bias]``, as one ``pool_linear`` step, where an algorithm of ``device_kind``
    takes it (the OpenCL library has one; on a GPU each of those steps was a launch).  The
    fused step runs where the head's last step ran; every value it skips had no other reader
    and is no graph output."""
    operator = _operator_on(registry, "pool_linear", device_kind)
    if operator is None:
        return steps
    only_reader = _readers(steps, outputs)
    replaced: dict[int, Step] = {}  # id of the head's last step -> the fused step
    dropped: set[int] = set()
    for pool in steps:
        if pool.operator != "global_avgpool":
            continue
        view = only_reader(pool.output)
        matmul = only_reader(view.output) if view is not None and view.problem is None \
            and not view.host_only else None
        x = pool.inputs[0]
        if (matmul is None or matmul.operator != "matmul" or matmul.inputs[0] is not view.output
                or len(matmul.inputs) != 2 or not matmul.inputs[1].is_const
                or view.output.shape != x.shape[:2] or view.output.dtype != x.dtype):
            continue
        head, inputs = [pool, view, matmul], [x, matmul.inputs[1]]
        bias = _bias_of(only_reader(matmul.output), matmul.output)
        if bias is not None:
            head.append(bias[0])
            inputs.append(bias[1])
        problem = operator.problem([v.shape for v in inputs], [v.dtype for v in inputs])
        if not any(a.device_kind == device_kind and a.unusable_reason(problem) is None
                   for a in registry.algorithms("pool_linear")):
            continue
        # Gemm lowers to a matmul and an add of one node: named once
        fused = Step(node="+".join(dict.fromkeys(s.node for s in head)),
                     op_type="+".join(dict.fromkeys(s.op_type for s in head)), inputs=inputs,
                     output=head[-1].output, problem=problem)
        replaced[id(head[-1])] = fused
        dropped.update(id(s) for s in head[:-1])
    return [replaced.get(id(step), step) for step in steps if id(step) not in dropped]


def _operator_on(registry: Registry, name: str, device_kind: str) -> Operator | None:
    """Operator ``name`` where an algorithm of ``device_kind`` computes it, else None: a
    pattern fuses into an operator only where its steps can then run."""
    if name not in registry.operators() or not any(
            a.device_kind == device_kind for a in registry.algorithms(name)):
        return None
    return registry.operator(name)


def _readers(steps: list[Step], outputs: Iterable[Value]) -> Callable[[Value], Step | None]:
    """``only_reader(value)``: the one step that reads ``value``, or None when it has several
    readers, none, or is a graph output."""
    readers: dict[int, list[Step | None]] = {}
    for step in steps:
        for value in step.inputs:
            readers.setdefault(id(value), []).append(step)
    for value in outputs:
        readers.setdefault(id(value), []).append(None)

    def only_reader(value: Value) -> Step | None:
        found = readers.get(id(value), [])
        return found[0] if len(found) == 1 else None
    return only_reader


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


def _erf_gelus(steps: list[Step], outputs: Iterable[Value], registry: Registry,
               device_kind: str) -> list[Step]:
    """GELU's exact form spelled out, ``x * (1 + erf(x / sqrt(2))) / 2``, as one ``gelu``
    step, where an algorithm of ``device_kind`` computes gelu.  Two spellings: torch's export
    (``Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5``) and the runtime's own lowering of
    ONNX's Gelu (``Mul(x, 0.5)`` first, ``x * (1 / sqrt 2)``).  Each intermediate value must
    have its one reader in the pattern and be no graph output.  The fused step runs where the
    pattern's last step ran."""
    gelu = _operator_on(registry, "gelu", device_kind)
    if gelu is None:
        return steps
    outputs = list(outputs)
    only_reader = _readers(steps, outputs)
    producer = {id(step.output): step for step in steps if step.problem is not None}
    replaced: dict[int, Step] = {}  # id of the pattern's last step -> the gelu step
    dropped: set[int] = set()
    for erf in steps:
        if erf.operator != "erf" or id(erf) in dropped:
            continue
        scaled = producer.get(id(erf.inputs[0]))
        if scaled is None or only_reader(scaled.output) is not erf:
            continue
        x = next((v for v in scaled.inputs if not v.is_const), None)
        factor = _scalar_of(scaled, x) if x is not None else None
        if not ((scaled.operator == "div" and scaled.inputs[0] is x
                 and _near(factor, math.sqrt(2)))
                or (scaled.operator == "mul" and _near(factor, 1 / math.sqrt(2)))):
            continue
        plus_one = only_reader(erf.output)
        if plus_one is None or plus_one.operator != "add" \
                or not _near(_scalar_of(plus_one, erf.output), 1.0):
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
            pattern = [scaled, erf, plus_one, product, last]
        elif (halved is not None and halved.operator == "mul"
              and any(v is x for v in halved.inputs)
              and only_reader(halved.output) is product and _near(_scalar_of(halved, x), 0.5)):
            pattern = [halved, scaled, erf, plus_one, product]
        else:
            continue
        last = pattern[-1]
        if last.output.shape != x.shape or last.output.dtype != x.dtype:
            continue
        replaced[id(last)] = Step(
            node="+".join(s.node for s in pattern),
            op_type="+".join(dict.fromkeys(s.op_type for s in pattern)), inputs=[x],
            output=last.output, problem=gelu.problem([x.shape], [x.dtype]),
            params={"approximate": "none"})
        dropped.update(id(s) for s in pattern[:-1])
    return [replaced.get(id(step), step) for step in steps if id(step) not in dropped]


def _all_readers(steps: list[Step], outputs: Iterable[Value]) -> Callable[[Value], list]:
    """``readers(value)``: the distinct steps that read ``value``, with None for a graph
    output."""
    found: dict[int, list[Step | None]] = {}
    for step in steps:
        for value in dict.fromkeys(id(v) for v in step.inputs):
            found.setdefault(value, []).append(step)
    for value in outputs:
        found.setdefault(id(value), []).append(None)
    return lambda value: found.get(id(value), [])


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
    layer_norm = _operator_on(registry, "layer_norm", device_kind)
    if layer_norm is None:
        return steps
    outputs = list(outputs)
    readers = _all_readers(steps, outputs)

    def sole(value: Value) -> Step | None:
        found = readers(value)
        return found[0] if len(found) == 1 else None

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
        users = readers(centered.output)
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
    or more.  The bias and the activation then cost no pass
    over the output of their own.  The view, if any, stays, reading the linear step's output;
    the matmul's output and the add's must have no other reader and be no graph output."""
    linear = _operator_on(registry, "linear", device_kind)
    if linear is None:
        return steps
    outputs = list(outputs)
    only_reader = _readers(steps, outputs)
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
        final = pattern[-1].output
        params = {"activation": activation}
        inputs = [x, weight, Value(f"{add.node}.bias", bias.shape, x.dtype, bias)]
        fused = Step(
            node="+".join(dict.fromkeys(s.node for s in (product, *pattern))),
            op_type="+".join(dict.fromkeys(s.op_type for s in (product, *pattern))),
            inputs=inputs, output=product.output if view is not None else final,
            problem=linear.problem([v.shape for v in inputs], [v.dtype for v in inputs],
                                   **params), params=params)
        if view is not None:
            view.output = final  # the same reshape, now of the finished product
        replaced[id(product)] = fused
        dropped.update(id(s) for s in pattern)
    return [replaced.get(id(step), step) for step in steps if id(step) not in dropped]


def _bias_of(step: Step | None, product: Value) -> tuple[Step, Value] | None:
    """(the add step, its bias as an (M,) constant) when ``step`` adds a constant per-column
    bias to ``product`` (N, M) and nothing else, else None."""
    if step is None or step.operator != "add" or len(step.inputs) != 2 \
            or step.inputs[0] is not product or not step.inputs[1].is_const:
        return None
    columns = product.shape[1]
    bias = step.inputs[1]
    if bias.dtype != product.dtype or step.output.shape != product.shape \
            or bias.const.size != columns or bias.const.shape[-1:] != (columns,):
        return None
    return step, Value(bias.name, (columns,), bias.dtype, bias.const.reshape(columns))


def _merge_relu(add_step: Step, add_relu) -> bool:
    """Make ``add_step`` the ``add_relu`` of the same operands (the relu after it merges)."""
    add_step.problem = add_relu.problem([v.shape for v in add_step.inputs],
                                        [v.dtype for v in add_step.inputs])
    return True


def _residual_into_producer(add: Step, producer: dict[int, Step], uses: Counter[int],
                            with_epilogue: dict[str, Operator], registry: Registry,
                            device_kind: str) -> Step | None:
    """Make one operand of ``add`` the residual of the step that computed the other, when its
    operator's epilogue takes a residual (and that step has no other reader, no activation and
    no residual yet); returns that step, or None when nothing fuses."""
    if len(add.inputs) != 2 or any(v.is_const for v in add.inputs):
        return None
    for mine, other in (add.inputs, add.inputs[::-1]):
        source = producer.get(id(mine))
        operator = with_epilogue.get(source.operator) if source is not None else None
        if (operator is None or not operator.epilogue.residual or uses[id(mine)] != 1
                or source.params.get("activation", "none") != "none"
                or source.params.get("residual")
                or not (mine.shape == other.shape == add.output.shape)
                or not (mine.dtype == other.dtype == add.output.dtype)):
            continue
        params = {**source.params, "residual": True}
        inputs = [*source.inputs, other]
        problem = operator.problem([v.shape for v in inputs], [v.dtype for v in inputs],
                                   **params)
        if not any(a.device_kind == device_kind and a.unusable_reason(problem) is None
                   for a in registry.algorithms(operator.name)):
            return None
        source.params, source.inputs, source.problem = params, inputs, problem
        source.node += "+" + add.node
        source.op_type += "+" + add.op_type
        source.output = add.output
        return source
    return None


def _merge(target: Step, step: Step, operator) -> bool:
    """Merge ``step`` into ``target`` (a step of ``operator``, which has an epilogue) when
    it is a foldable epilogue; True if merged."""
    params = target.params
    if step.problem is None or params.get("activation", "none") != "none":
        return False  # nothing folds through an activation
    if params.get("residual") and step.operator not in ACTIVATIONS:
        return False  # after a residual only an activation fuses (not a fold into weights)
    if step.operator == "batch_norm":
        return _fold_batch_norm(target, step, operator)
    if step.operator == "add":
        return _fold_bias(target, step, operator)
    if step.operator not in ACTIVATIONS:
        return False
    activation = {"activation": step.operator}
    if step.operator == "clip":
        activation["clip_min"] = float(step.problem.param("min", -np.inf))
        activation["clip_max"] = float(step.problem.param("max", np.inf))
    return _set_activation(target, activation, operator)


#: The activation steps that fold into an epilogue, by their operator's name, which is also
#: the epilogue's name for them (conv's ``activation``).
ACTIVATIONS = ("relu", "clip", "hard_swish", "sigmoid")


def _set_activation(target: Step, activation: dict, operator) -> bool:
    """``target`` with the epilogue ``activation``, if its operator takes it (an operator
    refuses what it does not know: nothing is changed then)."""
    before = dict(target.params)
    target.params.update(activation)
    try:
        _rebuild(target, operator)
    except ValueError:
        target.params.clear()
        target.params.update(before)
        return False
    return True


def _silu_into_producer(mul: Step, producer: dict[int, Step], uses: Counter[int],
                        with_epilogue: dict[str, Operator], kept: list[Step]) -> bool:
    """``x * sigmoid(x)`` (SiLU, as torch exports it: a Sigmoid and a Mul reading the same
    value) into the epilogue of the step that makes x, when x and the sigmoid have no other
    reader; the sigmoid's step is dropped.  True if fused."""
    if mul.operator != "mul" or len(mul.inputs) != 2:
        return False
    for x, gate in (mul.inputs, mul.inputs[::-1]):
        sigmoid, target = producer.get(id(gate)), producer.get(id(x))
        if (sigmoid is None or sigmoid.operator != "sigmoid" or sigmoid.inputs[0] is not x
                or target is None or target.operator not in with_epilogue
                or target.params.get("activation", "none") != "none"
                or uses[id(x)] != 2 or uses[id(gate)] != 1):
            continue
        if not _set_activation(target, {"activation": "silu"},
                               with_epilogue[target.operator]):
            return False
        kept.remove(sigmoid)
        target.node += f"+{sigmoid.node}+{mul.node}"
        target.op_type += "+Sigmoid+Mul"
        target.output = mul.output
        producer[id(mul.output)] = target
        return True
    return False


def _rebuild(target: Step, operator) -> None:
    target.problem = operator.problem([v.shape for v in target.inputs],
                                      [v.dtype for v in target.inputs], **target.params)


def _weights(target: Step) -> tuple[np.ndarray, np.ndarray] | None:
    """The step's constant weight and bias (zeros when it has none), or None (see
    :class:`fastrun.operator.Epilogue` for where they are)."""
    inputs = target.inputs
    if not inputs[1].is_const or (len(inputs) > 2 and not inputs[2].is_const):
        return None
    weight = inputs[1].const
    bias = inputs[2].const if len(inputs) > 2 else np.zeros(weight.shape[0], weight.dtype)
    return weight, bias


def _set_weights(target: Step, weight: np.ndarray, bias: np.ndarray, operator) -> None:
    x, old = target.inputs[0], target.inputs[1]
    dtype = old.dtype
    weight, bias = weight.astype(dtype), bias.astype(dtype)
    target.inputs = [x, Value(old.name, weight.shape, dtype, weight),
                     Value(old.name + ".bias", bias.shape, dtype, bias)]
    _rebuild(target, operator)


def _fold_batch_norm(target: Step, step: Step, operator) -> bool:
    """BN(f(x, W) + b) = f(x, W * s) + (b - mean) * s + beta, s = gamma / sqrt(var+eps), for
    an f linear in W whose output channels are W's axis 0 (conv's)."""
    weights = _weights(target)
    if weights is None or not all(v.is_const for v in step.inputs[1:5]):
        return False
    weight, bias = weights
    gamma, beta, mean, var = (v.const.astype(np.float64) for v in step.inputs[1:5])
    scale = gamma / np.sqrt(var + float(step.problem.param("epsilon", 1e-5)))
    if scale.shape != (weight.shape[0],):
        return False
    new_weight = weight.astype(np.float64) * scale.reshape(-1, *([1] * (weight.ndim - 1)))
    new_bias = (bias.astype(np.float64) - mean) * scale + beta
    _set_weights(target, new_weight, new_bias, operator)
    return True


def _fold_bias(target: Step, step: Step, operator) -> bool:
    """f(x) + c where c is constant and per output channel (or a scalar)."""
    if len(step.inputs) != 2:
        return False
    other = step.inputs[1]
    weights = _weights(target)
    out_shape = target.output.shape
    if weights is None or not other.is_const or other.dtype != target.output.dtype:
        return False
    if step.output.shape != out_shape or other.const.ndim > len(out_shape):
        return False
    shape = (1,) * (len(out_shape) - other.const.ndim) + other.const.shape
    channels = out_shape[1]
    if shape[0] != 1 or any(d != 1 for d in shape[2:]) or shape[1] not in (1, channels):
        return False
    weight, bias = weights
    per_channel = np.broadcast_to(other.const.reshape(-1), (channels,))
    _set_weights(target, weight, bias.astype(np.float64) + per_channel, operator)
    return True
