"""The blocked direct conv (16-channel weight blocks, 2 x 6 register tiles): the reference over
random problems (channel counts that are not a multiple of the block, planes of fewer than 6
pixels, strides, dilations, padding, groups, 1-D, strided inputs, every epilogue, a residual),
with and without preprocessed weights, every thread count, and its refusal of float64."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun_algorithms.conv import blocked_direct, heuristic, tiled_1x1
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import (
    CONV_ACTIVATIONS,
    NoSubProblems,
    assert_matches_reference,
    numba_threads,
    pretend_threads,
)

OPERATOR = ConvOperator()
BLOCKED = blocked_direct.BlockedDirectConv()


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, list[np.ndarray]]:
    group = draw(st.sampled_from([1, 1, 1, 2, 3]))
    n = draw(st.integers(1, 3))
    c = group * draw(st.integers(1, 20))
    k = group * draw(st.integers(1, 40))
    one_d = draw(st.booleans())
    kernel = [draw(st.integers(1, 3))] if one_d else [draw(st.integers(1, 3)),
                                                      draw(st.integers(1, 3))]
    spatial = [draw(st.integers(k_, 14)) for k_ in kernel]
    params: dict[str, Any] = {"group": group}
    if draw(st.booleans()):
        params["strides"] = [draw(st.integers(1, 3)) for _ in kernel]
    if draw(st.booleans()):
        params["pads"] = [draw(st.integers(0, 2)) for _ in range(2 * len(kernel))]
    if draw(st.booleans()):
        params["dilations"] = [1 if size < 2 * k_ - 1 else draw(st.integers(1, 2))
                               for k_, size in zip(kernel, spatial, strict=True)]
    activation = draw(st.sampled_from(CONV_ACTIVATIONS))
    if activation != "none":
        params["activation"] = activation
    if activation == "clip":
        params["clip_min"], params["clip_max"] = -0.5, 0.25
    if draw(st.booleans()):
        params["weight_preprocess"] = True
    shapes = [(n, c, *spatial), (k, c // group, *kernel)]
    if draw(st.booleans()):
        shapes.append((k,))
    out_shape = OPERATOR.output_shape(OPERATOR.problem(shapes, ["float32"] * len(shapes),
                                                       **params))
    if draw(st.booleans()):
        shapes.append(out_shape)
        params["residual"] = True
    problem = OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(draw(st.integers(0, 2**31))))
    if draw(st.booleans()):  # X as a strided view, as a slice of a larger tensor would be
        wide = np.zeros((*inputs[0].shape[:-1], 2 * inputs[0].shape[-1]), dtype="float32")
        wide[..., ::2] = inputs[0]
        inputs[0] = wide[..., ::2]
    return problem, inputs


def _run(problem, inputs):
    prepared = BLOCKED.preprocess(problem, inputs) if problem.weight_preprocess else None
    return BLOCKED.run(problem, inputs, NoSubProblems(), prepared)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), threads=st.sampled_from([1, 2, 3]))
def test_blocked_direct_matches_the_reference(case, threads):
    problem, inputs = case
    assert BLOCKED.usable(problem), BLOCKED.unusable_reason(problem)
    with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
        output = _run(problem, inputs)
    assert_matches_reference(OPERATOR, BLOCKED, problem, inputs, output)


def test_resnet_layers_match_and_repeat_exactly_on_every_thread_count():
    """A 3x3 layer of 7x7 pixels (6 tiles and an overlapping one, 33 channels: two whole
    blocks and one of a single channel), a strided one, and a 1x1 one read in place."""
    layers = (([(1, 40, 7, 7), (33, 40, 3, 3), (33,)], {"pads": [1, 1, 1, 1]}),
              ([(2, 16, 15, 15), (48, 16, 3, 3), (48,)],
               {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
              ([(1, 24, 9, 9), (20, 24, 1, 1)], {}))
    for shapes, params in layers:
        problem = OPERATOR.problem(shapes, ["float32"] * len(shapes), activation="relu",
                                   **params)
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(0))
        results = []
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            with numba_threads(threads):
                results.append(_run(problem, inputs))
                for _ in range(3):
                    np.testing.assert_array_equal(_run(problem, inputs), results[-1])
        assert_matches_reference(OPERATOR, BLOCKED, problem, inputs, results[0])
        # each value is summed in one order by one job, whatever the thread count
        np.testing.assert_array_equal(results[0], results[1])


def test_blocked_direct_refuses_float64_and_says_why():
    problem = OPERATOR.problem([(1, 4, 5, 5), (6, 4, 3, 3)], ["float64"] * 2)
    assert "float32 only" in BLOCKED.unusable_reason(problem)


def test_workspace_counts_the_staged_input_and_unpacked_weights():
    padded = OPERATOR.problem([(2, 8, 6, 6), (20, 8, 3, 3)], ["float32"] * 2,
                              pads=[1, 1, 1, 1])
    # staged (2, 8, 8, 8): the 6x6 input in the border its 6x6 output reads; packed
    # (1, 2, 72, 16): 20 output channels in two blocks of 16
    assert BLOCKED.workspace_bytes(padded) == 4 * (2 * 8 * 8 * 8 + 2 * 72 * 16)
    prepared = OPERATOR.problem([(2, 8, 6, 6), (20, 8, 3, 3)], ["float32"] * 2,
                                weight_preprocess=True)
    assert BLOCKED.workspace_bytes(prepared) == 0


def _first(shapes, threads, monkeypatch, **params):
    from fastrun import registry as registry_module

    # the rules read numba's thread count where they are (each conv algorithm's conv_rank)
    pretend_threads(monkeypatch, threads)
    problem = OPERATOR.problem(shapes, ["float32"] * len(shapes), **params)
    candidates = [a for a in registry_module.default_registry().algorithms("conv")
                  if a.device_kind == "cpu" and a.usable(problem)]
    return OPERATOR.heuristic_order(problem, candidates)[0].desc.name


def test_the_heuristic_puts_it_where_it_was_measured_to_win(monkeypatch):
    strided = [(1, 64, 56, 56), (128, 64, 3, 3)]
    assert _first(strided, 2, monkeypatch, strides=[2, 2], pads=[1] * 4) == "blocked_direct"
    deep = [(1, 256, 14, 14), (256, 256, 3, 3)]
    assert _first(deep, 2, monkeypatch, pads=[1] * 4) == "winograd_f2x3"
    assert _first(deep, 16, monkeypatch, pads=[1] * 4) == "blocked_direct"
    wide = [(1, 64, 56, 56), (64, 64, 3, 3)]
    assert _first(wide, 16, monkeypatch, pads=[1] * 4) == "winograd_f4x3"
    one_by_one = [(1, 256, 14, 14), (64, 256, 1, 1)]
    # tiled_1x1 first on 1x1 stride-1 layers, however many threads, where its tile is 8
    # channels high (AVX-512); with AVX2's 4-row tile the BLAS-based kernels (or
    # blocked_direct) go first
    wide_tile = tiled_1x1.MR >= heuristic.TILED_1X1_MIN_ROWS
    for threads in (2, 16):
        first = _first(one_by_one, threads, monkeypatch)
        assert (first == "tiled_1x1") == wide_tile, first
    downsample = [(1, 256, 14, 14), (512, 256, 1, 1)]
    assert _first(downsample, 16, monkeypatch, strides=[2, 2]) == "tiled_1x1"
    # on 2 threads the strided tiles go behind blocked_direct, and conv1x1 stays first
    assert _first(downsample, 2, monkeypatch, strides=[2, 2]) == "conv1x1"
    rgb = [(1, 3, 224, 224), (64, 3, 7, 7)]
    assert _first(rgb, 16, monkeypatch, strides=[2, 2], pads=[3] * 4) == "implicit_gemm"
