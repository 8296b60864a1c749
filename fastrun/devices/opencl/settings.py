"""The OpenCL device's settings (declared here, read through ``fastrun.config``)."""

from __future__ import annotations

from fastrun import config


def parse_opencl_indices(text: str) -> tuple[int, int]:
    """Read 'P:D' (platform index, device index), e.g. '0:1'."""
    platform, sep, device = text.strip().partition(":")
    try:
        indices = (int(platform), int(device)) if sep else None
    except ValueError:
        indices = None
    if indices is None or min(indices) < 0:
        raise ValueError(f"cannot read OpenCL device {text!r}: expected PLATFORM:DEVICE "
                         "indices, e.g. 0:0 (list them with `fastrun config --device opencl`)")
    return indices


def _helper_count(processes: int) -> int:
    if processes < 0:
        raise ValueError(f"build helper count {processes} (FASTRUN_BUILD_PROCESSES) is negative; "
                         "0 turns the helpers off")
    return processes


REPLAY = config.declare(
    "FASTRUN_REPLAY", "1 (default): a model on the OpenCL device records its kernel launches "
    "once, checks the recording against an ordinary run and replays it on every later run "
    "(docs/runtime.md, Launch plans); 0 issues every step through its algorithm", "opencl",
    config.parse_switch, True)
BUILD_PROCESSES = config.declare(
    "FASTRUN_BUILD_PROCESSES", "helper processes that compile a search's OpenCL programs at "
    "once (default on a GPU: one per CPU but one, at most 12 and one per 4 GiB of its memory; "
    "none on a CPU device, whose driver compiles when a kernel first runs; 0 turns them off; "
    "docs/opencl.md, Building kernels during a search)", "opencl", int, 0, check=_helper_count)
OPENCL_DEVICE = config.declare(
    "FASTRUN_OPENCL_DEVICE", "PLATFORM:DEVICE indices of the device 'opencl' selects, e.g. 0:1 "
    "(default: the first GPU, else the first device)", "opencl", parse_opencl_indices,
    parse_explicit=True)
