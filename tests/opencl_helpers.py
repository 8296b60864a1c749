"""What the OpenCL tests share: the device (or a skip saying why there is none) and the
smallest RunContext an OpenCL algorithm needs."""

from __future__ import annotations

import pytest


def open_test_device():
    """The default OpenCL device (PoCL's CPU device here); skips the test when pyopencl or
    an OpenCL platform is missing, naming which."""
    pytest.importorskip("pyopencl", reason="the OpenCL device needs pyopencl")
    from fastrun.opencl import OpenCLUnavailableError, open_device

    try:
        return open_device()
    except OpenCLUnavailableError as error:
        pytest.skip(f"no OpenCL platform with a device here: {error}")


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
