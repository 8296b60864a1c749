"""The numba kernels: one loop nest over the merged broadcast geometry (see ``_layout``), built
per operation and compiled per pair of operand dtypes.

Why a kernel *factory*: the operation must be a compile-time constant inside the inner loop, or
LLVM cannot vectorise it; so :func:`_build` closes the loop nest over the operation's scalar
function and the dtype both operands are converted to, and numba compiles one specialised
kernel per (operation, dtype of a, dtype of b).  Converting inside the loop means mixed-dtype
operands (int32 + float32, say) are never copied to a common dtype first.

Why the closures cache across processes: numba keys a closure's cache entry on a pickle of its
closure variables.  A numba dispatcher pickles with a fresh random id in every process (its
cache entry would never be found again), so the closed-over functions are plain Python functions
made callable from jitted code by ``register_jitable`` (the scalar functions pickle by name, the
inner ``span`` by value, both the same in every process) and numpy scalar types (by name).
Pickling ``span`` by value takes the globals it names along; an intrinsic such as
``stack_buffer`` pickles with a fresh random id in every process too, so ``span`` reaches it
through its module (``_common.stack_buffer``), which pickles by name.
``tests/algorithms/test_elementwise.py`` checks that a second process compiles nothing.

Kernels are compiled lazily, on the first call with a new combination: there are up to 7 x 16
pairs of them, and compiling a pair takes about 2 s (0.5 s serial, 1.3 s parallel); loading a
pair from numba's cache takes milliseconds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import prange, types
from numba.extending import register_jitable

from fastrun_algorithms import _common
from fastrun_algorithms._common import CACHE, U

#: Most merged dimensions a layout can have (numpy's own limit on array dimensions).
MAX_DIMS = 64


@register_jitable
def _add(x, y):
    return x + y


@register_jitable
def _sub(x, y):
    return x - y


@register_jitable
def _mul(x, y):
    return x * y


@register_jitable
def _div(x, y):
    return x / y


@register_jitable
def _greater_equal(x, y):
    return x >= y


@register_jitable
def _equal(x, y):
    return x == y


@register_jitable
def _less(x, y):
    return x < y


@register_jitable
def _greater(x, y):
    return x > y


@register_jitable
def _less_equal(x, y):
    return x <= y


@register_jitable
def _max(x, y):
    # numpy's rule, including which of two equal values (0.0 and -0.0) comes back: x when it is
    # larger or NaN, else y (so a NaN in y comes back too).
    return x if x > y or x != x else y


@register_jitable
def _min(x, y):
    return x if x < y or x != x else y


def _add_relu_in(cast: type) -> Callable:
    """``max(x + y, 0)`` computed in the type ``cast``.  The sum is cast before the comparison
    because numba adds two int32 values in int64: numpy's sum wraps around in int32 first, and
    a wrapped sum can be positive where the unwrapped one is negative.  The comparison is
    np.maximum's (see :func:`_max`): the sum when it is larger than 0 or NaN, else 0, so a sum
    of -0.0 gives +0.0 as in numpy."""

    def add_relu(x, y):
        value = cast(x + y)
        return value if value > 0 or value != value else cast(0)

    # Unique per compute type, for the same reason as the kernels' names (see _build).
    add_relu.__qualname__ = f"add_relu_{np.dtype(cast).name}"
    return register_jitable(add_relu)


#: Elements per block of the parallel kernel.  Fixed rather than derived from the thread count:
#: asking numba for the thread count costs 0.7 us from Python, and inside a kernel it makes the
#: kernel uncacheable (numba reaches it through a ctypes pointer).  4096 elements (16 to 32 KiB)
#: make the per-block setup negligible and cut a large output into enough blocks to spread over
#: many threads; below one block, ``parallel`` runs on one thread, where it cannot win anyway.
BLOCK = 4096

SCALAR_FUNCTIONS: dict[str, Callable] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "div": _div,
    "greater_equal": _greater_equal,
    "equal": _equal,
    "less": _less,
    "greater": _greater,
    "less_equal": _less_equal,
    "max": _max,
    "min": _min,
}
#: Operations whose scalar function depends on the compute type, built per type.
TYPED_SCALAR_FUNCTIONS: dict[str, Callable[[type], Callable]] = {
    "add_relu": _add_relu_in,
}


def _build(op: str, apply: Callable, cast: type) -> tuple[Callable, Callable]:
    """The serial and the parallel kernel of operation ``op`` (scalar function ``apply``)
    computing in the dtype whose numpy scalar type is ``cast``.

    Both take flat C-contiguous ``a``, ``b`` and ``out`` and the layout's ``geometry``.  The
    parallel one cuts the flat output range into blocks of :data:`BLOCK` elements and lets
    numba's scheduler hand each thread an equal, contiguous run of blocks.  An element's value
    does not depend on which thread computes it, so both are reproducible and give identical
    results.
    """

    def span(a, b, out, geometry, start, stop):
        """out[start:stop] of the flat output, row by row, a row being one run of the last
        (inner) merged dimension.  ``index`` is the current row's position in the outer
        dimensions, and ``oa``/``ob`` its offsets into a and b; both are found once from
        ``start`` (so a block can begin mid-row) and then advanced like an odometer, which
        costs an add per row instead of a division per outer dimension (3x faster on
        (100000, 3) + (3,), where rows are short).

        Nothing here allocates or slices: ``index`` lives on the stack and the arrays are
        indexed in full with unsigned offsets.  A slice or a heap array in a parallel loop
        costs atomic reference-count updates on the operands' shared counters; with 16
        threads those made the parallel kernel slower than the serial one (1.2 ms against
        0.5 ms on a 3.2 MB add, and 21 us without them).  The unsigned offsets keep the inner
        loops vectorised, which signed computed indices would not (numba's wraparound check).
        """
        outer = geometry.shape[1] - 1
        inner = geometry[0, outer]
        inner_a = geometry[1, outer]
        inner_b = geometry[2, outer]
        row = start // inner
        col = start - row * inner
        index = numba.carray(_common.stack_buffer(MAX_DIMS, np.int64), MAX_DIMS)
        oa = 0
        ob = 0
        for d in range(outer - 1, -1, -1):
            size = geometry[0, d]
            index[d] = row % size
            row //= size
            oa += index[d] * geometry[1, d]
            ob += index[d] * geometry[2, d]
        o = start
        while o < stop:
            n = min(inner - col, stop - o)
            if inner_a == 0:
                xs = cast(a[oa])
                first_b = ob + col
                for j in range(n):
                    out[U(o + j)] = apply(xs, cast(b[U(first_b + j)]))
            elif inner_b == 0:
                ys = cast(b[ob])
                first_a = oa + col
                for j in range(n):
                    out[U(o + j)] = apply(cast(a[U(first_a + j)]), ys)
            else:
                first_a = oa + col
                first_b = ob + col
                for j in range(n):
                    out[U(o + j)] = apply(cast(a[U(first_a + j)]), cast(b[U(first_b + j)]))
            o += n
            col = 0
            d = outer - 1
            while d >= 0:  # next row: step the last outer dimension, carrying into earlier ones
                index[d] += 1
                oa += geometry[1, d]
                ob += geometry[2, d]
                if index[d] < geometry[0, d]:
                    break
                oa -= geometry[1, d] * geometry[0, d]
                ob -= geometry[2, d] * geometry[0, d]
                index[d] = 0
                d -= 1

    def serial(a, b, out, geometry):
        span(a, b, out, geometry, 0, out.size)

    def parallel(a, b, out, geometry):
        size = out.size
        for block in prange((size + BLOCK - 1) // BLOCK):
            span(a, b, out, geometry, block * BLOCK, min(size, (block + 1) * BLOCK))

    # numba names a compiled function's symbol after its qualified name, a per-process counter
    # and the argument types.  Closures of this factory would all be "_build.<locals>.span", so
    # a kernel loaded from numba's cache (compiled in another process) could link against a
    # same-named symbol compiled in this one (seen here: a cached ``sub`` kernel ran ``add``'s
    # loop).  Naming them after the operation makes the symbols unique.
    for function in (span, serial, parallel):
        function.__qualname__ = f"{op}_{function.__name__}"
    register_jitable(span)
    return serial, parallel


def _signature(a_dtype: np.dtype, b_dtype: np.dtype, out_dtype: np.dtype) -> types.Signature:
    """``void(a, b, out, geometry)``, the operands typed read-only so that read-only inputs are
    accepted (numba converts writable ones to that type)."""

    def operand(dtype: np.dtype) -> types.Array:
        return types.Array(numba.from_dtype(dtype), 1, "C", readonly=True)

    return types.void(operand(a_dtype), operand(b_dtype),
                      types.Array(numba.from_dtype(out_dtype), 1, "C"),
                      types.Array(types.int64, 2, "C", readonly=True))


@functools.cache
def kernels(op: str, a_dtype: np.dtype, b_dtype: np.dtype, compute_dtype: np.dtype,
            out_dtype: np.dtype) -> tuple[Callable, Callable]:
    """(serial, parallel) for one operation and pair of operand dtypes, compiled (or loaded from
    numba's cache) on first use.  ``error_model="numpy"``: division by zero gives inf or nan
    as in numpy instead of raising ZeroDivisionError."""
    cast = np.dtype(compute_dtype).type
    apply = (TYPED_SCALAR_FUNCTIONS[op](cast) if op in TYPED_SCALAR_FUNCTIONS
             else SCALAR_FUNCTIONS[op])
    serial, parallel = _build(op, apply, cast)
    signature = _signature(np.dtype(a_dtype), np.dtype(b_dtype), np.dtype(out_dtype))
    return (numba.njit(signature, cache=CACHE, error_model="numpy")(serial),
            numba.njit(signature, cache=CACHE, error_model="numpy", parallel=True)(parallel))
