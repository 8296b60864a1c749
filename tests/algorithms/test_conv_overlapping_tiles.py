"""Kernels whose last tile overlaps the one before it (computed twice, identically) and whose
epilogue runs in vector loops: each tile must store finished values, never finish values in
the output, where a second thread may have stored the same outputs raw in between (the values
were then activated twice: a HardSwish layer of 96 -> 576 channels at 7x7 lost 0.02 to it)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from fastrun_algorithms.conv import blocked_direct, implicit_gemm, tiled_1x1
from fastrun_algorithms.conv.operator import ConvOperator
from tests.algorithms._helpers import NoSubProblems, assert_matches_reference, numba_threads

OPERATOR = ConvOperator()
#: (algorithm, X, W): planes that leave a partial last tile (49 pixels against 32- and
#: 6-pixel tiles, 40 columns against 16- and 32-column ones)
CASES = [
    (tiled_1x1.Tiled1x1Conv(), (1, 24, 7, 7), (72, 24, 1, 1)),
    (implicit_gemm.ImplicitGemmConv(), (1, 8, 12, 40), (24, 8, 3, 3)),
    (blocked_direct.BlockedDirectConv(), (1, 16, 7, 7), (32, 16, 3, 3)),
]


@pytest.mark.parametrize(("algorithm", "x_shape", "w_shape"), CASES,
                         ids=[case[0].desc.name for case in CASES])
@pytest.mark.parametrize("activation", ["hard_swish", "silu"])
@pytest.mark.parametrize("residual", [False, True])
def test_overlapping_tiles_store_each_output_finished_once(algorithm, x_shape, w_shape,
                                                           activation, residual):
    pad = w_shape[2] // 2
    out_shape = (x_shape[0], w_shape[0], x_shape[2], x_shape[3])
    shapes = [x_shape, w_shape, (w_shape[0],), *([out_shape] if residual else [])]
    problem = OPERATOR.problem(shapes, ["float32"] * len(shapes), pads=[pad] * 4,
                               activation=activation, residual=residual)
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(3))
    with numba_threads(min(2, numba.config.NUMBA_NUM_THREADS)):
        for _ in range(30):
            output = algorithm.run(problem, inputs, NoSubProblems())
            assert_matches_reference(OPERATOR, algorithm, problem, inputs, output)
