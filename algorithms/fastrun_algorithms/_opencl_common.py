"""What the OpenCL algorithms of the elementwise, activation, pooling, reduce, resize, linear and
conv_transpose operators share.

pyopencl is imported inside functions only: the algorithm modules import this one when the
plugin registers them, which must stay cheap and work without an OpenCL platform.

Every kernel of these operators takes its tensors as (buffer, element offset) pairs, so a
device array that is a view into a larger one (a slice the runtime hands on) needs no copy,
and launches a 1-D range rounded up to :data:`LOCAL_SIZE` work-items whose tail returns early:
an explicit local size, because with none some drivers pick a tiny one for an odd global size.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun_algorithms._common import round_up

#: Work-items per work-group of the element-per-work-item kernels (or the device's maximum
#: when smaller): a multiple of every GPU's SIMD width, and small enough that the rounded-up
#: tail of a small tensor wastes little.
LOCAL_SIZE = 128

#: OpenCL C type of each numpy dtype the kernels accept (numpy's bool is one byte of 0 or 1).
CL_TYPES = {
    "float32": "float", "float64": "double", "int8": "char", "int16": "short",
    "int32": "int", "int64": "long", "uint8": "uchar", "uint16": "ushort",
    "uint32": "uint", "uint64": "ulong", "bool": "uchar",
}


class OpenCLAlgorithm(Algorithm):
    """An algorithm of these kernels: a candidate on OpenCL devices only, REPRODUCIBLE (no
    atomics, a fixed order per shape), and float64 only where the device has cl_khr_fp64."""

    device_kind = "opencl"
    attributes = AlgoAttribute.REPRODUCIBLE

    def device_unusable_reason(self, device: Any, problem: Any) -> str | None:
        return fp64_reason(device, problem.dtypes)



def installed() -> bool:
    """Whether pyopencl is installed, found without importing it (slow, and it may fail
    without an OpenCL platform): each family registers its OpenCL algorithms only then.  They
    are candidates only on an OpenCL device, so a CPU search is the same either way."""
    return importlib.util.find_spec("pyopencl") is not None

def has_fp64(device: Any) -> bool:
    return "cl_khr_fp64" in device.cl_device.extensions


def fp64_reason(device: Any, dtypes: Sequence[Any]) -> str | None:
    """Why ``device`` cannot compute with these dtypes (float64 without ``cl_khr_fp64``)."""
    if any(np.dtype(d) == np.float64 for d in dtypes) and not has_fp64(device):
        return f"{device.name} does not support float64 (no cl_khr_fp64)"
    return None


#: The smallest work-group the reduction kernels (softmax rows, global-pool planes) use per
#: row or plane: always usable, so long rows and large planes keep a group configuration.
SMALLEST_GROUP = 32


def next_pow2(value: int) -> int:
    """The smallest power of two >= value (1 for 0 and 1)."""
    return 1 << max(0, int(value) - 1).bit_length()


def group_per_extent_reason(per: int, extent: int, unit: str, extent_name: str,
                            smallest: int = SMALLEST_GROUP) -> str | None:
    """Why a configuration with ``per`` work-items for each ``unit`` (a row, a plane) of
    ``extent`` elements is not worth timing: wider than the work (beyond ``smallest``, the
    smallest size registered, which always stays usable), a smaller group does the same."""
    if per > max(smallest, next_pow2(extent)):
        return (f"{per} work-items per {unit} exceed the {extent_name} {extent} "
                f"(a smaller group is as fast)")
    return None


def work_group_reason(device: Any, size: int) -> str | None:
    """Why a work-group of ``size`` work-items cannot be launched on ``device``, or None."""
    if size > device.max_work_group_size:
        return (f"work-group of {size} work-items, over the device's maximum of "
                f"{device.max_work_group_size}")
    return None


def local_size(device: Any) -> int:
    """The 1-D local size these kernels launch with on ``device``."""
    return min(LOCAL_SIZE, int(device.max_work_group_size))


def buffer(x: Any, which: str) -> tuple[Any, np.int64]:
    """(buffer, element offset) of a C-contiguous device array.

    Non-contiguous device arrays (a transposed view) are refused rather than copied: a hidden
    copy would be workspace nobody declared, and the caller can make the copy it wants.
    """
    if not x.flags.c_contiguous:
        raise ValueError(f"this OpenCL algorithm needs a C-contiguous {which}; got shape "
                         f"{x.shape} with strides {x.strides}")
    return x.base_data, np.int64(x.offset // x.dtype.itemsize)


def options(**defines: Any) -> list[str]:
    """``-DNAME=value`` build options in a fixed order (the program cache's key)."""
    return [f"-D{key}={value}" for key, value in sorted(defines.items())]


#: The start of a program over one element type ``R`` of any kind (:func:`any_type_options`):
#: cl_khr_fp64 where it is double, and ``IS_NAN(v)``, which is 0 for integer types (``v != v``
#: there draws a compiler warning).
ANY_TYPE_PRELUDE = r"""
#if FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#if FLOAT
#define IS_NAN(v) isnan(v)
#else
#define IS_NAN(v) 0
#endif
"""


def any_type_reason(algorithm: str, dtype: Any) -> str | None:
    """Why an :data:`ANY_TYPE_PRELUDE` program cannot take ``dtype`` (OpenCL C has no type for
    it, float16 say), or None."""
    name = np.dtype(dtype).name
    if name not in CL_TYPES:
        return f"{algorithm} computes in OpenCL C's types, which have no {name}"
    return None


def any_type_options(dtype: Any, **defines: Any) -> list[str]:
    """The build options of an :data:`ANY_TYPE_PRELUDE` program for ``dtype``."""
    dtype = np.dtype(dtype)
    return options(R=CL_TYPES[dtype.name], FP64=int(dtype == np.float64),
                   FLOAT=int(dtype.kind == "f"), **defines)


def launch(device: Any, kernel: Any, work_items: int, args: Sequence[Any],
           local: int | None = None) -> None:
    """Enqueue ``kernel`` over ``work_items`` (at least one) on the device's queue, 1-D."""
    local = local or local_size(device)
    device.launch(kernel, args, (round_up(max(1, work_items), local),), (local,))


def launch_groups(device: Any, kernel: Any, groups: int, local: int,
                  args: Sequence[Any]) -> None:
    """Enqueue ``kernel`` as ``groups`` work-groups of ``local`` work-items, 1-D."""
    device.launch(kernel, args, (groups * local,), (local,))


def local_memory(nbytes: int) -> Any:
    """A ``__local`` kernel argument of ``nbytes`` bytes."""
    import pyopencl as cl

    return cl.LocalMemory(nbytes)
