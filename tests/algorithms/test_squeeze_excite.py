"""``squeeze_excite``: the operator's shape and parameter rules, and ``fused`` against the
float64 reference over random blocks (every activation and gate, several images, planes of one
pixel to thousands, squeezed widths of one upward, NCHW and ``nchw16c``), the same bits on
every thread count, and the workspace it declares."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun_algorithms import squeeze_excite
from fastrun_algorithms.layout.blocking import LANES, blocked_shape
from fastrun_algorithms.squeeze_excite import fused
from fastrun_algorithms.squeeze_excite.operator import ACTIVATIONS, GATES
from tests.algorithms._helpers import (
    NoSubProblems,
    assert_allocates_its_workspace,
    assert_matches_reference,
    assert_same_bits_across_threads_and_concurrent_calls,
    cpu_registry,
    numba_threads,
)

REGISTRY = cpu_registry(squeeze_excite)
OPERATOR = REGISTRY.operator("squeeze_excite")
FUSED = fused.FusedSqueezeExcite()


def _shapes(n: int, c: int, s: int, spatial=(7, 7), blocked: bool = False
            ) -> list[tuple[int, ...]]:
    x = (n, c, *spatial)
    return [blocked_shape(x) if blocked else x, (c, s), (s,), (s, c), (c,)]


def _case(shapes, dtype: str, seed: int = 0, **params):
    problem = OPERATOR.problem(shapes, [dtype] * 5, **params)
    return problem, OPERATOR.random_inputs(problem, np.random.default_rng(seed))


@st.composite
def cases(draw: st.DrawFn):
    n, c, s = draw(st.integers(1, 3)), draw(st.integers(1, 70)), draw(st.integers(1, 20))
    spatial = draw(st.sampled_from([(1, 1), (3, 5), (14, 14), (56, 56), (9,)]))
    params = {"activation": draw(st.sampled_from(ACTIVATIONS)),
              "gate": draw(st.sampled_from(GATES))}
    if params["gate"] == "hard_sigmoid" and draw(st.booleans()):
        params.update(alpha=1 / 6, beta=0.5)  # torch's HardSigmoid; ONNX's defaults otherwise
    blocked = draw(st.booleans())
    if blocked:
        params["layout"] = "nchw16c"
    return _case(_shapes(n, c, s, spatial, blocked), draw(st.sampled_from(["float32", "float64"])),
                 draw(st.integers(0, 9)), **params)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), threads=st.sampled_from([1, 2, 3]))
def test_fused_matches_the_reference(case, threads):
    problem, inputs = case
    with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
        output = FUSED.run(problem, inputs, NoSubProblems())
    assert_matches_reference(OPERATOR, FUSED, problem, inputs, output)
    if problem.param("layout") == "nchw16c" and problem.shapes[1][0] % LANES:
        assert np.all(output[:, -1, ..., problem.shapes[1][0] % LANES:] == 0)  # padding lanes


def test_mobilenet_v3_blocks_repeat_exactly_and_allocate_what_they_declare():
    """MobileNetV3-Large's widest block (960 channels squeezed to 240, 7x7) and an early one
    (72 channels squeezed to 24 on 28x28 planes)."""
    for n, c, s, side, layout in ((1, 960, 240, 7, "nchw"), (2, 72, 24, 28, "nchw"),
                                  (1, 960, 240, 7, "nchw16c"), (2, 72, 24, 56, "nchw16c")):
        problem, inputs = _case(_shapes(n, c, s, (side, side), layout == "nchw16c"), "float32",
                                activation="relu", gate="hard_sigmoid", alpha=1 / 6, beta=0.5,
                                layout=layout)

        def call(problem=problem, inputs=inputs):
            return FUSED.run(problem, inputs, NoSubProblems())

        expected = assert_allocates_its_workspace(FUSED, problem, call)
        assert_matches_reference(OPERATOR, FUSED, problem, inputs, expected)
        assert_same_bits_across_threads_and_concurrent_calls(call, expected)


def test_a_plane_of_many_large_values_keeps_its_mean():
    """The plane is summed in float64: 50,176 values near 1e4 with a small spread (a float32
    running sum would lose the spread's bits)."""
    problem, inputs = _case(_shapes(1, 2, 1, (224, 224)), "float32", gate="sigmoid")
    inputs[0] = (1e4 + np.random.default_rng(1).standard_normal(inputs[0].shape)
                 ).astype(np.float32)
    inputs[1] = np.full_like(inputs[1], 1e-4)
    output = FUSED.run(problem, inputs, NoSubProblems())
    assert OPERATOR.error(problem, output, OPERATOR.reference(problem, inputs)) < 1e-6


def test_defaults_share_one_key():
    shapes = _shapes(1, 8, 2)
    plain = OPERATOR.problem(shapes, ["float32"] * 5)
    assert OPERATOR.problem(shapes, ["float32"] * 5, activation="none", gate="sigmoid",
                            layout="nchw") == plain
    hard = OPERATOR.problem(shapes, ["float32"] * 5, gate="hard_sigmoid")
    assert (hard.param("alpha"), hard.param("beta")) == (0.2, 0.5)


@pytest.mark.parametrize(("shapes", "params", "message"), [
    (_shapes(1, 8, 2), {"activation": "tanh"}, "activation must be one of"),
    (_shapes(1, 8, 2), {"gate": "relu"}, "gate must be one of"),
    (_shapes(1, 8, 2), {"alpha": 0.3}, "alpha/beta need gate='hard_sigmoid'"),
    (_shapes(1, 8, 2), {"scale": 2}, "has no parameter(s) scale"),
    (_shapes(1, 8, 2)[:4], {}, "takes X, W1, B1, W2 and B2"),
    ([(1, 8, 3, 3), (7, 2), (2,), (2, 8), (8,)], {}, "needs W1 (8, S)"),
    ([(1, 8, 3, 3), (8, 2), (2,), (3, 8), (8,)], {}, "needs W1 (8, S)"),
    ([(8, 3), *_shapes(1, 8, 2)[1:]], {}, "needs X of shape (N, C, *spatial)"),
    (_shapes(1, 8, 2), {"layout": "nhwc"}, "layout must be one of"),
    (_shapes(1, 8, 2), {"layout": "nchw16c"}, "must have shape (N, ceil(C/16)"),
    ([(1, 2, 7, 7, 16), *_shapes(1, 8, 2)[1:]], {"layout": "nchw16c"}, "i.e. (N, 1, ..., 16)"),
])
def test_malformed_problems_are_refused_with_the_reason(shapes, params, message):
    with pytest.raises(ValueError) as caught:
        OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)
    assert message in str(caught.value)


def test_mixed_or_integer_dtypes_are_refused():
    shapes = _shapes(1, 8, 2)
    with pytest.raises(ValueError, match="float32 or float64 inputs of one dtype"):
        OPERATOR.problem(shapes, ["float32"] * 4 + ["float64"])
    with pytest.raises(ValueError, match="float32 or float64 inputs of one dtype"):
        OPERATOR.problem(shapes, ["int32"] * 5)
