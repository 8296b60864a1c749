"""The linear operator (``act(X @ W + B)``) and its algorithms: against the reference on random
shapes, activations and dtypes, bit-identical across thread counts, clear errors."""

from __future__ import annotations

import platform

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fastrun.attribute import AlgoAttribute
from fastrun_algorithms import linear
from fastrun_algorithms._common import prefetch
from fastrun_algorithms.linear import packed
from tests.algorithms._helpers import assert_matches_reference, cpu_registry, numba_threads
from tests.opencl_helpers import device_fixture  # noqa: F401

REGISTRY = cpu_registry(linear)
OPERATOR = REGISTRY.operator("linear")
ALGORITHMS = REGISTRY.algorithms("linear")
PACKED = next(a for a in ALGORITHMS if a.desc.name == "packed")


@st.composite
def problems(draw):
    # N up to 150: whole and partial packed panels (64 columns on AVX-512, 32 on AVX2)
    m, k, n = draw(st.integers(0, 70)), draw(st.integers(0, 40)), draw(st.integers(1, 150))
    shapes = [(m, k), (k, n)] + ([(n,)] if draw(st.booleans()) else [])
    dtype = draw(st.sampled_from(["float32", "float64"]))
    activation = draw(st.sampled_from([None, "none", "relu", "gelu"]))
    params = {} if activation is None else {"activation": activation}
    if draw(st.booleans()):
        params["weight_preprocess"] = True
    if draw(st.booleans()):  # a residual, in the batched shape a transformer gives it
        params["residual"] = True
        shapes.append(draw(st.sampled_from([(m, n), (1, m, n)])))
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
    assume(algorithm.unusable_reason(problem) is None)
    prepared = algorithm.preprocess(problem, inputs) if problem.weight_preprocess else None
    assert_matches_reference(OPERATOR, algorithm, problem, inputs,
                             algorithm.run(problem, inputs, None, prepared))


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
    ([(2, 3), (3, 5), (5,)], {"residual": True}, "Z must have M x N = 10 values"),
    ([(2, 3), (3, 5), (5,), (2, 5), (2, 5)], {"residual": True}, "and Z, got 5"),
])
def test_bad_problems_are_named(shapes, params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)


def test_packed_is_bit_identical_across_thread_counts():
    """One job sums each value over k in order, whatever the thread count; rows that are not
    a whole tile, and columns that are not a whole panel, included."""
    algorithm = PACKED
    rng = np.random.default_rng(3)
    for m, k, n in ((197, 33, 150), (2, 17, 5), (6, 8, packed.PANEL)):
        problem = OPERATOR.problem([(m, k), (k, n), (n,)], ["float32"] * 3, activation="relu",
                                   weight_preprocess=True)
        inputs = [rng.standard_normal(s).astype(np.float32) for s in problem.shapes]
        prepared = algorithm.preprocess(problem, inputs)
        with numba_threads(1):
            one = algorithm.run(problem, inputs, None, prepared)
        np.testing.assert_array_equal(algorithm.run(problem, inputs, None, prepared), one)
        np.testing.assert_array_equal(algorithm.run(problem, inputs, None), one)  # packs itself
        assert_matches_reference(OPERATOR, algorithm, problem, inputs, one)


def test_packed_prefetching_changes_no_value_and_reaches_past_the_end_harmlessly():
    """The prefetch is a hint: the same bits with it off, at its distance, and far past the
    packed weights' end; on x86 it is the processor's prefetch instruction."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((13, 40)).astype(np.float32)
    w = rng.standard_normal((40, 70)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    kernel, weights = packed._compiled(), packed.pack(w)
    outputs = []
    for ahead in (0, packed.AHEAD, 10**9):
        out = np.empty((13, 70), np.float32)
        kernel(x, weights, bias, True, np.zeros((1, 1), np.float32), False, 1, ahead, out)
        outputs.append(out)
    np.testing.assert_array_equal(outputs[1], outputs[0])
    np.testing.assert_array_equal(outputs[2], outputs[0])
    if platform.machine() in ("x86_64", "AMD64"):  # the instruction, in a fresh compilation
        touch = numba.njit(lambda a, i: prefetch(a, i))
        touch(x, 3)
        assert any("prefetch" in text for text in touch.inspect_asm().values())


def test_packed_weights_are_panels_of_the_tile_width_zero_past_n():
    w = np.arange(3 * 70, dtype=np.float32).reshape(3, 70)
    panels = packed.pack(w)
    assert panels.shape == packed.packed_shape(3, 70) == (-(-70 // packed.PANEL), 3, packed.PANEL)
    assert not panels.flags.writeable
    np.testing.assert_array_equal(panels.transpose(1, 0, 2).reshape(3, -1)[:, :70], w)
    assert not panels.transpose(1, 0, 2).reshape(3, -1)[:, 70:].any()


def test_packed_refuses_what_it_cannot_tile_and_counts_its_workspace():
    algorithm = PACKED
    double = OPERATOR.problem([(4, 3), (3, 5)], ["float64"] * 2)
    assert "float32 only" in algorithm.unusable_reason(double)
    empty = OPERATOR.problem([(0, 3), (3, 5)], ["float32"] * 2)
    assert "rows, columns and a depth" in algorithm.unusable_reason(empty)
    per_call = OPERATOR.problem([(4, 3), (3, 70)], ["float32"] * 2)
    assert algorithm.workspace_bytes(per_call) == 4 * 3 * packed.PANEL * -(-70 // packed.PANEL)
    once = OPERATOR.problem([(4, 3), (3, 70)], ["float32"] * 2, weight_preprocess=True)
    assert algorithm.workspace_bytes(once) == 0


def test_registered_and_the_heuristic_order():
    """``packed`` first where its weights are packed once and the tile is AVX-512's; the split
    gemm first otherwise."""
    assert [a.desc.name for a in ALGORITHMS] == ["blas", "blas_split", "packed"]
    assert all(a.attributes == AlgoAttribute.REPRODUCIBLE for a in ALGORITHMS)
    problem = OPERATOR.problem([(197, 64), (64, 96)], ["float32"] * 2)
    assert [a.desc.name for a in OPERATOR.heuristic_order(problem, ALGORITHMS)] == \
        ["blas_split", "packed", "blas"]
    once = OPERATOR.problem([(197, 64), (64, 96)], ["float32"] * 2, weight_preprocess=True)
    first = "packed" if packed.ROWS == 6 else "blas_split"
    assert OPERATOR.heuristic_order(once, ALGORITHMS)[0].desc.name == first


# -- on an OpenCL device ---------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
@pytest.mark.parametrize(("bias", "residual"), [(True, False), (False, False), (True, True),
                                                (False, True)])
def test_cl_linear_matches_the_reference_through_its_matmul_sub_problem(device, activation,
                                                                        bias, residual):
    """A heuristic OpenCL session: cl_linear hands the product to the OpenCL matmul (chosen
    for its shape) and finishes it with the bias, residual and activation kernel; shapes of a
    ViT's projection with an odd width, and one with no rows."""
    import fastrun

    rng = np.random.default_rng(11)
    for m, k, n in ((197, 64, 96), (5, 3, 7), (0, 4, 3)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        inputs = [x, w] + ([rng.standard_normal(n).astype(np.float32)] if bias else []) \
            + ([rng.standard_normal((1, m, n)).astype(np.float32)] if residual else [])
        params = {"activation": activation, **({"residual": True} if residual else {})}
        problem = OPERATOR.problem([a.shape for a in inputs], ["float32"] * len(inputs),
                                   **params)
        with fastrun.session(device="opencl", strategy="heuristic", progress=False) as session:
            decision = session.decide(problem)
            out = session.device.to_host(session.call("linear", *inputs, **params))
        assert decision.algorithm.desc.name == "cl_linear"
        assert_matches_reference(OPERATOR, decision.algorithm, problem, inputs, out)
