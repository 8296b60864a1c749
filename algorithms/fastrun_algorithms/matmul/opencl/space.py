"""The registered OpenCL matmul configurations (pure Python: no OpenCL needed to list them).

A budgeted search (:mod:`fastrun.core.tuning`) can only find the best of a space it can afford to
sample, so the spaces are cut down to a few hundred configurations by rules that hold on every
GPU and CPU OpenCL device measured, not by what won on one of them.  docs/opencl-matmul.md
explains each rule.
"""

from __future__ import annotations

import itertools
from typing import Any

#: Candidate values of the ``cl_gemm`` parameters before the validity rules.
GEMM_MWG = (32, 64, 128)
GEMM_NWG = (32, 64, 128)
GEMM_KWG = (16, 32)
GEMM_MDIMC = (8, 16)
GEMM_NDIMC = (8, 16)
GEMM_VW = (1, 2, 4)
#: (SA, SB, DB): both tiles staged and double-buffered, both staged, only B staged, nothing
#: staged.  Staging only A is left out: A is read as one word broadcast to a row of
#: work-items, which caches serve as well as local memory, so it never helps without B staged
#: too.  Double buffering needs both tiles staged.
GEMM_STAGING = ((1, 1, 1), (1, 1, 0), (0, 1, 0), (0, 0, 0))

#: Bytes of local memory a float32 configuration may use: the OpenCL minimum for full-profile
#: devices (32 KiB), so every registered float32 configuration fits every conformant GPU.
LOCAL_MEM_BUDGET = 32 * 1024
#: Work per work-item: at least 2 x 2 outputs (otherwise it is just the tiled kernel) and at
#: most 8 in either direction / 64 in all: 8 x 8 already takes 127 of the 128 registers that
#: let two 256-work-item groups share an NVIDIA SM, and 16 x 8 (238 registers, one group per
#: SM) and 256-wide tiles measured slower on an H100 (docs/opencl-matmul.md).
MIN_WI, MAX_WI, MAX_OUTPUTS = 2, 8, 64

#: ``cl_tiled`` tile sizes.  32 x 32 = 1024 work-items needs a device that allows work-groups
#: that large (NVIDIA, PoCL); elsewhere it is refused at run time (see ``device_unusable_reason``).
TILED_SIZES = (8, 16, 32)

#: ``cl_direct`` outputs per work-item (WM x WN): a row of four for vector-matrix and skinny
#: products, a 4 x 4 block for small square ones.
DIRECT_WORK = ((1, 4), (4, 4))
#: ``cl_direct`` local sizes (LX along N, LY along M): powers of two from 8 to 256 work-items,
#: as mobile tuners generate them; which of them a problem may use is decided from its global
#: size (see ``DirectMatmul.unusable_reason``).
DIRECT_LOCAL = tuple(
    (lx, ly) for lx, ly in itertools.product((8, 16, 32, 64), (1, 2, 4, 8, 16))
    if 8 <= lx * ly <= 256
)


def a_vector_width(mwg: int, mdimc: int, vw: int, sa: int) -> int:
    """VWM, the width of the local reads of a staged A tile along M: VW where each
    work-item's rows split into VW-wide groups over MDIMC (``MWG % (MDIMC * VW) == 0``), else
    1 (and 1 without staging, where A is read from global memory one row at a time)."""
    return vw if sa and mwg % (mdimc * vw) == 0 else 1


def gemm_valid(mwg: int, nwg: int, kwg: int, mdimc: int, ndimc: int, vw: int, sa: int,
               sb: int, db: int = 0) -> bool:
    """Whether a ``cl_gemm`` configuration is registered (valid on common devices).

    The tile must split evenly over the work-items (rows over MDIMC, VW-wide columns over
    NDIMC, and with staging the cooperative loads over all of them), the work per work-item
    stays within registers, and the staged tiles fit ``LOCAL_MEM_BUDGET`` in float32, twice
    over with double buffering (counted without A's row padding: the largest tiles need a
    little more with it, which every GPU measured has; a device with exactly 32 KiB refuses
    them at run time).
    KWG: unstaged configurations use 16 only (without local memory KWG is only an unroll
    factor, and 16 vs 32 never mattered by more than noise); double-buffered ones 16 only
    (two 32-deep tiles of the large configurations do not fit the budget, and the
    double-buffered kernel hides the load latency that a deeper step would amortise: 8 and
    16 measured the same on an H100).
    """
    if db and not (sa and sb):
        return False
    if mwg % mdimc or nwg % (ndimc * vw) or kwg % vw:
        return False
    mwi, nwi = mwg // mdimc, nwg // ndimc
    if not (MIN_WI <= mwi <= MAX_WI and MIN_WI <= nwi <= MAX_WI and mwi * nwi <= MAX_OUTPUTS):
        return False
    threads = mdimc * ndimc
    if sa and (mwg * kwg // vw) % threads:
        return False
    if sb and (kwg * nwg // vw) % threads:
        return False
    if (1 + db) * (sa * mwg * kwg + sb * kwg * nwg) * 4 > LOCAL_MEM_BUDGET:
        return False
    if db:
        return kwg == 16
    return bool(sa and sb) or kwg == 16


#: Split-K slice counts registered (``split``), for the double-buffered configurations with
#: vector loads only: the ones that win on deep reductions, so the space grows by 4 x 43.
GEMM_SPLITS = (2, 4, 8, 16)


def gemm_configurations() -> list[dict[str, Any]]:
    """Every registered ``cl_gemm`` parameter set, in a fixed order: the tile
    configurations, then their split-K variants."""
    configs = []
    for mwg, nwg, kwg, mdimc, ndimc, vw, (sa, sb, db) in itertools.product(
            GEMM_MWG, GEMM_NWG, GEMM_KWG, GEMM_MDIMC, GEMM_NDIMC, GEMM_VW, GEMM_STAGING):
        if gemm_valid(mwg, nwg, kwg, mdimc, ndimc, vw, sa, sb, db):
            configs.append({"mwg": mwg, "nwg": nwg, "kwg": kwg, "mdimc": mdimc,
                            "ndimc": ndimc, "vw": vw, "sa": sa, "sb": sb, "db": db})
    configs += [{**config, "split": split} for split in GEMM_SPLITS for config in configs
                if config["db"] and config["vw"] >= 2]
    return configs


