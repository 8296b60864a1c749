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
               "sqrt", "exp", "log", "neg", "abs", "reciprocal", "erf")

PRELUDE = r"""
#if FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
typedef REAL real;
"""

UNARY = PRELUDE + r"""
/* One element per work-item.  p0, p1: leaky_relu's alpha; clip's min and max (the dtype's
   extremes where a bound is absent); hard_sigmoid's alpha and beta.  The comparisons are the
   operators' references: relu, clip and the hard ones keep a NaN a NaN (it fails every
   comparison), leaky_relu gives alpha * NaN. */
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
#else
    const real r = erf(v);
#endif
    out[o_off + i] = r;
}
"""

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
    out[o_off + i] = (x[x_off + i] - (real)mean[m_off + c]) * factor + (real)bias[b_off + c];
}
"""
