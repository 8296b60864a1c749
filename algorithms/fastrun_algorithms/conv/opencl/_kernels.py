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

/* act: 0 none, 1 relu, 2 clip(lo, hi), 3 hard_swish (lo 3, hi 1/6), 4 sigmoid, 5 silu (lo 1);
   the codes and arguments of conv/epilogue.py's activate.  relu keeps a NaN a NaN (v * 0), as
   the CPU epilogue does. */
inline real conv_epilogue(real v, const int act, const real lo, const real hi) {
    if (act == 1) return v > (real)0 ? v : v * (real)0;
    if (act == 2) return fmin(fmax(v, lo), hi);
    if (act == 3) return v * fmin(fmax((v + lo) * hi, (real)0), (real)1);
    if (act == 4) return lo / (lo + exp(-v));
    if (act == 5) return v / (lo + exp(-v));
    if (act == 6) return fmin(fmax(v * lo + hi, (real)0), (real)1);
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

#: Implicit GEMM: the conv as the product W (K/G x C/G*R*S) @ cols (C/G*R*S x N*OH*OW) per
#: group, with ``cols`` never written to memory: each work-group stages an MWG x KWG tile of the
#: weights and the KWG x NWG tile of ``cols`` it needs, gathered straight from the input (zeros
#: in the padding), in local memory, and its NDIMC x MDIMC work-items each accumulate an
#: MWI x NWI block of outputs in registers (in VW-wide groups of rows and of columns,
#: neighbouring work-items on neighbouring groups: conflict-free local reads).  The pixel
#: dimension runs over all images, so a batch fills the device as one product.
#:
#: Local tiles are read as VW-wide vectors (VW output channels and VW pixels per read), as
#: in the matmul's ``cl_gemm``, where vector reads were worth a third of its speed on an H100.
#: Each work-item always gathers the same B_COLS columns (pixels) of the cols tile, so their
#: image, row and column are decoded once; a row of cols (channel, tap) is decoded per load,
#: by the compile-time tap counts KR x KS, which compilers turn into multiplications.
#:
#: SPLIT_K (split-K, for small images with many channels, where the output tiles alone
#: would leave most of the device idle): work-group z sums one ``kchunk``-long slice of the
#: reduction and stores its partial block to ``part`` laid out (split, K, N*OH*OW).  Then it
#: counts itself in its tile's counter; the last of the tile's work-groups to arrive adds the
#: slices in a fixed order (0, 1, ...), applies the epilogue, stores the output and sets the
#: counter back to zero for the next launch.  One launch, where a second reduction kernel
#: used to cost a batch-1 model on an H200 a fifth of its host time; the same bits on every
#: run, whichever work-group arrives last.  Without SPLIT_K the kernel applies the epilogue
#: in its store.
IGEMM = PRELUDE + r"""
#define MWI (MWG / MDIMC)
#define NWI (NWG / NDIMC)
#define MVW (MWI / VW)
#define NVW (NWI / VW)
#define THREADS (MDIMC * NDIMC)
#define A_LOADS ((MWG * KWG) / THREADS)
#define B_LOADS ((KWG * NWG) / THREADS)
#if THREADS >= NWG
#define B_COLS 1
#else
#define B_COLS (NWG / THREADS)
#endif
#define TAPS (KR * KS)
#if VW == 1
typedef real realV;
#elif VW == 2
#if REAL_DOUBLE
typedef double2 realV;
#else
typedef float2 realV;
#endif
#else
#if REAL_DOUBLE
typedef double4 realV;
#else
typedef float4 realV;
#endif
#endif
/* Tile row (output channel) and column (pixel) of this work-item's element (i, v) / (j, v):
   VW-wide groups, neighbouring work-items on neighbouring groups. */
#define ROW(i, v) (((i) * MDIMC + ty) * VW + (v))
#define COL(j, v) (((j) * NDIMC + tx) * VW + (v))
/* A's local rows (k-major) are one vector longer than the tile: the transposing stores of a
   row of W then spread over the banks. */
#define AROW (MWG / VW + 1)
/* Output element `at` of channel `ch`: the sum, plus the bias and the residual where there
   are, through the activation. */
#define STORE_OUTPUT(at, ch, sum) (out[o_off + (at)] = conv_epilogue(                   \
    (sum) + (has_bias ? bias[b_off + (ch)] : (real)0) + (has_z ? z[z_off + (at)] : (real)0), \
    act, lo, hi))

/* The launch's scalars, passed as one argument: a driver charges every enqueue for each
   argument (NVIDIA's, driver 580: 10.1 us with 25 arguments, 8.9 us with 21 of them in one
   struct).  The 64-bit members come first, so the layout has no padding to agree on. */
typedef struct {
    long x_off, w_off, b_off, o_off, z_off;
    int C, H, W, K, OH, OW, sh, sw, dh, dw, pt, pl, cg, kg, NP, mtiles, kchunk;
    int has_bias, has_z, act;
    real lo, hi;
} igemm_scalars;

__kernel __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
void conv_igemm(
        const igemm_scalars s,
        __global const real* restrict x, __global const real* restrict w,
        __global const real* restrict bias, __global real* restrict out,
        __global const real* restrict z,
        __global real* part, __global volatile int* counters) {
    const long x_off = s.x_off, w_off = s.w_off, b_off = s.b_off, o_off = s.o_off;
    const long z_off = s.z_off;
    const int C = s.C, H = s.H, W = s.W, K = s.K, OH = s.OH, OW = s.OW;
    const int sh = s.sh, sw = s.sw, dh = s.dh, dw = s.dw, pt = s.pt, pl = s.pl;
    const int cg = s.cg, kg = s.kg, NP = s.NP, mtiles = s.mtiles, kchunk = s.kchunk;
    const int has_bias = s.has_bias, has_z = s.has_z, act = s.act;
    const real lo = s.lo, hi = s.hi;
    __local realV Av[KWG][AROW];
    __local realV Bv[KWG][NWG / VW];
    __local int last_slice;
    __local real* As = (__local real*)Av;
    __local real* Bs = (__local real*)Bv;
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * NDIMC + tx;
    const int n0 = get_group_id(0) * NWG;
    const int gm = get_group_id(1);
    const int g = gm / mtiles;
    const int m0 = (gm - g * mtiles) * MWG;
    const int depth = cg * TAPS;
    const int kbeg = get_group_id(2) * kchunk;
    const int kend = min(depth, kbeg + kchunk);
    const int P = OH * OW;
    const long HW = (long)H * W;

    long xbase[B_COLS];
    int iy0[B_COLS];
    int ix0[B_COLS];
    #pragma unroll
    for (int q = 0; q < B_COLS; ++q) {
        const int pix = n0 + (tid + q * THREADS) % NWG;
        const int img = pix / P;
        const int p = pix - img * P;
        const int oy = p / OW;
        xbase[q] = x_off + ((long)img * C + (long)g * cg) * HW;
        /* A pixel past the end gets a row far above the image: every tap reads as padding. */
        iy0[q] = pix < NP ? oy * sh - pt : -(1 << 28);
        ix0[q] = (p - oy * OW) * sw - pl;
    }
    __global const real* wg = w + w_off + (long)(g * kg + m0) * depth;

    realV acc[MWI][NVW];
    #pragma unroll
    for (int i = 0; i < MWI; ++i) {
        #pragma unroll
        for (int j = 0; j < NVW; ++j) acc[i][j] = (realV)(0);
    }
    for (int k0 = kbeg; k0 < kend; k0 += KWG) {
        #pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int e = tid + l * THREADS;
            const int kk = e % KWG;
            const int mm = e / KWG;
            As[kk * AROW * VW + mm] = (m0 + mm < kg && k0 + kk < kend)
                ? wg[(long)mm * depth + k0 + kk] : (real)0;
        }
        #pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const int e = tid + l * THREADS;
            const int q = l % B_COLS;
            const int row = e / NWG;
            const int kk = k0 + row;
            real v = (real)0;
            if (kk < kend) {
                const int c = kk / TAPS;
                const int t = kk - c * TAPS;
                const int i = t / KS;
                const int iy = iy0[q] + i * dh;
                const int ix = ix0[q] + (t - i * KS) * dw;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                    v = x[xbase[q] + c * HW + (long)iy * W + ix];
            }
            Bs[row * NWG + e % NWG] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int k = 0; k < KWG; ++k) {
            real av[MWI];
            realV bv[NVW];
            #pragma unroll
            for (int i = 0; i < MVW; ++i) {
                const realV a = Av[k][i * MDIMC + ty];
                #pragma unroll
                for (int v = 0; v < VW; ++v) av[i * VW + v] = ((const real*)&a)[v];
            }
            #pragma unroll
            for (int j = 0; j < NVW; ++j) bv[j] = Bv[k][j * NDIMC + tx];
            #pragma unroll
            for (int i = 0; i < MWI; ++i) {
                #pragma unroll
                for (int j = 0; j < NVW; ++j) acc[i][j] += av[i] * bv[j];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    #pragma unroll
    for (int j = 0; j < NVW; ++j) {
        #pragma unroll
        for (int u = 0; u < VW; ++u) {
            const int pix = n0 + COL(j, u);
            if (pix >= NP) continue;
#if !SPLIT_K
            const int img = pix / P;
            const long e = (long)img * K * P + (pix - img * P);
#endif
            #pragma unroll
            for (int i = 0; i < MVW; ++i) {
                #pragma unroll
                for (int v = 0; v < VW; ++v) {
                    const int m = m0 + ROW(i, v);
                    if (m >= kg) continue;
                    const int ch = g * kg + m;
                    const real value = ((const real*)&acc[i * VW + v][j])[u];
#if !SPLIT_K
                    STORE_OUTPUT(e + (long)ch * P, ch, value);
#else
                    part[((long)get_group_id(2) * K + ch) * NP + pix] = value;
#endif
                }
            }
        }
    }
#if SPLIT_K
    /* This slice's stores, visible device-wide before it counts itself. */
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    barrier(CLK_GLOBAL_MEM_FENCE);
    const int tile = get_group_id(1) * get_num_groups(0) + get_group_id(0);
    const int splits = get_num_groups(2);
    if (tid == 0) last_slice = atomic_inc(&counters[tile]) == splits - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last_slice) return;
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    /* Plain loads: this work-group has read none of these addresses before, so no cache
       holds an old copy (volatile loads, one at a time, made the reduction slower than the
       separate kernel it replaces). */
    __global const real* slices = part;
    #pragma unroll
    for (int j = 0; j < NVW; ++j) {
        #pragma unroll
        for (int u = 0; u < VW; ++u) {
            const int pix = n0 + COL(j, u);
            if (pix >= NP) continue;
            const int img = pix / P;
            const long e = (long)img * K * P + (pix - img * P);
            #pragma unroll
            for (int i = 0; i < MVW; ++i) {
                #pragma unroll
                for (int v = 0; v < VW; ++v) {
                    const int m = m0 + ROW(i, v);
                    if (m >= kg) continue;
                    const int ch = g * kg + m;
                    real value = (real)0;
                    for (int s = 0; s < splits; ++s)
                        value += slices[((long)s * K + ch) * NP + pix];
                    STORE_OUTPUT(e + (long)ch * P, ch, value);
                }
            }
        }
    }
    if (tid == 0) atomic_xchg(&counters[tile], 0);
#endif
}
"""
