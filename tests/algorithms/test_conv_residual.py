"""conv with a residual input, ``act(conv(X, W) + B + Z)``: every registered algorithm either
computes it (against the reference, over the shapes and epilogues the runtime fuses) or says it
cannot; none may ignore Z."""

from __future__ import annotations

import numpy as np
import pytest

from fastrun.algorithm import Algorithm
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import assert_matches_reference, conv_registry, numba_threads

OPERATOR = ConvOperator()
REGISTRY = conv_registry()
CPU = [a for a in REGISTRY.algorithms("conv") if a.device_kind == "cpu"]
OTHER = [a for a in REGISTRY.algorithms("conv") if a.device_kind != "cpu"]
#: what the residual shortcut of these algorithms must be able to join
TAKES_RESIDUAL = {"naive", "direct", "implicit_gemm", "im2col", "conv1x1", "pointwise",
                  "winograd_f2x3", "winograd_f4x3"}
#: the algorithms of 1x1 kernels only
ONE_BY_ONE = {"conv1x1", "pointwise"}


class Products:
    def call(self, problem, *inputs):
        return np.matmul(*inputs)


#: (X shape, W shape, parameters): ResNet's block ends (3x3 and 1x1, stride 1), strided and
#: padded layers, odd sizes (tile and vector remainders), several images, 1-D.
CASES = [
    ((1, 8, 9, 9), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 5, 11, 13), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 6, 10, 10), (12, 6, 1, 1), {}),
    ((2, 6, 9, 9), (10, 6, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 17, 17), (9, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 4, 20, 33), (19, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 15), (5, 3, 3), {"pads": [1, 1]}),
]
EPILOGUES = [{"activation": "relu"}, {}, {"activation": "clip", "clip_min": -0.5,
                                          "clip_max": 0.25}]


def _problem(x_shape, w_shape, params, epilogue, bias, dtype):
    out_shape = OPERATOR.output_shape(OPERATOR.problem([x_shape, w_shape], [dtype] * 2,
                                                       **params))
    shapes = [x_shape, w_shape, *([(w_shape[0],)] if bias else []), out_shape]
    return OPERATOR.problem(shapes, [dtype] * len(shapes), residual=True, **params, **epilogue)


def _inputs(problem, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, shape).astype(problem.dtypes[0]) for shape in problem.shapes]


def _ids(case):
    return "x".join(map(str, case[0])) + "-" + "x".join(map(str, case[1]))


@pytest.mark.parametrize("algorithm", CPU, ids=lambda a: a.desc.text)
@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: e.get("activation", "none"))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_cpu_algorithms_add_the_residual(algorithm: Algorithm, case, epilogue, bias):
    problem = _problem(*case, epilogue, bias, "float32")
    if not algorithm.usable(problem):
        assert algorithm.name not in TAKES_RESIDUAL or "residual" not in (
            algorithm.unusable_reason(problem) or ""), algorithm.unusable_reason(problem)
        pytest.skip(algorithm.unusable_reason(problem))
    inputs = _inputs(problem)
    out = algorithm.run(problem, inputs, Products(), algorithm.preprocess(problem, inputs))
    assert_matches_reference(OPERATOR, algorithm, problem, inputs, out)
    # the residual matters: the same conv without it gives another result
    assert not np.allclose(out, algorithm.run(problem, [*inputs[:-1], inputs[-1] * 0 + 1],
                                              Products(), algorithm.preprocess(problem, inputs)))


@pytest.mark.parametrize("algorithm", [a for a in CPU if a.name in TAKES_RESIDUAL],
                         ids=lambda a: a.desc.text)
def test_float64_and_any_thread_count(algorithm: Algorithm):
    one_by_one = algorithm.name in ONE_BY_ONE
    problem = _problem((2, 6, 12, 12), (9, 6, 1, 1) if one_by_one else (9, 6, 3, 3),
                       {} if one_by_one else {"pads": [1, 1, 1, 1]},
                       {"activation": "relu"}, True, "float64")
    inputs = _inputs(problem, seed=1)
    results = []
    for threads in (1, 2):
        with numba_threads(threads):
            out = algorithm.run(problem, inputs, Products(), algorithm.preprocess(problem,
                                                                                  inputs))
        assert_matches_reference(OPERATOR, algorithm, problem, inputs, out)
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])


def test_the_algorithms_that_should_take_a_residual_do():
    problem = _problem(*CASES[0], EPILOGUES[0], True, "float32")
    usable = {a.name for a in CPU if a.usable(problem)}
    assert usable >= TAKES_RESIDUAL - ONE_BY_ONE
    one_by_one = _problem(*CASES[2], EPILOGUES[0], True, "float32")
    assert {a.name for a in CPU if a.usable(one_by_one)} >= ONE_BY_ONE


@pytest.mark.parametrize("algorithm", OTHER, ids=lambda a: a.desc.text)
def test_algorithms_of_other_devices_take_a_residual_or_refuse_it(algorithm: Algorithm):
    """On OpenCL cl_igemm and both cl_winograd kernels add the residual
    (tests/algorithms/test_conv_opencl.py runs them against the reference); every other
    configuration refuses it with the reason."""
    reason = algorithm.unusable_reason(_problem(*CASES[0], EPILOGUES[0], True, "float32"))
    if algorithm.desc.name in ("cl_igemm", "cl_winograd", "cl_winograd_fused"):
        assert reason is None or "residual" not in reason
    else:
        assert reason and "residual" in reason


@pytest.mark.parametrize("shapes, message", [
    ([(1, 2, 5, 5), (3, 2, 3, 3), (3,), (1, 3, 4, 4)], "residual must have the output's shape"),
    ([(1, 2, 5, 5), (3, 2, 3, 3), (3,), (3,), (1, 3, 3, 3)], "takes 3 or 4 inputs"),
])
def test_bad_residuals_are_named(shapes, message):
    with pytest.raises(ValueError, match=message):
        OPERATOR.problem(shapes, ["float32"] * len(shapes), residual=True)


def test_the_residual_is_part_of_the_key():
    plain = OPERATOR.problem([(1, 2, 5, 5), (3, 2, 3, 3), (3,)], ["float32"] * 3)
    joined = OPERATOR.problem([(1, 2, 5, 5), (3, 2, 3, 3), (3,), (1, 3, 3, 3)],
                              ["float32"] * 4, residual=True)
    assert plain.key != joined.key and "residual=true" in joined.key
