"""1x1 convolution as register tiles of 8 output channels x 32 pixels (3 x 32 on AVX2), read in
place.

Why it exists.  A 1x1 convolution is the product (K, C) @ (C, H*W) per image, but MobileNet's
are awkward products for a BLAS: few input channels (16 to 192) make the sum too short to pay
for packing the operands, and the bias and activation then take a pass of their own.  Here no
operand is packed or copied: for every input channel a job broadcasts 8 weights, loads 32
consecutive pixels of that channel (two AVX-512 vectors of float32) and does 16 vector
multiply-adds into a tile held in registers (a stack buffer,
:func:`fastrun_algorithms._common.stack_buffer`); the epilogue (bias, residual, activation) is
applied as the tile is stored with whole-vector stores into the NCHW output.  Sixteen
accumulators keep both multiply-add units of a core busy through their latency with 10 loads
per 16 multiply-adds (a 6-channel tile measured the same or up to 20% slower).  With AVX2's 16
registers the tile is 3 channels x 32 pixels (``_common.three_row_tile``): 12 accumulators,
3 broadcasts and one input vector at a time fill the 16 registers, for four loads and three
broadcasts per twelve multiply-adds; on MobileNet's and ShuffleNet's 1x1 layers on the 2-core
AVX2 VM it took 0.69-1.07 of the time of the 4 x 16 tile of
:func:`fastrun_algorithms._common.register_tile` (0.80 summed over 14 layers, the two
interleaved in one process).  None, relu and clip are applied as the tile is stored with
selects (``epilogue.clamp``), so that the store loop is a vector loop.

On MobileNetV2's 1x1 layers on 2 cores (AMD Zen 5) it took 0.51-0.82 of the time of the best
other algorithm (16->96 at 112x112: 179 against ``pointwise``'s 255 us; 32->16 at 112x112:
51 against 87 us; 576->96 at 14x14 tied with ``blocked_direct``).

Edges.  The last pixel tile is shifted back to end at the last pixel, overlapping the one before
it (computed twice, identically); planes narrower than a tile take a plain loop.  Output
channels past a multiple of the tile's rows repeat the last channel and are not stored.

Strided layers (ResNet's downsampling 1x1 convolutions, stride 2, no padding) first gather
the pixels they read into a dense (C, OH*OW) block, kept between calls (:class:`ScratchPool`),
with a parallel copy of contiguous rows; the tiles then read that block as they read a stride-1
input.  The gather moves a quarter of the input once; reading the strided pixels from within
the tile loop would cost a gather per vector for every output channel tile.

Float32 only (a tile of float64 would not fit the registers).  REPRODUCIBLE: every output is
summed in channel order by one job, with FMA contraction only, whatever the thread count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import prange, types

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms._common import (
    CACHE,
    FASTMATH,
    PARTS_PER_THREAD,
    RunsThroughBind,
    ScratchPool,
    U,
    register_tile,
    stack_buffer,
    thread_count,
    three_row_tile,
    tile_fma3,
    tile_fma8,
    tile_rows8,
    vector_registers,
)
from fastrun_algorithms.conv import heuristic
from fastrun_algorithms.conv._gemm_common import buffer, item_type, no_bias, operands, readonly
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import (
    bounds,
    epilogue_args,
    residual_operand,
    store_tile,
)
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry

#: Output channels and pixels of one job's tile: 8 x 32 where there are 32 vector registers
#: (:func:`fastrun_algorithms._common.register_tile`), else 3 channels x four vectors
#: (:func:`fastrun_algorithms._common.three_row_tile`).
MR, NR = register_tile(32) if vector_registers()[0] >= 32 else three_row_tile()
#: Elements of the tile: a global, so that numba sees the literal the stack buffer needs.
TILE = MR * NR


@numba.njit(inline="always")
def _channel_step(acc, x, w, n, c, p0, width, r0, r1, r2, r3, r4, r5, r6, r7):
    """One input channel's multiply-adds into the tile (MR rows, ``width`` columns)."""
    if MR == 8:
        w0, w1, w2, w3 = w[r0, c], w[r1, c], w[r2, c], w[r3, c]
        w4, w5, w6, w7 = w[r4, c], w[r5, c], w[r6, c], w[r7, c]
        for t in range(width):
            tile_fma8(acc, t, x[n, c, p0 + U(t)], w0, w1, w2, w3, w4, w5, w6, w7)
    else:
        w0, w1, w2 = w[r0, c], w[r1, c], w[r2, c]
        for t in range(width):
            tile_fma3(acc, t, x[n, c, p0 + U(t)], w0, w1, w2)


def _tiled_kernel(x: np.ndarray, w: np.ndarray, bias: np.ndarray, has_bias: bool, code: int,
                  low: float, high: float, z: np.ndarray, has_residual: bool,
                  out: np.ndarray) -> None:
    """``out[n] = act(w @ x[n] + bias [+ z[n]])`` with X (N, C, P), W (K, C), out (N, K, P).

    Jobs are numbered (image, pixel tile, channel tile), so that one worker's consecutive jobs
    reuse the same pixels of every channel from its L1 cache.
    """
    batch, channels, pixels = x.shape
    k_total = w.shape[0]
    low_v, high_v = out.dtype.type(low), out.dtype.type(high)
    bounded, floor, ceiling = bounds(code, low, high, out)
    k_tiles = (k_total + MR - 1) // MR
    p_tiles = (pixels + NR - 1) // NR
    per_image = k_tiles * p_tiles
    for job in prange(batch * per_image):
        n = job // per_image
        rest = job - n * per_image
        tile = rest // k_tiles
        k0 = (rest - tile * k_tiles) * MR
        acc = numba.carray(stack_buffer(TILE, out.dtype), (MR, NR))
        scratch = numba.carray(stack_buffer(TILE, out.dtype), (TILE,))
        for i in range(MR):
            for t in range(NR):
                acc[i, t] = 0
        r0, r1, r2, r3, r4, r5, r6, r7 = tile_rows8(k0, k_total - 1)
        if pixels >= NR:
            p0 = U(min(tile * NR, pixels - NR))  # the last tile overlaps the one before it
            width = NR
            for c in range(channels):
                _channel_step(acc, x, w, n, c, p0, NR, r0, r1, r2, r3, r4, r5, r6, r7)
        else:  # a plane smaller than one tile
            p0 = U(0)
            width = pixels
            for c in range(channels):
                _channel_step(acc, x, w, n, c, p0, pixels, r0, r1, r2, r3, r4, r5, r6, r7)
        store_tile(out, z, has_residual, n, k0, min(MR, k_total - k0), p0, width, acc,
                   scratch, bias, has_bias, bounded, floor, ceiling, code, low_v, high_v)


def _gather_kernel(x: np.ndarray, sh: int, sw: int, parts: int, out: np.ndarray) -> None:
    """``out[n, c, y, z] = x[n, c, y*sh, z*sw]``: the pixels a strided 1x1 convolution reads,
    made dense.  Rows are dealt in ``parts`` to whichever thread is free.
    """
    batch, channels, oh, ow = out.shape
    rows = batch * channels * oh
    parts = min(rows, parts)
    for part in prange(parts):
        for row in range(part * rows // parts, (part + 1) * rows // parts):
            plane = row // oh
            y = row - plane * oh
            n = plane // channels
            c = plane - n * channels
            for z in range(ow):
                out[n, c, y, z] = x[n, c, y * sh, z * sw]


@functools.cache
def _compiled_gather() -> Callable[..., None]:
    f32 = np.dtype(np.float32)
    signature = types.void(types.Array(item_type(f32), 4, "A", readonly=True), types.intp,
                           types.intp, types.intp, buffer(f32, 4))
    return numba.njit(signature, parallel=True, cache=CACHE)(_gather_kernel)


#: The gathered inputs of strided problems, kept from one call to the next.
_SCRATCH = ScratchPool()


@functools.cache
def _compiled() -> Callable[..., None]:
    """The float32 kernel, compiled (or loaded from numba's cache) on first use; X, W and Z
    C-contiguous, so that LLVM knows their strides."""
    f32 = np.dtype(np.float32)
    c_in = functools.partial(types.Array, item_type(f32), layout="C", readonly=True)
    signature = types.void(c_in(ndim=3), c_in(ndim=2), readonly(f32, 1), types.boolean,
                           types.intp, types.float64, types.float64, c_in(ndim=3),
                           types.boolean, buffer(f32, 3))
    return numba.njit(signature, parallel=True, cache=CACHE, fastmath=FASTMATH)(_tiled_kernel)


class Tiled1x1Conv(RunsThroughBind, ConvAlgorithm):
    """1x1 convolution in 8 x 32 register tiles (see the module docstring): float32, no
    padding, one group, any stride."""

    operator = "conv"
    name = "tiled_1x1"
    attributes = AlgoAttribute.REPRODUCIBLE
    #: 2: strided problems became usable (their entries are measured again with it); 3: the
    #: 4 x 16 tile on 16 registers; 4: the 3 x 32 one; 5: hard_swish, sigmoid, silu and
    #: hard_sigmoid in vector loops; 6: the epilogue over the whole tile
    #: (``epilogue.store_tile``)
    version = 6
    #: where the gathered inputs of strided problems are kept between calls
    scratch = _SCRATCH

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        problems = []
        if (geo.r, geo.s) != (1, 1):
            problems.append(f"a 1x1 kernel (got {geo.r}x{geo.s})")
        if any((geo.pad_top, geo.pad_left, geo.pad_bottom, geo.pad_right)):
            problems.append("no padding")
        if geo.group != 1:
            problems.append(f"one group (got {geo.group})")
        if geo.dtype != "float32":
            problems.append(f"float32 (got {geo.dtype}: a float64 tile would not fit the "
                            f"vector registers)")
        return f"tiled_1x1 needs {', '.join(problems)}" if problems else None

    def workspace_bytes(self, problem: Problem) -> int:
        """None at stride 1: X, W and the residual are read where they lie (a runtime and the
        profiler pass them C-contiguous; only a strided one would be copied first).  A strided
        problem gathers the pixels it reads into a block of N*C*OH*OW values, kept for the
        next call (:class:`ScratchPool`)."""
        geo = geometry(problem)
        if not self._strided(geo):
            return 0
        return geo.n * geo.c * geo.oh * geo.ow * np.dtype(geo.dtype).itemsize

    @staticmethod
    def _strided(geo: ConvGeometry) -> bool:
        return (geo.stride_h, geo.stride_w) != (1, 1)

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., np.ndarray]:
        geo = geometry(problem)
        pixels = geo.oh * geo.ow
        strided = self._strided(geo)
        kernel = _compiled()
        epilogue = epilogue_args(geo)
        out_shape = (geo.n, geo.k, pixels)

        def call(*inputs: Any) -> np.ndarray:
            x, w, bias = operands(geo, inputs)
            gathered = None
            if strided:
                gathered = _SCRATCH.take(problem.key, lambda: (
                    np.empty((geo.n, geo.c, geo.oh, geo.ow), dtype=np.float32),))
                _compiled_gather()(x, geo.stride_h, geo.stride_w,
                                   PARTS_PER_THREAD * thread_count(), gathered[0])
                x3 = gathered[0].reshape(geo.n, geo.c, pixels)
            else:
                x3 = np.ascontiguousarray(x).reshape(geo.n, geo.c, pixels)
            w2 = np.ascontiguousarray(w).reshape(geo.k, geo.c)
            z = residual_operand(geo, inputs)
            out = np.empty(out_shape, dtype=np.float32)
            kernel(x3, w2, no_bias(out.dtype) if bias is None else bias, bias is not None,
                   *epilogue, z.reshape(z.shape[0], z.shape[1], -1), geo.has_residual, out)
            if gathered is not None:
                _SCRATCH.give(problem.key, gathered)
            return geo.output_view(out.reshape(geo.n, geo.k, geo.oh, geo.ow))
        return call

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        # First at stride 1 with a wide tile: with 32-pixel tiles on MobileNetV2's 1x1 layers
        # on 2 cores it took 0.51-0.82 of the best other algorithm's time (tied with
        # blocked_direct on 576->96 at 14x14), and on the 16-core host fast-run picked it for
        # 14 of MobileNetV2's 19 distinct 1x1 layers, blocked_direct for the other 5 (the
        # deepest sums).  A 3-row tile (AVX2) goes after pointwise (heuristic.TILED_1X1_MIN_ROWS).
        strided = self._strided(geo)
        if strided and thread_count() < heuristic.BLOCKED_MIN_THREADS:
            # ResNet-50's three strided (downsampling) 1x1 layers (2026-11-27,
            # probe_conv_kernels), against onnxruntime's time: on 2 threads it took 1.07-1.19,
            # blocked_direct 0.93-1.05 and im2col 0.93-0.99, so it goes after blocked_direct;
            # on 16 threads it took 0.89-1.19, blocked_direct 1.19-1.21, im2col 1.06-1.40.
            return (2, 0.5)
        if not strided and MR < heuristic.TILED_1X1_MIN_ROWS:
            return (0, 4)  # AVX2's 3-row tile: after pointwise and conv1x1
        return (0, 0.2)


def algorithms() -> list[Algorithm]:
    return [Tiled1x1Conv()]
