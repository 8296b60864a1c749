"""Winograd F(m x m, 3 x 3) on OpenCL: ``cl_winograd(m=2)`` and ``cl_winograd(m=4)``.

The same minimal filtering as the CPU's ``winograd_f2x3`` / ``winograd_f4x3``
(:mod:`fastrun_algorithms.conv.winograd`, whose transform matrices these kernels are generated
from): per transform point ``xi`` of the alpha x alpha tiles (alpha = m + 2), the products over
the input channels form one matrix product U[xi] (K x C) @ V[xi] (C x tiles).  So a 3x3 conv
with stride 1 costs alpha^2 / (9 m^2) of the direct method's multiply-adds (F(2,3): 1/2.25,
F(4,3): 1/4), which is how cuDNN beats any direct kernel on ResNet's batch-32 3x3 layers.

Three launches (four without weight preprocessing):

- ``wino_filter``: U = G g G^T for every (output, input) channel pair; with weight
  preprocessing (the runtime's default) made by the first call and kept with the prepared
  weights, so a prepared model pays it once;
- ``wino_input``: V = B^T d B for every tile and channel, zeros where a tile hangs over the
  padding or the image's edge, stored point-major (V[xi] is C x tiles, tiles contiguous, so
  neighbouring work-items store neighbouring values);
- the batched product M = U @ V: a ``matmul`` sub-problem of shape (alpha^2, K, C) @
  (alpha^2, C, tiles), searched among the OpenCL GEMM configurations like im2col's;
- ``wino_output``: A^T M A for every tile and output channel, with the bias, the residual and
  the activation, stored into the NCHW output (the tile's overhang past the edge dropped).

The transforms are generated as straight-line code from the matrices: zero coefficients
dropped, +-1 as additions, every other constant a literal of the element type.  Each value is
computed by one work-item in a fixed order: the same bits on every run, as reproducible as the
product's algorithm.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms._common import ceil_div, round_up
from fastrun_algorithms.conv import winograd
from fastrun_algorithms.conv._gemm_common import matmul_problem
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.conv.opencl import heuristic
from fastrun_algorithms.conv.opencl._kernels import PRELUDE
from fastrun_algorithms.conv.opencl.algorithms import (
    OpenCLConv,
    _epilogue_args,
    _in_output_shape,
    _residual_args,
)

#: Work-items per group of the transform kernels, along the tiles (one channel per row).
LOCAL = 64


def _combination(coefficients: Sequence[float], operand: Callable[[int], str]) -> str:
    """``sum(c * operand(i))`` as an OpenCL expression: zero terms dropped, +-1 without a
    multiplication, other constants as literals of the element type."""
    terms = []
    for index, c in enumerate(coefficients):
        if c == 0:
            continue
        value = operand(index)
        if c in (1, -1):
            terms.append(("+ " if c > 0 else "- ") + value)
        else:
            terms.append(f"+ (real)({float(c)!r}) * {value}")
    text = " ".join(terms) or "+ (real)0"
    return "(" + (text[2:] if text.startswith("+") else "-" + text[2:]) + ")"


def _products(matrix: Sequence[Sequence[float]], rows: int, outer: int, target: str,
              operand: str, indent: int = 8) -> str:
    """Statements ``target(a, b) = sum_i matrix[b][i] * operand(a, i)`` for a < ``outer`` and
    b < ``rows``: one matrix applied to each of ``outer`` vectors.  ``target`` takes a and b
    as positional ``{}`` or b as ``{b}``; ``operand`` takes ``{a}`` and ``{i}``."""
    lines = []
    for a in range(outer):
        for b in range(rows):
            left = target.format(a, b, b=b)
            right = _combination(matrix[b], lambda i, a=a: operand.format(a=a, i=i))
            lines.append(f"{' ' * indent}{left} = {right};")
    return "\n".join(lines)


def store_outputs(image: str, indent: int) -> str:
    """OpenCL statements that store a tile's outputs ``y[M][M]`` of output channel ``k`` at
    (``oy``, ``ox``) of image ``image``: the bias, the residual and the activation applied,
    the overhang past the output's edge dropped.  Shared by both Winograd programs."""
    text = f"""const real b = has_bias ? bias[b_off + k] : (real)0;
const long base = ((long){image} * K + k) * OH * OW;
#pragma unroll
for (int r = 0; r < M; ++r) {{
    #pragma unroll
    for (int q = 0; q < M; ++q) {{
        if (oy + r < OH && ox + q < OW) {{
            const long at = base + (long)(oy + r) * OW + ox + q;
            out[o_off + at] = conv_epilogue(
                y[r][q] + b + (has_z ? z[z_off + at] : (real)0), act, lo, hi);
        }}
    }}
}}"""
    return "\n".join(" " * indent + line for line in text.splitlines()) + "\n"


@functools.cache
def source(m: int) -> str:
    """The program of F(m x m, 3 x 3): its three kernels with the transforms written out."""
    bt, g, at = winograd.TRANSFORMS[m]
    alpha = m + 2
    point = "o[({} * ALPHA + {}) * stride]"  # value (a, b) of a transformed tile, point-major
    # filter: t = G w (alpha x 3) down each column j, then u = t G^T (alpha x alpha)
    filter_rows = _products(g, alpha, 1, "t[{b}][j]", "wk[{i} * 3 + j]")
    filter_cols = _products(g, alpha, alpha, point, "t[{a}][{i}]")
    # input: e = B^T d down each column j, then v = e B
    input_rows = _products(bt, alpha, 1, "e[{b}][j]", "d[{i}][j]")
    input_cols = _products(bt, alpha, alpha, point, "e[{a}][{i}]")
    # output: f = A^T s (m x alpha) down each column j, then y = f A (m x m)
    output_rows = _products(at, m, 1, "f[{b}][j]", "s[{i}][j]")
    output_values = _products(at, m, m, "y[{}][{}]", "f[{a}][{i}]", indent=4)
    return PRELUDE + f"""
#define M {m}
#define ALPHA {alpha}

/* U[xi][k][c] = (G w[k][c] G^T)[xi].  NDRange: (C rounded up, K). */
__kernel void wino_filter(const int K, const int C, __global const real* w, const long w_off,
                          __global real* u) {{
    const int c = get_global_id(0);
    const int k = get_global_id(1);
    if (c >= C) return;
    __global const real* wk = w + w_off + ((long)k * C + c) * 9;
    real t[ALPHA][3];
    #pragma unroll
    for (int j = 0; j < 3; ++j) {{
{filter_rows}
    }}
    const long stride = (long)K * C;
    __global real* o = u + (long)k * C + c;
    {{
{filter_cols}
    }}
}}

/* V[xi][c][t] = (B^T d B)[xi] for tile t (image, tile row, tile column) of channel c.
   NDRange: (tiles rounded up, C). */
__kernel void wino_input(const int C, const int H, const int W, const int TW, const int per,
                         const int tiles, const int pt, const int pl,
                         __global const real* x, const long x_off, __global real* v) {{
    const int t = get_global_id(0);
    const int c = get_global_id(1);
    if (t >= tiles) return;
    const int n = t / per;
    const int rest = t - n * per;
    const int ty = rest / TW;
    const int y0 = ty * M - pt;
    const int x0 = (rest - ty * TW) * M - pl;
    __global const real* plane = x + x_off + ((long)n * C + c) * H * W;
    real d[ALPHA][ALPHA];
    #pragma unroll
    for (int i = 0; i < ALPHA; ++i) {{
        const int y = y0 + i;
        #pragma unroll
        for (int j = 0; j < ALPHA; ++j) {{
            const int xx = x0 + j;
            d[i][j] = (y >= 0 && y < H && xx >= 0 && xx < W) ? plane[y * W + xx] : (real)0;
        }}
    }}
    real e[ALPHA][ALPHA];
    #pragma unroll
    for (int j = 0; j < ALPHA; ++j) {{
{input_rows}
    }}
    const long stride = (long)C * tiles;
    __global real* o = v + (long)c * tiles + t;
    {{
{input_cols}
    }}
}}

/* out[n][k][y][x] = act((A^T M[.][k][t] A)[y][x] + bias[k] + z[n][k][y][x]) for tile t.
   NDRange: (tiles rounded up, K). */
__kernel void wino_output(const int K, const int OH, const int OW, const int TW, const int per,
                          const int tiles, __global const real* mm, const long m_off,
                          __global const real* bias, const long b_off, const int has_bias,
                          __global real* out, const long o_off,
                          __global const real* z, const long z_off, const int has_z,
                          const int act, const real lo, const real hi) {{
    const int t = get_global_id(0);
    const int k = get_global_id(1);
    if (t >= tiles) return;
    const int n = t / per;
    const int rest = t - n * per;
    const int ty = rest / TW;
    const int oy = ty * M;
    const int ox = (rest - ty * TW) * M;
    const long stride = (long)K * tiles;
    __global const real* src = mm + m_off + (long)k * tiles + t;
    real s[ALPHA][ALPHA];
    #pragma unroll
    for (int i = 0; i < ALPHA; ++i) {{
        #pragma unroll
        for (int j = 0; j < ALPHA; ++j) s[i][j] = src[(i * ALPHA + j) * stride];
    }}
    real f[M][ALPHA];
    #pragma unroll
    for (int j = 0; j < ALPHA; ++j) {{
{output_rows}
    }}
    real y[M][M];
{output_values}
{store_outputs("n", 4)}}}
"""


class _Filters:
    """Preprocessed weights: the weights, and their transform U once a call has made it."""

    def __init__(self, weights: Any):
        self.weights = weights
        self.u: Any = None


def transformed_filters(prepared: _Filters | None, weights: Any,
                        make: Callable[[Any], Any]) -> Any:
    """U for this call: made from ``weights`` now without preprocessing, else made by the
    first call from the prepared weights and kept with them."""
    if prepared is None:
        return make(weights)
    if prepared.u is None:
        prepared.u = make(prepared.weights)
    return prepared.u


def tile_counts(geo: ConvGeometry, m: int) -> tuple[int, int]:
    """(tile columns per image row of tiles, tiles per image) of m x m output tiles."""
    across = ceil_div(geo.ow, m)
    return across, ceil_div(geo.oh, m) * across


class WinogradCLConv(OpenCLConv):
    """Winograd F(m x m, 3 x 3) for 3x3 convs with stride 1, dilation 1 and one group, any
    padding and batch; ``param``: ``m`` (2 or 4), the output tile size.  F(4,3) does 1.8x
    fewer products than F(2,3) but rounds more (still within the float32 tolerance, as on the
    CPU) and its 4x4 tiles overhang small images more."""

    name = "cl_winograd"
    takes_residual = True
    sub_operators = ("matmul",)

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.m = int(self.param["m"])
        self.alpha = self.m + 2
        self.source = source(self.m)

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return heuristic.winograd_rank(geo, self.param)

    def config_unusable_reason(self, problem: Problem) -> str | None:
        return winograd.unusable_reason(self.name, geometry(problem))

    def tiles(self, geo: ConvGeometry) -> tuple[int, int]:
        """(tile columns per image row of tiles, tiles per image)."""
        return tile_counts(geo, self.m)

    def shapes(self, geo: ConvGeometry) -> tuple[tuple[int, ...], ...]:
        """U (alpha^2, K, C), V (alpha^2, C, tiles) and the product (alpha^2, K, tiles)."""
        points, tiles = self.alpha * self.alpha, geo.n * self.tiles(geo)[1]
        return (points, geo.k, geo.c), (points, geo.c, tiles), (points, geo.k, tiles)

    def _product(self, problem: Problem) -> Problem:
        u, v, _ = self.shapes(geometry(problem))
        return matmul_problem(u, v, problem.dtypes[0])

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        return [self._product(problem)]

    def workspace_bytes(self, problem: Problem) -> int:
        """V and the product, and U when the weights are not preprocessed (all live at the
        product's call)."""
        geo = geometry(problem)
        u, v, product = (int(np.prod(shape)) for shape in self.shapes(geo))
        held = v + product + (0 if problem.weight_preprocess else u)
        return held * geo.itemsize

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> _Filters:
        """The weights, whose transform U the first call makes and keeps (the device to make
        it on comes with the call)."""
        return _Filters(inputs[1])

    def _filter(self, device: Any, geo: ConvGeometry, weights: Any) -> Any:
        u = device.empty(self.shapes(geo)[0], np.dtype(geo.dtype))
        w_buf, w_off = common.buffer(weights, "W")
        args = [np.int32(geo.k), np.int32(geo.c), w_buf, w_off, u.base_data]
        device.launch(self.kernel(device, geo, "wino_filter"), args,
                      (round_up(geo.c, LOCAL), geo.k), (LOCAL, 1))
        return u

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        geo = geometry(problem)
        device, dtype = ctx.device, np.dtype(geo.dtype)
        _, v_shape, _ = self.shapes(geo)
        across, per = self.tiles(geo)
        tiles = geo.n * per
        u = transformed_filters(prepared, inputs[1],
                                lambda weights: self._filter(device, geo, weights))
        v = device.empty(v_shape, dtype)
        x_buf, x_off = common.buffer(inputs[0], "X")
        ints = [geo.c, geo.h, geo.w, across, per, tiles, geo.pad_top, geo.pad_left]
        device.launch(self.kernel(device, geo, "wino_input"),
                      [*map(np.int32, ints), x_buf, x_off, v.base_data],
                      (round_up(tiles, LOCAL), geo.c), (LOCAL, 1))
        product = ctx.call(self._product(problem), u, v)
        out = device.empty((geo.n, geo.k, geo.oh, geo.ow), dtype)
        m_buf, m_off = common.buffer(product, "product")
        bias, act = _epilogue_args(geo, dtype, inputs, out.base_data)
        residual = _residual_args(geo, inputs, out.base_data)
        ints = [geo.k, geo.oh, geo.ow, across, per, tiles]
        device.launch(self.kernel(device, geo, "wino_output"),
                      [*map(np.int32, ints), m_buf, m_off, *bias, out.base_data, np.int64(0),
                       *residual, *act],
                      (round_up(tiles, LOCAL), geo.k), (LOCAL, 1))
        return _in_output_shape(out, geo)


def winograd_algorithms() -> list[Algorithm]:
    return [WinogradCLConv({"m": 2}), WinogradCLConv({"m": 4})]
