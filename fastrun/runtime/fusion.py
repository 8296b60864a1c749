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
(``x * sigmoid(x)``, a Sigmoid and a Mul reading the conv's output) into one epilogue.  An
operator whose epilogue has no weights takes only the activations it accepts: DenseNet's
``BatchNormalization -> Relu`` after each concatenation becomes one batch_norm step.

Before all this, multi-step patterns that one operator computes become that operator's step
(:mod:`fastrun.runtime.patterns`: GELU's Erf spelling, a LayerNorm spelled out, a projection
with its bias and activation).

Last, two multi-step blocks become one step each where the device has an algorithm for the
operator they fuse into: a classifier head (``pool_linear``) and a squeeze-and-excitation block
(``squeeze_excite``: MobileNetV3's, EfficientNet's and RegNet-Y's, four steps of a few
microseconds each).

A step is only merged into the step that produces its input when that output has no other
reader and is not a graph output: otherwise the unfused value is still needed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from fastrun.operator import Operator
from fastrun.registry import Registry
from fastrun.runtime import patterns
from fastrun.runtime.lowering import Step, Value, pose


def fuse(steps: list[Step], outputs: Iterable[Value], registry: Registry,
         device_kind: str = "cpu") -> list[Step]:
    """The steps with batch norms, bias adds, activations and residual adds merged into the
    steps before them whose operator declares an epilogue (conv's; a residual only where an
    algorithm of ``device_kind`` takes one), and relus into the (non-constant) adds left
    before them."""
    steps = patterns.replace(steps, outputs, registry, device_kind)
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
            step.problem = pose(registry.operator("add"), step.inputs)
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
    kept = _pool_linear_heads(kept, outputs, registry, device_kind)
    return _squeeze_excitations(kept, outputs, registry, device_kind)


def _pool_linear_heads(steps: list[Step], outputs: Iterable[Value], registry: Registry,
                       device_kind: str) -> list[Step]:
    """A classifier head, ``global_avgpool -> view (N, C) -> matmul by a constant [-> add of a
    constant bias]``, as one ``pool_linear`` step, where an algorithm of ``device_kind``
    takes it (the OpenCL library has one; on a GPU each of those steps was a launch).  The
    fused step runs where the head's last step ran; every value it skips had no other reader
    and is no graph output."""
    operator = patterns.operator_on(registry, "pool_linear", device_kind)
    if operator is None:
        return steps
    only_reader = patterns.Readers(steps, outputs).only
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
        problem = pose(operator, inputs)
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


def _squeeze_excitations(steps: list[Step], outputs: Iterable[Value], registry: Registry,
                         device_kind: str) -> list[Step]:
    """A squeeze-excitation block, ``x * gate(conv1x1(act(conv1x1(global_avgpool(x)))))``
    (its activations already in the convs' epilogues), as one ``squeeze_excite`` step where
    an algorithm of ``device_kind`` takes it: four steps for a few microseconds of work each
    became one.  The fused step runs where the multiply ran; the pool and the two convs had no
    other reader and are no graph output."""
    operator = patterns.operator_on(registry, "squeeze_excite", device_kind)
    if operator is None:
        return steps
    only_reader = patterns.Readers(steps, outputs).only
    producer = {id(step.output): step for step in steps if step.problem is not None}
    replaced: dict[int, Step] = {}  # id of the multiply -> the fused step
    dropped: set[int] = set()
    for mul in steps:
        if mul.operator != "mul" or len(mul.inputs) != 2:
            continue
        for x, gate in (mul.inputs, mul.inputs[::-1]):
            block = _squeeze_excitation(x, gate, mul, producer, only_reader)
            if block is None:
                continue
            pool, reduce, expand = block
            first, second = _matrix_of(reduce), _matrix_of(expand)
            params = {"activation": reduce.params.get("activation", "none"),
                      "gate": expand.params.get("activation", "none")}
            # hard_sigmoid's alpha and beta as the conv's epilogue has them (the operator
            # fills in ONNX's defaults for any it lacks)
            params.update({name: expand.params[name] for name in ("alpha", "beta")
                           if name in expand.params})
            inputs = [x, *first, *second]
            try:
                problem = pose(operator, inputs, **params)
            except ValueError:
                continue  # an activation or gate it does not take
            if not any(a.device_kind == device_kind and a.unusable_reason(problem) is None
                       for a in registry.algorithms(operator.name)):
                continue
            head = [pool, reduce, expand, mul]
            replaced[id(mul)] = Step(node="+".join(s.node for s in head),
                                     op_type="+".join(s.op_type for s in head), inputs=inputs,
                                     output=mul.output, problem=problem, params=params)
            dropped.update(id(s) for s in head[:-1])
            break
    return [replaced.get(id(step), step) for step in steps if id(step) not in dropped]


def _squeeze_excitation(x: Value, gate: Value, mul: Step, producer: dict[int, Step],
                        only_reader) -> tuple[Step, Step, Step] | None:
    """(pool, reduce, expand) when ``gate`` is computed from ``x`` by a squeeze-excitation
    chain whose values only the chain reads, else None."""
    expand = producer.get(id(gate))
    reduce = producer.get(id(expand.inputs[0])) if _pointwise_on_vector(expand) else None
    pool = producer.get(id(reduce.inputs[0])) if _pointwise_on_vector(reduce) else None
    if (pool is None or pool.operator != "global_avgpool" or pool.inputs[0] is not x
            or len(x.shape) != 4 or gate.shape != (*x.shape[:2], 1, 1)
            or mul.output.shape != x.shape or only_reader(gate) is not mul
            or only_reader(reduce.output) is not expand or only_reader(pool.output) is not reduce):
        return None
    return pool, reduce, expand


def _pointwise_on_vector(step: Step | None) -> bool:
    """Whether ``step`` is a plain 1x1 conv on a (N, C, 1, 1) value with constant weights:
    one group, no padding, stride or dilation, no residual."""
    if step is None or step.operator != "conv" or len(step.inputs) not in (2, 3):
        return False
    problem = step.problem
    weight = step.inputs[1]
    return (step.inputs[0].shape[2:] == (1, 1) and weight.is_const and weight.shape[2:] == (1, 1)
            and all(v.is_const for v in step.inputs[2:]) and problem.param("group", 1) == 1
            and not problem.param("residual", False)
            and not any(problem.param("pads", (0,)))
            and all(v == 1 for v in problem.param("strides", (1,)))
            and all(v == 1 for v in problem.param("dilations", (1,))))


def _matrix_of(conv: Step) -> tuple[Value, Value]:
    """A 1x1 conv's weight as the matrix (C, K) a matmul takes, and its bias (zeros when it
    has none)."""
    weight = conv.inputs[1]
    matrix = np.ascontiguousarray(weight.const.reshape(weight.shape[:2]).T)
    bias = (conv.inputs[2].const if len(conv.inputs) > 2
            else np.zeros(weight.shape[0], weight.dtype))
    return (Value(weight.name, matrix.shape, weight.dtype, matrix),
            Value(weight.name + ".bias", bias.shape, weight.dtype, bias))


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
    add_step.problem = pose(add_relu, add_step.inputs)
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
        problem = pose(operator, inputs, **params)
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
    if (params.get("residual") or not operator.epilogue.weights) \
            and step.operator not in ACTIVATIONS:
        return False  # only an activation fuses after a residual, or without weights
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
    if step.operator == "hard_sigmoid":  # ONNX's defaults where the node leaves them out
        activation["alpha"] = float(step.problem.param("alpha", 0.2))
        activation["beta"] = float(step.problem.param("beta", 0.5))
    return _set_activation(target, activation, operator)


#: The activation steps that fold into an epilogue, by their operator's name, which is also
#: the epilogue's name for them (conv's ``activation``).
ACTIVATIONS = ("relu", "clip", "hard_swish", "sigmoid", "hard_sigmoid")


def _set_activation(target: Step, activation: dict, operator) -> bool:
    """``target`` with the epilogue ``activation``, if its operator takes it (an operator
    refuses what it does not know: nothing is changed then)."""
    before = dict(target.params)
    target.params.update(activation)
    try:
        target.rebuild(operator)
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
    target.rebuild(operator)


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
