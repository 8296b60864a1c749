"""The OpenCL conv algorithms on the OpenCL device here (PoCL on the CPU in CI): every algorithm
against the conv operator's reference over a sample of parameter combinations and the ONNX
specification's examples, their usability, workspace and heuristic claims, and fast-run
searches on an OpenCL session (with cl_im2col's GEMM decided by the OpenCL matmul search).

PoCL compiles each program on first use (a fraction of a second to a second on 2 cores), so
the cases share programs: geometry is a kernel argument, and only outputs per work-item, the
depthwise window and the dtype are compile-time.  Sub-problems in the unit tests go to one
fixed OpenCL matmul configuration (the search tests use the real search).
"""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

import fastrun
from fastrun.cache import InMemoryCache
from fastrun.registry import Registry
from fastrun_algorithms import conv, matmul
from fastrun_algorithms.conv.opencl import (
    Conv1x1CLConv,
    DepthwiseCLConv,
    DirectCLConv,
    Im2colCLConv,
    ImplicitGemmCLConv,
    opencl_algorithms,
)
from fastrun_algorithms.conv.opencl.space import igemm_configurations
from fastrun_algorithms.conv.opencl.winograd_fused import FusedWinogradCLConv
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import conv_registry
from tests.onnx_cases import node_attributes, node_cases
from tests.opencl_helpers import device_fixture  # noqa: F401

OPERATOR = ConvOperator()


REGISTRY = conv_registry()
OPENCL = [a for a in REGISTRY.algorithms("conv") if a.device_kind == "opencl"]
#: Two cl_igemm configurations run on every case (one output block per work-group and
#: split-K, both vector widths); a seeded sample of the rest runs on fewer cases below.
IGEMM_EVERY_CASE = [
    ImplicitGemmCLConv({"mwg": 32, "nwg": 32, "kwg": 8, "mdimc": 16, "ndimc": 8, "vw": 2,
                        "split": 1}),
    ImplicitGemmCLConv({"mwg": 64, "nwg": 64, "kwg": 16, "mdimc": 16, "ndimc": 16, "vw": 4,
                        "split": 2}),
]
IGEMM_SAMPLE = [ImplicitGemmCLConv(c)
                for c in random.Random(7).sample(igemm_configurations(), 8)]
#: What the reference tests run: every configuration but the bulk of cl_igemm's.
CHECKED = [a for a in OPENCL if a.desc.name != "cl_igemm"] + IGEMM_EVERY_CASE
MATMUL_DIRECT = [a for a in REGISTRY.algorithms("matmul")
                 if a.device_kind == "opencl" and a.desc.name == "cl_direct"]


class Ctx:
    """RunContext with the device and sub-problems computed by the first usable OpenCL
    ``cl_direct`` matmul (one program per dtype).  Records the sub-problems' results, so the
    workspace test can tell the products the algorithm holds from the output."""

    def __init__(self, device):
        self.device = device
        self.results = []

    def call(self, problem, *inputs):
        algorithm = next(a for a in MATMUL_DIRECT if a.usable(problem))
        result = algorithm.run(problem, inputs, self)
        self.results.append(result)
        return result


def _problem(shapes, dtype="float32", **params):
    return OPERATOR.problem(shapes, [dtype] * len(shapes), **params)


def run(device, algorithm, problem, inputs, ctx=None):
    ctx = ctx or Ctx(device)
    out = algorithm.run(problem, [device.to_device(x) for x in inputs], ctx)
    return device.to_host(out)


def check(device, algorithm, problem, seed=0):
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    assert algorithm.device_unusable_reason(device, problem) is None
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(seed))
    host = run(device, algorithm, problem, inputs)
    assert host.shape == OPERATOR.output_shape(problem)
    assert host.dtype == np.dtype(problem.dtypes[0])
    error = OPERATOR.error(problem, host, OPERATOR.reference(problem, inputs))
    assert error <= OPERATOR.tolerance(problem), f"{algorithm.desc.text} on {problem}: {error}"


#: (id, shapes, params): strides, dilations, asymmetric pads, groups with several images,
#: depthwise with a channel multiplier, 1x1 (batched and grouped), 1-D, and each epilogue.
CASES = [
    ("stride-dilation-asym-pads-group", [(2, 6, 9, 11), (8, 3, 3, 2), (8,)],
     {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1], "group": 2,
      "activation": "relu"}),
    ("rgb-7x7-stride2", [(1, 3, 15, 13), (10, 3, 7, 7)],
     {"strides": 2, "pads": [3, 3, 3, 3], "activation": "clip", "clip_min": -0.3,
      "clip_max": 0.4}),
    ("deep-3x3-batch", [(2, 20, 6, 7), (12, 20, 3, 3), (12,)], {"pads": [1, 1, 1, 1]}),
    ("depthwise-mult2-stride2", [(2, 4, 9, 9), (8, 1, 3, 3), (8,)],
     {"strides": 2, "pads": [1, 1, 1, 1], "group": 4, "activation": "clip"}),
    ("depthwise-5x5-dilated", [(1, 5, 12, 10), (5, 1, 5, 5)],
     {"dilations": 2, "pads": [4, 3, 4, 5], "group": 5, "activation": "relu"}),
    ("1x1-batch", [(3, 6, 5, 4), (10, 6, 1, 1), (10,)], {"activation": "relu"}),
    ("1x1-groups", [(2, 6, 4, 5), (9, 2, 1, 1)], {"group": 3}),
    ("1x1-stride-pad", [(1, 4, 7, 7), (5, 4, 1, 1)], {"strides": 2, "pads": [1, 0, 0, 1]}),
    ("1d", [(2, 3, 20), (5, 3, 4), (5,)],
     {"strides": [2], "pads": [1, 2], "dilations": [2], "activation": "relu"}),
    ("3x3-hard-swish", [(1, 6, 8, 8), (8, 6, 3, 3), (8,)],
     {"pads": [1, 1, 1, 1], "activation": "hard_swish"}),
    ("depthwise-silu", [(2, 4, 9, 9), (4, 1, 3, 3), (4,)],
     {"pads": [1, 1, 1, 1], "group": 4, "activation": "silu"}),
    ("1x1-sigmoid", [(1, 6, 5, 4), (10, 6, 1, 1), (10,)], {"activation": "sigmoid"}),
    ("1x1-hard-sigmoid", [(1, 6, 1, 1), (10, 6, 1, 1), (10,)],
     {"activation": "hard_sigmoid", "alpha": 1 / 6}),
]


@pytest.mark.parametrize("shapes, params", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_algorithm_matches_the_reference(device, shapes, params):
    problem = _problem(shapes, **params)
    usable = [a for a in CHECKED if a.usable(problem)]
    assert any(a.desc.name == "cl_direct" for a in usable)  # usable for everything
    assert any(a.desc.name == "cl_im2col" for a in usable)
    assert any(a.desc.name == "cl_igemm" for a in usable)
    for algorithm in usable:
        check(device, algorithm, problem)


@pytest.mark.parametrize("algorithm", IGEMM_EVERY_CASE, ids=lambda a: a.desc.text)
@pytest.mark.parametrize("shapes, activation", [
    ([(2, 40, 6, 7), (40, 40, 3, 3), (40,), (2, 40, 6, 7)], "relu"),  # bias and residual
    ([(1, 36, 8, 8), (40, 36, 3, 3), (1, 40, 8, 8)], "none"),         # residual alone
    ([(2, 36, 40), (40, 36, 3), (40,), (2, 40, 40)], "relu"),         # 1-D
])
def test_igemm_adds_the_residual_before_the_activation(device, algorithm, shapes, activation):
    """A ResNet block's shortcut fused into the conv (split-K adds it in the reduction); the
    other OpenCL convs refuse it, so the runtime fuses it only where cl_igemm can run."""
    problem = _problem(shapes, pads=[1] * (2 * (len(shapes[0]) - 2)), residual=True,
                       activation=activation)
    check(device, algorithm, problem)
    direct = DirectCLConv({"ko": 1, "l": 32})
    assert "does not add a residual" in direct.unusable_reason(problem)


WINOGRAD = [a for a in OPENCL if a.desc.name in ("cl_winograd", "cl_winograd_fused")]


@pytest.mark.parametrize("algorithm", WINOGRAD, ids=lambda a: a.desc.text)
@pytest.mark.parametrize("shapes, params", [
    ([(2, 5, 9, 11), (7, 5, 3, 3), (7,)], {"pads": [1, 1, 1, 1], "activation": "relu"}),
    ([(1, 4, 6, 6), (3, 4, 3, 3)], {}),  # no padding: tiles hang over the 4x4 output
    ([(1, 3, 7, 10), (4, 3, 3, 3), (4,)], {"pads": [2, 0, 1, 3], "activation": "clip",
                                           "clip_min": -0.4, "clip_max": 0.5}),
    ([(2, 6, 5, 5), (6, 6, 3, 3), (6,), (2, 6, 5, 5)], {"pads": [1, 1, 1, 1],
                                                        "residual": True, "activation": "relu"}),
])
def test_winograd_matches_the_reference(device, algorithm, shapes, params):
    """Partial tiles at the right and bottom edges, asymmetric padding, several images, each
    epilogue; the transformed filters made per call and, preprocessed, once and kept."""
    problem = _problem(shapes, **params)
    check(device, algorithm, problem)
    prepared_problem = _problem(shapes, **params, weight_preprocess=True)
    inputs = OPERATOR.random_inputs(prepared_problem, np.random.default_rng(1))
    on_device = [device.to_device(x) for x in inputs]
    prepared = algorithm.preprocess(prepared_problem, on_device)
    reference = OPERATOR.reference(prepared_problem, inputs)
    for _ in range(2):  # the first call transforms the filters, the second reuses them
        out = device.to_host(algorithm.run(prepared_problem, on_device, Ctx(device), prepared))
        assert OPERATOR.error(prepared_problem, out, reference) <= 1e-3
    assert prepared.u is not None


def test_winograd_in_float64_and_its_usability(device):
    unusable = {
        "stride 1": _problem([(1, 4, 8, 8), (4, 4, 3, 3)], strides=2),
        "a 3x3 kernel": _problem([(1, 4, 8, 8), (4, 4, 5, 5)]),
        "group 1": _problem([(1, 4, 8, 8), (4, 2, 3, 3)], group=2),
        "dilation 1": _problem([(1, 4, 8, 8), (4, 4, 3, 3)], dilations=2),
    }
    for needed, problem in unusable.items():
        for algorithm in WINOGRAD:
            assert needed in algorithm.unusable_reason(problem)
    problem = _problem([(2, 6, 7, 9), (5, 6, 3, 3), (5,)], "float64", pads=[1, 1, 1, 1])
    fused = next(a for a in WINOGRAD if a.desc.name == "cl_winograd_fused")
    assert "float32 only" in fused.unusable_reason(problem)  # its local memory would double
    if "cl_khr_fp64" not in device.cl_device.extensions:
        pytest.skip(f"{device.name} has no float64 (cl_khr_fp64)")
    for algorithm in (a for a in WINOGRAD if a is not fused):
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(2))
        out = run(device, algorithm, problem, inputs)
        assert OPERATOR.error(problem, out, OPERATOR.reference(problem, inputs)) <= 1e-9


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("algorithm", IGEMM_EVERY_CASE, ids=lambda a: a.desc.text)
def test_igemm_reads_every_array_at_its_offset(device, algorithm, dtype):
    """cl_igemm takes its scalars as one struct (offsets, sizes, epilogue): each input at an
    offset of its own in a larger buffer, in both dtypes (the struct's float members change
    width), must land where the kernel reads it."""
    if dtype == "float64" and "cl_khr_fp64" not in device.cl_device.extensions:
        pytest.skip(f"{device.name} has no float64 (cl_khr_fp64)")
    problem = _problem([(2, 36, 6, 7), (40, 36, 3, 3), (40,), (2, 40, 6, 7)], dtype,
                       pads=[1, 1, 1, 1], residual=True, activation="clip", clip_min=-0.5,
                       clip_max=0.7)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(3))
    placed = []
    for lead, array in enumerate(inputs, start=1):
        big = device.to_device(np.concatenate([np.zeros(lead * 16, array.dtype), array.ravel()]))
        placed.append(big[lead * 16:].reshape(array.shape))
    assert all(a.offset > 0 for a in placed)
    host = device.to_host(algorithm.run(problem, placed, Ctx(device)))
    error = OPERATOR.error(problem, host, OPERATOR.reference(problem, inputs))
    assert error <= OPERATOR.tolerance(problem)


@pytest.mark.parametrize("algorithm", IGEMM_SAMPLE, ids=lambda a: a.desc.text)
def test_igemm_sample_matches_the_reference(device, algorithm):
    """Sampled configurations on a grouped, strided, padded batch whose output channels,
    pixels and reduction are all off the tile sizes (and deep enough for every split)."""
    problem = _problem([(3, 72, 9, 10), (130, 36, 3, 3), (130,)], strides=[1, 2],
                       pads=[1, 0, 2, 1], group=2, activation="relu")
    check(device, algorithm, problem)


def test_float64_where_the_device_has_it(device):
    if "cl_khr_fp64" not in device.cl_device.extensions:
        pytest.skip(f"{device.name} has no float64 (cl_khr_fp64)")
    grouped = _problem([(2, 4, 7, 6), (6, 2, 3, 3), (6,)], "float64", pads=[1, 0, 1, 2],
                       group=2, activation="clip", clip_min=-0.2, clip_max=0.2)
    for algorithm in (DirectCLConv({"ko": 4, "l": 32}), Im2colCLConv()):
        check(device, algorithm, grouped)
    depthwise = _problem([(1, 3, 8, 8), (3, 1, 3, 3)], "float64", pads=[1, 1, 1, 1], group=3)
    check(device, DepthwiseCLConv({"px": 4, "l": 32}), depthwise)
    pointwise = _problem([(2, 4, 3, 3), (5, 4, 1, 1), (5,)], "float64", activation="relu")
    check(device, Conv1x1CLConv(), pointwise)


def _onnx_conv_cases():
    for case in node_cases("Conv"):
        node = case.model.graph.node[0]
        attrs = node_attributes(node)
        for inputs, outputs in case.data_sets:
            yield pytest.param(inputs, attrs, outputs[0], id=case.name)


@pytest.mark.parametrize("inputs, attrs, expected", list(_onnx_conv_cases()))
def test_onnx_examples(device, inputs, attrs, expected):
    problem = OPERATOR.problem([x.shape for x in inputs], [x.dtype for x in inputs], **attrs)
    ran = 0
    for algorithm in CHECKED:
        if algorithm.usable(problem):
            out = run(device, algorithm, problem, inputs)
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4,
                                       err_msg=algorithm.desc.text)
            ran += 1
    assert ran >= 2


def test_registered_only_with_pyopencl(monkeypatch):
    texts = [a.desc.text for a in OPENCL]
    assert texts == [a.desc.text for a in opencl_algorithms()]
    assert len(texts) == len(set(texts))
    assert all(a.device_kind == "opencl" and a.desc.operator == "conv" for a in OPENCL)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyopencl" else real(name, *a))
    registry = Registry(load_plugins=False)
    conv.register(registry)
    assert all(a.device_kind == "cpu" for a in registry.algorithms("conv"))


def test_usability_reasons():
    dense = _problem([(1, 8, 5, 5), (4, 8, 3, 3)])
    assert "group == C" in DepthwiseCLConv({"px": 1, "l": 32}).unusable_reason(dense)
    assert "1x1 kernel" in Conv1x1CLConv().unusable_reason(dense)
    strided = _problem([(1, 8, 5, 5), (4, 8, 1, 1)], strides=2)
    assert "stride 1 and no padding" in Conv1x1CLConv().unusable_reason(strided)
    # 25 pixels: 128-wide work-groups would idle most work-items; 32 stays usable
    assert "128 work-items per group" in DirectCLConv({"ko": 4, "l": 128}).unusable_reason(dense)
    assert DirectCLConv({"ko": 4, "l": 32}).usable(dense)
    depthwise = _problem([(1, 8, 5, 5), (8, 1, 3, 3)], group=8)
    assert "a group has only 1" in DirectCLConv({"ko": 8, "l": 32}).unusable_reason(depthwise)
    assert DirectCLConv({"ko": 1, "l": 32}).usable(depthwise)
    huge = _problem([(1, 2, 20, 20), (2, 1, 9, 9)], group=2)
    assert "9x9 window is over the 64 taps" in DepthwiseCLConv({"px": 1, "l": 32}) \
        .unusable_reason(huge)

    def igemm(**param):
        base = {"mwg": 32, "nwg": 32, "kwg": 8, "mdimc": 16, "ndimc": 8, "vw": 2, "split": 1}
        return ImplicitGemmCLConv({**base, **param})

    small = _problem([(1, 8, 5, 5), (20, 8, 3, 3)], pads=[1] * 4)  # 20 channels, 25 pixels
    assert igemm().usable(small)  # the smallest tiles always are
    assert "a 64-channel tile for 20" in igemm(mwg=64).unusable_reason(small)
    assert "a 64-pixel tile for 25" in igemm(nwg=64).unusable_reason(small)
    assert "16 steps of 8" in igemm(split=8).unusable_reason(small)  # 72 deep: 9 steps
    assert igemm(split=8).usable(_problem([(1, 16, 5, 5), (20, 16, 3, 3)]))  # 18 steps
    shallow = _problem([(1, 1, 5, 5), (4, 1, 2, 2)])
    assert "a 16-deep step for a reduction of 4" in igemm(kwg=16).unusable_reason(shallow)


def test_device_limits_are_checked_before_running():
    class SmallDevice:
        name = "small"
        max_work_group_size = 64

        class cl_device:  # mimics pyopencl's attribute
            extensions = "cl_khr_global_int32_base_atomics"

    problem = _problem([(1, 4, 16, 16), (4, 4, 3, 3)])
    assert "over the device's maximum of 64" in DirectCLConv({"ko": 1, "l": 128}) \
        .device_unusable_reason(SmallDevice, problem)
    assert DirectCLConv({"ko": 1, "l": 32}).device_unusable_reason(SmallDevice, problem) is None
    double = _problem([(1, 4, 16, 16), (4, 4, 3, 3)], "float64")
    assert "float64" in Im2colCLConv().device_unusable_reason(SmallDevice, double)


class Recording:
    """The device as an algorithm sees it, recording every buffer it allocates itself."""

    def __init__(self, device):
        self._device = device
        self.allocated = []

    def empty(self, shape, dtype):
        array = self._device.empty(shape, dtype)
        self.allocated.append(array)
        return array

    def __getattr__(self, name):
        return getattr(self._device, name)


@pytest.mark.parametrize("algorithm, shapes, params", [
    (Im2colCLConv(), [(2, 4, 6, 6), (6, 4, 3, 3), (6,)], {"pads": [1, 1, 1, 1]}),  # batched
    (Im2colCLConv(), [(2, 4, 6, 6), (6, 2, 3, 3)], {"group": 2, "activation": "relu"}),
    (Conv1x1CLConv(), [(2, 4, 6, 6), (6, 4, 1, 1)], {}),
    (Conv1x1CLConv(), [(2, 4, 6, 6), (6, 2, 1, 1), (6,)], {"group": 2}),
    (DirectCLConv({"ko": 4, "l": 32}), [(2, 4, 6, 6), (6, 2, 3, 3)], {"group": 2}),
    (DepthwiseCLConv({"px": 4, "l": 32}), [(1, 4, 6, 6), (4, 1, 3, 3)], {"group": 4}),
    (IGEMM_EVERY_CASE[0], [(2, 4, 6, 6), (6, 2, 3, 3)], {"group": 2}),
    (IGEMM_EVERY_CASE[1], [(2, 40, 6, 6), (6, 40, 3, 3), (6,)], {"activation": "relu"}),
    (FusedWinogradCLConv(), [(2, 9, 6, 6), (33, 9, 3, 3), (33,)], {"pads": [1, 1, 1, 1]}),
], ids=["im2col-batched", "im2col-per-image", "1x1-batched", "1x1-per-image", "direct",
        "depthwise", "igemm", "igemm-split", "winograd-fused"])
def test_workspace_is_exactly_what_run_allocates(device, algorithm, shapes, params):
    """Own buffers besides the output, plus the sub-problem products held until copied into
    the output (a product that *is* the output is not workspace)."""
    problem = _problem(shapes, **params)
    ctx = Ctx(Recording(device))
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(0))
    out = algorithm.run(problem, [device.to_device(x) for x in inputs], ctx)
    output = out.base_data.int_ptr
    products = {r.base_data.int_ptr for r in ctx.results}  # allocated by the matmul
    own = sum(a.nbytes for a in ctx.device.allocated
              if a.base_data.int_ptr not in products | {output})
    held = max((r.nbytes for r in ctx.results if r.base_data.int_ptr != output), default=0)
    assert own + held == algorithm.workspace_bytes(problem)
    assert len(ctx.results) == len(algorithm.sub_problems(problem))
    for result, sub in zip(ctx.results, algorithm.sub_problems(problem), strict=True):
        assert result.shape == REGISTRY.operator("matmul").output_shape(sub)


def test_heuristic_order():
    def first(shapes, **params):
        problem = _problem(shapes, **params)
        usable = [a for a in OPENCL if a.usable(problem)]
        return OPERATOR.heuristic_order(problem, usable)[0]

    assert first([(1, 32, 56, 56), (32, 1, 3, 3)], group=32, pads=[1] * 4).desc.name \
        == "cl_depthwise"
    assert first([(1, 64, 56, 56), (256, 64, 1, 1)]).desc.name == "cl_conv1x1"
    rgb = first([(1, 3, 224, 224), (64, 3, 7, 7)], strides=2, pads=[3] * 4)
    assert rgb.desc.text == "cl_direct(ko=8,l=128)"
    deep = first([(1, 64, 56, 56), (64, 64, 3, 3)], pads=[1] * 4)
    assert deep.desc.name == "cl_igemm"
    # 64 channels x 3136 pixels: 49 output tiles of 64 x 64, split 8 ways for enough groups
    assert (deep.param["mwg"], deep.param["nwg"], deep.param["split"]) == (64, 64, 8)
    batch = _problem([(32, 64, 56, 56), (64, 64, 3, 3)], pads=[1] * 4)
    order = OPERATOR.heuristic_order(batch, [a for a in OPENCL if a.usable(batch)])
    assert order[0].desc.text == "cl_winograd(m=4)"  # deep 3x3, a batch of many pixels
    assert order[1].desc.text == "cl_winograd(m=2)"
    igemm = next(a for a in order if a.desc.name == "cl_igemm")
    assert igemm.param["split"] == 1  # 1568 output tiles already
    single = _problem([(1, 64, 56, 56), (64, 64, 3, 3)], pads=[1] * 4)
    order = [a.desc.name for a in OPERATOR.heuristic_order(
        single, [a for a in OPENCL if a.usable(single)])]
    assert order.index("cl_winograd") == order.count("cl_igemm")  # one image: launches count


def _layer(rng):
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    return x, w, b


def _expected(x, w, b, **params):
    problem = _problem([x.shape, w.shape, b.shape], **params)
    return OPERATOR.reference(problem, [x, w, b])


def test_fast_run_search_picks_an_opencl_algorithm_and_caches_it_by_device(device):
    """The whole registry on an OpenCL session: an OpenCL conv algorithm is chosen, checked,
    and cached under the OpenCL category (with cl_im2col's product, if the budgeted sample
    timed it, decided by the OpenCL matmul search first: the next test pins that down)."""
    cache = InMemoryCache()
    rng = np.random.default_rng(0)
    x, w, b = _layer(rng)
    params = {"strides": [1, 1], "pads": [1, 1, 1, 1]}
    with fastrun.session(device="opencl", strategy="fast-run", cache=cache, budget_s=0.01,
                         progress=False, tuning_budget=2) as session:
        result = session.call("conv", x, w, b, **params)
        out = session.device.to_host(result)
        decisions = session.chooser.decisions()
        problem = session.problem("conv", [x.shape, w.shape, b.shape], ["float32"] * 3,
                                  **params)
        decision = session.decide(problem)
    np.testing.assert_allclose(out, _expected(x, w, b, **params), rtol=1e-4, atol=1e-4)
    assert decision.source == "profiled"
    assert decision.algorithm.device_kind == "opencl"
    assert all(e.error is not None and e.error <= 2e-3 for e in decision.entries)
    assert any(r == "runs on cpu devices" for r in decision.excluded.values())
    assert all(d.algorithm.device_kind == "opencl" for d in decisions)
    categories = {category.split("|")[1]: category for category, _, _ in cache}
    conv_at = f"conv@{REGISTRY.algorithm_set_version('conv', 'opencl')}"
    assert conv_at in categories
    assert set(categories) <= {conv_at,
                               f"matmul@{REGISTRY.algorithm_set_version('matmul', 'opencl')}"}
    assert all(c.startswith(device.category + "|") for c in categories.values())


def test_im2col_gemm_is_chosen_by_the_opencl_matmul_search_and_shows_in_the_policy(device):
    """A registry whose only OpenCL conv algorithm is cl_im2col: its policy carries the matmul
    child the OpenCL matmul search decided (and cached) for its product."""
    registry = Registry(load_plugins=False)
    matmul.register(registry)
    registry.register_operator(ConvOperator())
    registry.register_algorithm(Im2colCLConv())
    cache = InMemoryCache()
    rng = np.random.default_rng(1)
    x, w, b = _layer(rng)
    params = {"strides": [1, 1], "pads": [1, 1, 1, 1], "activation": "relu"}
    with fastrun.session(device="opencl", strategy="fast-run", cache=cache, budget_s=0.01,
                         progress=False, tuning_budget=2, registry=registry) as session:
        out = session.device.to_host(session.call("conv", x, w, b, **params))
        policy = session.policy("conv", x, w, b, **params)
    np.testing.assert_allclose(out, _expected(x, w, b, **params), rtol=1e-4, atol=1e-4)
    assert policy.algorithm == "cl_im2col"
    (child,) = policy.children
    assert child.operator == "matmul" and child.source == "profiled"
    assert child.key == "float32[24x144],float32[144x144]"
    chosen = next(a for a in registry.algorithms("matmul") if a.desc.text == child.algorithm)
    assert chosen.device_kind == "opencl"
    assert any(c.startswith(device.category + "|matmul@") for c, _, _ in cache)


@pytest.mark.parametrize("split", [2, 8])
def test_split_k_reduces_in_the_last_work_group_of_each_tile(device, split):
    """One launch per call: the last slice of each tile to finish adds the slices in order,
    so every call gives the same bits (whichever slice is last) and leaves the tile counters
    zeroed for the next."""
    algorithm = ImplicitGemmCLConv({"mwg": 32, "nwg": 32, "kwg": 8, "mdimc": 16, "ndimc": 8,
                                    "vw": 2, "split": split})
    problem = _problem([(2, 40, 6, 7), (40, 40, 3, 3), (40,), (2, 40, 6, 7)],
                       pads=[1, 1, 1, 1], residual=True, activation="relu")
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(4))
    launches = []
    real_launch = device.launch
    device.launch = lambda *a, **k: (launches.append(a[0]), real_launch(*a, **k))[1]
    try:
        outputs = [run(device, algorithm, problem, inputs) for _ in range(3)]
    finally:
        del device.launch
    assert len(launches) == 3  # no reduction kernel of its own
    for again in outputs[1:]:
        np.testing.assert_array_equal(again, outputs[0])
    reference = OPERATOR.reference(problem, inputs)
    assert OPERATOR.error(problem, outputs[0], reference) <= OPERATOR.tolerance(problem)
    counters = algorithm._launches(device, problem).counters
    assert not device.to_host(counters).any()
