"""The ONNX specification's own node test cases, shared by every test module that uses them.

``onnx.backend.test.case.node.collect_testcases(op_type)`` can only be called once per
process: it imports the case modules, whose import runs the exporters filtered by the op type
of that *first* call, and returns the same list ever after.  So the cases are collected once,
unfiltered, and each test module filters them here.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import onnx


@functools.cache
def all_node_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    state = np.random.get_state()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cases = tuple(collect_testcases(None))
    finally:
        np.random.set_state(state)
    return cases


def node_cases(op_type: str) -> list:
    """Single-node cases of ``op_type`` (the spec's examples, not function expansions)."""
    cases = [case for case in all_node_cases()
             if len(case.model.graph.node) == 1 and case.model.graph.node[0].op_type == op_type]
    if not cases:
        raise LookupError(f"no ONNX node test cases for {op_type}: was collect_testcases called "
                          "with a filter before tests.onnx_cases collected them?")
    return cases


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values (strings decoded), as operator parameters."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
