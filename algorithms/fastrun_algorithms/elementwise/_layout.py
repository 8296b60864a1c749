"""numpy's broadcasting rules and the canonical form the numba kernels loop over.

The kernels never see the operands' shapes.  They see three flat C-contiguous arrays (a, b and
the output) and a small *geometry*: the output's shape with every size-1 dimension dropped and
neighbouring dimensions merged wherever both operands allow it, plus each operand's stride (in
elements) along every remaining dimension, 0 where the operand is broadcast.  Merging makes the
common cases collapse to one dimension:

* same shapes -> ``[n]`` with strides ``1, 1``: one flat loop;
* a 1-element operand -> ``[n]`` with strides ``0, 1`` (or ``1, 0``): a scalar loop;
* a row added to a matrix, ``(m, n) + (n,)`` -> ``[m, n]`` with strides ``(n, 1), (0, 1)``;
* a per-channel bias, ``(N, C, H, W) + (1, C, 1, 1)`` -> ``[N, C, H*W]``, strides
  ``(C*H*W, H*W, 1), (0, 1, 0)``: rows of H*W elements against one bias value each.

The geometry depends on the shapes alone (operands are made C-contiguous first, see
:func:`flat`), so it is computed once per pair of shapes and cached.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from fastrun.operator import Shape


@dataclass(frozen=True, slots=True)
class BroadcastLayout:
    """How one pair of operand shapes broadcasts, in the form the kernels use."""

    a_shape: Shape
    b_shape: Shape
    #: numpy's broadcast output shape
    out_shape: Shape
    #: product of ``out_shape``
    size: int
    #: int64, shape (3, rank), read-only: row 0 the merged output dimensions, rows 1 and 2 the
    #: element strides of a and b along them (0 where broadcast).  rank >= 1; the last
    #: dimension is the kernels' inner loop, and along it both strides are 0 or 1.
    geometry: np.ndarray

    @property
    def rank(self) -> int:
        """Number of dimensions left after dropping size-1 ones and merging the rest."""
        return int(self.geometry.shape[1])


def _contiguous_strides(shape: Shape, out_shape: Shape) -> list[int]:
    """Element strides of a C-contiguous array of ``shape`` (padded on the left with 1s to the
    output's rank) along the output's dimensions: 0 wherever it is broadcast."""
    padded = (1,) * (len(out_shape) - len(shape)) + shape
    strides = []
    step = 1
    for size, out_size in zip(reversed(padded), reversed(out_shape), strict=True):
        strides.append(step if size == out_size else 0)
        step *= size
    return strides[::-1]


@functools.lru_cache(maxsize=4096)
def broadcast_layout(a_shape: Shape, b_shape: Shape) -> BroadcastLayout:
    """The layout of a binary elementwise operation on operands of these shapes.

    Raises ValueError, naming both shapes and the first dimension that clashes, when numpy
    would refuse to broadcast them.  Cached: algorithms look it up on every call.
    """
    a_shape, b_shape = tuple(int(d) for d in a_shape), tuple(int(d) for d in b_shape)
    try:
        out_shape = tuple(int(d) for d in np.broadcast_shapes(a_shape, b_shape))
    except ValueError:
        raise ValueError(_clash(a_shape, b_shape)) from None
    strides_a = _contiguous_strides(a_shape, out_shape)
    strides_b = _contiguous_strides(b_shape, out_shape)

    dims: list[list[int]] = []  # [size, stride of a, stride of b], outermost first
    for size, sa, sb in zip(out_shape, strides_a, strides_b, strict=True):
        if size == 1:
            continue  # a size-1 output dimension is never stepped along
        if dims and dims[-1][1] == sa * size and dims[-1][2] == sb * size:
            # The previous dimension steps both operands by exactly one run of this one:
            # together they are a single dimension of the product's size.
            dims[-1] = [dims[-1][0] * size, sa, sb]
        else:
            dims.append([size, sa, sb])
    if not dims:  # one element (or a 0-d result): a flat loop of length 1
        dims = [[1, 1, 1]]
    geometry = np.array(dims, dtype=np.int64).T.copy()
    geometry.flags.writeable = False  # shared by every call through the cache
    return BroadcastLayout(a_shape, b_shape, out_shape, math.prod(out_shape), geometry)


def _clash(a_shape: Shape, b_shape: Shape) -> str:
    """Why two shapes do not broadcast, naming the clashing dimension."""
    for offset in range(1, min(len(a_shape), len(b_shape)) + 1):
        da, db = a_shape[-offset], b_shape[-offset]
        if da != db and da != 1 and db != 1:
            return (
                f"shapes {a_shape} and {b_shape} do not broadcast: dimension {-offset} (counted "
                f"from the right) is {da} in a and {db} in b; aligned from the right, each pair "
                "of dimensions must be equal or one of them 1"
            )
    return f"shapes {a_shape} and {b_shape} do not broadcast"


def flat(x: np.ndarray) -> np.ndarray:
    """``x`` as a 1-D C-contiguous array: a view when ``x`` is already a C-contiguous ndarray
    (the common case), otherwise a contiguous copy.  Copying a strided operand once keeps the
    kernels to one geometry per pair of shapes instead of one per combination of strides."""
    if type(x) is not np.ndarray or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    return x if x.ndim == 1 else x.reshape(-1)  # each reshape is a new view: ~0.1 us
