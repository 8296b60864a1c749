"""Where the time of a small OpenCL conv call goes: host work versus the kernel itself.

At batch 1 most ResNet-18 layers take tens of microseconds on a data-centre GPU, so the
Python work of a call (allocating the output, setting arguments, enqueueing) can decide its
time.  For a few layers this prints, per call: the host time (calls enqueued back to back,
the device kept busy), the marker-to-marker time the profiler measures for one call on an
idle queue, and the kernel's own event time.

    python -m benchmarks.probe_launch_overhead
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import fastrun
from fastrun.analysis.suites import RESNET18_LAYERS
from fastrun.cache import InMemoryCache
from fastrun.devices import get_device


def _kernel_microseconds(device, call, inputs, runs: int = 50) -> tuple[float, int]:
    """Median summed event time of the kernels one call launches, and how many it launches."""
    events = []
    original = device.launch

    def recording(*args, **kwargs):
        event = original(*args, **kwargs)
        events.append(event)
        return event

    device.launch = recording
    try:
        times = []
        for _ in range(runs):
            events.clear()
            device.measure(lambda: call(*inputs))  # on the queue that records event times
            times.append(sum(e.profile.end - e.profile.start for e in events) * 1e-3)
    finally:
        device.launch = original
    return statistics.median(times), len(events)


def _layer(device, session, layer) -> None:
    rng = np.random.default_rng(0)
    x, w, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in layer.shapes(1, epilogue=False))
    extra = {"activation": "relu"} if layer.activation == "relu" else {}
    call = session.prepare("conv", x, w, b, **layer.params(epilogue=False), **extra)
    inputs = [device.to_device(a) for a in (x, w, b)]
    for _ in range(20):
        call(*inputs)
    device.synchronize()
    runs = 500
    started = time.perf_counter()
    for _ in range(runs):
        call(*inputs)
    host_us = (time.perf_counter() - started) / runs * 1e6
    device.synchronize()
    window_us = statistics.median(device.measure(lambda: call(*inputs))[0] * 1e-3
                                  for _ in range(50))
    empty_us = statistics.median(device.measure(lambda: None)[0] * 1e-3 for _ in range(50))
    kernel_us, launches = _kernel_microseconds(device, call, inputs)
    print(f"{layer.name:<34} {call.algorithm.desc.text}\n"
          f"    host per call {host_us:6.1f} us | marker window {window_us:6.1f} us "
          f"(empty window {empty_us:4.1f}) | kernels {kernel_us:6.1f} us ({launches} launches)")


def main() -> None:
    device = get_device("opencl")
    print(f"# OpenCL device: {device}")
    session = fastrun.session(device=device, cache=InMemoryCache(), strategy="heuristic",
                              progress=False)
    for layer in (RESNET18_LAYERS[4], RESNET18_LAYERS[5], RESNET18_LAYERS[13]):
        _layer(device, session, layer)


if __name__ == "__main__":
    main()
