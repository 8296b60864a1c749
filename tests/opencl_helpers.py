"""What the OpenCL tests share: the device (or a skip saying why there is none) and the
smallest RunContext an OpenCL algorithm needs."""

from __future__ import annotations

import pytest

#: A kernel every OpenCL device must build: when it fails, the platform's compiler is broken
#: here (PoCL 3's bundled LLVM does not know AMD's Zen 5 and fails with "unknown target CPU
#: 'generic'"), and no test of fastrun's own code could pass.
_PROBE_KERNEL = "__kernel void probe(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def open_test_device():
    """The default OpenCL device (PoCL's CPU device here); skips the test when pyopencl or
    an OpenCL platform is missing, or when the platform cannot compile a trivial kernel,
    naming which."""
    pytest.importorskip("pyopencl", reason="the OpenCL device needs pyopencl")
    from fastrun.devices.opencl import OpenCLUnavailableError, open_device

    try:
        device = open_device()
    except OpenCLUnavailableError as error:
        pytest.skip(f"no OpenCL platform with a device here: {error}")
    return skip_unless_it_compiles(device)


def skip_unless_it_compiles(device):
    """``device``, or a skip naming the compiler's complaint when it cannot build a trivial
    kernel."""
    from fastrun.devices.opencl import OpenCLBuildError

    try:
        device.build(_PROBE_KERNEL)
    except OpenCLBuildError as error:
        pytest.skip(f"the OpenCL platform cannot compile on this machine ({device}): "
                    f"{' '.join(str(error).splitlines()[-2:])}")
    return device


@pytest.fixture(scope="module", name="device")
def device_fixture():
    """The OpenCL device, opened once per test module: ``from tests.opencl_helpers import
    device_fixture`` makes it the module's ``device`` fixture."""
    return open_test_device()


class DeviceContext:
    """A RunContext with the device only: for algorithms that declare no sub-problems."""

    def __init__(self, device):
        self.device = device

    def call(self, problem, *inputs):
        raise AssertionError(f"unexpected sub-problem {problem}")
