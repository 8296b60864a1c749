"""OpenCL C sources of the OpenCL conv algorithms (plain strings: nothing is compiled here).

Every program starts with :data:`PRELUDE`: the element type (``REAL_DOUBLE`` picks double)
and the fused epilogue.  Geometry travels as kernel arguments, so one program serves every
problem of a dtype and configuration; only what must be a compile-time constant for the
kernel to keep its accumulators in registers (outputs per work-item, and the depthwise
kernel's tap counts) is a ``-D`` option.  Tensors are passed as (buffer, element offset) so
that views of a larger array (one image, a reshaped weight) need no copy.

Every work-item sums its outputs in a fixed order with no atomics: results are bit-identical
run to run on one device and driver.
"""

from __future__ import annotations

PRELUDE = r"""
#if REAL_DOUBLE
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double real;
#else
typedef float real;
#endif

/* act: 0 none, 1 relu, 2 clip(lo, hi); the codes of conv/epilogue.py.  relu keeps a NaN a
   NaN (v * 0), as the CPU epilogue does. */
inline real conv_epilogue(real v, const int act, const real lo, const real hi) {
    if (act == 1) return v > (real)0 ? v : v * (real)0;
    if (act == 2) return fmin(fmax(v, lo), hi);
    return v;
}
"""

DIRECT = PRELUDE + r"""
/* KO consecutive output channels of one group at one output pixel per work-item.
   NDRange: (pixels OH*OW rounded up to the local size, G * kblocks, N).  The input value of
   each tap is loaded once and used KO times; the KO weights of a tap are the same for the
   whole work-group (the channel block is dimension 1), so GPUs broadcast them and PoCL
   hoists them out of its vectorised work-item loop. */
__kernel void conv_direct(
        const int C, const int H, const int W, const int K, const int R, const int S,
        const int OH, const int OW, const int sh, const int sw, const int dh, const int dw,
        const int pt, const int pl, const int cg, const int kg, const int kblocks,
        __global const real* x, const long x_off,
        __global const real* w, const long w_off,
        __global const real* bias, const long b_off, const int has_bias,
        __global real* out, const long o_off,
        const int act, const real lo, const real hi) {
    const int p = get_global_id(0);
    const int P = OH * OW;
    if (p >= P) return;
    const int blk = get_global_id(1);
    const int n = get_global_id(2);
    const int g = blk / kblocks;
    const int k0 = g * kg + (blk - g * kblocks) * KO;
    const int valid = min(KO, (g + 1) * kg - k0);
    const int oy = p / OW;
    const int ox = p - oy * OW;
    const int iy0 = oy * sh - pt;
    const int ix0 = ox * sw - pl;
    const int taps = cg * R * S;
    __global const real* xg = x + x_off + ((long)n * C + (long)g * cg) * H * W;
    __global const real* wk = w + w_off + (long)k0 * taps;
    int wrow[KO];
    real acc[KO];
    #pragma unroll
    for (int q = 0; q < KO; ++q) {
        wrow[q] = min(q, valid - 1) * taps;  /* channels past the group's end re-read the last */
        acc[q] = (real)0;
    }
    for (int c = 0; c < cg; ++c) {
        __global const real* xc = xg + (long)c * H * W;
        const int wc = c * R * S;
        for (int i = 0; i < R; ++i) {
            const int iy = iy0 + i * dh;
            if (iy < 0 || iy >= H) continue;
            for (int j = 0; j < S; ++j) {
                const int ix = ix0 + j * dw;
                if (ix < 0 || ix >= W) continue;
                const real v = xc[iy * W + ix];
                const int t = wc + i * S + j;
                #pragma unroll
                for (int q = 0; q < KO; ++q) acc[q] += v * wk[wrow[q] + t];
            }
        }
    }
    __global real* o = out + o_off + ((long)n * K + k0) * P + p;
    #pragma unroll
    for (int q = 0; q < KO; ++q) {
        if (q < valid) {
            const real b = has_bias ? bias[b_off + k0 + q] : (real)0;
            o[(long)q * P] = conv_epilogue(acc[q] + b, act, lo, hi);
        }
    }
}
"""

DEPTHWISE = PRELUDE + r"""
/* Depthwise (group == C, K = C * multiplier): PX neighbouring outputs of one row of one
   output channel per work-item, the KR x KS taps unrolled with the weights in registers.
   NDRange: (OH * ceil(OW / PX) rounded up to the local size, N * K). */
__kernel void conv_depthwise(
        const int C, const int H, const int W, const int K,
        const int OH, const int OW, const int sh, const int sw, const int dh, const int dw,
        const int pt, const int pl, const int mult,
        __global const real* x, const long x_off,
        __global const real* w, const long w_off,
        __global const real* bias, const long b_off, const int has_bias,
        __global real* out, const long o_off,
        const int act, const real lo, const real hi) {
    const int blocks = (OW + PX - 1) / PX;
    const int p = get_global_id(0);
    if (p >= OH * blocks) return;
    const int nk = get_global_id(1);
    const int n = nk / K;
    const int k = nk - n * K;
    const int c = k / mult;
    const int oy = p / blocks;
    const int ox0 = (p - oy * blocks) * PX;
    __global const real* xc = x + x_off + ((long)n * C + c) * H * W;
    __global const real* wk = w + w_off + (long)k * KR * KS;
    real wt[KR * KS];
    #pragma unroll
    for (int t = 0; t < KR * KS; ++t) wt[t] = wk[t];
    real acc[PX];
    #pragma unroll
    for (int q = 0; q < PX; ++q) acc[q] = (real)0;
    const int iy0 = oy * sh - pt;
    #pragma unroll
    for (int i = 0; i < KR; ++i) {
        const int iy = iy0 + i * dh;
        if (iy < 0 || iy >= H) continue;
        __global const real* row = xc + (long)iy * W;
        #pragma unroll
        for (int j = 0; j < KS; ++j) {
            #pragma unroll
            for (int q = 0; q < PX; ++q) {
                const int ix = (ox0 + q) * sw - pl + j * dw;
                const real v = (ix >= 0 && ix < W) ? row[ix] : (real)0;
                acc[q] += v * wt[i * KS + j];
            }
        }
    }
    const real b = has_bias ? bias[b_off + k] : (real)0;
    __global real* o = out + o_off + ((long)n * K + k) * OH * OW + (long)oy * OW + ox0;
    #pragma unroll
    for (int q = 0; q < PX; ++q) {
        if (ox0 + q < OW) o[q] = conv_epilogue(acc[q] + b, act, lo, hi);
    }
}
"""

GEMM_HELPERS = PRELUDE + r"""
/* im2col's unfold: cols[n][(c*R + i)*S + j][y*OW + z] = x[n][c][y*sh + i*dh - pt]
   [z*sw + j*dw - pl], zero in the padding.  NDRange: (OH*OW, C*R*S, images); dimension 0
   runs along the output pixels, so neighbouring work-items write neighbouring words. */
__kernel void unfold(
        const int C, const int H, const int W, const int R, const int S,
        const int OH, const int OW, const int sh, const int sw, const int dh, const int dw,
        const int pt, const int pl,
        __global const real* x, const long x_off,
        __global real* cols, const long c_off) {
    const int p = get_global_id(0);
    const int row = get_global_id(1);
    const int n = get_global_id(2);
    const int taps = R * S;
    const int c = row / taps;
    const int t = row - c * taps;
    const int i = t / S;
    const int j = t - i * S;
    const int y = p / OW;
    const int z = p - y * OW;
    const int iy = y * sh + i * dh - pt;
    const int ix = z * sw + j * dw - pl;
    real v = (real)0;
    if (iy >= 0 && iy < H && ix >= 0 && ix < W)
        v = x[x_off + (((long)n * C + c) * H + iy) * W + ix];
    cols[c_off + ((long)n * C * taps + row) * OH * OW + p] = v;
}

/* dst[n][k][p] = act(src[n][k][p] + bias[k]): the epilogue over a product, in place when
   src and dst are the same buffer (each element is read and written by one work-item).
   NDRange: (pixels, K, images). */
__kernel void epilogue(
        const int K, const int P,
        __global const real* src, const long s_off,
        __global const real* bias, const long b_off, const int has_bias,
        __global real* dst, const long d_off,
        const int act, const real lo, const real hi) {
    const int p = get_global_id(0);
    const int k = get_global_id(1);
    const long e = ((long)get_global_id(2) * K + k) * P + p;
    const real b = has_bias ? bias[b_off + k] : (real)0;
    dst[d_off + e] = conv_epilogue(src[s_off + e] + b, act, lo, hi);
}
"""
