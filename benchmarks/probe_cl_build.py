"""Seconds an OpenCL driver takes to build fast-run's kernels, one at a time, from threads, and
from helper processes: whether a search's compile time can be spread over the host's cores.

The programs are real ``cl_igemm`` configurations for a ResNet-18 3x3 layer at batch 32, each
built with a define no other build used (so neither pyopencl's disk cache nor the driver's own
finds it).  Printed, per program and as wall time for the lot:

- one after another in this process;
- from a pool of threads in this process (what ``Profiler._build_ahead`` does);
- from a pool of helper processes (spawned, each with its own context), with the pool's start
  shown apart;
- in this process again, from the binaries the helpers returned (what a helper's build leaves
  the searching process to do).

    python -m benchmarks.probe_cl_build [--programs 16] [--workers 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import time
import uuid

_HELPER: dict = {}


def _programs(count: int) -> list[tuple[str, list[str]]]:
    """(source, options) of the first ``count`` usable ``cl_igemm`` configurations for a
    3x3 64-channel layer at batch 32, each options list salted so it is built afresh."""
    from fastrun.analysis.suites import RESNET18_LAYERS
    from fastrun.registry import default_registry
    from fastrun_algorithms.conv.opencl.algorithms import ImplicitGemmCLConv, opencl_algorithms
    from fastrun_algorithms.conv.operator import geometry

    layer = RESNET18_LAYERS[1]  # layer1 3x3 64->64 @56 +relu
    shapes = layer.shapes(32)
    conv = default_registry().operator("conv")
    problem = conv.problem(shapes, ["float32"] * len(shapes), **layer.params())
    salt = uuid.uuid4().hex[:12]
    found = []
    for algorithm in opencl_algorithms():
        if not isinstance(algorithm, ImplicitGemmCLConv):
            continue
        if algorithm.config_unusable_reason(problem) is not None:
            continue
        salted = f"-DFASTRUN_PROBE_SALT=0x{salt}{len(found):04x}"
        options = [*algorithm._options(geometry(problem)), salted]
        found.append((algorithm.source, options))
        if len(found) == count:
            break
    return found


def _open():
    from fastrun.devices import get_device

    return get_device("opencl")


def _helper_start(platform: int, index: int) -> None:
    """A helper opens the same device with pyopencl alone (no fastrun, no numba to import)."""
    import pyopencl as cl

    device = cl.get_platforms()[platform].get_devices()[index]
    _HELPER["context"], _HELPER["device"] = cl.Context([device]), device


def _helper_ready(_: int) -> int:
    time.sleep(0.2)  # long enough that every helper takes one
    return os.getpid()


def _helper_build(job: tuple[str, list[str]]) -> tuple[bytes, float]:
    import pyopencl as cl

    source, options = job
    started = time.perf_counter()
    program = cl.Program(_HELPER["context"], source).build(options=options,
                                                           devices=[_HELPER["device"]])
    binary = program.get_info(cl.program_info.BINARIES)[0]
    return binary, time.perf_counter() - started


def _build_source(device, job) -> float:
    import pyopencl as cl

    source, options = job
    started = time.perf_counter()
    cl.Program(device.context, source).build(options=options, devices=[device.cl_device])
    return time.perf_counter() - started


def _build_binary(device, binary: bytes, options: list[str]) -> float:
    import pyopencl as cl

    started = time.perf_counter()
    cl.Program(device.context, [device.cl_device], [binary]).build(
        options=options, devices=[device.cl_device])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=16)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    args = parser.parse_args()
    device = _open()
    print(f"# {device.name}, driver {device.cl_device.driver_version}, {os.cpu_count()} "
          f"CPUs, CUDA_CACHE_DISABLE={os.environ.get('CUDA_CACHE_DISABLE', '')!r}", flush=True)
    count, workers = args.programs, args.workers

    jobs = _programs(count)
    started = time.perf_counter()
    serial = [_build_source(device, job) for job in jobs]
    wall = time.perf_counter() - started
    print(f"one at a time:        {wall:7.2f} s for {count}, {sum(serial) / count:.3f} s each")

    jobs = _programs(count)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        threaded = list(pool.map(lambda job: _build_source(device, job), jobs))
    wall = time.perf_counter() - started
    print(f"{workers} threads:            {wall:7.2f} s for {count}, "
          f"{sum(threaded) / count:.3f} s each as a thread saw it")

    jobs = _programs(count)
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context,
                                                initializer=_helper_start,
                                                initargs=(device.platform_index,
                                                          device.device_index)) as pool:
        pids = set(pool.map(_helper_ready, range(workers * 4)))
        ready = time.perf_counter() - started
        started = time.perf_counter()
        built = list(pool.map(_helper_build, jobs))
        wall = time.perf_counter() - started
    print(f"{workers} processes:          {wall:7.2f} s for {count}, "
          f"{sum(s for _, s in built) / count:.3f} s each in a helper, slowest "
          f"{max(s for _, s in built):.3f} s "
          f"(pool of {len(pids)} ready in {ready:.2f} s)")

    from_binary = [_build_binary(device, binary, options)
                   for (binary, _), (_, options) in zip(built, jobs, strict=True)]
    print(f"from helpers' binaries: {sum(from_binary):5.2f} s for {count}, "
          f"{sum(from_binary) / count:.3f} s each "
          f"({len(built[0][0])} bytes of binary each)")


if __name__ == "__main__":
    main()
