"""The OpenCL device on whatever platform is installed (PoCL's CPU device in CI): selection,
category, memory, program cache, marker timing, and OpenCL algorithms profiled and chosen.

Tests that need a platform skip when there is none; the errors for a missing pyopencl or a
missing platform are checked everywhere by hiding them.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from fastrun.algorithm import Algorithm
from fastrun.api import Session
from fastrun.attribute import AlgoAttribute
from fastrun.cache import InMemoryCache
from fastrun.category import clean, parse_device
from fastrun.cli import load_and_run
from fastrun.cli.main import main
from fastrun.devices import get_device, opencl
from fastrun.devices.cpu import CPUDevice
from fastrun.operator import Problem
from tests.fakes import DoubleOp
from tests.opencl_helpers import skip_unless_it_compiles


def _platform_available() -> bool:
    try:
        import pyopencl
    except ImportError:
        return False
    return any(devices for _, devices in opencl._platform_devices(pyopencl))


needs_platform = pytest.mark.skipif(
    not _platform_available(),
    reason="no OpenCL platform with a device (pip install 'pyopencl[pocl]' gives a CPU one)")


@pytest.fixture
def device(monkeypatch) -> opencl.OpenCLDevice:
    monkeypatch.delenv("FASTRUN_OPENCL_DEVICE", raising=False)
    return skip_unless_it_compiles(get_device("opencl"))


# -- errors without pyopencl or a platform ------------------------------------------------------
def test_without_pyopencl_the_error_says_so_and_the_commands_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyopencl", None)
    with pytest.raises(opencl.OpenCLUnavailableError, match="needs pyopencl"):
        get_device("opencl")
    assert main(["config", "--device", "opencl"]) == 2
    assert "needs pyopencl" in capsys.readouterr().err
    assert load_and_run.main(["model.onnx", "--device", "opencl:0:0"]) == 2
    assert "needs pyopencl" in capsys.readouterr().err


def test_without_a_platform_the_error_says_so(monkeypatch, capsys):
    pytest.importorskip("pyopencl")
    monkeypatch.setattr(opencl, "_platform_devices", lambda cl: [])
    with pytest.raises(opencl.OpenCLUnavailableError, match="no OpenCL platform") as caught:
        get_device("opencl")
    assert "nvidia.icd" in str(caught.value)
    assert main(["config", "--device", "opencl"]) == 2
    assert "no OpenCL platform" in capsys.readouterr().err


# -- selection ----------------------------------------------------------------------------------
@needs_platform
def test_selection_by_default_by_indices_and_by_variable(device, monkeypatch):
    assert isinstance(device, opencl.OpenCLDevice) and device.kind == "opencl"
    assert get_device("opencl") is device  # opened once per process
    assert get_device(device.spec) is device
    first = get_device("opencl:0:0")
    assert first.spec == "opencl:0:0" and (first.platform_index, first.device_index) == (0, 0)
    monkeypatch.setenv("FASTRUN_OPENCL_DEVICE", "0:0")
    assert get_device("opencl") is first
    assert get_device(device.spec) is device  # an explicit spec wins over the variable
    monkeypatch.setenv("FASTRUN_OPENCL_DEVICE", "0:99")
    with pytest.raises(opencl.OpenCLUnavailableError, match="0:99 does not exist"):
        get_device("opencl")


@needs_platform
def test_a_bad_index_lists_the_available_devices(device):
    with pytest.raises(opencl.OpenCLUnavailableError) as caught:
        get_device("opencl:9:0")
    message = str(caught.value)
    assert "9:0 does not exist" in message
    assert f"0:0 {get_device('opencl:0:0').name}" in message
    with pytest.raises(ValueError, match="expected PLATFORM:DEVICE"):
        get_device("opencl:a:b")


@needs_platform
def test_category_names_platform_device_driver_and_version(device):
    named = dict(parse_device(device.category))
    assert named["device"] == "opencl"
    cl_device = device.cl_device
    assert named["platform"] == clean(cl_device.platform.name)
    assert named["model"] == clean(cl_device.name)
    assert named["driver"] == clean(cl_device.driver_version)
    assert named["cl"].startswith("OpenCL ")
    assert named["units"] == str(device.max_compute_units)
    assert "|" not in device.category
    assert device.category != CPUDevice(1).category


@needs_platform
def test_device_attributes(device):
    import pyopencl as cl

    # enqueues go to a queue without profiling; measure() times on one with it
    profiling = cl.command_queue_properties.PROFILING_ENABLE
    assert not device.queue.properties & profiling
    assert device.measure(lambda: device.queue.properties)[1] & profiling
    assert not device.queue.properties & profiling
    assert device.context.devices == [device.cl_device]
    assert device.max_work_group_size >= 1
    assert device.local_mem_size > 0 and device.max_compute_units >= 1


# -- memory -------------------------------------------------------------------------------------
@needs_platform
def test_to_device_and_back(device):
    import pyopencl.array as cl_array

    host = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # not contiguous
    on_device = device.to_device(host)
    assert isinstance(on_device, cl_array.Array)
    assert on_device.shape == (4, 3) and on_device.dtype == np.float32
    np.testing.assert_array_equal(device.to_host(on_device), host)
    assert device.to_device(on_device) is on_device
    np.testing.assert_array_equal(device.to_host(host), host)
    empty = device.empty((2, 5), np.float64)
    assert isinstance(empty, cl_array.Array) and empty.shape == (2, 5)
    assert empty.dtype == np.float64


@pytest.mark.parametrize("shape", [(1, 8, 6, 6), (3,), (), (2, 0, 3), (5, 1, 7)])
def test_empty_arrays_are_what_pyopencl_would_make(device, shape):
    """``empty`` uses pyopencl's fast constructor: the same array as the public one, whose
    buffer comes from the device's pool and is reused once freed."""
    import pyopencl.array as cl_array

    ours = device.empty(shape, "float32")
    theirs = cl_array.empty(device.queue, shape, np.float32)
    for attribute in ("shape", "strides", "size", "nbytes", "dtype"):
        assert getattr(ours, attribute) == getattr(theirs, attribute), attribute
    assert ours.flags.c_contiguous and ours.queue is device.queue
    if ours.size:
        ours.fill(1.5)
        np.testing.assert_array_equal(device.to_host(ours * 2), np.full(shape, 3.0))


def test_empty_falls_back_to_the_public_constructor(device, monkeypatch, caplog):
    import pyopencl.array as cl_array

    class PublicOnly(cl_array.Array):
        def __init__(self, *args, _fast=False, **kwargs):
            if _fast:
                raise TypeError("unexpected keyword argument '_fast'")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(cl_array, "Array", PublicOnly)
    monkeypatch.setattr(device, "_array_class", PublicOnly)
    monkeypatch.setattr(device, "_fast_arrays", True)
    array = device.empty((2, 3), np.float32)
    assert array.shape == (2, 3) and not device._fast_arrays
    assert "fast array constructor is not available" in caplog.text


# -- programs -----------------------------------------------------------------------------------
SCALE = """
__kernel void scale(__global const float *x, __global float *y, const float factor) {
    const size_t i = get_global_id(0);
    y[i] = factor * x[i];
}
"""

SPIN = """
__kernel void spin(__global float *x, const int rounds) {
    const size_t i = get_global_id(0);
    float v = x[i];
    for (int r = 0; r < rounds; ++r) v = v * 0.999999f + 1e-6f;
    x[i] = v;
}
"""


@needs_platform
def test_programs_are_built_once_per_source_and_options(device):
    program = device.build(SCALE)
    assert device.build(SCALE) is program
    assert device.build(SCALE, ["-DUNUSED=1"]) is not program
    assert device.build(SCALE, ("-DUNUSED=1",)) is device.build(SCALE, ["-DUNUSED=1"])
    kernel = device.kernel(SCALE, "scale")
    assert device.kernel(SCALE, "scale") is kernel and kernel.function_name == "scale"
    assert device.kernel(SCALE, "scale", ["-DUNUSED=1"]) is not kernel


@needs_platform
def test_a_build_error_carries_the_build_log(device):
    broken = "__kernel void broken(__global float *x) { x[0] = undeclared_name; }"
    with pytest.raises(opencl.OpenCLBuildError, match="failed to build") as caught:
        device.build(broken)
    assert "undeclared_name" in caught.value.log
    assert "build log" in str(caught.value) and "undeclared_name" in str(caught.value)


# -- timing -------------------------------------------------------------------------------------
@needs_platform
def test_measure_covers_every_kernel_between_the_markers(device):
    kernel = device.build(SPIN).spin
    data = device.to_device(np.ones(4096, np.float32))
    kernel(device.queue, data.shape, None, data.data, np.int32(10))  # warm-up
    device.synchronize()

    def two_kernels():
        first = kernel(device.queue, data.shape, None, data.data, np.int32(2000))
        second = kernel(device.queue, data.shape, None, data.data, np.int32(2000))
        return first, second

    elapsed, (first, second) = device.measure(two_kernels)
    assert device.timer == "markers"
    both = (first.profile.end - first.profile.start) + (second.profile.end - second.profile.start)
    assert both > 0 and elapsed >= both
    assert elapsed >= second.profile.end - first.profile.start


@needs_platform
def test_measure_leaves_out_the_host_time_between_launches(device):
    """The queue is held shut while the call enqueues: 30 ms of host time between two short
    launches is not device time, as it would not be in a replayed launch plan."""
    import time

    kernel = device.build(SPIN).spin
    data = device.to_device(np.ones(256, np.float32))
    kernel(device.queue, data.shape, None, data.data, np.int32(10))  # warm-up
    device.synchronize()

    def with_a_host_gap():
        kernel(device.queue, data.shape, None, data.data, np.int32(10))
        time.sleep(0.03)
        kernel(device.queue, data.shape, None, data.data, np.int32(10))

    elapsed, _ = device.measure(with_a_host_gap)
    assert 0 < elapsed < 20e6


@needs_platform
def test_a_timed_call_that_waits_for_its_own_work_still_returns(device):
    """A blocking read inside the timed call waits for the queue the gate holds: the gate
    opens itself after GATE_TIMEOUT_S, and the time then counts the wait."""
    data = device.to_device(np.arange(64, dtype=np.float32))
    elapsed, host = device.measure(lambda: device.to_host(data))
    np.testing.assert_array_equal(host, np.arange(64))
    assert elapsed > 0


@needs_platform
def test_a_tune_takes_every_device_of_the_platform_and_type(device, monkeypatch):
    """``fleet_specs``: this device first, then the others of its platform and type (a
    machine's GPUs), none of another type; FASTRUN_OPENCL_DEVICE pins it to one."""
    from types import SimpleNamespace

    own_type = opencl._platform_devices(device._cl)[device.platform_index][1][
        device.device_index].type
    fake = [SimpleNamespace(type=own_type) for _ in range(device.device_index + 3)]
    fake[-1] = SimpleNamespace(type=own_type ^ 0xFF)  # another type
    platforms = [(None, [])] * device.platform_index + [(None, fake)]
    monkeypatch.setattr(opencl, "_platform_devices", lambda cl: platforms)
    specs = device.fleet_specs()
    p, d = device.platform_index, device.device_index
    expected = [f"opencl:{p}:{i}" for i in range(len(fake) - 1)]
    assert specs[0] == device.spec and sorted(specs) == sorted(expected)
    assert f"opencl:{p}:{len(fake) - 1}" not in specs and len(set(specs)) == len(specs)
    monkeypatch.setenv("FASTRUN_OPENCL_DEVICE", f"{p}:{d}")
    assert device.fleet_specs() == [device.spec]


def test_the_cpu_device_measures_with_its_clock():
    elapsed, value = CPUDevice(1).measure(lambda: sum(range(1000)))
    assert value == 499500 and elapsed > 0


# -- OpenCL algorithms in a session -------------------------------------------------------------
class ScaleCL(Algorithm):
    """y = factor * x with one kernel; the local size is this algorithm's configuration."""

    operator = "double"
    name = "scale_cl"
    attributes = AlgoAttribute.REPRODUCIBLE
    device_kind = "opencl"

    def __init__(self, local: int, factor: float = 2.0):
        super().__init__({"local": local, "factor": factor})
        self.local = local
        self.factor = factor
        self.devices: set[str] = set()

    def unusable_reason(self, problem):
        if problem.shapes[0][0] % self.local:
            return f"size not a multiple of {self.local}"
        return None

    def run(self, problem, inputs, ctx, prepared=None):
        device = ctx.device
        self.devices.add(device.spec)
        (x,) = inputs
        y = device.empty(x.shape, x.dtype)
        device.kernel(SCALE, "scale")(device.queue, x.shape, (self.local,), x.data, y.data,
                                      np.float32(self.factor))
        return y


class NumpyDouble(Algorithm):
    operator = "double"
    attributes = AlgoAttribute.REPRODUCIBLE

    def __init__(self, name: str):
        self.name = name
        super().__init__()

    def run(self, problem, inputs, ctx, prepared=None):
        return inputs[0] * 2 if self.name == "times" else inputs[0] + inputs[0]


def _registry():
    from fastrun.registry import Registry

    registry = Registry(load_plugins=False)
    registry.register_operator(DoubleOp("double"))
    algorithms = [ScaleCL(16), ScaleCL(64), ScaleCL(48), ScaleCL(32, factor=3.0),
                  NumpyDouble("times"), NumpyDouble("plus")]
    for algorithm in algorithms:
        registry.register_algorithm(algorithm)
    return registry, algorithms


@needs_platform
def test_opencl_algorithms_are_profiled_and_chosen_on_the_opencl_device(device):
    registry, (cl16, cl64, cl48, wrong, *_) = _registry()
    cache = InMemoryCache()
    problem = Problem.create("double", [(4096,)], ["float32"])
    session = Session(device=device, cache=cache, strategy="fast-run", registry=registry,
                      budget_s=0.005, progress=False)
    decision = session.decide(problem)
    assert decision.source == "profiled"
    assert decision.algorithm in (cl16, cl64)
    assert {e.algorithm for e in decision.entries} == {cl16.desc.text, cl64.desc.text}
    assert all(e.time_s > 0 and e.error == 0.0 for e in decision.entries)
    assert decision.excluded["times"] == "runs on cpu devices"
    assert decision.excluded["plus"] == "runs on cpu devices"
    assert decision.excluded[cl48.desc.text].startswith("not usable: size not a multiple")
    assert decision.excluded[wrong.desc.text].startswith("numerical error")
    assert cl16.devices == {device.spec}  # each algorithm reached the device through ctx

    # A call takes host arrays, returns a device array.
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    np.testing.assert_array_equal(device.to_host(session.call("double", x)), 2 * x)
    on_device = device.to_device(x)
    np.testing.assert_array_equal(device.to_host(session.call("double", on_device)), 2 * x)

    # The CPU device, sharing the cache, sees only the CPU algorithms.
    cpu = Session(device="cpu:1", cache=cache, strategy="fast-run", registry=registry,
                  budget_s=0.005, progress=False)
    cpu_decision = cpu.decide(problem)
    assert cpu_decision.source == "profiled" and cpu_decision.algorithm.device_kind == "cpu"
    assert cpu_decision.excluded[cl16.desc.text] == "runs on opencl devices"
    categories = cache.categories()
    assert len(categories) == 2 and decision.category != cpu_decision.category
    assert decision.category.startswith("opencl;") and cpu_decision.category.startswith("cpu;")
    assert {e.algorithm for e in cache.get(cpu_decision.category, problem.key)} <= {
        "times", "plus"}

    # A second OpenCL session reads its own category back.
    again = Session(device=device, cache=cache, strategy="fast-run", registry=registry,
                    progress=False)
    assert again.decide(problem).source == "cache"


@needs_platform
def test_a_measured_call_sees_what_came_before_and_is_seen_after(device):
    """The timed call runs on the profiling queue, everything else on the plain one: queues
    do not order each other, so measure() must."""
    kernel = device.kernel(SCALE, "scale")
    x = device.to_device(np.arange(1 << 16, dtype=np.float32))    # plain queue
    y = device.empty(x.shape, np.float32)
    z = device.empty(x.shape, np.float32)
    device.launch(kernel, [x.data, y.data, np.float32(2.0)], x.shape, None)  # plain queue
    device.measure(lambda: device.launch(kernel, [y.data, z.data, np.float32(3.0)],
                                         x.shape, None))
    device.launch(kernel, [z.data, y.data, np.float32(0.5)], x.shape, None)  # plain again
    np.testing.assert_array_equal(device.to_host(y), np.arange(1 << 16) * 3.0)


@needs_platform
def test_reshaped_shares_the_buffer_and_keeps_an_offset(device):
    x = device.to_device(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    flat = device.reshaped(x, (6, 4))
    assert flat.shape == (6, 4) and flat.base_data is x.base_data
    np.testing.assert_array_equal(device.to_host(flat), np.arange(24).reshape(6, 4))
    second = device.reshaped(x[1], (12,))  # a view that starts inside the buffer
    np.testing.assert_array_equal(device.to_host(second), np.arange(12, 24))
    with pytest.raises(ValueError):
        device.reshaped(x, (5, 5))  # pyopencl's own error for a size that does not match


@needs_platform
def test_arrays_of_one_layout_share_their_flags(device):
    """Launches check their arguments' flags: worked out once per layout, not per array."""
    first, second = device.empty((2, 3, 4), np.float32), device.empty((2, 3, 4), np.float32)
    assert first.flags is second.flags and first.flags.c_contiguous
    assert device.reshaped(first, (6, 4)).flags is device.empty((6, 4), np.float32).flags
    assert device.empty((2, 3, 4), np.float64).flags is not first.flags  # other strides


@needs_platform
@pytest.mark.parametrize("dtype, size", [(np.float32, 1001), (np.uint8, 7), (np.float64, 3)])
def test_same_bits_and_copy_work_on_the_device(device, dtype, size):
    """What the search's checks use instead of downloads: a word-by-word (or byte-by-byte)
    comparison kernel, and a copy made on the device."""
    host = np.arange(size).astype(dtype)
    x = device.to_device(host)
    copy = device.copy(x)
    assert copy.base_data is not x.base_data and device.same_bits(copy, x)
    changed = host.copy()
    changed.view(np.uint8)[-1] ^= 1  # one bit of the last byte
    assert not device.same_bits(x, device.to_device(changed))
    assert not device.same_bits(x, device.to_device(host.astype(np.int16)))  # dtype
    assert not device.same_bits(x, device.to_device(host[:-1]))  # shape
    if size > 2:  # views inside a buffer: offsets
        assert device.same_bits(x[1:], device.to_device(host[1:]))
        assert not device.same_bits(x[1:], x[:-1])
    assert device.same_bits(x, host.copy()) is True  # a host array: compared on the host
    np.testing.assert_array_equal(device.to_host(copy), host)
