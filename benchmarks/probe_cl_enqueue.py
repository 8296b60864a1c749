"""Host microseconds of one OpenCL launch, by what it does: the floor of a model step's host
cost on a driver.

Times 2000 back-to-back launches of a tiny kernel (the device never the bottleneck) on a queue
with profiling and on one without: the enqueue alone (arguments set once), with 25 arguments
set each time, with two buffer arguments set each time; then setting 25 arguments alone, an
output array from a memory pool, and the direct ``clEnqueueNDRangeKernel`` call without an
event that a launch plan's replay may use (``fastrun/devices/opencl/replay.py``), also for the
same kernel with its 21 scalars passed as one struct (does a driver charge per argument or per
byte?).

    python -m benchmarks.probe_cl_enqueue
"""

from __future__ import annotations

import numpy as np

from benchmarks._common import time_calls

SOURCE = """
__kernel void k0(__global float* y) { y[get_global_id(0)] = 1.0f; }
__kernel void k25(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8,
                  int a9, int a10, int a11, int a12, int a13, int a14, int a15, int a16,
                  __global const float* x, long xo, __global const float* w, long wo,
                  __global const float* b, long bo, __global float* y, long yo)
{ y[get_global_id(0) + yo] = x[xo] + a0 + a16; }
typedef struct { int a[17]; long xo, wo, bo, yo; } scalars;
__kernel void k5(const scalars s, __global const float* x, __global const float* w,
                 __global const float* b, __global float* y)
{ y[get_global_id(0) + s.yo] = x[s.xo] + s.a[0] + s.a[16]; }
"""

#: The 21 scalars of ``k25`` as one struct argument of ``k5`` (C's layout: ``align=True``).
SCALARS = np.dtype([("a", np.int32, (17,)), ("xo", np.int64), ("wo", np.int64),
                    ("bo", np.int64), ("yo", np.int64)], align=True)


def _host_us(queue, function, runs: int = 2000) -> float:
    """Host microseconds per call, the queue drained before (after a warm-up) and after."""
    for _ in range(200):
        function()
    queue.finish()
    seconds = time_calls(function, runs)
    queue.finish()
    return seconds * 1e6


def main() -> None:
    import pyopencl as cl

    from fastrun.devices import get_device

    device = get_device("opencl")
    context = device.context
    print(f"# {device.name}, driver {device.cl_device.driver_version}")
    program = cl.Program(context, SOURCE).build()
    buf = cl.Buffer(context, cl.mem_flags.READ_WRITE, 4 << 20)
    props = cl.command_queue_properties
    for tag, properties in (("profiling queue", props.PROFILING_ENABLE), ("plain queue", 0),
                            ("out-of-order", props.OUT_OF_ORDER_EXEC_MODE_ENABLE)):
        try:
            queue = cl.CommandQueue(context, properties=properties)
        except cl.Error as error:  # out-of-order execution is optional
            print(f"{tag:16s} not available: {error}")
            continue
        _probe_queue(cl, context, program, buf, queue, tag)


def _probe_queue(cl, context, program, buf, queue, tag: str) -> None:
    from pyopencl import array as cl_array
    from pyopencl import tools as cl_tools

    k0 = cl.Kernel(program, "k0")
    k0.set_args(buf)
    k25 = cl.Kernel(program, "k25")
    k25.set_scalar_arg_dtypes([np.int32] * 17 + [None, np.int64] * 4)
    args = [np.int32(i) for i in range(17)] + [buf, np.int64(0)] * 4
    k25.set_args(*args)
    k5 = cl.Kernel(program, "k5")
    k5.set_scalar_arg_dtypes([None] * 5)
    k5.set_args(np.zeros(1, SCALARS), buf, buf, buf, buf)
    pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(queue))
    f32 = np.dtype(np.float32)
    rows = {
        "enqueue, arguments set once": lambda: cl.enqueue_nd_range_kernel(
            queue, k0, (1024,), (128,)),
        "enqueue of a 25-argument kernel, arguments set once":
            lambda: cl.enqueue_nd_range_kernel(queue, k25, (1024,), (128,)),
        "set 25 arguments + enqueue": lambda: (
            k25.set_args(*args), cl.enqueue_nd_range_kernel(queue, k25, (1024,), (128,))),
        "set 2 buffer arguments + enqueue": lambda: (
            k25.set_arg(17, buf), k25.set_arg(23, buf),
            cl.enqueue_nd_range_kernel(queue, k25, (1024,), (128,))),
        "set 25 arguments only": lambda: k25.set_args(*args),
        "an array from the memory pool": lambda: cl_array.Array(
            None, (64, 56, 56), f32, allocator=pool, strides=(12544, 224, 4), _fast=True,
            _size=200704, _context=context, _queue=queue),
    }
    enqueue = _direct_enqueue()
    if enqueue is not None:  # what a launch plan's replay may use instead of pyopencl's call
        raw = _raw_arguments(queue, k0, (1024,), (128,))
        rows["direct enqueue (ctypes, no event), arguments set once"] = (
            lambda: enqueue(*raw))
        raw25 = _raw_arguments(queue, k25, (1024,), (128,))
        rows["direct enqueue of the 25-argument kernel"] = lambda: enqueue(*raw25)
        raw3 = _raw_arguments(queue, k25, (64, 16, 1), (8, 16, 1))
        rows["direct enqueue of the 25-argument kernel, 3-D sizes"] = lambda: enqueue(*raw3)
        raw5 = _raw_arguments(queue, k5, (64, 16, 1), (8, 16, 1))
        rows["direct, 3-D, the 21 scalars in one struct (5 arguments)"] = lambda: enqueue(*raw5)
    for label, function in rows.items():
        print(f"{tag:16s} {label:55s} {_host_us(queue, function):7.2f} us")


def _direct_enqueue():
    from fastrun.devices.opencl.replay import _enqueue_function

    return _enqueue_function()


def _raw_arguments(queue, kernel, global_size, local_size) -> tuple:
    import ctypes

    dims = len(global_size)
    return (ctypes.c_void_p(queue.int_ptr), ctypes.c_void_p(kernel.int_ptr), ctypes.c_uint(dims),
            None, (ctypes.c_size_t * dims)(*global_size), (ctypes.c_size_t * dims)(*local_size),
            ctypes.c_uint(0), None, None)


if __name__ == "__main__":
    main()
