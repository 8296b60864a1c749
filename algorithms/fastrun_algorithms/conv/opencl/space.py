"""The registered ``cl_igemm`` configurations (pure Python: no OpenCL needed to list them).

The implicit-GEMM conv kernel has the register-tiled GEMM's parameters (work-group tile
MWG x NWG, reduction step KWG, work-group shape MDIMC x NDIMC) plus a split-K factor, and
follows the same validity rules as ``cl_gemm`` (:mod:`fastrun_algorithms.matmul.opencl.space`:
outputs per work-item, local-memory budget), so a configuration that is valid for one is
valid for the other on every device.  Vector widths apply to the local-memory reads only,
and there are no unstaged variants: the cols tile is a gather from the input, so it must go
through local memory, and its global loads are not aligned for vector loads.
"""

from __future__ import annotations

import itertools
from typing import Any

from fastrun_algorithms.matmul.opencl.space import LOCAL_MEM_BUDGET, MAX_OUTPUTS, MAX_WI, MIN_WI

IGEMM_MWG = (32, 64, 128)
IGEMM_NWG = (32, 64, 128)
IGEMM_KWG = (8, 16)
#: MDIMC 8 and VW 1 are left out: timing all 528 configurations of the fuller space on
#: ResNet-18's 3x3 layers (batch 1 and 32, ``benchmarks/probe_cl_igemm.py``, H200) never
#: found either among the best; they ran 1-28% (MDIMC 8) and 1-21% (VW 1) behind the best
#: configuration without them.
IGEMM_MDIMC = (16,)
IGEMM_NDIMC = (8, 16)
#: Width of the local-memory reads (output channels and pixels per read).
IGEMM_VW = (2, 4)
#: Reduction slices.  Batch-1 ResNet layers with 7x7 or 14x14 outputs have 49-196 pixels and
#: 64-512 output channels: a few dozen output tiles, against a GPU's 100+ compute units.
IGEMM_SPLIT = (1, 2, 4, 8)


def igemm_valid(mwg: int, nwg: int, kwg: int, mdimc: int, ndimc: int, vw: int) -> bool:
    """Whether a ``cl_igemm`` tile configuration is registered: the tiles split evenly over
    the work-items (the cooperative loads too, and the cols tile by whole columns: either
    every work-item owns one column or NWG is a multiple of the work-group), the work per
    work-item is in the matmul's register range and splits into VW-wide groups, and both
    tiles fit the local-memory budget in float32 (A with its padding vector)."""
    if mwg % (mdimc * vw) or nwg % (ndimc * vw):
        return False
    mwi, nwi = mwg // mdimc, nwg // ndimc
    if not (MIN_WI <= mwi <= MAX_WI and MIN_WI <= nwi <= MAX_WI and mwi * nwi <= MAX_OUTPUTS):
        return False
    threads = mdimc * ndimc
    if (mwg * kwg) % threads or (kwg * nwg) % threads:
        return False
    if threads % nwg and nwg % threads:
        return False
    return (kwg * (mwg + vw) + kwg * nwg) * 4 <= LOCAL_MEM_BUDGET


def igemm_configurations() -> list[dict[str, Any]]:
    """Every registered ``cl_igemm`` parameter set, in a fixed order."""
    return [{"mwg": mwg, "nwg": nwg, "kwg": kwg, "mdimc": mdimc, "ndimc": ndimc, "vw": vw,
             "split": split}
            for mwg, nwg, kwg, mdimc, ndimc, vw, split in itertools.product(
                IGEMM_MWG, IGEMM_NWG, IGEMM_KWG, IGEMM_MDIMC, IGEMM_NDIMC, IGEMM_VW,
                IGEMM_SPLIT)
            if igemm_valid(mwg, nwg, kwg, mdimc, ndimc, vw)]
