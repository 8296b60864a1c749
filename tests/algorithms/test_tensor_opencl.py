"""The OpenCL tensor algorithms (``cl_copy``, ``cl_pad``, ``cl_gather``) on the OpenCL device
here (PoCL on the CPU in CI): against their operators' references on the same random problems
as the numpy algorithms (every dtype, empty axes, negative steps and pads, every pad mode),
on views that start inside a larger buffer, and through an OpenCL session.

Programs are compiled per (kernel, merged rank, element width), so the random cases share a
few dozen programs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrun
from fastrun.registry import Registry
from fastrun_algorithms import tensor
from fastrun_algorithms.tensor.opencl import CLGather, CLTranspose, merge_axes
from tests.algorithms.test_tensor import OP_NAMES, draw_case
from tests.opencl_helpers import DeviceContext, device_fixture  # noqa: F401

pytest.importorskip("pyopencl", reason="the OpenCL algorithms need pyopencl")

REGISTRY = Registry(load_plugins=False)
tensor.register(REGISTRY)
OPENCL = {name: [a for a in REGISTRY.algorithms(name) if a.device_kind == "opencl"]
          for name in OP_NAMES}


def test_every_operator_has_one_opencl_algorithm():
    assert {name: [a.desc.text for a in algorithms] for name, algorithms in OPENCL.items()} == {
        "transpose": ["cl_copy"], "concat": ["cl_copy"], "slice": ["cl_copy"],
        "pad": ["cl_pad"], "gather": ["cl_gather"]}


@pytest.mark.parametrize("op", OP_NAMES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_matches_reference(device, op: str, data: st.DataObject) -> None:
    inputs, params = draw_case(data, op)
    operator = REGISTRY.operator(op)
    problem = operator.problem_for(inputs, **params)
    (algorithm,) = OPENCL[op]
    output = algorithm.run(problem, [device.to_device(x) for x in inputs], DeviceContext(device))
    assert output.flags.c_contiguous
    got = device.to_host(output)
    assert got.shape == operator.output_shape(problem) and got.dtype == inputs[0].dtype
    assert operator.error(problem, got, operator.reference(problem, inputs)) == 0.0, problem


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "float16"])
def test_expand_and_where_broadcast_as_numpy_does(device, dtype):
    """Expand's broadcast axes are read with stride 0; Where reads the condition, x and y each
    through its own broadcast strides, scalars (0-d) and size-1 axes included."""
    rng = np.random.default_rng(12)
    expand = REGISTRY.operator("expand")
    (cl_expand,) = [a for a in REGISTRY.algorithms("expand") if a.device_kind == "opencl"]
    where = REGISTRY.operator("where")
    (cl_where,) = [a for a in REGISTRY.algorithms("where") if a.device_kind == "opencl"]
    for shape, target in [((3, 1), (2, 3, 4)), ((1,), (5,)), ((), (2, 2)), ((2, 1, 3), (2, 4, 3)),
                          ((4,), (0, 4))]:
        x = rng.standard_normal(shape).astype(dtype) if dtype != "bool" else \
            rng.random(shape) < 0.5
        problem = expand.problem_for([x], shape=target)
        got = cl_expand.run(problem, [device.to_device(x)], DeviceContext(device)).get()
        np.testing.assert_array_equal(got, expand.reference(problem, [x]))
    for shapes in [((2, 3), (2, 3), (2, 3)), ((3, 1), (1, 4), ()), ((), (2, 1, 3), (4, 1)),
                   ((1, 5), (5,), (3, 1))]:
        cond = rng.random(shapes[0]) < 0.5
        x, y = (rng.standard_normal(s).astype(dtype) if dtype != "bool" else
                rng.random(s) < 0.5 for s in shapes[1:])
        problem = where.problem_for([cond, x, y])
        got = cl_where.run(problem, [device.to_device(np.asarray(a)) for a in (cond, x, y)],
                           DeviceContext(device)).get()
        np.testing.assert_array_equal(got, where.reference(problem, [cond, x, y]))


def test_gather_elements_and_scatter_nd(device):
    """GatherElements on every axis with negative indices and indices shorter than data;
    ScatterND with every reduction, whole-slice and single-element rows, and a repeated row
    (applied in order, as the CPU algorithm does)."""
    rng = np.random.default_rng(14)
    gather = REGISTRY.operator("gather_elements")
    (cl_gather,) = [a for a in REGISTRY.algorithms("gather_elements")
                    if a.device_kind == "opencl"]
    for axis in range(3):
        for dtype, index in (("float32", "int64"), ("int64", "int32"), ("bool", "int64")):
            problem = gather.problem([(3, 4, 5), (2, 3, 4)], [dtype, index], axis=axis)
            inputs = gather.random_inputs(problem, rng)
            got = cl_gather.run(problem, [device.to_device(x) for x in inputs],
                                DeviceContext(device)).get()
            np.testing.assert_array_equal(got, gather.reference(problem, inputs))
    scatter = REGISTRY.operator("scatter_nd")
    (cl_scatter,) = [a for a in REGISTRY.algorithms("scatter_nd") if a.device_kind == "opencl"]
    for reduction in ("none", "add", "mul", "max", "min"):
        for data, indices in (((4, 3, 2), (2, 1)), ((4, 3, 2), (5, 3)), ((5,), (7, 1))):
            updates = indices[:-1] + data[indices[-1]:]
            for dtype in ("float32", "int32"):
                problem = scatter.problem([data, indices, updates], [dtype, "int64", dtype],
                                          reduction=reduction)
                inputs = scatter.random_inputs(problem, rng)
                got = cl_scatter.run(problem, [device.to_device(x) for x in inputs],
                                     DeviceContext(device)).get()
                np.testing.assert_array_equal(got, scatter.reference(problem, inputs))
    data = np.zeros(4, np.float32)
    repeated = np.array([[1], [1], [3]], np.int64)
    updates = np.array([1.0, 2.0, 5.0], np.float32)
    for reduction, expected in (("none", [0, 2, 0, 5]), ("add", [0, 3, 0, 5])):
        problem = scatter.problem_for([data, repeated, updates], reduction=reduction)
        got = cl_scatter.run(problem, [device.to_device(x) for x in (data, repeated, updates)],
                             DeviceContext(device)).get()
        np.testing.assert_array_equal(got, expected)


def test_views_inside_a_larger_buffer(device):
    """Inputs are read through their offset and strides: a row range of a device array
    (offset into its buffer) needs no copy first."""
    x = np.arange(60, dtype=np.int16).reshape(5, 12)
    view = device.to_device(x)[1:4]
    problem = REGISTRY.operator("transpose").problem([(3, 12)], ["int16"])
    got = CLTranspose().run(problem, [view], DeviceContext(device)).get()
    np.testing.assert_array_equal(got, x[1:4].T)
    problem = REGISTRY.operator("gather").problem([(3, 12), (2,)], ["int16", "int64"], axis=1)
    indices = device.to_device(np.array([-1, 3]))
    output = CLGather().run(problem, [view, indices], DeviceContext(device))
    np.testing.assert_array_equal(output.get(), x[1:4][:, [11, 3]])


def test_merge_axes():
    # contiguous to contiguous: one axis
    assert merge_axes((2, 3, 4), (12, 4, 1), (12, 4, 1)) == ((24,), ((1,), (1,)))
    # NCHW -> NHWC: N, H*W, C
    sizes, (dst, src) = merge_axes((2, 5, 6, 3), (90, 18, 3, 1), (90, 6, 1, 30))
    assert sizes == (2, 30, 3) and dst == (90, 3, 1) and src == (90, 1, 30)
    # size-1 axes vanish; a single element keeps one axis
    assert merge_axes((1, 1), (1, 1), (1, 1)) == ((1,), ((0,), (0,)))


def test_through_an_opencl_session(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    session = fastrun.session(device=device, strategy="heuristic", registry=REGISTRY,
                              cache=fastrun.InMemoryCache(), progress=False)
    with session:
        for _ in range(2):
            got = fastrun.call("pad", fastrun.call("transpose", x, perm=(0, 2, 1)),
                               pads=(0, 1, 0, 0, 1, 0), mode="wrap")
            np.testing.assert_array_equal(
                device.to_host(got), np.pad(x.transpose(0, 2, 1), [(0, 0), (1, 1), (0, 0)],
                                            mode="wrap"))
