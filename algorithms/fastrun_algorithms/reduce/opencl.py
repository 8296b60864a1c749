"""The ``reduce``, ``arg_reduce`` and ``topk`` operators on an OpenCL device: ``cl_reduce``,
``cl_arg_reduce`` and ``cl_topk``, one work-item per output element (per run for topk).

The models' reductions run over adjacent axes (a pool's plane, a norm's row, the channels), so
X is viewed as (outer, reduced, inner) (:func:`~fastrun_algorithms.reduce.operator.blocks`);
output element (o, i) walks its run with a stride of ``inner``, and neighbouring work-items
take neighbouring ``i``, so the reads coalesce whenever inner > 1.  Sums (sum, mean, l1, l2,
sum_square) are compensated (Kahan): the CPU algorithms sum float32 in float64 and round once,
and a compensated float32 sum keeps about that accuracy without needing ``cl_khr_fp64``.
max and min let a NaN win, as numpy's maximum does; over an empty run they give -inf and
+inf, the mean NaN, the sums 0, prod 1, as the operator defines.

``cl_arg_reduce`` walks its run the same way and keeps the index of the extreme: the first
of equal extremes, or the last with ``select_last_index``, a NaN counting as the extreme (the
first NaN, or the last), as numpy's argmax does.

``cl_topk`` gives each run to one work-item, which picks its k indices one after another: each
the first, in the order the operator defines (NaN above every number, then by value, ties by
the lower index), of the elements that come after the one picked before.  That is k passes
over the run, made for a classifier's top-5, not for sorting long runs.

Float inputs only for reduce and arg_reduce (the integer and bool reductions stay on the
CPU's ``numpy``); topk takes integers too.  REPRODUCIBLE:
each output is reduced by one work-item in index order; no workspace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms.activation.opencl._kernels import PRELUDE
from fastrun_algorithms.reduce.arg import ArgReduceOperator
from fastrun_algorithms.reduce.operator import MODES, adjacent_float_reason, blocks, output_shape
from fastrun_algorithms.reduce.topk import TopKOperator

REDUCE = PRELUDE + r"""
/* MODE: the index in reduce.operator.MODES (sum, mean, max, min, prod, l1, l2, sum_square). */
__kernel void reduce(const long outputs, const long count, const long inner,
                     __global const real* x, const long x_off,
                     __global real* out, const long o_off) {
    const long i = get_global_id(0);
    if (i >= outputs) return;
    const long o = i / inner;
    __global const real* run = x + x_off + o * count * inner + (i - o * inner);
#if MODE == 2 || MODE == 3
    real acc = MODE == 2 ? (real)(-INFINITY) : (real)INFINITY;
    for (long r = 0; r < count; ++r) {
        const real v = run[r * inner];
#if MODE == 2
        acc = (v > acc || isnan(v)) ? v : acc;
#else
        acc = (v < acc || isnan(v)) ? v : acc;
#endif
    }
#elif MODE == 4
    real acc = (real)1;
    for (long r = 0; r < count; ++r) acc *= run[r * inner];
#else
    real acc = (real)0, carry = (real)0;
    for (long r = 0; r < count; ++r) {
        const real v = run[r * inner];
#if MODE == 5
        const real term = fabs(v) - carry;
#elif MODE == 6 || MODE == 7
        const real term = v * v - carry;
#else
        const real term = v - carry;
#endif
        const real next = acc + term;
        carry = (next - acc) - term;
        acc = next;
    }
#if MODE == 1
    acc = acc / (real)count;
#elif MODE == 6
    acc = sqrt(acc);
#endif
#endif
    out[o_off + i] = acc;
}
"""


ARG_REDUCE = PRELUDE + r"""
/* MAX: 1 for argmax, 0 for argmin; LAST: 1 to keep the last of equal extremes.  A NaN is the
   extreme: once one is held, only a later NaN (with LAST) replaces it. */
__kernel void arg_reduce(const long outputs, const long count, const long inner,
                         __global const real* x, const long x_off,
                         __global long* out, const long o_off) {
    const long i = get_global_id(0);
    if (i >= outputs) return;
    const long o = i / inner;
    __global const real* run = x + x_off + o * count * inner + (i - o * inner);
    real best = run[0];
    long at = 0;
    for (long r = 1; r < count; ++r) {
        const real v = run[r * inner];
        int better;
        if (isnan(best)) {
            better = LAST && isnan(v);
        } else if (isnan(v)) {
            better = 1;
        } else {
            better = MAX ? (LAST ? v >= best : v > best) : (LAST ? v <= best : v < best);
        }
        if (better) {
            best = v;
            at = r;
        }
    }
    out[o_off + i] = at;
}
"""


TOPK = common.ANY_TYPE_PRELUDE + r"""
/* Whether element a (value va) comes before b (value vb) in topk's order; LARGEST 1 for the
   largest first.  NaN is above every number; equal values go by the lower index. */
int before(const R va, const long a, const R vb, const long b) {
    const int na = IS_NAN(va), nb = IS_NAN(vb);
    if (na != nb) return LARGEST ? na : nb;
    if (!na && va != vb) return LARGEST ? va > vb : va < vb;
    return a < b;
}

__kernel void topk(const long runs, const long count, const long inner, const long k,
                   __global const R* x, const long x_off, __global long* out,
                   const long o_off) {
    const long i = get_global_id(0);
    if (i >= runs) return;
    const long o = i / inner;
    const long within = i - o * inner;
    __global const R* run = x + x_off + o * count * inner + within;
    __global long* dst = out + o_off + o * k * inner + within;
    long prev = -1;
    R prev_v = (R)0;
    for (long j = 0; j < k; ++j) {
        long best = -1;
        R best_v = (R)0;
        for (long r = 0; r < count; ++r) {
            const R v = run[r * inner];
            if (prev >= 0 && !before(prev_v, prev, v, r)) continue;
            if (best < 0 || before(v, r, best_v, best)) {
                best = r;
                best_v = v;
            }
        }
        dst[j * inner] = best;
        prev = best;
        prev_v = best_v;
    }
}
"""


def axis_runs(problem: Problem) -> tuple[int, int, int]:
    """(outer, count, inner): X as runs of ``count`` values along the problem's ``axis``,
    ``inner`` apart."""
    shape, axis = problem.shapes[0], problem.param("axis")
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


class OpenCLTopK(common.OpenCLAlgorithm):
    """topk's indices, a work-item per run, k passes (see the module docstring)."""

    operator = "topk"
    name = "cl_topk"

    def unusable_reason(self, problem: Problem) -> str | None:
        return common.any_type_reason("cl_topk", problem.dtypes[0])

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        out = device.empty(TopKOperator().output_shape(problem), np.dtype(np.int64))
        outer, count, inner = axis_runs(problem)
        k = problem.param("k")
        if outer * inner * k == 0:
            return out
        kernel = device.kernel(TOPK, "topk", common.any_type_options(
            dtype, LARGEST=int(problem.param("largest"))))
        common.launch(device, kernel, outer * inner, [
            np.int64(outer * inner), np.int64(count), np.int64(inner), np.int64(k),
            *common.buffer(inputs[0], "X"), *common.buffer(out, "output")])
        return out


class OpenCLArgReduce(common.OpenCLAlgorithm):
    """ArgMax and ArgMin, a work-item per output (see the module docstring)."""

    operator = "arg_reduce"
    name = "cl_arg_reduce"

    def unusable_reason(self, problem: Problem) -> str | None:
        if np.dtype(problem.dtypes[0]).kind != "f":
            return "cl_arg_reduce takes float inputs only"
        return None

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        out = device.empty(ArgReduceOperator().output_shape(problem), np.dtype(np.int64))
        outer, count, inner = axis_runs(problem)
        if outer * inner == 0:
            return out
        kernel = device.kernel(ARG_REDUCE, "arg_reduce", common.options(
            REAL=common.CL_TYPES[dtype.name], FP64=int(dtype == np.float64),
            MAX=int(problem.param("mode") == "max"),
            LAST=int(problem.param("select_last_index"))))
        common.launch(device, kernel, outer * inner, [
            np.int64(outer * inner), np.int64(count), np.int64(inner),
            *common.buffer(inputs[0], "X"), *common.buffer(out, "output")])
        return out


class OpenCLReduce(common.OpenCLAlgorithm):
    """A work-item per output element over adjacent reduced axes, float inputs (see the
    module docstring)."""

    operator = "reduce"
    name = "cl_reduce"
    attributes = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def unusable_reason(self, problem: Problem) -> str | None:
        return adjacent_float_reason(problem, "cl_reduce")

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        dtype = np.dtype(problem.dtypes[0])
        out = device.empty(output_shape(problem), dtype)
        outer, count, inner = blocks(problem)
        outputs = outer * inner
        if outputs == 0:
            return out
        kernel = device.kernel(REDUCE, "reduce", common.options(
            REAL=common.CL_TYPES[dtype.name], FP64=int(dtype == np.float64),
            MODE=MODES.index(problem.param("mode"))))
        common.launch(device, kernel, outputs, [
            np.int64(outputs), np.int64(count), np.int64(inner),
            *common.buffer(inputs[0], "X"), *common.buffer(out, "output")])
        return out


def algorithms() -> list[Algorithm]:
    return [OpenCLReduce(), OpenCLArgReduce(), OpenCLTopK()]


