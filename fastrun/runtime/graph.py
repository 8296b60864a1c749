"""Reading an ONNX model into the runtime's own small graph form.

The runtime works on plain Python objects (nodes with decoded attributes, initializers as numpy
arrays) instead of protobuf messages, so that lowering and fusion read like ordinary code and
the onnx package is touched in one module only.  Everything that can be checked without running
anything is checked here, so a malformed model fails before any search starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastrun.runtime.errors import ModelError

#: The oldest default-domain opset the lowering handles (older models use attribute forms
#: that were removed before opset 7, e.g. BatchNormalization's consumed_inputs); older models
#: are upgraded to it with ONNX's version converter when they are read.
MIN_OPSET = 7

Dim = int | str | None


@dataclass
class Node:
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: the ONNX NodeProto it was read from (what :func:`evaluate_constant_node` runs)
    proto: Any = field(default=None, repr=False, compare=False)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def __str__(self) -> str:
        return f"{self.op_type} node {self.name!r}"


@dataclass
class GraphInput:
    name: str
    shape: tuple[Dim, ...] | None
    dtype: np.dtype


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    initializers: dict[str, np.ndarray]
    inputs: list[GraphInput]
    outputs: list[str]
    #: version of the default ("ai.onnx") domain the model imports
    opset: int
    #: inputs and outputs the model declares float16: the graph was read as float32
    #: (:func:`float16_as_float32`); a run takes those inputs in float16 (or float32) and
    #: casts those outputs back
    float16_inputs: tuple[str, ...] = ()
    float16_outputs: tuple[str, ...] = ()
    #: the model is written in float16 (anywhere) and is computed in float32
    float16: bool = False


def load_model_proto(model: Any):
    """An ``onnx.ModelProto`` from a path, bytes, a ``zoo:NAME`` spec or a ModelProto."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        try:
            return onnx.load_from_string(model)
        except Exception as error:
            raise ModelError(f"cannot parse the model bytes: {error}") from None
    spec = os.fspath(model)
    if spec.startswith("zoo:"):
        from fastrun.runtime import zoo

        return zoo.resolve(spec)
    if not os.path.exists(spec):
        raise ModelError(f"model file {spec!r} does not exist (built-in models: "
                         f"{', '.join('zoo:' + n for n in _zoo_names())})")
    try:
        return onnx.load(spec)
    except Exception as error:
        raise ModelError(f"cannot read {spec!r} as an ONNX model: {error}") from None


def _zoo_names() -> list[str]:
    from fastrun.runtime import zoo

    return zoo.names()


def _upgraded(model):
    """A model older than opset 7 converted to opset 7 by ONNX's version converter.

    Models exported for opset 6 and before (e.g. ONNX's pytorch-converted test models) spell
    broadcasting and batch norm with attributes that opset 7 removed; the converter rewrites
    them, so the lowering only knows opset 7 on."""
    opset = next((entry.version for entry in model.opset_import
                  if entry.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= MIN_OPSET:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as error:
        raise ModelError(f"the model uses opset {opset}, and ONNX's version converter cannot "
                         f"upgrade it to opset {MIN_OPSET}: {error}") from None


def _attribute_value(attribute) -> Any:
    import onnx
    from onnx import numpy_helper

    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        if value and isinstance(value[0], bytes):
            return [v.decode("utf-8", errors="replace") for v in value]
        if value and isinstance(value[0], onnx.TensorProto):
            return [numpy_helper.to_array(v) for v in value]
    if isinstance(value, onnx.GraphProto):
        return value  # kept so the lowering can name it unsupported
    return value


def _value_info(info) -> GraphInput:
    from onnx import helper

    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        raise ModelError(f"graph input {info.name!r} is not a tensor; only tensor inputs are "
                         "supported")
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except Exception:
        raise ModelError(f"graph input {info.name!r} has an unsupported element type "
                         f"{tensor.elem_type}") from None
    shape: tuple[Dim, ...] | None = None
    if tensor.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor.shape.dim)
    return GraphInput(info.name, shape, dtype)


def from_onnx(model: Any, check: bool = True) -> Graph:
    """Read and check a model: the ONNX checker, the opset range and the graph's wiring."""
    import onnx
    from onnx import numpy_helper

    proto = _upgraded(load_model_proto(model))
    if check:
        try:
            onnx.checker.check_model(proto)
        except Exception as error:
            raise ModelError(f"the model fails the ONNX checker: {error}") from None
    opset = None
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            opset = entry.version
    if opset is None:
        raise ModelError("the model imports no default-domain (ai.onnx) opset")
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ModelError(f"the model uses opset {opset}; fastrun supports opsets {MIN_OPSET} "
                         f"to {newest}")
    graph = proto.graph
    initializers: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        try:
            initializers[tensor.name] = numpy_helper.to_array(tensor)
        except Exception as error:
            raise ModelError(f"initializer {tensor.name!r} cannot be read: {error}") from None
    inputs = [_value_info(i) for i in graph.input if i.name not in initializers]
    nodes = []
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        attrs = {a.name: _attribute_value(a) for a in node.attribute}
        domain = node.domain if node.domain not in ("ai.onnx",) else ""
        op_type = node.op_type if domain == "" else f"{domain}.{node.op_type}"
        nodes.append(Node(name, op_type, list(node.input), list(node.output), attrs, node))
    result = Graph(graph.name or "model", nodes, initializers, inputs,
                   [o.name for o in graph.output], opset)
    check_wiring(result)
    return float16_as_float32(result, graph)


#: ONNX's element type codes of the two dtypes :func:`float16_as_float32` swaps
FLOAT16, FLOAT = 10, 1


def float16_as_float32(graph: Graph, proto_graph: Any) -> Graph:
    """The graph computed in float32 where the model is written in float16: fastrun has no
    float16 kernels, and a float16 model is still a model a user brings (onnxruntime runs
    it).  float16 initializers, inputs, constants and casts become float32; the outputs the
    model declares float16 are listed in ``float16_outputs``, so that a run casts them back,
    and its float16 inputs in ``float16_inputs`` (random inputs are drawn in float16).
    A model without float16 is returned as it is."""
    declared = {o.name: o.type.tensor_type.elem_type for o in proto_graph.output
                if o.type.HasField("tensor_type")}
    outputs = tuple(name for name in graph.outputs if declared.get(name) == FLOAT16)
    half = np.dtype(np.float16)
    touched = bool(outputs)
    for name, array in graph.initializers.items():
        if array.dtype == half:
            graph.initializers[name] = array.astype(np.float32)
            touched = True
    inputs = []
    for index, value in enumerate(graph.inputs):
        if value.dtype == half:
            graph.inputs[index] = GraphInput(value.name, value.shape, np.dtype(np.float32))
            inputs.append(value.name)
            touched = True
    for node in graph.nodes:
        if node.op_type == "Cast" and node.attrs.get("to") == FLOAT16:
            node.attrs["to"] = FLOAT
            touched = True
        for key in ("value", "value_float"):  # Constant, ConstantOfShape
            value = node.attrs.get(key)
            if isinstance(value, np.ndarray) and value.dtype == half:
                node.attrs[key] = value.astype(np.float32)
                touched = True
    if touched:
        graph.float16_inputs, graph.float16_outputs = tuple(inputs), outputs
        graph.float16 = True
    return graph


def check_wiring(graph: Graph) -> None:
    """Every node input is produced earlier (ONNX requires topological order), no value is
    produced twice, and every graph output exists."""
    defined = set(graph.initializers) | {i.name for i in graph.inputs} | {""}
    for node in graph.nodes:
        missing = [name for name in node.inputs if name not in defined]
        if missing:
            raise ModelError(f"{node} reads {', '.join(repr(m) for m in missing)}, which no "
                             "earlier node, input or initializer produces")
        for name in node.outputs:
            if name and name in defined:
                raise ModelError(f"{node} writes {name!r}, which is already defined")
            defined.add(name)
    missing = [name for name in graph.outputs if name not in defined]
    if missing:
        raise ModelError(f"graph output(s) {', '.join(map(repr, missing))} are never produced")


def evaluate_constant_node(node: Node, inputs: list[np.ndarray | None],
                           opset: int) -> list[np.ndarray]:
    """The outputs of ``node`` on constant ``inputs`` (None for an omitted optional input),
    computed by ONNX's reference implementation of its op.

    Why: an exported transformer computes shapes, masks and position tables from constants
    (Shape of a static input, Range, Equal, Where, Expand, Mod...).  With static input shapes
    those are constants, computed once when the model is loaded, so ops that never touch a
    tensor at run time need no lowering.  Raises ValueError (naming ONNX's reason) when the
    reference cannot compute it."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    if node.proto is None:
        raise ValueError("the node was not read from an ONNX model")
    feeds, infos = {}, []
    for name, array in zip(node.inputs, inputs, strict=False):
        if not name or array is None:
            continue
        array = np.asarray(array)
        feeds[name] = array
        infos.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.outputs if name]
    domain = node.proto.domain or ""
    model = helper.make_model(
        helper.make_graph([node.proto], "constant", infos, outputs),
        opset_imports=[helper.make_opsetid(domain, opset)])
    try:
        results = ReferenceEvaluator(model).run(None, feeds)
    except Exception as error:  # the reference's own errors: unknown op, bad attributes...
        raise ValueError(f"{type(error).__name__}: {error}") from None
    # the node's own proto may still say float16 (a Cast to it): fastrun computes in float32
    arrays = [np.asarray(value) for value in results]
    return [a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays]

