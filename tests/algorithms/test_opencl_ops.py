"""The OpenCL algorithms of the elementwise, activation and pooling operators on the OpenCL
device here (PoCL on the CPU in CI): each against its operator's reference over broadcasting
cases, dtypes, NaN and infinities where the CPU operator defines them, pooling pads, strides,
dilations, ceil_mode and count_include_pad, softmax axes; the ONNX specification's MaxPool,
AveragePool, Relu and Softmax examples; and a heuristic OpenCL session choosing them.

PoCL compiles each program once per build-option set (a fraction of a second each), so the
cases share option sets: geometry is always a kernel argument, and the elementwise cases use
few dtype combinations per operation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import fastrun
from fastrun.attribute import AlgoAttribute
from fastrun.cache import InMemoryCache
from fastrun.registry import Registry
from fastrun_algorithms import activation, elementwise, pooling
from tests.onnx_cases import node_attributes, node_cases
from tests.opencl_helpers import DeviceContext, device_fixture  # noqa: F401

REGISTRY = Registry(load_plugins=False)
for _package in (elementwise, activation, pooling):
    _package.register(REGISTRY)


def opencl(operator: str) -> list:
    return [a for a in REGISTRY.algorithms(operator) if a.device_kind == "opencl"]


def run_on(device, algorithm, problem, inputs):
    """The algorithm's output, read back, after checking it may run here."""
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    assert algorithm.device_unusable_reason(device, problem) is None
    out = algorithm.run(problem, [device.to_device(np.asarray(x)) for x in inputs],
                        DeviceContext(device))
    return device.to_host(out)


def check(device, problem, inputs, exact=False, algorithms=None):
    """Every (or each given) OpenCL algorithm of the problem's operator that is usable matches
    the reference within the operator's tolerance (or exactly, NaN included); returns how
    many ran."""
    operator = REGISTRY.operator(problem.operator)
    reference = operator.reference(problem, inputs)
    ran = 0
    for algorithm in algorithms or opencl(problem.operator):
        if not algorithm.usable(problem):
            continue
        host = run_on(device, algorithm, problem, inputs)
        assert host.shape == tuple(operator.output_shape(problem))
        assert host.dtype == operator.output_dtype(problem), algorithm.desc
        if exact:  # NaN where the reference has NaN (the pooling operators' error would not
            # compare them), every other element equal
            np.testing.assert_array_equal(host, reference, err_msg=algorithm.desc.text)
        else:
            error = operator.error(problem, host, reference)
            assert error <= operator.tolerance(problem), f"{algorithm.desc.text} {problem}: {error}"
        ran += 1
    assert ran, f"no OpenCL algorithm ran {problem}"
    return ran


def test_registered_with_their_attributes():
    names = {op: sorted({a.desc.text for a in opencl(op)}) for op in (
        "add", "greater_equal", "relu", "clip", "softmax", "batch_norm", "maxpool",
        "global_avgpool", "lrn", "pool_linear", "gelu", "layer_norm")}
    assert names == {
        "add": ["cl_elementwise"], "greater_equal": ["cl_elementwise"], "relu": ["cl_unary"],
        "clip": ["cl_unary"], "softmax": [f"cl_softmax(per_row={n})" for n in (1, 256, 32)],
        "gelu": ["cl_unary"], "layer_norm": [f"cl_layer_norm(per_row={n})" for n in (256, 32)],
        "batch_norm": ["cl_batch_norm"], "maxpool": ["cl_pool"],
        "global_avgpool": [f"cl_global_pool(per_plane={n})" for n in (1, 256, 32)],
        "lrn": ["cl_lrn"],
        "pool_linear": [f"cl_pool_linear(local={n})" for n in (128, 32)]}
    problem = REGISTRY.operator("relu").problem([(3, 4)], ["float32"])
    for op in REGISTRY.operators():
        for algorithm in opencl(op):
            assert AlgoAttribute.REPRODUCIBLE in algorithm.attributes
            if op == "relu":
                assert algorithm.workspace_bytes(problem) == 0


# -- elementwise ---------------------------------------------------------------------------------

#: (a shape, b shape): same shapes, a row, a per-channel bias, a scalar (0-d), both sides
#: broadcast, a 6-D case that stays 6-D after merging, an empty output.
SHAPES = [((5, 7), (5, 7)), ((4, 6), (6,)), ((2, 3, 4, 5), (1, 3, 1, 1)), ((), (7,)),
          ((3, 1, 5), (1, 4, 1)), ((2, 1, 3, 1, 2, 1), (1, 2, 1, 3, 1, 2)), ((0, 3), (3,))]
#: dtype pairs per operation (few, to keep the program builds few)
DTYPES = {"add": [("float32", "float32"), ("int32", "int32")],
          "sub": [("float32", "float32"), ("int32", "float32")],
          "mul": [("float32", "float32"), ("int64", "int64")],
          "div": [("float32", "float32"), ("int32", "int32")],
          "greater_equal": [("float32", "float32"), ("int32", "int64")],
          "max": [("float32", "float32"), ("float64", "float64")],
          "min": [("float32", "float32"), ("int32", "int32")],
          "add_relu": [("float32", "float32"), ("int32", "float64")],
          "equal": [("float32", "float32"), ("int32", "int64")],
          "less": [("float32", "float32")], "greater": [("int32", "int32")],
          "less_equal": [("float64", "float32")]}


@pytest.mark.parametrize("op", list(DTYPES))
def test_elementwise_broadcasting_and_dtypes(device, op):
    operator = REGISTRY.operator(op)
    rng = np.random.default_rng(0)
    for dtypes in DTYPES[op]:
        for shapes in SHAPES:
            problem = operator.problem(list(shapes), list(dtypes))
            check(device, problem, operator.random_inputs(problem, rng), exact=True)


def test_elementwise_specials_overflow_and_views(device):
    specials = np.array([np.nan, 1.0, -np.inf, np.inf, 0.0, -0.0, np.nan, 2.0], np.float32)
    other = np.array([1.0, np.nan, 3.0, np.inf, -0.0, 0.0, np.nan, 0.0], np.float32)
    for op in ("max", "min", "div", "greater_equal", "sub", "add_relu"):
        problem = REGISTRY.operator(op).problem([(8,), (8,)], ["float32", "float32"])
        check(device, problem, [specials, other], exact=True)
    # integer arithmetic wraps around as numpy's (add_relu: before the comparison with 0);
    # integer division by zero is inf or nan
    big = np.array([2**31 - 1, -2**31, 7, 0], np.int32)
    for op in ("add", "div", "add_relu"):
        problem = REGISTRY.operator(op).problem([(4,), (4,)], ["int32", "int32"])
        with np.errstate(all="ignore"):
            check(device, problem, [big, np.array([1, -1, 0, 0], np.int32)], exact=True)
    # an operand that is a view with an offset into a larger device array
    algorithm = opencl("add")[0]
    problem = REGISTRY.operator("add").problem([(3, 4), (4,)], ["float32", "float32"])
    whole = np.arange(20, dtype=np.float32).reshape(5, 4)
    b = np.linspace(-1, 1, 4, dtype=np.float32)
    out = algorithm.run(problem, [device.to_device(whole)[2:], device.to_device(b)],
                        DeviceContext(device))
    np.testing.assert_array_equal(device.to_host(out), whole[2:] + b)
    with pytest.raises(ValueError, match="C-contiguous"):
        algorithm.run(REGISTRY.operator("add").problem([(4, 5), (4, 5)], ["float32"] * 2),
                      [device.to_device(whole).T, device.to_device(whole.T.copy())],
                      DeviceContext(device))


def test_elementwise_limits():
    algorithm = opencl("add")[0]
    problem = REGISTRY.operator("add").problem(
        [(2, 1, 3, 1, 2, 1, 3), (1, 2, 1, 3, 1, 2, 1)], ["float32", "float32"])
    assert "7 merged dimensions" in algorithm.unusable_reason(problem)

    class NoDouble:
        name = "a device without doubles"
        cl_device = type("D", (), {"extensions": "cl_khr_byte_addressable_store"})()

    mixed = REGISTRY.operator("add").problem([(3,), (3,)], ["int32", "float32"])  # float64
    assert "float64" in algorithm.device_unusable_reason(NoDouble(), mixed)
    single = REGISTRY.operator("add").problem([(3,), (3,)], ["float32", "float32"])
    assert algorithm.device_unusable_reason(NoDouble(), single) is None


# -- activations ---------------------------------------------------------------------------------

SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 40.0, -40.0, 1e-30, np.inf, -np.inf, np.nan]


def _activation_input(shape, dtype, rng):
    x = rng.standard_normal(shape) * 3
    x.reshape(-1)[:len(SPECIALS)] = SPECIALS[:x.size]
    return x.astype(dtype)


@pytest.mark.parametrize("op, params", [
    ("relu", {}), ("leaky_relu", {"alpha": 0.2}), ("leaky_relu", {"alpha": -1.5}),
    ("clip", {"min": -1.0, "max": 2.0}), ("clip", {"max": 0.5}), ("clip", {"min": 1, "max": -1}),
    ("sigmoid", {}), ("tanh", {}), ("hard_sigmoid", {}),
    ("hard_sigmoid", {"alpha": -0.5, "beta": 1.25}), ("hard_swish", {}), ("sqrt", {}),
    ("exp", {}), ("log", {}), ("neg", {}), ("abs", {}), ("reciprocal", {}), ("erf", {})])
def test_unary(device, op, params):
    operator = REGISTRY.operator(op)
    rng = np.random.default_rng(1)
    for shape in [(3, 5, 7), (1,), (), (0, 4)]:
        x = _activation_input(shape, "float32", rng)
        problem = operator.problem_for([x], **params)
        check(device, problem, [x], exact=op in ("relu", "leaky_relu", "clip", "neg", "abs"))


def test_unary_other_dtypes(device):
    rng = np.random.default_rng(2)
    for dtype in ("int8", "int32", "uint16", "int64"):
        x = rng.integers(-100 if dtype[0] == "i" else 0, 100, size=(4, 9)).astype(dtype)
        problem = REGISTRY.operator("clip").problem_for([x], min=3, max=50)
        check(device, problem, [x], exact=True)
    if "cl_khr_fp64" in device.cl_device.extensions:
        for op in ("relu", "sigmoid"):
            x = _activation_input((6, 5), "float64", rng)
            check(device, REGISTRY.operator(op).problem_for([x]), [x])


@pytest.mark.parametrize("shape, axis", [((5, 7), 1), ((5, 7), 0), ((3, 4, 6), 1),
                                         ((2, 3, 4), 2), ((2, 1300), -1), ((9,), 0)])
def test_softmax(device, shape, axis):
    operator = REGISTRY.operator("softmax")
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 4
    problem = operator.problem_for([x], axis=axis)
    usable = [a.desc.text for a in opencl("softmax") if a.usable(problem)]
    assert "cl_softmax(per_row=1)" in usable and "cl_softmax(per_row=32)" in usable
    assert ("cl_softmax(per_row=256)" in usable) == (shape[axis] > 128)
    check(device, problem, [x])


def test_a_scaled_softmax_is_refused_so_the_runtime_keeps_the_scale_a_step():
    """cl_softmax computes the softmax of its input as it is: a scaled problem (the CPU
    runtime's folded attention scale) is not usable, so on OpenCL the scale stays a step."""
    problem = REGISTRY.operator("softmax").problem([(4, 9)], ["float32"], scale=0.125)
    assert all(a.unusable_reason(problem) for a in opencl("softmax"))


def test_softmax_special_rows(device):
    """A NaN, a +inf or all -inf in a row make the whole row NaN, as the reference does;
    large values do not overflow (the maximum is subtracted)."""
    x = np.array([[1.0, np.nan, 2.0, 0.0], [1.0, np.inf, 2.0, 0.0],
                  [-np.inf, -np.inf, -np.inf, -np.inf], [1000.0, 999.0, -1000.0, 0.0]],
                 np.float32)
    problem = REGISTRY.operator("softmax").problem_for([x], axis=1)
    assert check(device, problem, [x]) == 2  # the 256-wide group is unusable on rows of 4


@pytest.mark.parametrize("form", ["none", "tanh"])
def test_gelu_both_forms_and_its_tails(device, form):
    """Far below zero the exact form is x times a tiny probability (erfc keeps its digits),
    far above it is x; NaN and the infinities go through as the reference has them."""
    operator = REGISTRY.operator("gelu")
    x = np.concatenate([np.linspace(-12, 12, 301), [np.nan, np.inf, -np.inf, 0.0, -0.0]])
    for dtype in ("float32", "float64"):
        values = x.astype(dtype)
        check(device, operator.problem_for([values], approximate=form), [values])


@pytest.mark.parametrize("shape, axis", [((4, 192), -1), ((2, 3, 768), 2), ((3, 1300), 1),
                                         ((2, 3, 4, 5), 1), ((5, 1), 1), ((0, 8), 1)])
def test_layer_norm(device, shape, axis):
    """Rows of a ViT's and a BERT's width, rows longer than the widest group, a norm over
    several axes, rows of one element (the output is the bias), and no rows at all."""
    operator = REGISTRY.operator("layer_norm")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    normalised = shape[axis:]
    scale = rng.standard_normal(normalised).astype(np.float32)
    bias = rng.standard_normal(normalised).astype(np.float32)
    problem = operator.problem_for([x, scale, bias], axis=axis, epsilon=1e-6)
    usable = [a.desc.text for a in opencl("layer_norm") if a.usable(problem)]
    length = math.prod(normalised)
    assert "cl_layer_norm(per_row=32)" in usable
    assert ("cl_layer_norm(per_row=256)" in usable) == (length > 128)
    check(device, problem, [x, scale, bias])


def test_batch_norm(device):
    operator = REGISTRY.operator("batch_norm")
    rng = np.random.default_rng(4)
    for shape, pdtype in [((2, 3, 4, 5), "float32"), ((4, 3), "float64"), ((1, 2, 7), "float32")]:
        c = shape[1]
        inputs = [rng.standard_normal(shape).astype(np.float32) + 5,
                  *(rng.standard_normal(c).astype(pdtype) for _ in range(3)),
                  rng.uniform(0.1, 1, c).astype(pdtype)]
        check(device, operator.problem_for(inputs, epsilon=1e-3), inputs)
        # a fused Relu (DenseNet's), on values of both signs
        inputs[0] = inputs[0] - 5
        check(device, operator.problem_for(inputs, epsilon=1e-3, activation="relu"), inputs)


# -- pooling ---------------------------------------------------------------------------------

#: (x shape, params): pads, strides, dilations, ceil_mode with and without count_include_pad,
#: asymmetric pads, 1-D, 3-D, auto_pad.
POOL_CASES = [
    ((2, 3, 9, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1],
                    "ceil_mode": 1}),
    ((1, 2, 8, 7), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1],
                    "ceil_mode": 1, "count_include_pad": 1}),
    ((1, 3, 10, 10), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 2, 1, 2],
                      "count_include_pad": 1}),
    ((2, 2, 12), {"kernel_shape": [4], "strides": [3], "pads": [2, 1], "ceil_mode": 1}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 1, 0, 0, 1, 1],
                       "count_include_pad": 1}),
    ((1, 1, 7, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("shape, params", POOL_CASES, ids=range(len(POOL_CASES)))
def test_pool(device, shape, params):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(np.float32)
    for name in ("maxpool", "avgpool"):
        kept = {k: v for k, v in params.items() if name == "avgpool" or k != "count_include_pad"}
        problem = REGISTRY.operator(name).problem_for([x], **kept)
        check(device, problem, [x], exact=name == "maxpool")


def test_maxpool_nan_and_float64(device):
    x = np.arange(2 * 5 * 5, dtype=np.float32).reshape(1, 2, 5, 5)
    x[0, 0, 1, 1] = np.nan
    x[0, 1, 4, 4] = -np.inf
    problem = REGISTRY.operator("maxpool").problem_for([x], kernel_shape=[2, 2],
                                                       pads=[1, 1, 1, 1])
    check(device, problem, [x], exact=True)
    if "cl_khr_fp64" in device.cl_device.extensions:
        y = np.random.default_rng(6).standard_normal((2, 3, 6, 5))
        avg = REGISTRY.operator("avgpool").problem_for([y], kernel_shape=[3, 3], strides=2,
                                                       pads=[1, 1, 1, 1], ceil_mode=1)
        check(device, avg, [y])


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 2, 70, 70), (2, 3, 7), (3, 4)])
def test_global_pool(device, shape):
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    for name in ("global_maxpool", "global_avgpool"):
        problem = REGISTRY.operator(name).problem_for([x])
        check(device, problem, [x], exact=name == "global_maxpool")
    x.reshape(-1)[3] = np.nan  # a NaN in one plane makes that plane's max NaN
    problem = REGISTRY.operator("global_maxpool").problem_for([x])
    check(device, problem, [x], exact=True)


@pytest.mark.parametrize("x_shape, outputs, bias", [
    ((2, 6, 5, 5), 70, True),    # a batch, outputs over several work-groups of either size
    ((1, 40, 7), 3, False),      # 1-D, fewer outputs than work-items, no bias
    ((3, 5, 1, 1), 130, True)])  # 1x1 planes (nothing to pool)
def test_pool_linear(device, x_shape, outputs, bias):
    """GlobalAveragePool -> Flatten -> Gemm in one launch: the planes' means into local
    memory, then one output per work-item."""
    rng = np.random.default_rng(9)
    inputs = [rng.standard_normal(x_shape).astype(np.float32),
              rng.standard_normal((x_shape[1], outputs)).astype(np.float32)]
    if bias:
        inputs.append(rng.standard_normal(outputs).astype(np.float32))
    problem = REGISTRY.operator("pool_linear").problem_for(inputs)
    assert REGISTRY.operator("pool_linear").output_shape(problem) == (x_shape[0], outputs)
    assert check(device, problem, inputs) == (1 if outputs < 64 else 2)


def test_pool_linear_says_what_it_cannot_take(device):
    operator = REGISTRY.operator("pool_linear")
    with pytest.raises(ValueError, match=r"W of shape \(4, M\)"):
        operator.problem([(1, 4, 2, 2), (5, 3)], ["float32"] * 2)
    with pytest.raises(ValueError, match=r"B of shape \(3,\)"):
        operator.problem([(1, 4, 2, 2), (4, 3), (4,)], ["float32"] * 3)
    with pytest.raises(ValueError, match="one dtype"):
        operator.problem([(1, 4, 2, 2), (4, 3)], ["float32", "float64"])
    with pytest.raises(ValueError, match="X of shape"):
        operator.problem([(1, 4), (4, 3)], ["float32"] * 2)
    wide = operator.problem([(1, 1 << 20, 1, 1), (1 << 20, 8)], ["float32"] * 2)
    algorithm = opencl("pool_linear")[0]
    assert "local memory" in algorithm.device_unusable_reason(device, wide)


def test_lrn(device):
    rng = np.random.default_rng(8)
    for shape, params in [((2, 7, 3, 3), {"size": 3}), ((1, 5, 4), {"size": 4, "alpha": 0.5,
                                                                     "beta": 0.6, "bias": 2.0}),
                          ((2, 3), {"size": 5})]:
        x = rng.standard_normal(shape).astype(np.float32)
        check(device, REGISTRY.operator("lrn").problem_for([x], **params), [x])


# -- the ONNX specification's examples ---------------------------------------------------------

ONNX_NAMES = {"MaxPool": "maxpool", "AveragePool": "avgpool", "Relu": "relu",
              "Softmax": "softmax"}


def _onnx_params():
    for op_type, name in ONNX_NAMES.items():
        for case in node_cases(op_type):
            node = case.model.graph.node[0]
            attrs = node_attributes(node)
            for inputs, outputs in case.data_sets:
                marks = []
                if len(node.output) != 1:
                    marks.append(pytest.mark.skip(reason="the Indices output is not supported"))
                elif inputs[0].dtype not in (np.float32, np.float64):
                    marks.append(pytest.mark.skip(reason=f"{inputs[0].dtype} inputs"))
                yield pytest.param(name, inputs, attrs, outputs[0], max(case.rtol, 1e-5),
                                   id=case.name, marks=marks)


ONNX_CASES = list(_onnx_params())


def test_the_specification_has_examples():
    names = [case.values[0] for case in ONNX_CASES if not case.marks]
    assert {name: names.count(name) for name in ONNX_NAMES.values()} == {
        "maxpool": 16, "avgpool": 20, "relu": 1, "softmax": 7}


@pytest.mark.parametrize("name, inputs, attrs, expected, rtol", ONNX_CASES)
def test_onnx_examples(device, name, inputs, attrs, expected, rtol):
    operator = REGISTRY.operator(name)
    problem = operator.problem_for(inputs, **attrs)
    assert operator.output_shape(problem) == expected.shape
    ran = 0
    for algorithm in opencl(name):
        if algorithm.usable(problem):
            out = run_on(device, algorithm, problem, inputs)
            assert out.dtype == expected.dtype
            np.testing.assert_allclose(out, expected, rtol=rtol, atol=1e-5,
                                       err_msg=algorithm.desc.text)
            ran += 1
    assert ran


# -- on an OpenCL session ------------------------------------------------------------------------

def test_heuristic_orders_keep_and_rank_the_opencl_candidates():
    softmax = REGISTRY.operator("softmax")
    order = [a.desc.text for a in softmax.heuristic_order(
        softmax.problem([(4, 4096)], ["float32"], axis=1), opencl("softmax"))]
    assert order[0] == "cl_softmax(per_row=256)" and len(order) == 3
    order = [a.desc.text for a in softmax.heuristic_order(
        softmax.problem([(4, 4096, 8)], ["float32"], axis=1), opencl("softmax"))]
    assert order[0] == "cl_softmax(per_row=1)"
    pool = REGISTRY.operator("global_avgpool")
    order = [a.desc.text for a in pool.heuristic_order(
        pool.problem([(1, 64, 7, 7)], ["float32"]), opencl("global_avgpool"))]
    assert order[0] == "cl_global_pool(per_plane=32)" and len(order) == 3
    for op, shapes in (("add", [(3,), (3,)]), ("relu", [(3,)]), ("maxpool", [(1, 1, 4, 4)]),
                       ("lrn", [(1, 3, 2)]), ("batch_norm", [(2, 3), (3,), (3,), (3,), (3,)])):
        params = {"kernel_shape": [2, 2]} if op == "maxpool" else {"size": 3} \
            if op == "lrn" else {}
        operator = REGISTRY.operator(op)
        problem = operator.problem(shapes, ["float32"] * len(shapes), **params)
        everything = REGISTRY.algorithms(op)
        assert len(operator.heuristic_order(problem, everything)) == len(everything)


def test_session_chooses_the_opencl_algorithms(device):
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(2, 3, 4)
    with fastrun.session(device="opencl", strategy="heuristic", cache=InMemoryCache(),
                         registry=REGISTRY, progress=False) as session:
        session_device = session.device
        y = session.call("relu", x)
        assert type(y).__name__ == "Array"  # a pyopencl array: it stays on the device
        z = session.call("add", y, np.float32(1.0))
        s = session.call("softmax", z, axis=-1)
        p = session.call("maxpool", s.reshape(2, 3, 4, 1), kernel_shape=[2, 1], strides=[2, 1])
        host = session_device.to_host(p)
        chosen = {d.problem.operator: d.algorithm.desc.name
                  for d in session.chooser.decisions()}
    e = np.exp(np.maximum(x, 0) + 1)
    expected = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(host, np.maximum(expected[:, :, 0::2], expected[:, :, 1::2])[
        ..., None], rtol=1e-6)
    assert chosen["relu"] == "cl_unary" and chosen["add"] == "cl_elementwise"
    assert chosen["softmax"].startswith("cl_softmax") and chosen["maxpool"] == "cl_pool"
    assert math.isclose(float(host.sum()), float(expected.reshape(2, 3, 2, 2).max(-1).sum()),
                        rel_tol=1e-5)
