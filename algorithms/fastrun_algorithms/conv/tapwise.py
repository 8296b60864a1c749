"""tapwise: one matmul sub-problem per kernel tap, over only the outputs that tap reaches
("kn2row"), summed into the output.

Why it exists.  A dilated convolution on a small map reads mostly padding: DeepLabV3's ASPP
has 3x3 convolutions of dilation 12, 24 and 36, and on the 14x14 map of a 224-pixel input the
outer taps of the last two fall wholly outside the image.  im2col and the direct kernels still
multiply those zeros: 867 MFLOP per layer (8.5 ms of a 40 ms inference on the 2-core VM,
where onnxruntime took 1.7-2.6 ms).  Here each tap (r, s) is a 1x1 convolution of the input
window it reads onto the output rectangle whose reads stay inside the image; a tap that
reaches no output is skipped, so those two layers cost one 1x1 convolution each, and the
dilation-12 one about a fifth of its taps' work.

How.  Per image and tap, the window is gathered into a (C, rows * cols) block (the whole input
when the tap reads all of it, without a copy), W[:, :, r, s] (K, C) multiplies it through the
``matmul`` sub-problem (so its search picks the product's algorithm), and the product is
written into the first tap's output rectangle, or added into the others'.  The bias, residual
and activation then run as conv's epilogue pass.  With ``weight_preprocess`` the taps'
weights are copied once into (taps, K, C) matrices.

Usable only where the taps reach at most :data:`MOST_REACHED` of the outputs they would in
a layer without padding: elsewhere every tap reaches most outputs, and this would do
``im2col``'s multiply-adds in more and smaller products with a pass per tap, while adding up
to four matmul sub-problems of its own to every search.  Groups are not taken (each group
would be a product of its own per tap).

REPRODUCIBLE as far as its matmul sub-problems are: the taps are summed in one fixed order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms.conv._gemm_common import epilogue_in_place, matmul_problem, operands
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import residual_operand
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry

#: The largest share of its taps' outputs a layer may keep for ``tapwise`` to be usable: the
#: ASPP layers it is for keep 11-18%, a 3x3 layer with a one-pixel border 82-98%.
MOST_REACHED = 0.5


@dataclass(frozen=True)
class _Reach:
    """The outputs [first, last] one tap offset reaches along an axis, and the input index the
    first of them reads."""

    first: int
    last: int
    source: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    @property
    def outputs(self) -> slice:
        return slice(self.first, self.last + 1)

    def inputs(self, stride: int) -> slice:
        """The input indices the reached outputs read, ``stride`` apart."""
        return slice(self.source, self.source + (self.count - 1) * stride + 1, stride)


def _reach(size: int, out: int, stride: int, pad: int, offset: int) -> _Reach | None:
    """Along one axis: the outputs o with 0 <= o * stride - pad + offset < size (an interval),
    or None when there are none."""
    first = max(0, -(-(pad - offset) // stride))
    last = min(out - 1, (size - 1 + pad - offset) // stride)
    if first > last:
        return None
    return _Reach(first, last, first * stride - pad + offset)


@dataclass(frozen=True)
class _Tap:
    r: int
    s: int
    rows: _Reach
    cols: _Reach

    @property
    def pixels(self) -> int:
        return self.rows.count * self.cols.count


@functools.lru_cache(maxsize=1024)
def _taps(problem: Problem) -> tuple[_Tap, ...]:
    """The taps that reach an output, in (r, s) order but the one reaching the most outputs
    first (its product is written; the others' are added)."""
    geo = geometry(problem)
    taps = []
    for r in range(geo.r):
        rows = _reach(geo.h, geo.oh, geo.stride_h, geo.pad_top, r * geo.dil_h)
        for s in range(geo.s):
            cols = _reach(geo.w, geo.ow, geo.stride_w, geo.pad_left, s * geo.dil_w)
            if rows is not None and cols is not None:
                taps.append(_Tap(r, s, rows, cols))
    if taps:
        widest = max(range(len(taps)), key=lambda i: (taps[i].pixels, -i))
        taps.insert(0, taps.pop(widest))
    return tuple(taps)


@functools.lru_cache(maxsize=1024)
def _reached(problem: Problem) -> float:
    """The outputs the taps reach, over all of them for every tap."""
    geo = geometry(problem)
    return sum(tap.pixels for tap in _taps(problem)) / (geo.r * geo.s * geo.oh * geo.ow)


def _whole(geo: ConvGeometry, tap: _Tap) -> bool:
    """Whether the tap reads the whole input, in order: its window is the image itself."""
    return (tap.rows.count == geo.h and tap.cols.count == geo.w and tap.rows.source == 0
            and tap.cols.source == 0 and geo.stride_h == geo.stride_w == 1)


@functools.lru_cache(maxsize=1024)
def _products(problem: Problem) -> tuple[Problem, ...]:
    """Each reaching tap's matmul sub-problem, in :func:`_taps`' order."""
    geo = geometry(problem)
    return tuple(matmul_problem((geo.k, geo.c), (geo.c, tap.pixels), geo.dtype)
                 for tap in _taps(problem))


class TapwiseConv(ConvAlgorithm):
    """A product per kernel tap over the outputs it reaches (see the module docstring)."""

    operator = "conv"
    name = "tapwise"
    attributes = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE
    sub_operators = ("matmul",)

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if geo.group > 1:
            return f"tapwise takes one group (got {geo.group})"
        share = _reached(problem)
        if share > MOST_REACHED:
            return (f"tapwise pays where taps read mostly padding: here they reach "
                    f"{share:.0%} of their outputs (at most {MOST_REACHED:.0%})")
        return None

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        return list(_products(problem)) * geometry(problem).n

    def workspace_bytes(self, problem: Problem) -> int:
        """One tap at a time: its gathered window, its product and (without weight
        preprocessing) its weights made contiguous."""
        geo = geometry(problem)
        largest = 0
        for tap in _taps(problem):
            window = 0 if _whole(geo, tap) else geo.c * tap.pixels
            weights = 0 if problem.weight_preprocess else geo.k * geo.c
            largest = max(largest, window + geo.k * tap.pixels + weights)
        return largest * geo.itemsize

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> np.ndarray:
        """The reaching taps' weights as contiguous (taps, K, C) matrices."""
        geo = geometry(problem)
        w = operands(geo, inputs)[1]
        taps = _taps(problem)
        return np.ascontiguousarray(np.stack([w[:, :, tap.r, tap.s] for tap in taps])) \
            if taps else np.zeros((0, geo.k, geo.c), w.dtype)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = geometry(problem)
        x, w, bias = operands(geo, inputs)
        taps, products = _taps(problem), _products(problem)
        # the first tap's product is written where it reaches every output, else added to zeros
        written = bool(taps) and taps[0].pixels == geo.oh * geo.ow
        out = (np.empty if written else np.zeros)((geo.n, geo.k, geo.oh, geo.ow), x.dtype)
        for n in range(geo.n):
            for index, (tap, product) in enumerate(zip(taps, products, strict=True)):
                weights = prepared[index] if prepared is not None \
                    else np.ascontiguousarray(w[:, :, tap.r, tap.s])
                if _whole(geo, tap):
                    window = x[n].reshape(geo.c, -1)
                else:
                    window = np.ascontiguousarray(x[n, :, tap.rows.inputs(geo.stride_h),
                                                    tap.cols.inputs(geo.stride_w)])
                    window = window.reshape(geo.c, -1)
                result = np.asarray(ctx.call(product, weights, window)).reshape(
                    geo.k, tap.rows.count, tap.cols.count)
                target = out[n, :, tap.rows.outputs, tap.cols.outputs]
                if index == 0 and written:
                    target[...] = result
                else:
                    target += result
                del result, window, weights  # one tap's buffers alive at a time
        epilogue_in_place(out, bias, geo, residual_operand(geo, inputs))
        return geo.output_view(out)

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        """Ahead of the GEMM family: where it is usable, most of the other algorithms' work
        multiplies padding."""
        return (2, -1)


def algorithms() -> list[Algorithm]:
    return [TapwiseConv()]
