"""The OpenCL algorithms of the operators the newer models brought (reduce, resize,
conv_transpose) on the OpenCL device here (PoCL on the CPU in CI): each against its operator's
reference over the parameters models use, and the cases it refuses named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from fastrun.registry import Registry
from fastrun_algorithms import conv_transpose, reduce, resize
from tests.algorithms.test_conv_transpose import problems as conv_transpose_problems
from tests.algorithms.test_resize import problems as resize_problems
from tests.opencl_helpers import DeviceContext, device_fixture  # noqa: F401

REGISTRY = Registry(load_plugins=False)
for _package in (reduce, resize, conv_transpose):
    _package.register(REGISTRY)


def opencl(operator: str) -> list:
    return [a for a in REGISTRY.algorithms(operator) if a.device_kind == "opencl"]


def check(device, problem, inputs):
    """Every usable OpenCL algorithm of the problem's operator matches the reference within
    the operator's tolerance; returns how many ran."""
    operator = REGISTRY.operator(problem.operator)
    reference = operator.reference(problem, inputs)
    ran = 0
    for algorithm in opencl(problem.operator):
        if not algorithm.usable(problem):
            continue
        assert algorithm.device_unusable_reason(device, problem) is None
        out = algorithm.run(problem, [device.to_device(np.asarray(x)) for x in inputs],
                            DeviceContext(device))
        host = device.to_host(out)
        assert host.shape == reference.shape and host.dtype == reference.dtype
        error = operator.error(problem, host, reference)
        assert error <= operator.tolerance(problem), f"{algorithm.desc.text} {problem}: {error}"
        ran += 1
    assert ran, f"no OpenCL algorithm ran {problem}"
    return ran


# -- reduce ---------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's NaN mean of no values
@pytest.mark.parametrize("mode", ["sum", "mean", "max", "min", "prod", "l1", "l2", "sum_square"])
@pytest.mark.parametrize("shape, axes, keepdims", [
    ((2, 3, 56, 56), (2, 3), True),   # a spatial mean, as MNASNet and ShuffleNet take it
    ((4, 768), (1,), True),           # a norm's row
    ((2, 5, 7), (1,), False),         # the channels, inner > 1
    ((3, 4, 5), (0, 1, 2), False),    # everything
    ((2, 0, 3), (1,), True),          # an empty run
])
def test_cl_reduce_matches_the_reference(device, mode, shape, axes, keepdims):
    operator = REGISTRY.operator("reduce")
    rng = np.random.default_rng(6)
    scale = 0.3 if mode == "prod" else 1.0  # a product of many values stays finite
    x = (rng.standard_normal(shape) * scale + (0.1 if mode == "prod" else 0.0))
    for dtype in ("float32", "float64"):
        values = x.astype(dtype)
        problem = operator.problem_for([values], mode=mode, axes=axes, keepdims=keepdims)
        check(device, problem, [values])


def test_cl_reduce_lets_nan_win_and_sums_without_losing_digits(device):
    """A NaN wins max and min; a mean of a million float32 values of 1 + small steps keeps the
    float64 result's digits (a plain float32 sum drifts by thousands of ulps)."""
    operator = REGISTRY.operator("reduce")
    x = np.array([[1.0, np.nan, 3.0], [np.inf, -1.0, 2.0]], np.float32)
    for mode in ("max", "min"):
        check(device, operator.problem_for([x], mode=mode, axes=(1,), keepdims=False), [x])
    long = (1 + np.arange(1 << 20) * 1e-7).astype(np.float32).reshape(1, -1)
    check(device, operator.problem_for([long], mode="mean", axes=(1,), keepdims=False), [long])


@pytest.mark.parametrize("mode", ["max", "min"])
@pytest.mark.parametrize("last", [False, True])
def test_cl_arg_reduce_matches_the_reference(device, mode, last):
    """Ties (few distinct values), NaN counting as the extreme, every axis."""
    operator = REGISTRY.operator("arg_reduce")
    assert [a.name for a in opencl("arg_reduce")] == ["cl_arg_reduce"]
    rng = np.random.default_rng(13)
    x = rng.integers(-2, 3, (3, 4, 5)).astype(np.float32)
    x[1, 2, 3] = x[2, 0, 1] = x[2, 0, 4] = np.nan
    for axis in range(3):
        for keepdims in (True, False):
            problem = operator.problem_for([x], mode=mode, axis=axis, keepdims=keepdims,
                                           select_last_index=last)
            assert check(device, problem, [x]) == 1


@pytest.mark.parametrize("largest", [True, False])
def test_cl_topk_matches_the_reference(device, largest):
    """Ties (few distinct values), NaN and the infinities, every axis, k from 1 to the whole
    run, floats and integers."""
    operator = REGISTRY.operator("topk")
    assert [a.name for a in opencl("topk")] == ["cl_topk"]
    rng = np.random.default_rng(15)
    x = rng.integers(-2, 3, (3, 4, 5)).astype(np.float32)
    x[1, 2, 3], x[2, 0, 1], x[0, 1, 1], x[0, 3, 2] = np.nan, np.nan, np.inf, -np.inf
    for values in (x, np.nan_to_num(x, posinf=7, neginf=-7).astype(np.int64)):
        for axis in range(3):
            for k in (1, 2, values.shape[axis]):
                problem = operator.problem_for([values], k=k, axis=axis, largest=largest)
                assert check(device, problem, [values]) == 1


def test_cl_reduce_refuses_what_it_does_not_reduce():
    operator = REGISTRY.operator("reduce")
    (algorithm,) = opencl("reduce")
    apart = operator.problem([(2, 3, 4)], ["float32"], mode="sum", axes=(0, 2))
    assert "adjacent reduced axes" in algorithm.unusable_reason(apart)
    integers = operator.problem([(2, 3)], ["int32"], mode="sum", axes=(1,))
    assert "float inputs only" in algorithm.unusable_reason(integers)


# -- resize -----------------------------------------------------------------------------------

@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=resize_problems())
def test_cl_resize_matches_the_reference(device, drawn):
    """Every mode, coordinate transform, nearest rounding, antialiasing, exclude_outside and
    crop box the CPU algorithms are tested on; what cl_resize refuses is named."""
    problem, x = drawn
    (algorithm,) = opencl("resize")
    reason = algorithm.unusable_reason(problem)
    if reason is not None:
        assert ("float inputs only" in reason or "last two axes only" in reason), reason
        return
    check(device, problem, [x])


def test_cl_resize_upsamples_a_segmentation_head(device):
    """DeepLabV3's and FCN's last step: 21 class planes bilinearly upsampled 8x, half_pixel."""
    operator = REGISTRY.operator("resize")
    x = np.random.default_rng(8).standard_normal((1, 21, 28, 28)).astype(np.float32)
    problem = operator.problem_for([x], mode="linear", sizes=[1, 21, 224, 224])
    assert check(device, problem, [x]) == 1


# -- conv_transpose -----------------------------------------------------------------------------

@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=conv_transpose_problems())
def test_cl_conv_transpose_matches_the_reference(device, drawn):
    """1-D and 2-D, groups, strides, dilations, output padding, pads, auto_pad and an
    output_shape that crops or extends, with and without a bias, float32 and float64."""
    problem, inputs = drawn
    assert check(device, problem, inputs) == 1
