"""The OpenCL backend's runtime steps: reshapes, casts, host-only functions on device arrays.

On the CPU a view step is a numpy closure made while lowering (``reshape(...).astype(...)``).
A device array needs its own forms: a reshape of a contiguous ``pyopencl.array.Array`` is a
view of the same buffer (free, as numpy's is), and a cast is one small kernel.  The step's
output value (``step.output``) holds the shape and dtype, so nothing about
the numpy closure has to be read back.

Casts use this module's kernel rather than pyopencl's ``astype``: numpy's ``astype(bool)`` is
``x != 0``, which an OpenCL C cast to an 8-bit type is not, and float16 needs ``vload_half`` /
``vstore_half`` (core OpenCL) on devices without ``cl_khr_fp16``.

Steps made by ``Builder.apply`` (saturating float8 casts, integer division's truncation) are
numpy functions with no kernel; on a device they run on a host copy (one download and one
upload each), which keeps such models correct; none of the zoo models has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: OpenCL C type of each element type a cast reads or writes (float16 goes through float with
#: vload_half/vstore_half, so it needs no type here).
_CL_TYPES = {
    "bool": "uchar", "int8": "char", "uint8": "uchar", "int16": "short", "uint16": "ushort",
    "int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong",
    "float32": "float", "float64": "double",
}

CAST_SOURCE = r"""
#if NEEDS_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#if SRC_HALF
#define LOAD(i) vload_half(i, src)
#define SRC_T half
#else
#define LOAD(i) src[i]
#endif
#if DST_HALF
#define STORE(i, v) vstore_half_rte((float)(v), i, dst)
#define DST_T half
#elif DST_BOOL
#define STORE(i, v) dst[i] = (uchar)((v) != 0)
#else
#define STORE(i, v) dst[i] = (DST_T)(v)
#endif

__kernel void cast(__global DST_T* dst, __global const SRC_T* src, const long src_off) {
    const long i = get_global_id(0);
    STORE(i, LOAD(src_off + i));
}
"""


DIFFERS_SOURCE = r"""
__kernel void differs(__global const WORD* a, const long a_off, __global const WORD* b,
                      const long b_off, const long n, __global int* flag) {
    const long i = get_global_id(0);
    if (i < n && a[a_off + i] != b[b_off + i]) *flag = 1;
}
"""


def same_bits(device: Any, a: Any, b: Any) -> bool:
    """Whether two contiguous device arrays of one shape and dtype hold the same bits: one
    kernel compares them word by word (bytes where the sizes or offsets are not whole words)
    and only a flag comes back."""
    nbytes = a.size * a.dtype.itemsize
    if nbytes == 0:
        return True
    word = 4 if nbytes % 4 == 0 and a.offset % 4 == 0 and b.offset % 4 == 0 else 1
    flag = device.zeros((1,), np.int32)
    kernel = device.kernel(DIFFERS_SOURCE, "differs",
                           [f"-DWORD={'uint' if word == 4 else 'uchar'}"])
    count = nbytes // word
    local = 128
    device.launch(kernel, (a.base_data, np.int64(a.offset // word), b.base_data,
                           np.int64(b.offset // word), np.int64(count), flag.base_data),
                  (-(-count // local) * local,), (local,))
    return int(device.to_host(flag)[0]) == 0


def _cast_options(source: np.dtype, target: np.dtype) -> list[str]:
    options = [f"-DNEEDS_FP64={int('float64' in (source.name, target.name))}",
               f"-DSRC_HALF={int(source.name == 'float16')}",
               f"-DDST_HALF={int(target.name == 'float16')}",
               f"-DDST_BOOL={int(target.name == 'bool')}"]
    if source.name != "float16":
        options.append(f"-DSRC_T={_CL_TYPES[source.name]}")
    if target.name != "float16":
        options.append(f"-DDST_T={_CL_TYPES[target.name]}")
    return options


def cast(device: Any, array: Any, dtype: np.dtype) -> Any:
    """A new contiguous device array: ``array`` converted as numpy's ``astype`` converts
    (C conversions; ``!= 0`` for bool; round to nearest even into float16)."""

    source, target = np.dtype(array.dtype), np.dtype(dtype)
    if not array.flags.c_contiguous:
        raise ValueError(f"a device cast needs a contiguous array; got strides {array.strides}")
    if any(d.name not in _CL_TYPES and d.name != "float16" for d in (source, target)):
        raise ValueError(f"no device cast from {source} to {target}")
    out = device.empty(array.shape, target)
    if array.size == 0:
        return out
    kernel = device.kernel(CAST_SOURCE, "cast", _cast_options(source, target))
    device.launch(kernel, (out.base_data, array.base_data,
                           np.int64(array.offset // source.itemsize)), (array.size,))
    return out


def view_function(step: Any, device: Any) -> Callable[[Any], Any]:
    """The callable a view step runs on ``device`` (a device array in, a device array out)."""
    shape, dtype = step.output.shape, step.output.dtype
    if step.host_only:
        host = step.view

        def round_trip(array: Any) -> Any:
            return device.to_device(host(device.to_host(array)))

        return round_trip

    def view(array: Any) -> Any:
        if array.shape != shape:
            array = device.reshaped(array, shape)
        if array.dtype != dtype:
            array = cast(device, array, dtype)
        return array

    return view
