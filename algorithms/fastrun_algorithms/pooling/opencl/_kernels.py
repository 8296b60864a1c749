"""OpenCL C sources of the OpenCL pooling algorithms (plain strings: nothing is compiled
here).

Every program starts with :data:`PRELUDE`: ``REAL`` is the element type and ``FP64`` enables
cl_khr_fp64.  Geometry, the pooling mode and the LRN constants travel as kernel arguments, so
each source builds once per dtype.  Tensors are (buffer, element offset) pairs.  Every output
is combined by one work-item (or one work-group's fixed tree) in a fixed order, with no
atomics: results are bit-identical run to run on one device and driver.
"""

from __future__ import annotations

#: ``mode`` argument of the pooling kernels.
MAX, AVERAGE, AVERAGE_WITH_PAD = 0, 1, 2

PRELUDE = r"""
#if FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
typedef REAL real;

/* np.maximum's rule: v when it is larger or NaN, else the running value (which stays NaN once
   it is NaN, since nothing compares larger than NaN): a NaN on either side comes back. */
inline real nan_max(const real acc, const real v) {
    return (v > acc || v != v) ? v : acc;
}

/* Taps j < k of one axis whose position start + j * d lies in [lo, hi). */
inline int taps_inside(const int start, const int k, const int d, const int lo, const int hi) {
    int count = 0;
    for (int j = 0; j < k; ++j) {
        const int p = start + j * d;
        count += (p >= lo && p < hi) ? 1 : 0;
    }
    return count;
}
"""

POOL = PRELUDE + r"""
/* maxpool / avgpool over up to 3 spatial axes (1-D and 2-D as 3-D with leading axes of
   one), one output per work-item.  Output o along an axis reads input positions
   o * stride - pad_begin + j * dilation; positions outside the input are skipped, so padding
   never wins a max and adds nothing to a sum.  The average divides by the taps inside the
   input (mode 1) or inside the explicitly padded input [-pad_begin, size + pad_end) (mode 2:
   count_include_pad; positions only ceil_mode's last window reaches are never counted), one
   count per axis, multiplied: the definition of pooling/geometry.py. */
__kernel void pool(
        const long total, const int mode,
        const int D, const int H, const int W, const int OD, const int OH, const int OW,
        const int kd, const int kh, const int kw, const int sd, const int sh, const int sw,
        const int dd, const int dh, const int dw,
        const int pf, const int pt, const int pl, const int pk, const int pb, const int pr,
        __global const real* x, const long x_off, __global real* out, const long o_off) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int ow = (int)(i % OW);
    long rest = i / OW;
    const int oh = (int)(rest % OH);
    rest /= OH;
    const int od = (int)(rest % OD);
    const long plane = rest / OD;
    __global const real* xp = x + x_off + plane * D * H * W;
    const int z0 = od * sd - pf;
    const int y0 = oh * sh - pt;
    const int x0 = ow * sw - pl;
    real acc = mode == 0 ? (real)(-INFINITY) : (real)0;
    for (int a = 0; a < kd; ++a) {
        const int z = z0 + a * dd;
        if (z < 0 || z >= D) continue;
        for (int b = 0; b < kh; ++b) {
            const int y = y0 + b * dh;
            if (y < 0 || y >= H) continue;
            __global const real* row = xp + ((long)z * H + y) * W;
            for (int c = 0; c < kw; ++c) {
                const int xx = x0 + c * dw;
                if (xx < 0 || xx >= W) continue;
                const real v = row[xx];
                acc = mode == 0 ? nan_max(acc, v) : acc + v;
            }
        }
    }
    if (mode != 0) {
        const int padded = mode == 2;
        const int count =
            taps_inside(z0, kd, dd, padded ? -pf : 0, padded ? D + pk : D)
            * taps_inside(y0, kh, dh, padded ? -pt : 0, padded ? H + pb : H)
            * taps_inside(x0, kw, dw, padded ? -pl : 0, padded ? W + pr : W);
        acc = acc / (real)count;
    }
    out[o_off + i] = acc;
}
"""

GLOBAL_POOL = PRELUDE + r"""
/* Max (mode 0) or mean (mode 1) of each (image, channel) plane of `size` elements: the sum
   divided once by the size, as the numpy algorithm does. */

/* One work-item per plane, reading it in order. */
__kernel void global_pool_item(const long planes, const long size, const int mode,
                               __global const real* x, const long x_off,
                               __global real* out, const long o_off) {
    const long p = get_global_id(0);
    if (p >= planes) return;
    __global const real* xp = x + x_off + p * size;
    real acc = mode == 0 ? (real)(-INFINITY) : (real)0;
    for (long l = 0; l < size; ++l) acc = mode == 0 ? nan_max(acc, xp[l]) : acc + xp[l];
    out[o_off + p] = mode == 0 ? acc : acc / (real)size;
}

/* One work-group per plane: its work-items stride over the plane (neighbouring items on
   neighbouring words), then a tree in local memory (a power-of-two local size) combines
   their partial results. */
__kernel void global_pool_group(const long size, const int mode,
                                __global const real* x, const long x_off,
                                __global real* out, const long o_off,
                                __local real* scratch) {
    const long p = get_group_id(0);
    const int t = get_local_id(0);
    const int T = get_local_size(0);
    __global const real* xp = x + x_off + p * size;
    real acc = mode == 0 ? (real)(-INFINITY) : (real)0;
    for (long l = t; l < size; l += T) acc = mode == 0 ? nan_max(acc, xp[l]) : acc + xp[l];
    scratch[t] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int width = T / 2; width > 0; width /= 2) {
        if (t < width) {
            const real other = scratch[t + width];
            scratch[t] = mode == 0 ? nan_max(scratch[t], other) : scratch[t] + other;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) out[o_off + p] = mode == 0 ? scratch[0] : scratch[0] / (real)size;
}
"""

LRN = PRELUDE + r"""
/* ONNX LRN, one element per work-item: the squares of the channels c - before .. c + after
   (clipped to the channels) summed in channel order, then x / (bias + coef * sum)^beta with
   coef = alpha / size.  inner is the product of X's dimensions after the channels. */
__kernel void lrn(const long total, const int C, const long inner, const int before,
                  const int after, const real coef, const real bias, const real beta,
                  __global const real* x, const long x_off,
                  __global real* out, const long o_off) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long p = i % inner;
    const long t = i / inner;
    const int c = (int)(t % C);
    __global const real* xs = x + x_off + (t - c) * inner + p;
    const int lo = max(0, c - before);
    const int hi = min(C - 1, c + after);
    real s = (real)0;
    for (int k = lo; k <= hi; ++k) {
        const real v = xs[(long)k * inner];
        s += v * v;
    }
    out[o_off + i] = x[x_off + i] / pow(coef * s + bias, beta);
}
"""

#: pool_linear: Y[n, m] = sum over c of mean(X[n, c, :]) * W[c, m] (+ B[m]).  Work-group (g, n)
#: first pools image n's C channels into local memory (work-items striding over the channels,
#: each plane summed in order, divided once by its size), then each of its work-items computes
#: one output m = g * L + t over the channels in order (neighbouring work-items on neighbouring
#: columns of W: coalesced reads).  One launch for GlobalAveragePool -> Flatten -> Gemm.
POOL_LINEAR = PRELUDE + r"""
__kernel void pool_linear(const int C, const long size, const int M,
                          __global const real* x, const long x_off,
                          __global const real* w, const long w_off,
                          __global const real* bias, const long b_off, const int has_bias,
                          __global real* out, const long o_off,
                          __local real* pooled) {
    const int t = get_local_id(0);
    const int L = get_local_size(0);
    const long n = get_group_id(1);
    __global const real* xn = x + x_off + n * C * size;
    for (int c = t; c < C; c += L) {
        __global const real* plane = xn + (long)c * size;
        real acc = (real)0;
        for (long l = 0; l < size; ++l) acc += plane[l];
        pooled[c] = acc / (real)size;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int m = get_group_id(0) * L + t;
    if (m >= M) return;
    real acc = (real)0;
    __global const real* wm = w + w_off + m;
    for (int c = 0; c < C; ++c) acc += pooled[c] * wm[(long)c * M];
    out[o_off + n * M + m] = has_bias ? acc + bias[b_off + m] : acc;
}
"""
