"""OpenCL C sources of the OpenCL activation algorithms (plain strings: nothing is compiled
here).

Every program starts with :data:`PRELUDE`: ``REAL`` is the element type (an OpenCL C type
name) and ``FP64`` enables cl_khr_fp64.  Sizes travel as kernel arguments, so one program
serves every shape; the unary source also takes ``OP`` (the index in :data:`UNARY_CODES`),
because each activation is its own tiny kernel and a run-time switch would cost a branch per
element for no saved build (each activation is one operator, so one program per operator and
dtype either way).  Tensors are (buffer, element offset) pairs, so views need no copy.

Nothing here uses atomics or a thread-count dependent order: results are bit-identical run to
run on one device and driver.
"""

from __future__ import annotations

#: The unary activations in kernel-code order.
UNARY_CODES = ("relu", "leaky_relu", "clip", "sigmoid", "tanh", "hard_sigmoid", "hard_swish",
               "sqrt", "exp", "log", "neg", "abs", "reciprocal", "erf", "gelu")

PRELUDE = r"""
#if FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
typedef REAL real;
"""

#: The exact GELU of one value, for every program that ends in one (``cl_unary``'s gelu,
#: ``cl_linear``'s epilogue): written with erfc so that 1 + erf(x / sqrt 2) keeps its digits
#: where x is very negative (erfc(-x / sqrt 2) is that sum).
GELU_EXACT = r"""
inline real gelu_exact(const real v) {
    return (real)0.5 * v * erfc(-v * (real)0.7071067811865476);
}
"""

# the helper only in gelu's program: clip's integer types have no erfc
UNARY = (PRELUDE + f"#if OP == {UNARY_CODES.index('gelu')}\n" + GELU_EXACT + "#endif\n"
         + r"""
/* One element per work-item.  p0, p1: leaky_relu's alpha; clip's min and max (the dtype's
   extremes where a bound is absent); hard_sigmoid's alpha and beta.  The comparisons are the
   operators' references: relu, clip and the hard ones keep a NaN a NaN (it fails every
   comparison), leaky_relu gives alpha * NaN.  gelu: p0 is 1 for the tanh form, 0 for the
   exact one. */
__kernel void unary(const long total, __global const real* x, const long x_off,
                    __global real* out, const long o_off, const real p0, const real p1) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const real v = x[x_off + i];
#if OP == 0
    const real r = v < (real)0 ? (real)0 : v;
#elif OP == 1
    const real r = v >= (real)0 ? v : v * p0;
#elif OP == 2
    const real low = v < p0 ? p0 : v;
    const real r = low > p1 ? p1 : low;
#elif OP == 3
    /* exp(-v) overflows to inf far below zero, and 1 / (1 + inf) is the right limit, 0 */
    const real r = (real)1 / ((real)1 + exp(-v));
#elif OP == 4
    const real r = tanh(v);
#elif OP == 5
    /* fmin/fmax would drop a NaN: compares keep it, as the reference does */
    const real g = p0 * v + p1;
    const real low = g < (real)0 ? (real)0 : g;
    const real r = low > (real)1 ? (real)1 : low;
#elif OP == 6
    /* (x + 3) / 6: exact near the knee at -3, where x / 6 + 1/2 would cancel */
    const real g = (v + (real)3) * (real)(1.0 / 6.0);
    const real low = g < (real)0 ? (real)0 : g;
    const real r = v * (low > (real)1 ? (real)1 : low);
#elif OP == 7
    const real r = sqrt(v);
#elif OP == 8
    const real r = exp(v);
#elif OP == 9
    const real r = log(v);
#elif OP == 10
    const real r = -v;
#elif OP == 11
    const real r = fabs(v);
#elif OP == 12
    const real r = (real)1 / v;
#elif OP == 13
    const real r = erf(v);
#else
    real r;
    if (p0 != (real)0) {
        const real u = (real)0.7978845608028654 * (v + (real)0.044715 * v * v * v);
        /* tanh exactly +-1 at the infinities (PoCL's is not), so that -inf gives NaN as the
           reference's -inf * (1 - 1) does */
        r = (real)0.5 * v * ((real)1 + (isinf(u) ? copysign((real)1, u) : tanh(u)));
    } else {
        r = gelu_exact(v);
    }
#endif
    out[o_off + i] = r;
}
""")

SOFTMAX = PRELUDE + r"""
/* Softmax over rows of L elements, `inner` apart (the axis of an (outer, L, inner) view);
   row r starts at (r / inner) * L * inner + r % inner.  Three passes per row: the maximum,
   exp(x - max) written to the output and summed, then the division.  The maximum skips NaN
   (fmax), but a NaN still reaches the sum and so every output of its row, as in the
   reference; a row holding +inf gives NaN likewise (inf - inf). */

/* One work-item per row: neighbouring work-items take neighbouring rows, which are
   neighbouring words when inner > 1. */
__kernel void softmax_item(const long rows, const long L, const long inner,
                           __global const real* x, const long x_off,
                           __global real* out, const long o_off) {
    const long r = get_global_id(0);
    if (r >= rows) return;
    const long outer = r / inner;
    const long start = outer * L * inner + (r - outer * inner);
    __global const real* xr = x + x_off + start;
    __global real* yr = out + o_off + start;
    real m = (real)(-INFINITY);
    for (long l = 0; l < L; ++l) m = fmax(m, xr[l * inner]);
    real s = (real)0;
    for (long l = 0; l < L; ++l) {
        const real e = exp(xr[l * inner] - m);
        yr[l * inner] = e;
        s += e;
    }
    for (long l = 0; l < L; ++l) yr[l * inner] = yr[l * inner] / s;
}

/* One work-group per row: each work-item strides over the row, then the partial maxima and
   sums are combined by a tree in local memory (the local size is a power of two).  Each
   work-item rescales the elements it wrote, so only the reductions need barriers. */
__kernel void softmax_group(const long L, const long inner,
                            __global const real* x, const long x_off,
                            __global real* out, const long o_off,
                            __local real* scratch) {
    const long r = get_group_id(0);
    const int t = get_local_id(0);
    const int T = get_local_size(0);
    const long outer = r / inner;
    const long start = outer * L * inner + (r - outer * inner);
    __global const real* xr = x + x_off + start;
    __global real* yr = out + o_off + start;
    real m = (real)(-INFINITY);
    for (long l = t; l < L; l += T) m = fmax(m, xr[l * inner]);
    scratch[t] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = T / 2; width > 0; width /= 2) {
        if (t < width) scratch[t] = fmax(scratch[t], scratch[t + width]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    real s = (real)0;
    for (long l = t; l < L; l += T) {
        const real e = exp(xr[l * inner] - m);
        yr[l * inner] = e;
        s += e;
    }
    scratch[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = T / 2; width > 0; width /= 2) {
        if (t < width) scratch[t] += scratch[t + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    s = scratch[0];
    for (long l = t; l < L; l += T) yr[l * inner] = yr[l * inner] / s;
}
"""

BATCH_NORM = PRELUDE + r"""
/* Inference batch norm, one element per work-item: channel (i / inner) % C, where inner is
   the product of X's dimensions after the channels.  TS, TB, TM, TV are the types of scale,
   B, mean and var, converted to X's type first (as the numpy algorithm converts them).
   (x - mean) * factor + B, the mean subtracted first: accurate for large means. */
__kernel void batch_norm(const long total, const long C, const long inner,
                         __global const real* x, const long x_off,
                         __global const TS* scale, const long s_off,
                         __global const TB* bias, const long b_off,
                         __global const TM* mean, const long m_off,
                         __global const TV* var, const long v_off,
                         __global real* out, const long o_off, const real epsilon) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long c = (i / inner) % C;
    const real factor = (real)scale[s_off + c] / sqrt((real)var[v_off + c] + epsilon);
    const real v = (x[x_off + i] - (real)mean[m_off + c]) * factor + (real)bias[b_off + c];
#if RELU
    out[o_off + i] = v < (real)0 ? (real)0 : v;
#else
    out[o_off + i] = v;
#endif
}
"""

LAYER_NORM = PRELUDE + r"""
/* LayerNormalization, one work-group per row of L elements (rows are contiguous; the local
   size is a power of two): the mean, then the mean squared deviation (two passes, each summed
   by the work-items striding over the row and then by a tree in local memory), then
   (x - mean) / sqrt(var + epsilon) * scale + bias, as the reference computes it. */
__kernel void layer_norm(const long L, __global const real* x, const long x_off,
                         __global const real* scale, const long s_off,
                         __global const real* bias, const long b_off,
                         __global real* out, const long o_off, const real epsilon,
                         __local real* scratch) {
    const long r = get_group_id(0);
    const int t = get_local_id(0);
    const int T = get_local_size(0);
    __global const real* xr = x + x_off + r * L;
    __global real* yr = out + o_off + r * L;
    real s = (real)0;
    for (long l = t; l < L; l += T) s += xr[l];
    scratch[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = T / 2; width > 0; width /= 2) {
        if (t < width) scratch[t] += scratch[t + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const real mean = scratch[0] / (real)L;
    barrier(CLK_LOCAL_MEM_FENCE);
    real q = (real)0;
    for (long l = t; l < L; l += T) {
        const real d = xr[l] - mean;
        q += d * d;
    }
    scratch[t] = q;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = T / 2; width > 0; width /= 2) {
        if (t < width) scratch[t] += scratch[t + width];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const real deviation = sqrt(scratch[0] / (real)L + epsilon);
    for (long l = t; l < L; l += T)
        yr[l] = (xr[l] - mean) / deviation * scale[s_off + l] + bias[b_off + l];
}
"""
