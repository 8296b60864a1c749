"""The ``parallel`` algorithm of the unary activations but tanh: a numba ``prange`` over the
flat contiguous tensor, which numba's scheduler splits into one contiguous run per thread.

erf has no numpy function, so this is its only algorithm; exp, log and erf call the scalar
libm functions per element, like sigmoid (below), and rank first only from
:data:`~fastrun_algorithms.activation.operator.COMPUTE_BOUND_MIN_THREADS` threads on.

relu, leaky_relu, clip, hard_sigmoid and hard_swish: their loops are multiply-adds, compares
and selects, which LLVM vectorises, so the work is memory bound and more threads add
bandwidth.  On (8, 64, 112, 112) float32 (24.5 MiB)
``parallel`` took 0.05-0.11x numpy's time on a 16-core host; on the 2-core development VM
leaky_relu took 0.45x (numpy needs two passes for it) and relu and clip about the same as
numpy's single SIMD pass (see ``operator.PARALLEL_MIN_BYTES`` for the sizes in between).

sigmoid: in float32 through :func:`fastrun_algorithms._fastmath.sigmoid`, multiply-adds
LLVM vectorises; in float64 through libm's scalar exp, about 5x slower per thread than numpy's
SIMD loop.  The heuristic puts it first only from
:data:`~fastrun_algorithms.activation.operator.COMPUTE_BOUND_MIN_THREADS` threads on; a search
measures both.  tanh: without Intel's SVML numba calls the scalar libm tanh per element; it
lost everywhere (4.4-5.9x slower on 16 cores, 25x on 2), so it has no parallel algorithm.

One kernel per operation, generic over the dtype: numba compiles it on the first call with a
new dtype (and once more for read-only inputs) and caches the machine code on disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import prange

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import CACHE, ParallelRanked
from fastrun_algorithms._fastmath import sigmoid
from fastrun_algorithms.activation.operator import ClipOperator, HardSigmoidOperator


@numba.njit(parallel=True, cache=CACHE)
def relu_kernel(x, out):
    for i in prange(x.size):
        v = x[i]
        out[i] = 0 if v < 0 else v  # NaN fails the compare and stays NaN, as in numpy


@numba.njit(parallel=True, cache=CACHE)
def leaky_relu_kernel(x, out, alpha):
    for i in prange(x.size):
        v = x[i]
        out[i] = v if v >= 0 else v * alpha


@numba.njit(parallel=True, cache=CACHE)
def clip_kernel(x, out, low, high):
    # Two selects rather than min(max(...)): the same NaN rule as np.clip (NaN passes), and
    # min > max gives max everywhere, as ONNX specifies.
    for i in prange(x.size):
        v = x[i]
        v = low if v < low else v
        out[i] = high if v > high else v


@numba.njit(parallel=True, cache=CACHE)
def sigmoid_kernel(x, out, one):
    # float32 through the vectorisable sigmoid (fastrun_algorithms._fastmath), float64
    # through libm's exp; ``one`` is unused (the argument builder is reciprocal's too).
    for i in prange(x.size):
        out[i] = sigmoid(x[i])


@numba.njit(parallel=True, cache=CACHE)
def hard_sigmoid_kernel(x, out, alpha, beta):
    # in float64 (alpha, beta are): near the lower knee the two terms cancel; the selects of
    # clip_kernel, so a NaN fails both compares and stays NaN
    for i in prange(x.size):
        v = alpha * np.float64(x[i]) + beta
        v = 0.0 if v < 0.0 else v
        out[i] = 1.0 if v > 1.0 else v


@numba.njit(parallel=True, cache=CACHE)
def hard_swish_kernel(x, out, three, sixth, zero, one):
    # the gate as (x + 3) / 6: exact near the knee at -3 (see numpy_impl._hard_swish)
    for i in prange(x.size):
        v = x[i]
        gate = (v + three) * sixth
        gate = zero if gate < zero else gate
        out[i] = v * (one if gate > one else gate)


@numba.njit(parallel=True, cache=CACHE)
def sqrt_kernel(x, out):
    for i in prange(x.size):
        out[i] = np.sqrt(x[i])


@numba.njit(parallel=True, cache=CACHE)
def exp_kernel(x, out):
    for i in prange(x.size):
        out[i] = np.exp(x[i])


@numba.njit(parallel=True, cache=CACHE)
def log_kernel(x, out):
    for i in prange(x.size):
        out[i] = np.log(x[i])


@numba.njit(parallel=True, cache=CACHE)
def neg_kernel(x, out):
    for i in prange(x.size):
        out[i] = -x[i]


@numba.njit(parallel=True, cache=CACHE)
def abs_kernel(x, out):
    for i in prange(x.size):
        out[i] = abs(x[i])


@numba.njit(parallel=True, cache=CACHE)
def reciprocal_kernel(x, out, one):
    for i in prange(x.size):
        out[i] = one / x[i]


@numba.njit(parallel=True, cache=CACHE)
def erf_kernel(x, out):
    for i in prange(x.size):
        out[i] = math.erf(x[i])


def _no_args(problem: Problem) -> tuple:
    return ()


def _leaky_relu_args(problem: Problem) -> tuple:
    return (np.dtype(problem.dtypes[0]).type(problem.param("alpha")),)


def _clip_args(problem: Problem) -> tuple:
    return ClipOperator.bounds(problem)


def _one_args(problem: Problem) -> tuple:
    """``one`` in the input dtype (sigmoid, reciprocal): float32 arithmetic stays float32."""
    return (np.dtype(problem.dtypes[0]).type(1),)


def _hard_sigmoid_args(problem: Problem) -> tuple:
    return tuple(float(c) for c in HardSigmoidOperator.coefficients(problem))


def _hard_swish_args(problem: Problem) -> tuple:
    dtype = np.dtype(problem.dtypes[0]).type
    return dtype(3), dtype(1 / 6), dtype(0), dtype(1)


#: Problems whose scalar arguments are kept per algorithm; when full the table is cleared
#: (rebuilding an entry costs a microsecond).
MAX_PROBLEMS = 4096

#: operation -> (kernel, its scalar arguments for a problem, in the input dtype)
KERNELS: dict[str, tuple[Callable, Callable[[Problem], tuple]]] = {
    "relu": (relu_kernel, _no_args),
    "leaky_relu": (leaky_relu_kernel, _leaky_relu_args),
    "clip": (clip_kernel, _clip_args),
    "sigmoid": (sigmoid_kernel, _one_args),
    "hard_sigmoid": (hard_sigmoid_kernel, _hard_sigmoid_args),
    "hard_swish": (hard_swish_kernel, _hard_swish_args),
    "sqrt": (sqrt_kernel, _no_args),
    "exp": (exp_kernel, _no_args),
    "log": (log_kernel, _no_args),
    "neg": (neg_kernel, _no_args),
    "abs": (abs_kernel, _no_args),
    "reciprocal": (reciprocal_kernel, _one_args),
    "erf": (erf_kernel, _no_args),
}


class ParallelUnary(ParallelRanked, Algorithm):
    """numba ``prange`` over the flat tensor; a non-contiguous input is copied to a
    contiguous one first.  REPRODUCIBLE: an element's value does not depend on the thread
    that computes it."""

    name = "parallel"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, operator: str, pays: Callable[[Problem], bool]):
        self.operator = operator  # before super().__init__, which builds the identity from it
        super().__init__(pays)
        self.kernel, self.arguments = KERNELS[operator]
        self._args: dict[str, tuple] = {}

    def workspace_bytes(self, problem: Problem) -> int:
        """Nothing for contiguous inputs (the case that matters); a strided one is copied,
        which the caller, not the problem, decides."""
        return 0

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        args = self._args.get(problem.key)
        if args is None:
            if len(self._args) >= MAX_PROBLEMS:
                self._args.clear()
            args = self._args[problem.key] = self.arguments(problem)
        x = inputs[0]
        if type(x) is not np.ndarray or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        shape = problem.shapes[0]
        out = np.empty(shape, x.dtype)
        if out.size:
            self.kernel(x.reshape(-1), out.reshape(-1), *args)
        return out


