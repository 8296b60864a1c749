"""Sizes checked before anything is allocated.

A model input of 1x3x100000x100000, a ``ConstantOfShape`` of 3.6 TiB or ``fastrun profile
--inputs 200000x200000,...`` would otherwise end in numpy's ``MemoryError`` (or the kernel's
OOM killer) after minutes of work, with no word of which tensor was too large.  Every tensor's
size is known from the shapes before it is allocated, so the runtime (while lowering a model)
and ``fastrun profile`` (for its inputs) compare it with the memory limit first and refuse with
a message that names the tensor, its shape and its size.

The limit is ``FASTRUN_MEMORY_LIMIT`` (a size such as ``64GiB``), by default this machine's
physical memory: no single tensor larger than that can be computed here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from fastrun import config
from fastrun.base.units import human_bytes


class TensorTooLargeError(ValueError):
    """A tensor would need more memory than the limit allows (nothing was allocated)."""


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit() -> int | None:
    """The largest tensor, in bytes, fastrun agrees to allocate (None: no limit known)."""
    return config.MEMORY_LIMIT.get(default=physical_memory())


def check_tensor(shape: Sequence[int], dtype: object, what: str) -> None:
    """Raise :class:`TensorTooLargeError` naming ``what`` when a tensor of ``shape`` and
    ``dtype`` would not fit the memory limit (or has a negative dimension)."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise TensorTooLargeError(f"{what}: shape {dims} has a negative dimension")
    size = math.prod(dims) * np.dtype(dtype).itemsize
    limit = memory_limit()
    if limit is not None and size > limit:
        raise TensorTooLargeError(
            f"{what}: a tensor of shape {dims} ({np.dtype(dtype)}) needs {human_bytes(size)}, more "
            f"than the memory limit of {human_bytes(limit)} (FASTRUN_MEMORY_LIMIT; default: this "
            "machine's memory)")
