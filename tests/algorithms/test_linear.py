"""The linear operator (``act(X @ W + B)``) and its algorithms: against the reference on random
shapes, activations and dtypes, bit-identical across thread counts, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun.attribute import AlgoAttribute
from fastrun_algorithms import linear
from tests.algorithms._helpers import assert_matches_reference, cpu_registry, numba_threads
from tests.opencl_helpers import device_fixture  # noqa: F401

REGISTRY = cpu_registry(linear)
OPERATOR = REGISTRY.operator("linear")
ALGORITHMS = REGISTRY.algorithms("linear")


@st.composite
def problems(draw):
    m, k, n = draw(st.integers(0, 70)), draw(st.integers(0, 40)), draw(st.integers(1, 50))
    shapes = [(m, k), (k, n)] + ([(n,)] if draw(st.booleans()) else [])
    dtype = draw(st.sampled_from(["float32", "float64"]))
    activation = draw(st.sampled_from([None, "none", "relu", "gelu"]))
    params = {} if activation is None else {"activation": activation}
    problem = OPERATOR.problem(shapes, [dtype] * len(shapes), **params)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    if draw(st.booleans()) and m and k:  # X a strided view, as a slice of a tensor would be
        wide = rng.standard_normal((m, 2 * k)).astype(dtype)
        inputs[0] = wide[:, ::2]
    return problem, inputs


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=[a.desc.name for a in ALGORITHMS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=problems())
def test_matches_the_reference(algorithm, drawn):
    problem, inputs = drawn
    OPERATOR.validate(problem)
    assert_matches_reference(OPERATOR, algorithm, problem, inputs,
                             algorithm.run(problem, inputs, None))


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=[a.desc.name for a in ALGORITHMS])
def test_reproducible_at_a_thread_count_and_close_across_them(algorithm):
    """Each value is summed by one gemm over K in an order fixed by the shapes and the thread
    count: the same bits run to run.  Between thread counts the blocks differ, and OpenBLAS's
    kernels for a block's edges follow its shape, so the last bits may too."""
    problem = OPERATOR.problem([(64, 48), (48, 40), (40,)], ["float32"] * 3, activation="gelu")
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in problem.shapes]
    with numba_threads(1):
        one = algorithm.run(problem, inputs, None)
    again = algorithm.run(problem, inputs, None)
    np.testing.assert_allclose(again, one, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(algorithm.run(problem, inputs, None), again)


@pytest.mark.parametrize(("shapes", "params", "message"), [
    ([(2, 3), (4, 5)], {}, "X (M, K) and W (K, N)"),
    ([(2, 3, 1), (3, 5)], {}, "X (M, K) and W (K, N)"),
    ([(2, 3), (3, 5), (4,)], {}, "bias must be (5,)"),
    ([(2, 3), (3, 5)], {"activation": "tanh"}, "activation must be one of"),
    ([(2, 3), (3, 5)], {"alpha": 1.0}, "no parameter(s) alpha"),
    ([(2, 3)], {}, "takes 2 or 3 inputs"),
])
def test_bad_problems_are_named(shapes, params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)


def test_registered_and_the_split_goes_first():
    assert [a.desc.name for a in ALGORITHMS] == ["blas", "blas_split"]
    assert all(a.attributes == AlgoAttribute.REPRODUCIBLE for a in ALGORITHMS)
    problem = OPERATOR.problem([(197, 64), (64, 96)], ["float32"] * 2)
    assert [a.desc.name for a in OPERATOR.heuristic_order(problem, ALGORITHMS)] == \
        ["blas_split", "blas"]


# -- on an OpenCL device ---------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_cl_linear_matches_the_reference_through_its_matmul_sub_problem(device, activation,
                                                                        bias):
    """A heuristic OpenCL session: cl_linear hands the product to the OpenCL matmul (chosen
    for its shape) and finishes it with the bias and activation kernel; shapes of a ViT's
    projection with an odd width, and one with no rows."""
    import fastrun

    rng = np.random.default_rng(11)
    for m, k, n in ((197, 64, 96), (5, 3, 7), (0, 4, 3)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        inputs = [x, w] + ([rng.standard_normal(n).astype(np.float32)] if bias else [])
        problem = OPERATOR.problem([a.shape for a in inputs], ["float32"] * len(inputs),
                                   activation=activation)
        with fastrun.session(device="opencl", strategy="heuristic", progress=False) as session:
            decision = session.decide(problem)
            out = session.device.to_host(session.call("linear", *inputs,
                                                      activation=activation))
        assert decision.algorithm.desc.name == "cl_linear"
        assert_matches_reference(OPERATOR, decision.algorithm, problem, inputs, out)
