"""Winograd F(2x2, 3x3) on OpenCL in one launch: ``cl_winograd_fused``.

``cl_winograd`` (:mod:`.winograd`) runs a conv as three launches: the input transform writes
V for every tile and channel, a batched matmul multiplies it by the filters' transform U, and
the output transform reads the product back.  At batch 8-32 the two intermediate tensors are
several times the conv's input and output, and each launch costs host time.  Here one
work-group computes a block of ``TK`` output channels by ``TT`` tiles completely:

- per step of ``CB`` input channels it transforms its tiles' 4x4 input patches into local
  memory (V) and stages the matching block of U (made once per weights, zero-padded to whole
  blocks, so its loads need no bounds);
- each of the 16 transform points has 16 work-items, each accumulating an 8 x 8 block of
  (channel, tile) products of its point in registers, so every value read from local memory
  serves eight multiply-adds;
- after the last step the accumulators go through local memory (half the channels at a time)
  to the work-items that apply the output transform, the bias, the residual and the
  activation, and store the 2 x 2 outputs.

Each output is summed in the same order on every run (no atomics): as reproducible as
``cl_winograd``.  float32 only: float64 doubles the 32 KiB of local memory a group uses.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms._common import ceil_div, round_up
from fastrun_algorithms.conv import winograd
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.conv.opencl import heuristic
from fastrun_algorithms.conv.opencl._kernels import PRELUDE
from fastrun_algorithms.conv.opencl.algorithms import (
    OpenCLConv,
    _epilogue_args,
    _in_output_shape,
    _residual_args,
)
from fastrun_algorithms.conv.opencl.winograd import (
    _Filters,
    _products,
    store_outputs,
    tile_counts,
    transformed_filters,
)

#: Output tile size and transform points (alpha^2) of F(2x2, 3x3).
M, POINTS = 2, 16
#: Output channels and tiles of a work-group, input channels per staged step.
TK, TT, CB = 32, 32, 8
#: Work-items per group: 16 per transform point (a 4 x 4 grid of 8 x 8 blocks of its products).
LOCAL = 256
#: Bytes of local memory a group uses (float32): U's and V's blocks of one step.
LOCAL_BYTES = POINTS * CB * (TK + TT) * 4
#: Work-groups a launch should fill before the heuristic tries this kernel early: two per
#: compute unit of a large GPU, as for ``cl_igemm``.
MIN_GROUPS = heuristic.IGEMM_MIN_GROUPS


@functools.cache
def source() -> str:
    """The program: the filter transform (U, point-major, [point][channel][output channel]
    padded to whole blocks) and the fused kernel, the transforms written out from the
    matrices as :mod:`.winograd` writes them."""
    bt, g, at = winograd.TRANSFORMS[M]
    alpha = M + 2
    filter_rows = _products(g, alpha, 1, "t[{b}][j]", "wk[{i} * 3 + j]")
    filter_cols = _products(g, alpha, alpha, "o[({} * ALPHA + {}) * stride]", "t[{a}][{i}]")
    input_rows = _products(bt, alpha, 1, "e[{b}][j]", "d[{i}][j]")
    input_cols = _products(bt, alpha, alpha, "vs[(({} * ALPHA + {}) * CB + tc) * TT + tl]",
                           "e[{a}][{i}]")
    output_rows = _products(at, M, 1, "f[{b}][j]", "s[{i}][j]", indent=12)
    output_values = _products(at, M, M, "y[{}][{}]", "f[{a}][{i}]", indent=12)
    return PRELUDE + f"""
#define M {M}
#define ALPHA {alpha}
#define POINTS {POINTS}
#define TK {TK}
#define TT {TT}
#define CB {CB}
#define LSIZE {LOCAL}
#define WK 8
#define WT 8
#define TTT (TT / WT)
#define HALF (TK / 2)
#define U_LOADS (POINTS * CB * TK / 4 / LSIZE)

/* U[xi][c][k] = (G w[k][c] G^T)[xi], zero where k >= K or c >= C (the padding of whole
   blocks).  NDRange: (Kp, Cp). */
__kernel void fused_filter(const int K, const int C, const int Kp, const int Cp,
                           __global const real* w, const long w_off, __global real* u) {{
    const int k = get_global_id(0);
    const int c = get_global_id(1);
    const long stride = (long)Cp * Kp;
    __global real* o = u + (long)c * Kp + k;
    if (k >= K || c >= C) {{
        for (int xi = 0; xi < ALPHA * ALPHA; ++xi) o[xi * stride] = (real)0;
        return;
    }}
    __global const real* wk = w + w_off + ((long)k * C + c) * 9;
    real t[ALPHA][3];
    #pragma unroll
    for (int j = 0; j < 3; ++j) {{
{filter_rows}
    }}
    {{
{filter_cols}
    }}
}}

/* out[n][k] for output channels k0.. k0+TK and tiles t0.. t0+TT of a work-group.
   NDRange: (tile blocks * LSIZE, Kp / TK); local (LSIZE, 1). */
__kernel __attribute__((reqd_work_group_size(LSIZE, 1, 1)))
void wino_fused(const int C, const int Cp, const int Kp, const int H, const int W,
                const int TW, const int per, const int tiles, const int pt, const int pl,
                const int K, const int OH, const int OW,
                __global const real* x, const long x_off, __global const real* u,
                __global const real* bias, const long b_off, const int has_bias,
                __global real* out, const long o_off,
                __global const real* z, const long z_off, const int has_z,
                const int act, const real lo, const real hi) {{
    __local real lds[POINTS * CB * (TK + TT)];
    __local real* us = lds;                      /* [point][CB][TK] */
    __local real* vs = lds + POINTS * CB * TK;   /* [point][CB][TT] */
    const int lid = get_local_id(0);
    const int t0 = get_group_id(0) * TT;
    const int k0 = get_group_id(1) * TK;
    /* the products: transform point p, a WK x WT block (kt, tt) of its TK x TT */
    const int p = lid / 16;
    const int kt = (lid % 16) / TTT;
    const int tt = (lid % 16) % TTT;
    /* the input transform: channel tc of each step, tile tl */
    const int tc = lid / TT;
    const int tl = lid % TT;
    const int t = t0 + tl;
    const int n = t / per;
    const int rest = t - n * per;
    const int ty = rest / TW;
    const int y0 = ty * M - pt;
    const int x0 = (rest - ty * TW) * M - pl;
    real acc[WK][WT];
    #pragma unroll
    for (int i = 0; i < WK; ++i) {{
        #pragma unroll
        for (int j = 0; j < WT; ++j) acc[i][j] = (real)0;
    }}
    /* Each step's global reads (U's block as 4-wide vectors, this work-item's input patch of
       channel c0 + tc) go to registers a step ahead, so they are in flight while the
       previous step's products run. */
    float4 ureg[U_LOADS];
    real d[ALPHA][ALPHA];
#define FETCH(c0) do {{ \
        _Pragma("unroll") \
        for (int r = 0; r < U_LOADS; ++r) {{ \
            const int row = (lid + r * LSIZE) / (TK / 4); \
            const int col = (lid + r * LSIZE) - row * (TK / 4); \
            const int xi = row / CB; \
            ureg[r] = vload4(0, u + ((long)xi * Cp + (c0) + row - xi * CB) * Kp + k0 + col * 4); \
        }} \
        const int c_ = (c0) + tc; \
        const bool live_ = t < tiles && c_ < C; \
        __global const real* plane_ = x + x_off + ((long)n * C + c_) * H * W; \
        _Pragma("unroll") \
        for (int i = 0; i < ALPHA; ++i) {{ \
            _Pragma("unroll") \
            for (int j = 0; j < ALPHA; ++j) {{ \
                const int yy = y0 + i, xx = x0 + j; \
                d[i][j] = (live_ && yy >= 0 && yy < H && xx >= 0 && xx < W) \
                    ? plane_[yy * W + xx] : (real)0; \
            }} \
        }} \
    }} while (0)
    FETCH(0);
    for (int c0 = 0; c0 < Cp; c0 += CB) {{
        #pragma unroll
        for (int r = 0; r < U_LOADS; ++r) {{
            const int row = (lid + r * LSIZE) / (TK / 4);
            const int col = (lid + r * LSIZE) - row * (TK / 4);
            vstore4(ureg[r], 0, us + row * TK + col * 4);
        }}
        real e[ALPHA][ALPHA];
        #pragma unroll
        for (int j = 0; j < ALPHA; ++j) {{
{input_rows}
        }}
        {{
{input_cols}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        if (c0 + CB < Cp) FETCH(c0 + CB);
        #pragma unroll
        for (int cc = 0; cc < CB; ++cc) {{
            __local const real* ur = us + (p * CB + cc) * TK + kt * WK;
            __local const real* vr = vs + (p * CB + cc) * TT + tt * WT;
            const float4 a0 = vload4(0, ur), a1 = vload4(1, ur);
            const float4 b0 = vload4(0, vr), b1 = vload4(1, vr);
            const real a[WK] = {{a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w}};
            const real b[WT] = {{b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w}};
            #pragma unroll
            for (int i = 0; i < WK; ++i) {{
                #pragma unroll
                for (int j = 0; j < WT; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
            }}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    /* the output transform, half the group's channels at a time: [point][HALF][TT] */
    for (int part = 0; part < 2; ++part) {{
        if (kt * WK / HALF == part) {{
            #pragma unroll
            for (int i = 0; i < WK; ++i) {{
                #pragma unroll
                for (int j = 0; j < WT; ++j)
                    lds[(p * HALF + kt * WK - part * HALF + i) * TT + tt * WT + j] = acc[i][j];
            }}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int pair = lid; pair < HALF * TT; pair += LSIZE) {{
            const int kk = pair / TT;
            const int tq = pair - kk * TT;
            const int k = k0 + part * HALF + kk;
            const int tile = t0 + tq;
            if (k >= K || tile >= tiles) continue;
            real s[ALPHA][ALPHA];
            #pragma unroll
            for (int i = 0; i < ALPHA; ++i) {{
                #pragma unroll
                for (int j = 0; j < ALPHA; ++j)
                    s[i][j] = lds[((i * ALPHA + j) * HALF + kk) * TT + tq];
            }}
            real f[M][ALPHA];
            #pragma unroll
            for (int j = 0; j < ALPHA; ++j) {{
{output_rows}
            }}
            real y[M][M];
{output_values}
            const int on = tile / per;
            const int orest = tile - on * per;
            const int oty = orest / TW;
            const int oy = oty * M;
            const int ox = (orest - oty * TW) * M;
{store_outputs("on", 12)}        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
}}
"""


class FusedWinogradCLConv(OpenCLConv):
    """Winograd F(2x2, 3x3) in one launch for 3x3 convs with stride 1, dilation 1 and one
    group, float32, any padding and batch (see the module docstring)."""

    name = "cl_winograd_fused"
    takes_residual = True

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.source = source()

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        """Right after ``cl_winograd(m=2)`` where its groups fill a large GPU, else after
        every Winograd (a batch-1 layer leaves most compute units idle)."""
        groups = ceil_div(tile_counts(geo, M)[1] * geo.n, TT) * ceil_div(geo.k, TK)
        return (*heuristic.winograd_rank(geo, {"m": 2}), 0.5 if groups >= MIN_GROUPS else 2)

    def config_unusable_reason(self, problem: Problem) -> str | None:
        if problem.dtypes[0] != "float32":
            return (f"{self.name} computes float32 only ({problem.dtypes[0]} would double "
                    f"its {LOCAL_BYTES // 1024} KiB of local memory per group)")
        return winograd.unusable_reason(self.name, geometry(problem))

    def work_group_size(self) -> int:
        return LOCAL

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        reason = super().device_unusable_reason(device, problem)
        if reason is None and device.local_mem_size < LOCAL_BYTES:
            reason = (f"cl_winograd_fused needs {LOCAL_BYTES} bytes of local memory per "
                      f"group, {device.name} has {device.local_mem_size}")
        return reason

    @staticmethod
    def padded(geo: ConvGeometry) -> tuple[int, int]:
        """(output channels, input channels) of U, rounded up to whole blocks."""
        return round_up(geo.k, TK), round_up(geo.c, CB)

    def workspace_bytes(self, problem: Problem) -> int:
        """U, when the weights are not preprocessed (nothing else: that is the point)."""
        if problem.weight_preprocess:
            return 0
        geo = geometry(problem)
        kp, cp = self.padded(geo)
        return POINTS * kp * cp * geo.itemsize

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> _Filters:
        """The weights, whose transform the first call makes and keeps."""
        return _Filters(inputs[1])

    def _filter(self, device: Any, geo: ConvGeometry, weights: Any) -> Any:
        kp, cp = self.padded(geo)
        u = device.empty((POINTS, cp, kp), np.dtype(geo.dtype))
        w_buf, w_off = common.buffer(weights, "W")
        args = [*map(np.int32, (geo.k, geo.c, kp, cp)), w_buf, w_off, u.base_data]
        device.launch(self.kernel(device, geo, "fused_filter"), args, (kp, cp), (TK, 1))
        return u

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        geo = geometry(problem)
        device, dtype = ctx.device, np.dtype(geo.dtype)
        u = transformed_filters(prepared, inputs[1],
                                lambda weights: self._filter(device, geo, weights))
        across, per = tile_counts(geo, M)
        tiles = geo.n * per
        kp, cp = self.padded(geo)
        out = device.empty((geo.n, geo.k, geo.oh, geo.ow), dtype)
        x_buf, x_off = common.buffer(inputs[0], "X")
        bias, act = _epilogue_args(geo, dtype, inputs, out.base_data)
        residual = _residual_args(geo, inputs, out.base_data)
        ints = [geo.c, cp, kp, geo.h, geo.w, across, per, tiles, geo.pad_top, geo.pad_left,
                geo.k, geo.oh, geo.ow]
        device.launch(self.kernel(device, geo, "wino_fused"),
                      [*map(np.int32, ints), x_buf, x_off, u.base_data, *bias,
                       out.base_data, np.int64(0), *residual, *act],
                      (ceil_div(tiles, TT) * LOCAL, kp // TK), (LOCAL, 1))
        return _in_output_shape(out, geo)


def fused_winograd_algorithms() -> list[Algorithm]:
    return [FusedWinogradCLConv()]
