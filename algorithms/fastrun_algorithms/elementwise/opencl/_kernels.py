"""OpenCL C source of ``cl_elementwise`` (a plain string: nothing is compiled here).

One source for every operation and dtype combination; the build options pick them:
``TA``/``TB`` (operand types), ``TC`` (the type numpy converts both to), ``TO`` (the result
type: ``TC``, or uchar for a bool), ``OP`` (the operation's index in :data:`OP_CODES`),
``TC_INT`` (integer arithmetic, done in the unsigned type ``UTC`` and reinterpreted with
``AS_TC`` so that overflow wraps as in numpy; signed overflow is undefined in OpenCL C) and
``FP64`` (enable cl_khr_fp64).

Broadcasting travels as kernel arguments: the merged output dimensions of
:func:`~fastrun_algorithms.elementwise._layout.broadcast_layout`, innermost first, with each
operand's element stride along them (0 where it is broadcast), up to :data:`MAX_RANK`.  So one
program serves every shape of a dtype combination.  Each work-item computes one output
element from its flat index; the index is split into coordinates with 32-bit arithmetic
when the output has fewer than 2^31 elements (64-bit division costs several times more on
GPUs), which the two kernels ``binary32`` and ``binary64`` provide.
"""

from __future__ import annotations

#: The operations in kernel-code order.
OP_CODES = ("add", "sub", "mul", "div", "greater_equal", "max", "min", "add_relu", "equal",
            "less", "greater", "less_equal")

#: Dimensions the kernel decomposes an index into (merged dimensions, see ``_layout``).
MAX_RANK = 6

SOURCE = r"""
#if FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
typedef TA ta;
typedef TB tb;
typedef TC tc;
typedef TO to;
#if TC_INT
#define IS_NAN(v) 0
#else
#define IS_NAN(v) ((v) != (v))
#endif

/* max/min follow numpy: x when it wins or is NaN, else y (so a NaN in y comes back too). */
inline to apply(const tc x, const tc y) {
#if OP == 0
#if TC_INT
    return (to)AS_TC((UTC)x + (UTC)y);
#else
    return (to)(x + y);
#endif
#elif OP == 1
#if TC_INT
    return (to)AS_TC((UTC)x - (UTC)y);
#else
    return (to)(x - y);
#endif
#elif OP == 2
#if TC_INT
    return (to)AS_TC((UTC)x * (UTC)y);
#else
    return (to)(x * y);
#endif
#elif OP == 3
    return (to)(x / y);
#elif OP == 4
    return (to)(x >= y ? 1 : 0);
#elif OP == 5
    return (to)((x > y || IS_NAN(x)) ? x : y);
#elif OP == 6
    return (to)((x < y || IS_NAN(x)) ? x : y);
#elif OP == 7
    /* add_relu: np.maximum(x + y, 0): the sum when larger or NaN, else 0 (so -0.0 gives 0) */
#if TC_INT
    const tc v = AS_TC((UTC)x + (UTC)y);
#else
    const tc v = x + y;
#endif
    return (to)((v > (tc)0 || IS_NAN(v)) ? v : (tc)0);
#elif OP == 8
    return (to)(x == y ? 1 : 0);
#elif OP == 9
    return (to)(x < y ? 1 : 0);
#elif OP == 10
    return (to)(x > y ? 1 : 0);
#else
    return (to)(x <= y ? 1 : 0);
#endif
}

/* One merged dimension k (innermost first): below the outermost one, peel its coordinate
   off the rest of the index; at the outermost, the rest is the coordinate. */
#define DIM(IDX, k)                                                                       \
    if (k < rank - 1) {                                                                   \
        const IDX q = rest / (IDX)n##k;                                                   \
        const IDX r = rest - q * (IDX)n##k;                                               \
        ia += (long)r * a##k;                                                             \
        ib += (long)r * b##k;                                                             \
        rest = q;                                                                         \
    } else if (k == rank - 1) {                                                           \
        ia += (long)rest * a##k;                                                          \
        ib += (long)rest * b##k;                                                          \
    }

#define BINARY(NAME, IDX)                                                                 \
__kernel void NAME(                                                                       \
        const long total, const int rank,                                                 \
        const long n0, const long n1, const long n2,                                      \
        const long n3, const long n4, const long n5,                                      \
        const long a0, const long a1, const long a2,                                      \
        const long a3, const long a4, const long a5,                                      \
        const long b0, const long b1, const long b2,                                      \
        const long b3, const long b4, const long b5,                                      \
        __global const ta* a, const long a_off,                                           \
        __global const tb* b, const long b_off,                                           \
        __global to* out, const long o_off) {                                             \
    const IDX i = (IDX)get_global_id(0);                                                  \
    if ((long)i >= total) return;                                                         \
    IDX rest = i;                                                                         \
    long ia = a_off;                                                                      \
    long ib = b_off;                                                                      \
    DIM(IDX, 0) DIM(IDX, 1) DIM(IDX, 2) DIM(IDX, 3) DIM(IDX, 4) DIM(IDX, 5)               \
    out[o_off + (long)i] = apply((tc)a[ia], (tc)b[ib]);                                   \
}

BINARY(binary32, uint)
BINARY(binary64, ulong)
"""
