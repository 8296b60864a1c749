"""The shape of the register tiles: what the processor's vector registers hold.

A tile whose accumulators, input vector and broadcast weights do not fit the registers is
spilled to the stack on every multiply-add (2-3x slower on AVX2), so each kernel's width must
leave room for them on the processor it is compiled for."""

from __future__ import annotations

import pytest

from fastrun_algorithms import _common
from fastrun_algorithms.conv import implicit_gemm, tiled_1x1
from fastrun_algorithms.matmul import register_tiled

KERNELS = [implicit_gemm, tiled_1x1, register_tiled]


@pytest.mark.parametrize(("registers", "lanes", "wanted", "columns"), [
    (32, 16, 16, 16),  # AVX-512 with 512-bit vectors: the widths chosen there are kept
    (32, 16, 32, 32),
    (32, 8, 32, 16),  # AVX-512 with 256-bit vectors: two registers per row
    (16, 8, 16, 8),  # AVX2: one register per row
    (16, 8, 32, 8),
    (16, 4, 16, 4),  # SSE
    (32, 4, 16, 8),  # AArch64: 32 registers of 4 lanes
])
def test_tile_columns(monkeypatch, registers, lanes, wanted, columns):
    monkeypatch.setattr(_common, "vector_registers", lambda: (registers, lanes))
    assert _common.tile_columns(wanted) == columns


@pytest.mark.parametrize(("registers", "lanes", "wanted", "tile"), [
    (32, 16, 16, (8, 16)),  # AVX-512: 8 rows, the columns the kernel wants
    (32, 16, 32, (8, 32)),
    (16, 8, 16, (4, 16)),  # AVX2: 4 rows of two vectors
    (16, 8, 32, (4, 16)),
    (16, 4, 16, (4, 8)),  # SSE
])
def test_register_tile(monkeypatch, registers, lanes, wanted, tile):
    monkeypatch.setattr(_common, "vector_registers", lambda: (registers, lanes))
    assert _common.register_tile(wanted) == tile


@pytest.mark.parametrize("module", KERNELS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_tiles_fit_this_processor(module):
    """The accumulators, one broadcast weight per row and one input vector fit the registers
    (16 accumulators in AVX2's 16 registers spilled on every multiply-add)."""
    registers, lanes = _common.vector_registers()
    assert module.MR * -(-module.NR // lanes) + module.MR + 1 <= registers
    assert module.TILE == module.MR * module.NR


@pytest.mark.parametrize(("registers", "lanes", "tile"), [(32, 16, (8, 32)), (16, 8, (3, 32))])
def test_tiled_1x1_tile(monkeypatch, registers, lanes, tile):
    monkeypatch.setattr(_common, "vector_registers", lambda: (registers, lanes))
    assert tiled_1x1._tile(registers, lanes) == tile


def test_vector_registers_follow_numba_features(monkeypatch):
    from numba.core import config as numba_config

    _common.vector_registers.cache_clear()
    try:
        monkeypatch.setattr(numba_config, "CPU_FEATURES", "+avx,+avx2,+fma,-avx512f")
        assert _common.vector_registers() == (16, 8)
        _common.vector_registers.cache_clear()
        monkeypatch.setattr(numba_config, "CPU_FEATURES", "+avx,+avx2,+avx512f,+avx512vl")
        monkeypatch.setenv("FASTRUN_VECTOR_BITS", "256")
        assert _common.vector_registers() == (32, 8)
    finally:
        _common.vector_registers.cache_clear()
