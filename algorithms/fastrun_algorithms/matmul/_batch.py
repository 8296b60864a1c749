"""numpy's matmul shape rules and the canonical batched 3-D form the kernels compute in.

Every kernel here computes ``(batch, M, K) x (batch, K, N) -> (batch, M, N)``.  numpy's matmul
is more general (1-D operands, any number of broadcast batch dimensions), so this module maps a
problem onto that form once per pair of shapes (cached) and the per-call work is a couple of
reshapes that are views for every operand that is not broadcast.  Keeping the shape rules here,
beside the mapping, means ``MatmulOperator.validate`` and the algorithms cannot disagree about
them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from numba import types

from fastrun.operator import Problem, Shape


@dataclass(frozen=True, slots=True)
class MatmulLayout:
    """How one pair of operand shapes maps onto ``(batch, M, K) x (batch, K, N)``."""

    a_shape: Shape
    b_shape: Shape
    #: broadcast batch dimensions of the result (``()`` for plain 2-D products)
    batch_shape: Shape
    #: product of ``batch_shape``: the leading dimension of the 3-D form
    batch: int
    m: int
    k: int
    n: int
    #: numpy's output shape (1-D operands drop their M or N dimension)
    out_shape: Shape

    #: the operands' shapes in the 3-D form (batch, M, K) and (batch, K, N)
    a3_shape: Shape
    b3_shape: Shape

    @property
    def out3_shape(self) -> Shape:
        return (self.batch, self.m, self.n)

    def to_3d(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``a`` as (batch, M, K) and ``b`` as (batch, K, N).

        An operand whose batch dimensions already equal the result's (1-D ones included) is
        only reshaped, which is a view for contiguous arrays and for the quadrant views strassen
        hands down.  A broadcast operand goes through ``np.broadcast_to`` (a read-only stride-0
        view) and is copied only when numpy cannot merge its batch dimensions into one without.
        """
        return _as_3d(a, self.a3_shape, self.batch_shape), _as_3d(b, self.b3_shape,
                                                                   self.batch_shape)

    def from_3d(self, out3: np.ndarray) -> np.ndarray:
        """The (batch, M, N) result in numpy's output shape (a view of the contiguous result)."""
        return out3.reshape(self.out_shape)


def _as_3d(x: np.ndarray, shape3: Shape, batch_shape: Shape) -> np.ndarray:
    if x.ndim > 2 and x.shape[:-2] != batch_shape:
        x = np.broadcast_to(x, (*batch_shape, *x.shape[-2:]))
    elif x.ndim <= 2 and batch_shape:
        x = np.broadcast_to(x.reshape(shape3[1:]), (*batch_shape, *shape3[1:]))
    return x.reshape(shape3)


@functools.lru_cache(maxsize=4096)
def matmul_layout(a_shape: Shape, b_shape: Shape) -> MatmulLayout:
    """The layout of ``np.matmul(A, B)`` for operands of these shapes.

    Raises ValueError, naming both shapes, when numpy would refuse the product.  Cached because
    algorithms call it on every run and the result depends on the shapes alone.
    """
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if not a_shape or not b_shape:
        which = "A" if not a_shape else "B"
        raise ValueError(
            f"matmul: operand {which} is 0-d (scalar); matmul needs operands with at least one "
            f"dimension (got A {a_shape}, B {b_shape}); use elementwise multiplication for scalars"
        )
    # numpy promotes a 1-D A to a row (1, K) and a 1-D B to a column (K, 1).
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    m, k = a2[-2:]
    k_b, n = b2[-2:]
    if k != k_b:
        raise ValueError(
            f"matmul: inner dimensions do not match: A has shape {a_shape} (K={k}) and B has "
            f"shape {b_shape} (K={k_b}); the last dimension of A must equal the "
            f"{'only' if len(b_shape) == 1 else 'second-to-last'} dimension of B"
        )
    try:
        batch_shape = tuple(int(d) for d in np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        raise ValueError(
            f"matmul: batch dimensions do not broadcast: A has shape {a_shape} (batch "
            f"{a2[:-2]}) and B has shape {b_shape} (batch {b2[:-2]}); each pair of batch "
            "dimensions, aligned from the right, must be equal or one of them 1"
        ) from None
    out_shape = (
        *batch_shape,
        *((m,) if len(a_shape) > 1 else ()),
        *((n,) if len(b_shape) > 1 else ()),
    )
    batch = math.prod(batch_shape)
    return MatmulLayout(a_shape, b_shape, batch_shape, batch, m, k, n, out_shape,
                        (batch, m, k), (batch, k, n))


def layout_of(problem: Problem) -> MatmulLayout:
    """:func:`matmul_layout` of a (validated) matmul problem."""
    return matmul_layout(problem.shapes[0], problem.shapes[1])


def kernel_signature(dtype: np.dtype, *extra: types.Type) -> types.Signature:
    """``void(A, B, out, *extra)`` for the 3-D kernels, with A and B typed as read-only arrays of
    any layout.

    Compiling against this one signature per dtype lets numba accept C-contiguous operands,
    strided views and read-only broadcast views alike (it converts them to the general type), so
    a kernel is compiled once per dtype instead of once for every combination of operand layouts
    that dispatch happens to see.
    """
    item = numba_dtype(dtype)
    operand = types.Array(item, 3, "A", readonly=True)
    return types.void(operand, operand, types.Array(item, 3, "C"), *extra)


def numba_dtype(dtype: np.dtype) -> types.Type:
    return numba.from_dtype(np.dtype(dtype))


# --------------------------------------------------------------------------------------------
# Operands for kernels that index a 3-D form with a shared operand kept at a batch of one
# (register_tiled, blas_split)


def operand_3d(x: np.ndarray, shape3: Shape, layout: MatmulLayout) -> np.ndarray:
    """``x`` as a 3-D operand a kernel indexes directly: (batch, rows, cols) when its batch
    dimensions are the result's, (1, rows, cols) when it has no batch of its own (it is shared
    by every product, without a copy), and otherwise (a partial broadcast, e.g. (2, 1, M, K)
    against (1, 3, K, N)) materialised at the full batch, which :func:`materialised_bytes`
    counts."""
    if _shared(x.shape):
        return x.reshape((1, *shape3[1:]))
    if _own_batch(x.shape, layout):
        return x.reshape(shape3)
    return np.ascontiguousarray(np.broadcast_to(x, (*layout.batch_shape, *x.shape[-2:]))
                                ).reshape(shape3)


def run_3d(problem: Problem, inputs: Sequence[Any],
           compiled: Callable[[np.dtype, str, str], Callable[..., None]]) -> np.ndarray:
    """Run a numba kernel ``kernel(a, b, out)`` on the operands' 3-D forms (see
    :func:`operand_3d`) into a new (batch, M, N) output, in numpy's output shape.
    ``compiled(dtype, a_layout, b_layout)`` gives the kernel for C-contiguous ("C") or strided
    ("A") operands: the contiguous variant is the fast one, since LLVM then knows the strides."""
    layout = layout_of(problem)
    a = operand_3d(np.asarray(inputs[0]), layout.a3_shape, layout)
    b = operand_3d(np.asarray(inputs[1]), layout.b3_shape, layout)
    out = np.empty(layout.out3_shape, dtype=a.dtype)
    compiled(a.dtype, "C" if a.flags.c_contiguous else "A",
             "C" if b.flags.c_contiguous else "A")(a, b, out)
    return layout.from_3d(out)


def materialised_bytes(problem: Problem) -> int:
    """Bytes :func:`operand_3d` copies for ``problem``: only an operand whose batch dimensions
    broadcast partially against the other's (neither its own batch nor one shared matrix)."""
    layout = layout_of(problem)
    itemsize = np.dtype(problem.dtypes[0]).itemsize
    total = 0
    for shape, shape3 in ((layout.a_shape, layout.a3_shape), (layout.b_shape, layout.b3_shape)):
        if not _shared(shape) and not _own_batch(shape, layout):
            total += math.prod(shape3) * itemsize
    return total


def _shared(shape: Shape) -> bool:
    return len(shape) <= 2 or math.prod(shape[:-2]) == 1


def _own_batch(shape: Shape, layout: MatmulLayout) -> bool:
    return tuple(shape[:-2]) == tuple(layout.batch_shape)
