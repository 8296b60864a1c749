"""Build helpers (fastrun.devices.opencl.builders): while a search's builds run, OpenCL
programs are compiled in helper processes and loaded from the binaries they send back; a helper
that cannot start or dies leaves the builds to the searching process, and a compile error is
still reported with its log.  On PoCL here (helpers are off by default on a CPU device, so the
tests turn them on)."""

from __future__ import annotations

import concurrent.futures
import logging
import uuid

import numpy as np
import pytest

from fastrun.algorithm import Algorithm
from fastrun.core.profiler import Profiler
from fastrun.core.strategy import SearchOptions
from fastrun.devices.opencl import OpenCLBuildError, builders
from fastrun.devices.opencl.settings import BUILD_PROCESSES
from fastrun.operator import Problem
from tests.opencl_helpers import device_fixture  # noqa: F401  (the module's device)

ADD = "__kernel void add(__global float *x) { x[get_global_id(0)] += VALUE; }"


def _options(value: int) -> list[str]:
    """Options no earlier build used (so no disk cache answers in place of a helper)."""
    return [f"-DVALUE={value}.0f", f"-DSALT=0x{uuid.uuid4().hex[:12]}"]


def _add(device, program, n: int = 8) -> np.ndarray:
    import pyopencl as cl

    x = device.to_device(np.zeros(n, np.float32))
    kernel = cl.Kernel(program, "add")
    kernel.set_args(x.base_data)
    cl.enqueue_nd_range_kernel(device.queue, kernel, (n,), None)
    return device.to_host(x)


@pytest.fixture
def answers(monkeypatch):
    """Every binary the helpers sent back (None: they could not)."""
    seen = []
    binary = builders.BuildHelpers.binary

    def spy(self, source, options):
        result = binary(self, source, options)
        seen.append(result)
        return result

    monkeypatch.setattr(builders.BuildHelpers, "binary", spy)
    return seen


def test_programs_built_inside_come_from_helpers_and_run(device, monkeypatch, answers):
    monkeypatch.setenv("FASTRUN_BUILD_PROCESSES", "2")
    with device.parallel_builds():
        with device.parallel_builds():  # nested: the same helpers
            helpers = device._helpers
        assert device._helpers is helpers is not None
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            programs = list(pool.map(lambda v: device.build(ADD, _options(v)), range(3)))
        processes = [helper.process for helper in helpers._helpers]
        assert len(processes) == 2 and all(p.poll() is None for p in processes)
    assert len(answers) == 3 and all(isinstance(binary, bytes) for binary in answers)
    assert device._helpers is None and all(p.poll() is not None for p in processes)
    for value, program in enumerate(programs):
        np.testing.assert_array_equal(_add(device, program), np.full(8, value, np.float32))
    assert device.build(ADD, ["-DVALUE=5.0f"]) is not None and len(answers) == 3  # outside


def test_a_compile_error_is_still_reported_with_its_log(device, monkeypatch, answers):
    monkeypatch.setenv("FASTRUN_BUILD_PROCESSES", "2")
    broken = f"__kernel void broken(__global float *x) {{ x[0] = undeclared_{uuid.uuid4().hex}; }}"
    with device.parallel_builds(), pytest.raises(OpenCLBuildError) as caught:
        device.build(broken)
    assert answers == [None] and "undeclared_" in caught.value.log


def test_a_helper_that_dies_leaves_the_builds_here(device, monkeypatch, answers, caplog):
    monkeypatch.setenv("FASTRUN_BUILD_PROCESSES", "2")
    with device.parallel_builds():
        device.build(ADD, _options(1))
        for helper in device._helpers._helpers:
            helper.process.kill()
            helper.process.wait()
        with caplog.at_level(logging.WARNING, logger=builders.__name__):
            program = device.build(ADD, _options(2))
            later = device.build(ADD, _options(3))
    assert isinstance(answers[0], bytes) and answers[1:] == [None, None]
    assert "build helpers stopped" in caplog.text and "is gone" in caplog.text
    np.testing.assert_array_equal(_add(device, program), np.full(8, 2, np.float32))
    np.testing.assert_array_equal(_add(device, later), np.full(8, 3, np.float32))


def test_a_helper_that_cannot_open_the_device_says_so(caplog):
    helpers = builders.BuildHelpers(99, 0, 1)  # no such platform
    with caplog.at_level(logging.WARNING, logger=builders.__name__):
        assert helpers.binary(ADD, _options(1)) is None
        assert helpers.binary(ADD, _options(1)) is None  # given up: asks no helper again
    assert "could not start" in caplog.text and "IndexError" in caplog.text
    assert caplog.text.count("build helpers stopped") == 1
    helpers.close()


def test_helpers_are_off_on_a_cpu_device_by_default(device, monkeypatch):
    monkeypatch.delenv("FASTRUN_BUILD_PROCESSES", raising=False)
    import pyopencl as cl

    if device.cl_device.type & cl.device_type.GPU:
        pytest.skip("the OpenCL device here is a GPU")
    assert device.default_build_processes() == 0
    with device.parallel_builds():
        assert device._helpers is None
    assert BUILD_PROCESSES.get(default=5) == 5
    monkeypatch.setenv("FASTRUN_BUILD_PROCESSES", "-1")
    with pytest.raises(ValueError, match=r"-1 \(FASTRUN_BUILD_PROCESSES\) is negative"):
        BUILD_PROCESSES.get()


def test_a_gpu_gets_helpers_by_its_cpus_and_memory(device, monkeypatch):
    """One per CPU but one, at most 12, and one per 4 GiB of the GPU's memory."""
    import pyopencl as cl

    class GPU:
        type = cl.device_type.GPU
        global_mem_size = 80 << 30

    monkeypatch.setattr(device, "cl_device", GPU())
    for cpus, memory, expected in ((16, 80, 12), (8, 80, 7), (2, 80, 1), (16, 8, 2)):
        GPU.global_mem_size = memory << 30
        monkeypatch.setattr("os.cpu_count", lambda cpus=cpus: cpus)
        assert device.default_build_processes() == expected


class _Compiles(Algorithm):
    """A candidate whose build hook compiles a program of its own (as the tuned OpenCL
    families compile their configuration)."""

    operator = "double"
    name = "compiles"
    device_kind = "opencl"

    def build(self, problem, device):
        self.program = device.build(ADD, self.param["options"])


def test_the_search_builds_candidates_ahead_in_helpers(device, monkeypatch, answers):
    monkeypatch.setenv("FASTRUN_BUILD_PROCESSES", "2")
    candidates = [_Compiles({"options": tuple(_options(v))}) for v in range(3)]
    profiler = Profiler(device, SearchOptions())
    profiler._build_ahead(Problem.create("double", [(8,)], ["float32"]), candidates)
    assert len(answers) == 3 and all(isinstance(binary, bytes) for binary in answers)
    assert device._helpers is None  # stopped once the builds were done
    for value, candidate in enumerate(candidates):
        np.testing.assert_array_equal(_add(device, candidate.program),
                                      np.full(8, value, np.float32))
