"""maxpool and avgpool in plain numpy: pad once, then one strided view per kernel offset.

Works for every parameter set and spatial rank (1-D to 3-D), and needs no compilation, so it is
the fallback where the numba kernel is unusable (3-D) and the one to trust when a kernel is in
doubt.  It makes one pass over the output per kernel offset, which is why the numba kernel beats
it on the usual 3x3 layers.  Each output is combined in kernel-offset order, whatever the
threads: reproducible.

Every ufunc here runs on whole contiguous arrays: numpy gives a ufunc with a strided or
broadcast operand an iteration buffer of up to ``np.getbufsize()`` elements, memory that
``workspace_bytes`` could not state exactly, whereas np.copyto copies a strided view without
one.  So each offset's view is copied into one contiguous buffer before it is combined.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms.pooling import heuristic
from fastrun_algorithms.pooling.geometry import PoolGeometry, pool_geometry


def _source(geo: PoolGeometry, x: np.ndarray) -> np.ndarray:
    """X itself when no window reads outside it; otherwise a copy padded to every position a
    window reads, with -inf (padding never wins a max) or zeros (nothing to add)."""
    if not geo.reads_outside:
        return x
    padded = np.full((geo.n, geo.c, *geo.reach), 0 if geo.average else -np.inf, dtype=geo.dtype)
    np.copyto(padded[(slice(None), slice(None), *(slice(b, b + s) for b, s in zip(
        geo.begins, geo.sizes, strict=True)))], x)
    return padded


@functools.lru_cache(maxsize=256)
def _divisors(problem: Problem) -> np.ndarray:
    """The average's divisor of every output position, (1, 1, *out) in the problem's dtype;
    only for problems whose windows do not all have the same one.  Cached (read-only) rather
    than rebuilt per run: it depends on the problem alone."""
    geo = pool_geometry(problem)
    divisors = np.ones((1, 1, *geo.out))
    for axis, counts in enumerate(geo.divisor_counts):
        shape = [1] * (2 + geo.spatial)
        shape[2 + axis] = len(counts)
        divisors = divisors * np.asarray(counts, np.float64).reshape(shape)
    divisors = divisors.astype(geo.dtype)
    divisors.setflags(write=False)
    return divisors


def _needs_temporary(geo: PoolGeometry) -> bool:
    """A contiguous output-sized buffer is needed to combine a second kernel offset, or to
    hold the divisors when they differ between windows."""
    return int(np.prod(geo.kernel)) > 1 or (geo.average and geo.uniform_divisor is None)


class NumpyPool(Algorithm):
    """maxpool or avgpool with numpy over strided views of a padded copy: each kernel offset's
    view is copied into a contiguous buffer and combined into the output."""

    name = "numpy"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, operator: str):
        self.operator = operator
        super().__init__()

    def workspace_bytes(self, problem: Problem) -> int:
        """The padded copy of X (only when some window reads outside X) and one output-sized
        buffer (unless a single 1x1 offset with one divisor needs none)."""
        geo = pool_geometry(problem)
        itemsize = np.dtype(geo.dtype).itemsize
        total = 0
        if geo.reads_outside:
            total += geo.n * geo.c * int(np.prod(geo.reach)) * itemsize
        if _needs_temporary(geo):
            total += int(np.prod(geo.out_shape)) * itemsize
        return total

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> np.ndarray:
        geo = pool_geometry(problem)
        source = _source(geo, inputs[0])
        out = np.empty(geo.out_shape, dtype=geo.dtype)
        temporary = np.empty_like(out) if _needs_temporary(geo) else None
        combine = np.add if geo.average else np.maximum
        offsets = itertools.product(*(range(k) for k in geo.kernel))
        for index, offset in enumerate(offsets):
            window = source[(slice(None), slice(None), *(
                slice(j * d, j * d + (o - 1) * st + 1, st)
                for j, d, o, st in zip(offset, geo.dilations, geo.out, geo.strides,
                                       strict=True)))]
            if index == 0:
                np.copyto(out, window)
            else:
                np.copyto(temporary, window)
                combine(out, temporary, out=out)
        if geo.average:
            uniform = geo.uniform_divisor
            if uniform is None:
                np.copyto(temporary, _divisors(problem))
                np.divide(out, temporary, out=out)
            elif uniform != 1:
                out /= uniform
        return out

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return (1,) if heuristic.direct_first(problem) else (0,)


def algorithms() -> list[Algorithm]:
    return [NumpyPool("maxpool"), NumpyPool("avgpool")]
