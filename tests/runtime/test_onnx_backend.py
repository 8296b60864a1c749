"""ONNX's own backend conformance tests (``onnx.backend.test.BackendTest``), run against fastrun.

The harness
-----------
``BackendTest`` collects its test cases through ``onnx.backend.test.runner.load_model_tests``.
Recent onnx wheels no longer ship ``onnx/backend/test/data/node``; the node cases are instead
produced in memory by importing the case modules under ``onnx.backend.test.case.node`` (each
module's ``export_*`` functions compute the expected outputs with numpy and call ``expect``).
Importing all ~200 modules costs seconds and builds ~1900 cases for ops fastrun does not have,
so :func:`_load_model_tests` (patched in while ``BackendTest`` is constructed) imports only the
modules of :data:`NODE_CASE_MODULES` and returns the cases whose graphs use supported op types
only.  Nothing is written to disk, so this works from a clean clone and has no stale cache.

The other kinds that live in the wheel (``simple``, ``pytorch-converted``, ``pytorch-operator``)
are read from its data directory and filtered the same way (by the op types in each
``model.onnx``); ``real`` (model downloads) and ``light`` are not collected.

Every case of a supported op runs on CPU, except the patterns in :data:`EXCLUDED`, each with the
reason; ``docs/onnx.md`` lists the same exclusions.  CUDA variants are dropped: fastrun's ONNX
backend is CPU only (see ``test_supports_device``).
"""

from __future__ import annotations

import importlib
import os
import re
import unittest
import warnings
from unittest import mock

import numpy as np
import onnx
import onnx.backend.test
import onnx.backend.test.runner
import pytest
from onnx import helper
from onnx.backend.test.case.test_case import TestCase as OnnxTestCase
from onnx.backend.test.loader import DATA_DIR
from onnx.backend.test.loader import load_model_tests as onnx_load_model_tests

from fastrun.runtime import ModelError
from fastrun.runtime.onnx_backend import FastrunBackend

#: ONNX op type -> module of ``onnx.backend.test.case.node`` that holds its cases.
NODE_CASE_MODULES = {
    "Add": "add", "AveragePool": "averagepool", "BatchNormalization": "batch_normalization",
    "Cast": "cast", "Clip": "clip", "Concat": "concat", "Constant": "constant",
    "ConstantOfShape": "constantofshape", "Conv": "conv", "ConvTranspose": "convtranspose",
    "Div": "div", "Dropout": "dropout", "Einsum": "einsum",
    "Flatten": "flatten", "Gather": "gather", "Gemm": "gemm",
    "GlobalAveragePool": "globalaveragepool", "GlobalMaxPool": "globalmaxpool",
    "LayerNormalization": "layernormalization", "Gelu": "gelu", "Equal": "equal",
    "Less": "less", "Greater": "greater", "LessOrEqual": "less",
    "GreaterOrEqual": "greater", "Where": "where", "Expand": "expand",
    "HardSigmoid": "hardsigmoid", "HardSwish": "hardswish", "Sqrt": "sqrt", "Exp": "exp",
    "Log": "log", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal", "Erf": "erf",
    "Identity": "identity", "LRN": "lrn", "LeakyRelu": "leakyrelu", "MatMul": "matmul",
    "MaxPool": "maxpool", "Mul": "mul", "Pad": "pad", "Relu": "relu", "Reshape": "reshape",
    "ReduceSum": "reducesum", "ReduceMean": "reducemean", "ReduceMax": "reducemax",
    "ReduceMin": "reducemin", "ReduceProd": "reduceprod", "ReduceL1": "reducel1",
    "ReduceL2": "reducel2", "ReduceSumSquare": "reducesumsquare",
    "Resize": "resize", "Upsample": "upsample", "InstanceNormalization": "instance_normalization",
    "ArgMax": "argmax", "ArgMin": "argmin", "TopK": "topk", "GatherElements": "gatherelements",
    "ScatterND": "scatternd",
    "Shape": "shape", "Sigmoid": "sigmoid", "Size": "size", "Slice": "slice",
    "Softmax": "softmax", "Split": "split", "Squeeze": "squeeze", "Sub": "sub", "Sum": "sum",
    "Tanh": "tanh", "Tile": "tile", "Transpose": "transpose", "Unsqueeze": "unsqueeze",
}
SUPPORTED_OP_TYPES = frozenset(NODE_CASE_MODULES)

#: Test-name pattern (``re.search`` on e.g. ``test_Conv3d_cpu``) -> why it is skipped.  Only
#: forms fastrun's contract cannot express belong here; docs/onnx.md lists the same.
EXCLUDED: dict[str, str] = {
    r"^test_Conv3d":
        "3-D convolution: the conv operator takes 1-D and 2-D convolutions only",
    r"^test_einsum_batch_diagonal":
        "Einsum with a letter repeated in one operand (a diagonal) is not lowered",
    r"^test_einsum_.*_bfloat16":
        "bfloat16 tensors: matmul and reduce compute float32 and float64",
    r"^test_convtranspose_3d":
        "3-D transposed convolution: the conv_transpose operator takes 1-D and 2-D ones only",
    r"^test_batchnorm_.*_training_mode":
        "training-mode BatchNormalization (batch statistics, running-statistics outputs): "
        "fastrun runs inference",
    r"^test_training_dropout(?!_zero_ratio)":
        "training-mode Dropout with a nonzero ratio drops at random: fastrun runs inference",
    r"^test_maxpool_with_argmax_":
        "MaxPool's second (Indices) output: the maxpool operator returns the pooled values only",
    r"^test_cast_e8m0_FLOAT(16)?_to_FLOAT8E8M0":
        "casts to FLOAT8E8M0 (a power-of-two scale type with its own rounding modes) are not "
        "implemented",
    r"^test_identity_(opt|sequence)_":
        "optional and sequence values: fastrun's values are tensors only",
    r"^test_equal_string":
        "string tensors: fastrun's values are numeric",
    r"^test_flexattention_fp16":
        "float16 tensors: the elementwise and activation operators compute float32 and float64",
}

#: The wheel's on-disk kinds that are worth running (``real`` downloads models; ``light`` is
#: not a kind the runner collects).
DISK_KINDS = ("simple", "pytorch-converted", "pytorch-operator")


def _op_types(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx")} | {
        f"{node.domain}.{node.op_type}" for node in model.graph.node
        if node.domain not in ("", "ai.onnx")}


def _node_cases() -> list[OnnxTestCase]:
    """The node cases of the supported op types, built in memory by ONNX's own case modules."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # (the Cast cases overflow on purpose while computing their saturated expectations)
        warnings.simplefilter("ignore", RuntimeWarning)
        for module in sorted(set(NODE_CASE_MODULES.values())):
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    from onnx.backend.test.case.node import _NodeTestCases

    return [case for case in _NodeTestCases if _op_types(case.model) <= SUPPORTED_OP_TYPES]


def _disk_cases(kind: str) -> list[OnnxTestCase]:
    """The wheel's stored cases of ``kind`` whose models use supported op types only."""
    if not os.path.isdir(os.path.join(DATA_DIR, kind)):
        return []
    cases = []
    for case in onnx_load_model_tests(DATA_DIR, kind):
        if case.model_dir is None:
            continue  # a download
        model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
        if _op_types(model) <= SUPPORTED_OP_TYPES:
            cases.append(case)
    return cases


def _load_model_tests(data_dir: str = DATA_DIR, kind: str | None = None) -> list[OnnxTestCase]:
    """Stands in for onnx's loader while ``BackendTest`` collects (see the module docstring)."""
    if kind == "node":
        return _node_cases()
    if kind in DISK_KINDS:
        return _disk_cases(kind)
    return []


def _backend_test() -> onnx.backend.test.BackendTest:
    with mock.patch.object(onnx.backend.test.runner, "load_model_tests", _load_model_tests):
        return onnx.backend.test.BackendTest(FastrunBackend, __name__)


def _test_cases() -> dict[str, type[unittest.TestCase]]:
    """The generated classes, CPU only (the backend has no other device), with every case
    matching :data:`EXCLUDED` skipped with its reason (``BackendTest.exclude`` would only name
    the pattern in the skip message)."""
    test_cases = _backend_test().test_cases
    for cls in test_cases.values():
        for name in [n for n in vars(cls) if n.startswith("test_")]:
            if name.endswith("_cuda"):
                delattr(cls, name)
                continue
            for pattern, reason in EXCLUDED.items():
                if re.search(pattern, name):
                    setattr(cls, name, unittest.skip(reason)(getattr(cls, name)))
                    break
    return test_cases


# (``enable_report()`` is left out: it only attaches the ``onnx_coverage`` mark that onnx's own
# coverage plugin reads, which is not installed, so pytest would warn about an unknown mark.)
globals().update(_test_cases())


# -- the backend API itself -------------------------------------------------------------------
def _add_model() -> onnx.ModelProto:
    node = helper.make_node("Add", ["a", "b"], ["c"])
    info = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 3]) for n in "abc"]
    graph = helper.make_graph([node], "add", info[:2], info[2:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def test_supports_device():
    assert FastrunBackend.supports_device("CPU")
    assert not FastrunBackend.supports_device("CUDA")


def test_prepare_rejects_a_malformed_model():
    model = _add_model()
    model.graph.node[0].input[1] = "nowhere"  # reads a value nothing produces
    with pytest.raises(ModelError):
        FastrunBackend.prepare(model)


def test_run_node_add():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((3,), 0.5, dtype=np.float32)
    (c,) = FastrunBackend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [a, b])
    np.testing.assert_array_equal(c, a + b)


def test_run_model_with_a_dict_of_inputs():
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    outputs = FastrunBackend.run_model(_add_model(), {"b": b, "a": a})
    np.testing.assert_allclose(outputs.c, a + b, rtol=1e-6)
    assert re.fullmatch("c", outputs._fields[0])


def test_run_node_with_an_omitted_optional_input():
    """An empty name in ``node.input`` is an omitted input: the arrays are the present ones."""
    x = np.array([-2.0, 0.5, 3.0], dtype=np.float32)
    node = helper.make_node("Clip", ["x", "", "high"], ["y"])
    (y,) = FastrunBackend.run_node(node, [x, np.array(1.0, dtype=np.float32)])
    np.testing.assert_array_equal(y, [-2.0, 0.5, 1.0])


def test_an_input_lowering_needs_as_data_is_bound_per_value():
    """A Reshape whose target shape is a graph input: each distinct shape value gets its own
    specialisation, and the data input stays a run-time input."""
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph(
        [node], "reshape",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["rows", "columns"])])
    rep = FastrunBackend.prepare(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for target in ([3, 2], [1, 6], [3, 2]):
        (y,) = rep.run([x, np.array(target, dtype=np.int64)])
        np.testing.assert_array_equal(y, x.reshape(target))
    assert len(rep._models) == 2
    assert rep._bound == ["shape"]


def test_an_opset_6_model_is_upgraded():
    """Legacy broadcasting (``broadcast=1``) is rewritten by ONNX's version converter."""
    node = helper.make_node("Add", ["a", "b"], ["c"], broadcast=1)
    graph = helper.make_graph(
        [node], "legacy_add",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [2, 3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    a = np.ones((2, 3, 4), dtype=np.float32)
    b = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    (c,) = FastrunBackend.run_model(model, [a, b])
    np.testing.assert_array_equal(c, a + b)
