"""Rule-of-thumb order of the OpenCL matmul algorithms for one problem.

It is the order a heuristic strategy picks from, the profiling order, and what the budgeted
search (:mod:`fastrun.core.tuning`) always includes in its first round ("the heuristic's first
ones"), so its job is to put a few good configurations first without knowing the device.
"""

from __future__ import annotations

from typing import Any

from fastrun_algorithms._common import ceil_div
from fastrun_algorithms.matmul._batch import MatmulLayout

#: Below this many multiply-adds per batch entry, or with M or N under SMALL_SIDE, tiles and
#: padded copies cost more than they save and the direct kernel goes first.
SMALL_MACS = 64 ** 3
SMALL_SIDE = 16
#: Work-groups that keep a large GPU busy (an H100 has 132 SMs; two groups each are plenty).
BUSY_GROUPS = 256


def is_small(layout: MatmulLayout) -> bool:
    """Fewer than ``SMALL_MACS`` multiply-adds, or M or N under ``SMALL_SIDE``: where tiles and
    padded copies cost more than they save."""
    m, n, k = max(layout.m, 1), max(layout.n, 1), max(layout.k, 1)
    return m * n * k < SMALL_MACS or min(m, n) < SMALL_SIDE


# Each OpenCL matmul class ranks itself with one of the rules below (its ``family_rank``);
# sort keys, smaller first, compared across the families:
#
# 1. small products (:func:`is_small`): ``cl_direct`` first, the configuration wasting the
#    fewest work-items first;
# 2. ``cl_gemm``: by fit = (fraction of the padded product that is real work) x (fraction of
#    ``BUSY_GROUPS`` work-groups the tiling and its split-K slices provide), then more outputs
#    per work-item (register reuse), wider vectors, both tiles staged, double-buffered (the
#    fastest kernel measured on an H100 at 2048 to 8192), KWG 16, and the fewest slices;
# 3. ``cl_tiled`` (16 first), then ``cl_direct`` for large products;
# 4. ``cl_naive`` last.

def direct_rank(layout: MatmulLayout, p: dict[str, Any]) -> tuple[float, ...]:
    """``cl_direct``: first for small products, after the tiled kernels otherwise; the least
    idle work-items, then 64-128 work-items per group, then more outputs per work-item."""
    m, n = max(layout.m, 1), max(layout.n, 1)
    gx, gy = ceil_div(n, p["wn"]), ceil_div(m, p["wm"])
    used = (gx * gy) / (ceil_div(gx, p["lx"]) * p["lx"] * ceil_div(gy, p["ly"]) * p["ly"])
    size_penalty = abs(p["lx"] * p["ly"] - 128) / 128
    return (0 if is_small(layout) else 3, -round(used, 2), size_penalty, -(p["wm"] * p["wn"]))


def gemm_rank(layout: MatmulLayout, p: dict[str, Any]) -> tuple[float, ...]:
    """``cl_gemm``: first for products that are not small, by fit, then the kernel's
    strengths (see the list above)."""
    m, n, k, batch = max(layout.m, 1), max(layout.n, 1), max(layout.k, 1), max(layout.batch, 1)
    mp, np_, kp = (ceil_div(m, p["mwg"]) * p["mwg"], ceil_div(n, p["nwg"]) * p["nwg"],
                   ceil_div(k, p["kwg"]) * p["kwg"])
    coverage = (m * n * k) / (mp * np_ * kp)
    split = p.get("split", 1)
    groups = batch * (mp // p["mwg"]) * (np_ // p["nwg"]) * split
    fit = coverage * min(1.0, groups / BUSY_GROUPS)
    outputs = (p["mwg"] // p["mdimc"]) * (p["nwg"] // p["ndimc"])
    return (1 if is_small(layout) else 0, -round(fit, 2), -outputs, -p["vw"],
            -(p["sa"] + p["sb"]), -p.get("db", 0), p["kwg"], -(p["mdimc"] * p["ndimc"]), split)


def tiled_rank(p: dict[str, Any]) -> tuple[float, ...]:
    """``cl_tiled``: after ``cl_gemm``, the 16 x 16 tile first."""
    return (2, abs(p["ts"] - 16))


#: ``cl_naive``'s key: last.
NAIVE_RANK = (9,)
#: The key of an OpenCL matmul class without a rule of its own.
OTHER_RANK = (8,)
