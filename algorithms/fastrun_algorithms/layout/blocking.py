"""The channel-blocked tensor layout ``nchw16c``, and conversions to and from NCHW.

Why it exists.  A kernel that puts its vector over channels (``conv/blocked_direct.py``,
``conv/blocked_depthwise.py``) reads and writes an NCHW tensor one scalar per channel plane:
16 strided accesses where one vector load or store would do.  In ``nchw16c`` a tensor
(N, C, H, W) is stored as (N, ceil(C/16), H, W, 16): the 16 channels of a block sit next to
each other for every pixel, one float32 AVX-512 vector (two AVX2 ones).  This is the
"NCHWc" idea of MLAS and oneDNN.

Padding lanes.  When C is not a multiple of 16 the last block has ``16 - C % 16`` lanes past
the channels.  Producers write zeros there when they can (conv, reorder); consumers never read
them (a blocked conv's tables only cover the real channels), so a layout-transparent step in
between (relu, add, sigmoid) may leave any finite value there without changing a result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np
from numba import prange

from fastrun_algorithms._common import CACHE, U

#: Channels per block: one float32 vector of AVX-512.
LANES = 16
NCHW = "nchw"
BLOCKED = "nchw16c"
LAYOUTS = (NCHW, BLOCKED)


def blocks(channels: int) -> int:
    """Channel blocks of ``channels`` channels (the last one may be partly padding)."""
    return -(-channels // LANES)


def blocked_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The ``nchw16c`` shape of an (N, C, H, W) tensor."""
    n, c, *spatial = shape
    return (n, blocks(c), *spatial, LANES)


def nchw_shape(shape: Sequence[int], channels: int) -> tuple[int, ...]:
    """The NCHW shape of an ``nchw16c`` tensor holding ``channels`` channels."""
    n, _, *spatial, _ = shape
    return (n, channels, *spatial)


def check_blocked(shape: Sequence[int], channels: int, what: str) -> None:
    """Raise ValueError unless ``shape`` is an ``nchw16c`` tensor of ``channels`` channels."""
    if len(shape) < 3 or shape[-1] != LANES or shape[1] != blocks(channels):
        raise ValueError(f"{what} in layout {BLOCKED} must have shape (N, ceil(C/{LANES}), "
                         f"spatial..., {LANES}) with C={channels}, i.e. (N, {blocks(channels)}, "
                         f"..., {LANES}); got {tuple(shape)}")


def to_blocked(x: np.ndarray) -> np.ndarray:
    """NCHW (any rank from 2) -> ``nchw16c``, zero padding lanes; numpy, the reference."""
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    padded = np.zeros((n, blocks(c) * LANES, *spatial), dtype=x.dtype)
    padded[:, :c] = x
    moved = padded.reshape(n, blocks(c), LANES, *spatial)
    return np.ascontiguousarray(np.moveaxis(moved, 2, -1))


def to_nchw(x: np.ndarray, channels: int) -> np.ndarray:
    """``nchw16c`` -> NCHW, dropping padding lanes; numpy, the reference."""
    n, nb = x.shape[:2]
    spatial = x.shape[2:-1]
    moved = np.moveaxis(x, -1, 2).reshape(n, nb * LANES, *spatial)
    return np.ascontiguousarray(moved[:, :channels])


#: Pixels one task of the parallel conversions moves: 256 pixels of a 16-channel block, 16 KiB
#: of float32, into the blocked layout; 64 out of it (each pixel's lanes go to 16 planes,
#: so fewer pixels keep a task's 16 output rows in cache).
BLOCK_CHUNK = 256
UNBLOCK_CHUNK = 64


@numba.njit(inline="always")
def _task(task, nb, chunks, chunk, pixels):
    """(image, block, first pixel, end pixel) of task number ``task`` of a conversion, the
    tasks numbered (image, block, chunk of ``chunk`` pixels)."""
    n = task // (nb * chunks)
    rest = task - n * nb * chunks
    b = rest // chunks
    start = (rest - b * chunks) * chunk
    return n, b, start, min(start + chunk, pixels)


@numba.njit(parallel=True, cache=CACHE)
def _block_kernel(x, out):
    """``out[n, b, p, t] = x[n, b*16 + t, p]`` (zero past C); x (N, C, P), out (N, B, P, 16).
    Tasks are (image, block, chunk of pixels), enough for every thread at batch 1; each pixel's
    16 lanes are written together (one vector store; the reads gather 16 planes).  Written
    lane by lane per plane instead, the conversion was 2.1-2.3x slower on 2 threads."""
    n_img, channels, pixels = x.shape
    nb = out.shape[1]
    chunks = (pixels + BLOCK_CHUNK - 1) // BLOCK_CHUNK
    for task in prange(n_img * nb * chunks):
        n, b, start, stop = _task(task, nb, chunks, BLOCK_CHUNK, pixels)
        full = min(LANES, channels - b * LANES)
        if full == LANES:
            for p in range(start, stop):
                for t in range(LANES):
                    out[n, b, U(p), t] = x[n, b * LANES + t, U(p)]
        else:
            for p in range(start, stop):
                for t in range(LANES):
                    out[n, b, U(p), t] = x[n, b * LANES + t, U(p)] if t < full else 0


@numba.njit(parallel=True, cache=CACHE)
def _unblock_kernel(x, out):
    """``out[n, c, p] = x[n, c // 16, p, c % 16]``; x (N, B, P, 16), out (N, C, P); tasks of
    (image, block, chunk of pixels), each pixel's 16 lanes read together (1.2-1.6x faster on 2
    threads than a pass per channel)."""
    n_img, channels, pixels = out.shape
    nb = x.shape[1]
    chunks = (pixels + UNBLOCK_CHUNK - 1) // UNBLOCK_CHUNK
    for task in prange(n_img * nb * chunks):
        n, b, start, stop = _task(task, nb, chunks, UNBLOCK_CHUNK, pixels)
        full = min(LANES, channels - b * LANES)
        if full == LANES:
            for p in range(start, stop):
                for t in range(LANES):
                    out[n, b * LANES + t, U(p)] = x[n, b, U(p), t]
        else:
            for p in range(start, stop):
                for t in range(full):
                    out[n, b * LANES + t, U(p)] = x[n, b, U(p), t]


def to_blocked_parallel(x: np.ndarray) -> np.ndarray:
    """:func:`to_blocked` by numba's workers."""
    n, c = x.shape[:2]
    pixels = math.prod(x.shape[2:])
    out = np.empty(blocked_shape(x.shape), dtype=x.dtype)
    _block_kernel(np.ascontiguousarray(x).reshape(n, c, pixels),
                  out.reshape(n, blocks(c), pixels, LANES))
    return out


def to_nchw_parallel(x: np.ndarray, channels: int) -> np.ndarray:
    """:func:`to_nchw` by numba's workers."""
    n, nb = x.shape[:2]
    pixels = math.prod(x.shape[2:-1])
    out = np.empty(nchw_shape(x.shape, channels), dtype=x.dtype)
    _unblock_kernel(np.ascontiguousarray(x).reshape(n, nb, pixels, LANES),
                    out.reshape(n, channels, pixels))
    return out
