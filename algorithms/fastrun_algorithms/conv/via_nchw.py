"""A blocked-layout conv computed in NCHW: reorder in, the NCHW conv, reorder out.

Why it exists.  Every conv can then run in ``nchw16c`` (see
:mod:`fastrun_algorithms.layout.blocking`), whatever its shape, so a runtime can keep a chain of
layers blocked through one layer no blocked kernel serves.  And a blocked problem always has at
least two candidates, so a search times it and the cache records that time: that is the figure
a runtime weighs the blocked layout by, and a layer where this algorithm wins is one where the
blocked layout does not pay.

How: sub-problems only, each decided like any other: ``reorder`` of X (and Z) to NCHW, the same
conv in NCHW, ``reorder`` of the result to ``nchw16c``.  The NCHW sub-problem is the very
problem a runtime decides for the layer in NCHW (weight preprocessing included), so a search
that weighs both layouts searches it once.  A sub-problem is handed the weights as they are,
so its algorithm transforms them on every call here: this algorithm is never measured faster
than what it wraps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.layout.blocking import BLOCKED, NCHW
from fastrun_algorithms.layout.operator import ReorderOperator

_REORDER = ReorderOperator()


def _nchw_shapes(problem: Problem, geo: ConvGeometry) -> list[tuple[int, ...]]:
    shapes = [(geo.n, geo.c, geo.h, geo.w), *problem.shapes[1:]]
    if geo.has_residual:
        shapes[-1] = (geo.n, geo.k, geo.oh, geo.ow)
    return shapes


def _problems(problem: Problem) -> dict[str, Problem]:
    """The sub-problems by role: x (and z) to NCHW, conv, y back to blocked."""
    from fastrun_algorithms.conv.operator import ConvOperator

    geo = geometry(problem)
    params = {k: v for k, v in problem.params if k != "layout"}
    dtype = problem.dtypes[0]
    conv = ConvOperator().problem(_nchw_shapes(problem, geo), problem.dtypes, **params)
    result = {
        "x": _REORDER.problem([problem.shapes[0]], [dtype], to=NCHW, channels=geo.c),
        "conv": conv,
        "y": _REORDER.problem([(geo.n, geo.k, geo.oh, geo.ow)], [dtype], to=BLOCKED),
    }
    if geo.has_residual:
        result["z"] = _REORDER.problem([problem.shapes[-1]], [dtype], to=NCHW, channels=geo.k)
    return result


class ViaNchwConv(ConvAlgorithm):
    """Any ``nchw16c`` conv, as reorders around the NCHW conv (see the module docstring)."""

    operator = "conv"
    name = "via_nchw"
    attributes = AlgoAttribute.REPRODUCIBLE
    layouts = (BLOCKED,)
    sub_operators = ("conv", "reorder")

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        return list(_problems(problem).values())

    def workspace_bytes(self, problem: Problem) -> int:
        """The NCHW copies of X, Z and the result; with weight preprocessing, also room for
        the weight transform its NCHW algorithm then makes on each call, which that
        algorithm's own figure leaves out: 4x the weights, the most any of them makes
        (Winograd F(4x4, 3x3): 36 values per 3x3 filter)."""
        geo = geometry(problem)
        outputs = geo.k * geo.oh * geo.ow * (1 + geo.has_residual)
        elements = geo.n * (geo.c * geo.h * geo.w + outputs)
        if problem.weight_preprocess:
            elements += 4 * geo.k * geo.cg * geo.r * geo.s
        return elements * np.dtype(problem.dtypes[0]).itemsize

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        subs = _problems(problem)
        nchw = [ctx.call(subs["x"], inputs[0]), *inputs[1:]]
        if "z" in subs:
            nchw[-1] = ctx.call(subs["z"], inputs[-1])
        return ctx.call(subs["y"], ctx.call(subs["conv"], *nchw))

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return (8, 0)  # reorders around the NCHW conv: never faster than that conv


def algorithms() -> list[Algorithm]:
    return [ViaNchwConv()]
