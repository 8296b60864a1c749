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


def _tiles(module) -> tuple[tuple[int, int], ...]:
    """Every (rows, columns) tile a kernel module compiles for."""
    return module.TILES if hasattr(module, "TILES") else ((module.MR, module.NR),)


@pytest.mark.parametrize("module", KERNELS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_tiles_fit_this_processor(module):
    """The accumulators, one broadcast weight per row and one input vector fit the registers
    (16 accumulators in AVX2's 16 registers spilled on every multiply-add)."""
    registers, lanes = _common.vector_registers()
    for rows, columns in _tiles(module):
        assert rows * -(-columns // lanes) + rows + 1 <= registers
    if hasattr(module, "TILE"):
        assert module.TILE == module.MR * module.NR


def test_the_three_row_tile_fills_avx2_registers_exactly(monkeypatch):
    """3 x four vectors of 8: 12 accumulators, 3 broadcasts and 1 input vector, 16 registers."""
    monkeypatch.setattr(_common, "vector_registers", lambda: (16, 8))
    rows, columns = _common.three_row_tile()
    assert (rows, columns) == (3, 32)
    assert rows * columns // 8 + rows + 1 == 16


def test_implicit_gemm_takes_the_wide_tile_on_wide_rows_only():
    """Rows of 13 would leave most of a 32-column tile idle (1.7x slower on the AVX2 VM)."""
    from fastrun_algorithms.conv.operator import ConvOperator

    def tile(side):
        problem = ConvOperator().problem([(1, 8, side, side), (8, 8, 3, 3)], ["float32"] * 2,
                                         pads=[1] * 4)
        return implicit_gemm._plan(problem).tile

    assert tile(13) == implicit_gemm.NARROW
    assert tile(55) == implicit_gemm.WIDE


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
