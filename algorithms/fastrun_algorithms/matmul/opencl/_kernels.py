"""OpenCL C source of the matmul kernels (text only: importing this needs no OpenCL).

Every kernel computes ``C[p] = A[p] @ B[p]`` for row-major ``A (M x K)``, ``B (K x N)`` and
``C (M x N)``.  Buffers are passed with an element offset (pyopencl arrays can start inside a
buffer) and a batch stride (0 for an operand broadcast over the batch), so one launch covers the
whole batch through the third NDRange dimension.  Configuration values arrive as ``-D`` build
options, so each configuration is its own program with its loops fully unrolled, and the
device layer caches the build per (source, options, device, driver).
"""

from __future__ import annotations

#: Scalar and vector types for float32 or float64 (``-D REAL_DOUBLE=1``), and ``VW``-wide
#: loads/stores that need only element alignment (vloadN/vstoreN).
COMMON = r"""
#if REAL_DOUBLE
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double real;
typedef double2 real2;
typedef double4 real4;
#else
typedef float real;
typedef float2 real2;
typedef float4 real4;
#endif

#ifndef VW
#define VW 1
#endif
#if VW == 1
typedef real realV;
#define LOADV(p) (*(p))
#define STOREV(v, p) (*(p) = (v))
#elif VW == 2
typedef real2 realV;
#define LOADV(p) vload2(0, (p))
#define STOREV(v, p) vstore2((v), 0, (p))
#elif VW == 4
typedef real4 realV;
#define LOADV(p) vload4(0, (p))
#define STOREV(v, p) vstore4((v), 0, (p))
#else
#error "VW must be 1, 2 or 4"
#endif
"""

#: One work-item per output element, driver-chosen local size: the simplest correct kernel,
#: the baseline the others are measured against.
NAIVE = COMMON + r"""
__kernel void mm_naive(const int M, const int N, const int K,
                       __global const real* restrict A, const long a_off, const long a_bs,
                       __global const real* restrict B, const long b_off, const long b_bs,
                       __global real* restrict C, const long c_off)
{
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    const long p = get_global_id(2);
    if (m >= M || n >= N) return;
    const __global real* a = A + a_off + p * a_bs + (long)m * K;
    const __global real* b = B + b_off + p * b_bs + n;
    real acc = 0;
    for (int k = 0; k < K; ++k) acc += a[k] * b[(long)k * N];
    C[c_off + p * M * N + (long)m * N + n] = acc;
}
"""

#: Square TS x TS tiles of A and B staged in local memory, one output per work-item; edges are
#: handled by loading zeros, so no padded copies are needed.  The +1 column keeps the
#: transposed reads of As free of local-memory bank conflicts.
TILED = COMMON + r"""
__kernel __attribute__((reqd_work_group_size(TS, TS, 1)))
void mm_tiled(const int M, const int N, const int K,
              __global const real* restrict A, const long a_off, const long a_bs,
              __global const real* restrict B, const long b_off, const long b_bs,
              __global real* restrict C, const long c_off)
{
    __local real As[TS][TS + 1];
    __local real Bs[TS][TS + 1];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int n = get_group_id(0) * TS + tx;
    const int m = get_group_id(1) * TS + ty;
    const long p = get_global_id(2);
    const __global real* a = A + a_off + p * a_bs;
    const __global real* b = B + b_off + p * b_bs;
    real acc = 0;
    for (int k0 = 0; k0 < K; k0 += TS) {
        As[ty][tx] = (m < M && k0 + tx < K) ? a[(long)m * K + k0 + tx] : (real)0;
        Bs[ty][tx] = (k0 + ty < K && n < N) ? b[(long)(k0 + ty) * N + n] : (real)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int k = 0; k < TS; ++k) acc += As[ty][k] * Bs[k][tx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (m < M && n < N) C[c_off + p * M * N + (long)m * N + n] = acc;
}
"""

#: WM x WN outputs per work-item straight from global memory, no local memory and no padding:
#: out-of-range rows and columns read a clamped (valid) element and are simply not stored, so
#: the inner loop has no branches.  For small, skinny or odd shapes, where tiling and padding
#: cost more than they save.
DIRECT = COMMON + r"""
__kernel void mm_direct(const int M, const int N, const int K,
                        __global const real* restrict A, const long a_off, const long a_bs,
                        __global const real* restrict B, const long b_off, const long b_bs,
                        __global real* restrict C, const long c_off)
{
    const int n0 = get_global_id(0) * WN;
    const int m0 = get_global_id(1) * WM;
    const long p = get_global_id(2);
    if (m0 >= M || n0 >= N) return;
    const __global real* a = A + a_off + p * a_bs;
    const __global real* b = B + b_off + p * b_bs;
    __global real* c = C + c_off + p * M * N;
    int rows[WM];
    int cols[WN];
    #pragma unroll
    for (int i = 0; i < WM; ++i) rows[i] = min(m0 + i, M - 1);
    #pragma unroll
    for (int j = 0; j < WN; ++j) cols[j] = min(n0 + j, N - 1);
    real acc[WM][WN];
    #pragma unroll
    for (int i = 0; i < WM; ++i) {
        #pragma unroll
        for (int j = 0; j < WN; ++j) acc[i][j] = 0;
    }
    for (int k = 0; k < K; ++k) {
        real av[WM];
        real bv[WN];
        #pragma unroll
        for (int i = 0; i < WM; ++i) av[i] = a[(long)rows[i] * K + k];
        #pragma unroll
        for (int j = 0; j < WN; ++j) bv[j] = b[(long)k * N + cols[j]];
        #pragma unroll
        for (int i = 0; i < WM; ++i) {
            #pragma unroll
            for (int j = 0; j < WN; ++j) acc[i][j] += av[i] * bv[j];
        }
    }
    #pragma unroll
    for (int i = 0; i < WM; ++i) {
        #pragma unroll
        for (int j = 0; j < WN; ++j) {
            if (m0 + i < M && n0 + j < N) c[(long)(m0 + i) * N + n0 + j] = acc[i][j];
        }
    }
}
"""

#: The register-tiled kernel.  A work-group of NDIMC x MDIMC work-items computes an MWG x NWG
#: tile of C.  Columns: work-item (tx, ty) owns NWI = NWG/NDIMC columns in VW-wide vectors
#: (tx*VW, tx*VW + NDIMC*VW, ...), so neighbouring work-items touch neighbouring vectors:
#: coalesced global loads and stores, conflict-free local reads.  Rows: MWI = MWG/MDIMC rows in
#: VWM-wide groups (ty*VWM, ty*VWM + MDIMC*VWM, ...); VWM is VW when A is staged and the rows
#: split that way, else 1, so that a staged A column is read from local memory as vectors too
#: (per k a work-item issues MWI/VWM + NWI/VW local loads for MWI x NWI multiply-adds).
#: K advances KWG at a time; with SA (SB) the A (B) tile of that step is first copied
#: cooperatively into local memory (A transposed to k-major, so the inner loop reads a column
#: of it as consecutive words; each row is padded by one vector so that the transposing stores
#: spread over the banks), without it the inner loop reads global memory directly (better where
#: local memory is emulated or the cache already does the job).  With DB (both tiles staged)
#: local memory is double-buffered and the next step's tile is prefetched into registers while
#: the current one is multiplied: one barrier per step, and the global-load latency hides
#: behind the arithmetic.  Edges: the launch covers M, N and K rounded up to the tile (M, N, K);
#: the operands are MR x KR and KR x NR.  With EDGE_M (EDGE_N) rows (column vectors) past them
#: read the last real ones again (clamped, so no address leaves the operand) and are not
#: stored; with EDGE_K depths past KR read zeros.  So a product whose sizes are no tile
#: multiple (197 tokens in a ViT) needs no padded copies, whose extra launches cost more than
#: the product on a GPU; the host pads only a K or N that is no multiple of VW (a vector must
#: not straddle the edge).  The switches are build options, set only for the dimensions that
#: need them: an aligned product runs the kernel without a clamp or a select (they cost the
#: 128 x 128 tile a quarter of its speed at 4096).
GEMM = COMMON + r"""
#define MWI (MWG / MDIMC)
#define NWI (NWG / NDIMC)
#define NVW (NWI / VW)
#define THREADS (MDIMC * NDIMC)
#define A_LOADS ((MWG * KWG / VW) / THREADS)
#define B_LOADS ((KWG * NWG / VW) / THREADS)
#ifndef DB
#define DB 0
#endif
#if SA && (MWG % (MDIMC * VW) == 0)
#define VWM VW
#else
#define VWM 1
#endif
#define MVW (MWI / VWM)
#if VWM == 1
typedef real realM;
#elif VWM == 2
typedef real2 realM;
#else
typedef real4 realM;
#endif
/* Row of C (within the tile) of this work-item's ii-th row. */
#define ROW(ii) ((((ii) / VWM) * MDIMC + ty) * VWM + (ii) % VWM)
/* A's local row length (k-major): MWG words plus one vector of padding. */
#define AROW (MWG / VWM + 1)

/* Scatter the VW words of v into rows kk, kk+1, ... of the k-major local A tile s. */
#if VW == 1
#define STORE_AT(s, kk, mm, v) (s)[(kk) * AROW * VWM + (mm)] = (v)
#elif VW == 2
#define STORE_AT(s, kk, mm, v) { (s)[(kk) * AROW * VWM + (mm)] = (v).s0; \
    (s)[((kk) + 1) * AROW * VWM + (mm)] = (v).s1; }
#else
#define STORE_AT(s, kk, mm, v) { (s)[(kk) * AROW * VWM + (mm)] = (v).s0; \
    (s)[((kk) + 1) * AROW * VWM + (mm)] = (v).s1; \
    (s)[((kk) + 2) * AROW * VWM + (mm)] = (v).s2; \
    (s)[((kk) + 3) * AROW * VWM + (mm)] = (v).s3; }
#endif
#ifndef EDGE_M
#define EDGE_M 0
#endif
#ifndef EDGE_N
#define EDGE_N 0
#endif
#ifndef EDGE_K
#define EDGE_K 0
#endif
#if EDGE_M
#define A_ROW(row) min((row), mlast)
#define ROW_STORED(row) ((row) <= mlast)
#else
#define A_ROW(row) (row)
#define ROW_STORED(row) 1
#endif
#if EDGE_N
#define B_COL(col) min((col), nlast)
#define COL_STORED(col) ((col) <= nlast)
#else
#define B_COL(col) (col)
#define COL_STORED(col) 1
#endif
#if EDGE_K
#define K_REAL(k) ((k) < KR)
#else
#define K_REAL(k) 1
#endif
/* A's VW-wide vector at row `row`, depth k0 + kk, and B's at depth k0 + kk, column `col`,
 * read kk past a and b (the double-buffered loop moves a and b to each step's depth k0; the
 * other loops leave them at depth 0 and pass k0 = 0): zero at a depth past KR. */
#define LOAD_A(row, kk, k0) (K_REAL((k0) + (kk)) ? LOADV(a + (long)A_ROW(row) * KR + (kk)) \
                                                  : (realV)(0))
#define LOAD_B(kk, col, k0) (K_REAL((k0) + (kk)) ? LOADV(b + (long)(kk) * NR + B_COL(col)) \
                                                  : (realV)(0))
/* Unpack a VWM-wide local read of A into the scalars av[i*VWM ...]. */
#if VWM == 1
#define UNPACK_A(av, i, v) av[(i)] = (v)
#elif VWM == 2
#define UNPACK_A(av, i, v) { av[2 * (i)] = (v).s0; av[2 * (i) + 1] = (v).s1; }
#else
#define UNPACK_A(av, i, v) { av[4 * (i)] = (v).s0; av[4 * (i) + 1] = (v).s1; \
    av[4 * (i) + 2] = (v).s2; av[4 * (i) + 3] = (v).s3; }
#endif

__kernel __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
void mm_gemm(const int M, const int N, const int K, const int MR, const int NR, const int KR,
             __global const real* restrict A, const long a_off, const long a_bs,
             __global const real* restrict B, const long b_off, const long b_bs,
             __global real* restrict C, const long c_off, const long c_bs,
             const int kchunk, const int slices, __global real* part,
             __global volatile int* counters)
{
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int m0 = get_group_id(1) * MWG;
    const int n0 = get_group_id(0) * NWG;
#if SPLIT_K
    /* Work-group z sums slice s of the reduction for batch entry p. */
    const long zz = get_group_id(2);
    const long p = zz / slices;
    const int s = (int)(zz - p * slices);
    const int kbeg = s * kchunk;
    const int kend = min(K, kbeg + kchunk);
    __local int last_slice;
#else
    const long p = get_group_id(2);
    const int kbeg = 0;
    const int kend = K;
#endif
    const __global real* a = A + a_off + p * a_bs + (long)m0 * KR;
    const __global real* b = B + b_off + p * b_bs + n0;
    __global real* c = C + c_off + p * c_bs + (long)m0 * NR + n0;
    /* The tile's last real row and column vector (edges only read them again). */
    const int mlast = MR - 1 - m0;
    const int nlast = NR - VW - n0;
#if SA || SB
    const int tid = ty * NDIMC + tx;
#endif
#if SA
    __local realM Alm[DB + 1][KWG][AROW];
#endif
#if SB
    __local realV Blm[DB + 1][KWG][NWG / VW];
#endif
    realV acc[MWI][NVW];
    #pragma unroll
    for (int i = 0; i < MWI; ++i) {
        #pragma unroll
        for (int j = 0; j < NVW; ++j) acc[i][j] = (realV)(0);
    }
#if DB
    /* Each step first stores the tile its registers hold (loaded during the previous step)
     * into buffer buf, then loads the next tile into registers and multiplies buffer buf.
     * Buffer buf was last read two steps ago, before the previous step's barrier, so one
     * barrier per step suffices. */
    realV ra[A_LOADS];
    realV rb[B_LOADS];
    /* This work-item's share of the tiles at a and b, into registers. */
    /* a and b point at the tile of depth kt */
#define LOAD_TILES_TO_REGISTERS(kt)                                                    \
    do {                                                                               \
        _Pragma("unroll")                                                              \
        for (int l = 0; l < A_LOADS; ++l) {                                            \
            const int r = tid + l * THREADS;                                           \
            ra[l] = LOAD_A(r / (KWG / VW), (r % (KWG / VW)) * VW, (kt));               \
        }                                                                              \
        _Pragma("unroll")                                                              \
        for (int l = 0; l < B_LOADS; ++l) {                                            \
            const int r = tid + l * THREADS;                                           \
            rb[l] = LOAD_B(r / (NWG / VW), (r % (NWG / VW)) * VW, (kt));               \
        }                                                                              \
    } while (0)
    a += kbeg;
    b += (long)kbeg * NR;
    LOAD_TILES_TO_REGISTERS(kbeg);
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += KWG) {
        {
            __local real* as = (__local real*)&Alm[buf][0][0];
            #pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                const int r = tid + l * THREADS;
                STORE_AT(as, (r % (KWG / VW)) * VW, r / (KWG / VW), ra[l]);
            }
            #pragma unroll
            for (int l = 0; l < B_LOADS; ++l) {
                const int r = tid + l * THREADS;
                Blm[buf][r / (NWG / VW)][r % (NWG / VW)] = rb[l];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + KWG < kend) {
            a += KWG;
            b += (long)KWG * NR;
            LOAD_TILES_TO_REGISTERS(k0 + KWG);
        }
        __local const realM (*As)[AROW] = Alm[buf];
        __local const realV (*Bs)[NWG / VW] = Blm[buf];
#else
    for (int k0 = kbeg; k0 < kend; k0 += KWG) {
#if SA
        {
            __local real* as = (__local real*)&Alm[0][0][0];
            #pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                const int r = tid + l * THREADS;
                const int mm = r / (KWG / VW);
                const int kk = (r % (KWG / VW)) * VW;
                const realV v = LOAD_A(mm, k0 + kk, 0);
                STORE_AT(as, kk, mm, v);
            }
        }
        __local const realM (*As)[AROW] = Alm[0];
#endif
#if SB
        #pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const int r = tid + l * THREADS;
            const int kk = r / (NWG / VW);
            const int nv = r % (NWG / VW);
            Blm[0][kk][nv] = LOAD_B(k0 + kk, nv * VW, 0);
        }
        __local const realV (*Bs)[NWG / VW] = Blm[0];
#endif
#if SA || SB
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
#endif
        #pragma unroll
        for (int k = 0; k < KWG; ++k) {
            real av[MWI];
            realV bv[NVW];
#if SA
            #pragma unroll
            for (int i = 0; i < MVW; ++i) {
                const realM v = As[k][i * MDIMC + ty];
                UNPACK_A(av, i, v);
            }
#else
            #pragma unroll
            for (int i = 0; i < MWI; ++i) {
                av[i] = K_REAL(k0 + k) ? a[(long)A_ROW(ROW(i)) * KR + k0 + k] : (real)0;
            }
#endif
            #pragma unroll
            for (int j = 0; j < NVW; ++j) {
#if SB
                bv[j] = Bs[k][j * NDIMC + tx];
#else
                bv[j] = LOAD_B(k0 + k, (j * NDIMC + tx) * VW, 0);
#endif
            }
            #pragma unroll
            for (int i = 0; i < MWI; ++i) {
                #pragma unroll
                for (int j = 0; j < NVW; ++j) acc[i][j] += av[i] * bv[j];
            }
        }
#if DB
        buf ^= 1;
#elif SA || SB
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
#if !SPLIT_K
    #pragma unroll
    for (int i = 0; i < MWI; ++i) {
        if (!ROW_STORED(ROW(i))) continue;
        #pragma unroll
        for (int j = 0; j < NVW; ++j) {
            const int col = (j * NDIMC + tx) * VW;
            if (COL_STORED(col)) STOREV(acc[i][j], c + (long)ROW(i) * NR + col);
        }
    }
#else
    /* The slice's partial tile, then the last slice of the tile to finish adds them all in
       order (0, 1, ...) into C and sets the tile's counter back to zero: see conv_igemm. */
    const long plane = (long)M * N;
    __global real* mine = part + zz * plane + (long)m0 * N + n0;
    #pragma unroll
    for (int i = 0; i < MWI; ++i) {
        #pragma unroll
        for (int j = 0; j < NVW; ++j) {
            STOREV(acc[i][j], mine + (long)ROW(i) * N + (j * NDIMC + tx) * VW);
        }
    }
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    barrier(CLK_GLOBAL_MEM_FENCE);
    const int tile = (int)((p * get_num_groups(1) + get_group_id(1)) * get_num_groups(0)
                           + get_group_id(0));
    if (ty == 0 && tx == 0) last_slice = atomic_inc(&counters[tile]) == slices - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last_slice) return;
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    const __global real* first = part + p * slices * plane + (long)m0 * N + n0;
    #pragma unroll
    for (int i = 0; i < MWI; ++i) {
        if (!ROW_STORED(ROW(i))) continue;
        #pragma unroll
        for (int j = 0; j < NVW; ++j) {
            const int col = (j * NDIMC + tx) * VW;
            if (!COL_STORED(col)) continue;
            const long at = (long)ROW(i) * N + col;
            realV sum = LOADV(first + at);
            for (int t = 1; t < slices; ++t) sum += LOADV(first + t * plane + at);
            STOREV(sum, c + (long)ROW(i) * NR + col);
        }
    }
    if (ty == 0 && tx == 0) atomic_xchg(&counters[tile], 0);
#endif
}
"""

#: Copies between an operand and its zero-padded, tile-multiple copy for ``mm_gemm`` (built
#: into the same program, so one build serves a configuration).  ``rows`` x ``cols`` is the
#: real matrix, ``prows`` x ``pcols`` the padded one; the launch covers the padded (pad) or the
#: real (unpad) extent exactly, with the batch in the third dimension.
PAD = r"""
__kernel void pad_copy(const int rows, const int cols,
                       __global const real* restrict src, const long s_off, const long s_bs,
                       const int prows, const int pcols, __global real* restrict dst)
{
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const long p = get_global_id(2);
    const real v = (row < rows && col < cols)
        ? src[s_off + p * s_bs + (long)row * cols + col] : (real)0;
    dst[p * prows * pcols + (long)row * pcols + col] = v;
}

__kernel void unpad_copy(const int rows, const int cols,
                         __global const real* restrict src, const int prows, const int pcols,
                         __global real* restrict dst, const long d_off)
{
    const int col = get_global_id(0);
    const int row = get_global_id(1);
    const long p = get_global_id(2);
    dst[d_off + p * rows * cols + (long)row * cols + col] =
        src[p * prows * pcols + (long)row * pcols + col];
}
"""

#: The ``cl_gemm`` program: the kernel and its padding copies.
GEMM_PROGRAM = GEMM + PAD
