"""fastrun as an ONNX backend (``onnx.backend.base.Backend``).

This is what lets ONNX's own conformance suite (``onnx.backend.test.BackendTest``) run against
fastrun: ``prepare`` checks and keeps the model, and each ``run`` executes it as a
:class:`~fastrun.runtime.Model` for the shapes of the inputs it is given (a prepared model is
specialised to static shapes, so one is kept per distinct set of input shapes).  Two things go
beyond :func:`fastrun.runtime.load`: graph inputs that lowering needs as data (a Reshape's shape,
a Slice's starts) are bound to the values given, and models older than opset 7 are upgraded
with ONNX's version converter.

By default the backend decides with the operators' heuristics and an in-memory cache, so a
conformance run measures correctness, not search time; pass ``session=`` to ``prepare`` or
``run_model`` to use another strategy or cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from fastrun.api import Session
from fastrun.cache import InMemoryCache
from fastrun.runtime.errors import ModelError
from fastrun.runtime.graph import Graph, from_onnx
from fastrun.runtime.lowering import NonConstantInputError
from fastrun.runtime.model import Model

_default_session: Session | None = None


def _session() -> Session:
    global _default_session
    if _default_session is None:
        _default_session = Session(cache=InMemoryCache(), strategy="heuristic", progress=False)
    return _default_session


class FastrunRep(BackendRep):
    """A checked model; specialised (lowered, fused, decided) per distinct input shapes.

    fastrun lowers with every shape known and needs some inputs as data while lowering (a
    Reshape's target shape, a Slice's starts, a Clip's bounds).  When a model takes such a value
    as a graph input, as ONNX's node tests do, the backend has it in hand at run time: it binds
    that input as a constant, and the input's value becomes part of the specialisation key.
    """

    def __init__(self, graph: Graph, session: Session):
        super().__init__()
        self.graph = graph
        self.session = session
        self._models: dict[tuple, Model] = {}
        #: graph inputs that lowering needs as data (found on the first run)
        self._bound: list[str] = []

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = [spec.name for spec in self.graph.inputs]
        if isinstance(inputs, dict):
            feeds = {name: np.asarray(value) for name, value in inputs.items()}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            values = list(inputs)
            if len(values) > len(names):
                raise ValueError(f"the model takes {len(names)} input(s) ({', '.join(names)}), "
                                 f"got {len(values)}")
            feeds = {name: np.asarray(value) for name, value in zip(names, values, strict=False)}
        model = self._model(feeds)
        outputs = model.run({name: a for name, a in feeds.items() if name not in self._bound})
        return namedtupledict("Outputs", self.graph.outputs)(
            *[outputs[name] for name in self.graph.outputs])

    def _key(self, feeds: dict[str, np.ndarray]) -> tuple:
        shapes = tuple(sorted((name, a.shape, a.dtype.str) for name, a in feeds.items()))
        bound = tuple((name, feeds[name].tobytes()) for name in self._bound if name in feeds)
        return shapes, bound

    def _model(self, feeds: dict[str, np.ndarray]) -> Model:
        """The model for these feeds: cached, or built, binding inputs lowering asks for."""
        model = self._models.get(self._key(feeds))
        if model is not None:
            return model
        while True:
            bound = {name: feeds[name] for name in self._bound if name in feeds}
            graph = self._bind(bound)
            try:
                model = Model(graph, self.session, input_shapes={
                    name: a.shape for name, a in feeds.items() if name not in bound})
                break
            except NonConstantInputError as error:
                if error.value not in feeds or error.value in bound:
                    raise
                self._bound.append(error.value)
        self._models[self._key(feeds)] = model
        return model

    def _bind(self, bound: dict[str, np.ndarray]) -> Graph:
        """The graph with the ``bound`` inputs turned into initializers."""
        if not bound:
            return self.graph
        specs = {spec.name: spec for spec in self.graph.inputs}
        return dataclasses.replace(
            self.graph,
            inputs=[spec for spec in self.graph.inputs if spec.name not in bound],
            initializers={**self.graph.initializers, **{
                name: np.asarray(array, dtype=specs[name].dtype)
                for name, array in bound.items()}})


class FastrunBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                **kwargs: Any) -> FastrunRep:
        if not cls.supports_device(device):
            raise ValueError(f"fastrun's ONNX backend runs on CPU, not {device!r}")
        # (from_onnx runs the ONNX checker that Backend.prepare would, raising ModelError)
        graph = from_onnx(model)
        return FastrunRep(graph, kwargs.get("session") or _session())

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """One node as a one-node model whose inputs are the given arrays, one per non-empty
        name in ``node.input`` (an empty name is an omitted optional input)."""
        check = {"opset_version": kwargs["opset_version"]} if "opset_version" in kwargs else {}
        try:
            super().run_node(node, inputs, device=device, outputs_info=outputs_info, **check)
        except onnx.checker.ValidationError as error:
            raise ModelError(f"the node fails the ONNX checker: {error}") from None
        names = [name for name in node.input if name]
        arrays = [np.asarray(value) for value in inputs]
        if len(arrays) != len(names):
            raise ValueError(f"the {node.op_type} node names {len(names)} input(s) "
                             f"({', '.join(names)}), got {len(arrays)} array(s)")
        graph_inputs = [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                          array.shape)
            for name, array in zip(names, arrays, strict=True)]
        graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output
                         if name]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(
            helper.make_graph([node], "run_node", graph_inputs, graph_outputs),
            opset_imports=[helper.make_opsetid("", opset)])
        rep = FastrunRep(from_onnx(model, check=False), kwargs.get("session") or _session())
        return rep.run(dict(zip(names, arrays, strict=True)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = FastrunBackend.prepare
run_model = FastrunBackend.run_model
run_node = FastrunBackend.run_node
supports_device = FastrunBackend.supports_device

__all__ = ["FastrunBackend", "FastrunRep", "prepare", "run_model", "run_node",
           "supports_device"]
