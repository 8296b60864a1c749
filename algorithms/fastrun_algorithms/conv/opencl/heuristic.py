"""Rule-of-thumb order of the OpenCL conv algorithms for one problem.

The order a heuristic strategy picks from and the order fast-run times candidates in, so its
job is to put a good candidate first without knowing the device.  The rules mirror the CPU
ones in :mod:`fastrun_algorithms.conv.heuristic` (a specialised kernel when one applies, a
direct kernel for few input channels, the GEMM route otherwise), because the reasons carry
over: a GEMM only pays for its unfold and extra launches when each output sums enough terms.
"""

from __future__ import annotations

from typing import Any

from fastrun_algorithms._common import ceil_div
from fastrun_algorithms.conv import heuristic as cpu_heuristic
from fastrun_algorithms.conv.geometry import ConvGeometry

#: At most this many input channels per group and ``cl_direct`` goes before ``cl_im2col`` (the
#: CPU rule's threshold): the unfold is then mostly copying, the product is shallow, and the
#: direct kernel needs one launch instead of three.  On PoCL (docs/opencl-conv.md) direct won
#: ResNet's 3-channel first layer narrowly and the depthwise layers clearly, im2col every
#: deeper layer by 1.4x or more.
DIRECT_MAX_CHANNELS = 4


def _used(work: int, local: int) -> float:
    """Fraction of the launched work-items along the pixels that have an output."""
    return work / (ceil_div(work, local) * local)


# Each OpenCL conv class ranks itself with one of the rules below (its ``family_rank``); sort
# keys, smaller first, compared across the families:
#
# 1. ``cl_depthwise`` and ``cl_conv1x1`` where they apply (they are usable only there);
# 2. ``cl_winograd`` (usable only for 3x3 stride-1 layers) for deep layers of a batch with
#    many output pixels, else after ``cl_igemm`` (:func:`winograd_rank`);
# 3. few input channels per group (<= ``DIRECT_MAX_CHANNELS``: the RGB first layer, depthwise
#    layers): ``cl_direct``, then ``cl_igemm``, then ``cl_im2col``; more: ``cl_igemm``,
#    ``cl_im2col``, ``cl_direct`` (the implicit GEMM does im2col's product in one launch with
#    no unfold buffer);
# 4. within each family, the rule's own order (the functions' docstrings).

def shallow(geo: ConvGeometry) -> bool:
    """At most ``DIRECT_MAX_CHANNELS`` input channels per group."""
    return geo.cg <= DIRECT_MAX_CHANNELS


def depthwise_rank(geo: ConvGeometry, p: dict[str, Any]) -> tuple[float, ...]:
    """``cl_depthwise``: first; 4 outputs per work-item on rows of 8 or more, then the fewest
    idle work-items, then the larger local size."""
    wide_first = 0 if (p["px"] > 1) == (geo.ow >= 8) else 1
    work = geo.oh * ceil_div(geo.ow, p["px"])
    return (0, wide_first, -round(_used(work, p["l"]), 2), -p["l"])


#: ``cl_conv1x1``'s key: first where it applies.
CONV1X1_RANK = (0,)
#: The key of an OpenCL conv class without a rule of its own.
OTHER_RANK = (8,)


def direct_rank(geo: ConvGeometry, p: dict[str, Any]) -> tuple[float, ...]:
    """``cl_direct``: fewest idle work-items along the pixels, fewest idle channel
    accumulators, then more channels per work-item (input reuse), then the larger local
    size."""
    fill = geo.kg / (ceil_div(geo.kg, p["ko"]) * p["ko"])
    return (1 if shallow(geo) else 3, -round(_used(geo.oh * geo.ow, p["l"]), 2),
            -round(fill, 2), -p["ko"], -p["l"])


def igemm_rank(geo: ConvGeometry, p: dict[str, Any]) -> tuple[float, ...]:
    """``cl_igemm``: see :func:`_igemm_order`."""
    return (2 if shallow(geo) else 1, *_igemm_order(geo, p))


def im2col_rank(geo: ConvGeometry) -> tuple[float, ...]:
    """``cl_im2col``: after ``cl_igemm``."""
    return (3 if shallow(geo) else 2, 0.0)


#: Output pixels (all images together) from which ``cl_winograd`` goes first for a deep
#: 3x3 layer of a batch: a GPU's batch-32 ResNet layers (25088 to 1568 pixels), where its
#: 2.25-4x fewer products pay for two more launches and the transforms' memory traffic.  A
#: single image goes to the implicit GEMM first: a batch-1 layer on a large GPU waits for its
#: launches.
WINOGRAD_FIRST_PIXELS = 1024


def winograd_rank(geo: ConvGeometry, p: dict) -> tuple[float, ...]:
    """``cl_winograd``: first for deep layers (the CPU's channel threshold) of a batch with
    many output pixels, else right after ``cl_igemm``; F(4,3) before F(2,3) where the CPU
    rule has it (enough pixels for its larger tiles)."""
    pixels = geo.n * geo.oh * geo.ow
    deep = min(geo.cg, geo.kg) >= cpu_heuristic.WINOGRAD_MIN_CHANNELS
    big = pixels >= cpu_heuristic.WINOGRAD_F4_MIN_PIXELS
    order = 0 if (p["m"] == 4) == big else 1
    first = deep and geo.n > 1 and pixels >= WINOGRAD_FIRST_PIXELS
    return (0.5 if first else 1.5, order)


#: Work-groups an implicit-GEMM launch should have before larger tiles are preferred: enough
#: to give each compute unit of a large GPU (100+) two, which the heuristic cannot ask the
#: device about.  On an H200 the batch-1 ResNet-18 layers ran fastest with 128-400 groups
#: (split-K where the output tiles alone were fewer).
IGEMM_MIN_GROUPS = 256


def _igemm_order(geo: ConvGeometry, p: dict) -> tuple[float, ...]:
    """Within ``cl_igemm``: least padding waste in the output tiles, then enough work-groups
    (``IGEMM_MIN_GROUPS``, counting split-K slices), then more outputs per work-item (more
    reuse of each staged value), the widest local reads, the deeper step, and the fewest
    slices."""
    pixels = geo.n * geo.oh * geo.ow
    mtiles, ntiles = ceil_div(geo.kg, p["mwg"]), ceil_div(pixels, p["nwg"])
    fill = geo.kg / (mtiles * p["mwg"]) * pixels / (ntiles * p["nwg"])
    groups = geo.group * mtiles * ntiles * p["split"]
    outputs = (p["mwg"] // p["mdimc"]) * (p["nwg"] // p["ndimc"])
    return (-round(fill, 1), -min(groups, IGEMM_MIN_GROUPS) // 32, -outputs, -p["vw"],
            -p["kwg"], p["split"])
