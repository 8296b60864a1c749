"""Seconds an OpenCL driver takes to build fast-run's kernels, one at a time, from threads, and
from helper processes: whether a search's compile time can be spread over the host's cores.

The programs are real ``cl_igemm`` configurations for a ResNet-18 3x3 layer at batch 32, each
built with a define no other build used (so neither pyopencl's disk cache nor the driver's own
finds it).  Printed, per program and as wall time for the lot:

- one after another in this process;
- from a pool of threads in this process (what ``Profiler._build_ahead`` does);
- from fastrun's build helpers (``fastrun/devices/opencl/builders.py``: processes of their
  own, each with its own context), with their start shown apart;
- in this process again, from the binaries the helpers returned (what a helper's build leaves
  the searching process to do).

    python -m benchmarks.probe_cl_build [--programs 16] [--workers 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
import uuid


def _programs(count: int) -> list[tuple[str, list[str]]]:
    """(source, options) of the first ``count`` usable ``cl_igemm`` configurations for a
    3x3 64-channel layer at batch 32, each options list salted so it is built afresh."""
    from fastrun.analysis.suites import RESNET18_LAYERS
    from fastrun.registry import default_registry
    from fastrun_algorithms.conv.opencl import ImplicitGemmCLConv, opencl_algorithms
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

    from fastrun.devices.opencl.builders import BuildHelpers

    helpers = BuildHelpers(device.platform_index, device.device_index, workers)
    warm_up = _programs(workers)  # one each, so every helper has opened the device
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda job: helpers.binary(*job), warm_up))
    ready = time.perf_counter() - started

    def compiled(job: tuple[str, list[str]]) -> tuple[bytes, float]:
        began = time.perf_counter()
        binary = helpers.binary(*job)
        if binary is None:
            raise SystemExit("a build helper failed: see the log above")
        return binary, time.perf_counter() - began

    jobs = _programs(count)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        built = list(pool.map(compiled, jobs))
    wall = time.perf_counter() - started
    helpers.close()
    print(f"{workers} helper processes:   {wall:7.2f} s for {count}, "
          f"{sum(s for _, s in built) / count:.3f} s each as a thread saw it "
          f"(helpers ready in {ready:.2f} s, one first program each included)")

    from_binary = [_build_binary(device, binary, options)
                   for (binary, _), (_, options) in zip(built, jobs, strict=True)]
    print(f"from helpers' binaries: {sum(from_binary):5.2f} s for {count}, "
          f"{sum(from_binary) / count:.3f} s each "
          f"({len(built[0][0])} bytes of binary each)")


if __name__ == "__main__":
    main()
