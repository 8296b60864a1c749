"""batch_norm's ``parallel`` algorithm: one pass over X, planes shared out among the workers.

Why: the numpy algorithm makes three broadcast passes over the output on one thread.  In
DenseNet-121, whose 62 BatchNormalizations normalise each dense block's concatenated input
before its ReLU (a BN that no convolution before it can absorb), they took 18.1 of 40.1 ms on
the 16-core host at 16 threads, against 3.1 ms for onnxruntime's
(``benchmarks/probe_layers_vs_ort.py``).

How: the per-channel factor ``scale / sqrt(var + epsilon)`` is computed once for C values, by
the numpy algorithm's own function (``numpy_impl.batch_norm_channels``), then each output is
``(x - mean) * factor + B``, the same operations in the same order and precision as numpy's
passes: the two algorithms give the same values.  A Relu fused into the step (DenseNet's,
after each batch norm) is applied in the same pass.  X is (N*C, P) planes cut into runs of
:data:`RUN` values, one task each, so that a layer of few large planes splits over the threads
as well as one of many small ones.
REPRODUCIBLE: a value does not depend on the thread that computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, U
from fastrun_algorithms.activation.numpy_impl import batch_norm_channel_bytes, batch_norm_channels

#: Values of a plane one task normalises (64 KB of float32).
RUN = 16384


@numba.njit(parallel=True, cache=CACHE)
def _batch_norm_kernel(x, mean, factor, bias, relu, out):
    """out[r] = (x[r] - mean[c]) * factor[c] + bias[c] for plane r of channel c = r % C,
    through a Relu when ``relu``."""
    planes, length = x.shape
    channels = mean.shape[0]
    runs = (length + RUN - 1) // RUN
    for task in prange(planes * runs):
        plane = task // runs
        start = (task - plane * runs) * RUN
        stop = min(length, start + RUN)
        c = plane % channels
        m, f, b = mean[c], factor[c], bias[c]
        if relu:
            zero = out.dtype.type(0)
            for i in range(start, stop):
                v = (x[plane, U(i)] - m) * f + b
                out[plane, U(i)] = zero if v < zero else v  # NaN stays NaN, as relu's
        else:
            for i in range(start, stop):
                out[plane, U(i)] = (x[plane, U(i)] - m) * f + b


class ParallelBatchNorm(Algorithm):
    """One parallel pass over X (see the module docstring)."""

    operator = "batch_norm"
    name = "parallel"
    attributes = AlgoAttribute.REPRODUCIBLE

    def workspace_bytes(self, problem: Problem) -> int:
        """The per-channel vectors in X's dtype (:func:`batch_norm_channel_bytes`)."""
        return batch_norm_channel_bytes(problem)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        x = np.ascontiguousarray(inputs[0])
        mean, factor, bias = batch_norm_channels(problem, inputs, x.dtype)
        out = np.empty(x.shape, x.dtype)
        planes = x.shape[0] * x.shape[1]
        if out.size:
            _batch_norm_kernel(x.reshape(planes, -1), mean, factor, bias,
                               problem.param("activation") == "relu", out.reshape(planes, -1))
        return out

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        """First at every size and thread count: one pass where numpy makes three.  It took
        0.15-0.47 of numpy's time on DenseNet-121's shapes (56x56 to 7x7) and on a 3 x 224x224
        input at 2 threads on the 2-core VM, and 0.21-0.54 at 1 thread."""
        return (0.0,)
