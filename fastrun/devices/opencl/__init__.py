"""The OpenCL device: selection, category, memory, program builds and event timing.

pyopencl is imported inside functions only, so ``import fastrun`` stays fast and works on
machines without pyopencl or without an OpenCL platform; those learn why only when they ask
for an OpenCL device (:class:`OpenCLUnavailableError`).

Devices are opened once per process and per (platform, device) index pair: a context,
its queues and the program cache are worth keeping across sessions, and kernels built in
one context cannot run in another.

What it may import: the device protocol, the base modules, numpy and pyopencl (inside
functions); it is the only place in fastrun that imports pyopencl.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from fastrun.category import DEVICE, device_text
from fastrun.devices import Device
from fastrun.devices.opencl.settings import BUILD_PROCESSES, OPENCL_DEVICE, parse_opencl_indices

log = logging.getLogger(__name__)

T = TypeVar("T")

_NVIDIA_ICD_HINT = ("an NVIDIA GPU needs its ICD registered: /etc/OpenCL/vendors/nvidia.icd "
                    "containing the path of libnvidia-opencl.so.1")


class OpenCLUnavailableError(ValueError):
    """No OpenCL device can be opened as asked: no pyopencl, no platform, or a bad index.

    A ValueError, like any other bad device spec, so the command-line tools report it as a
    usage error (exit 2) with this message.
    """


class OpenCLBuildError(RuntimeError):
    """An OpenCL program failed to compile; :attr:`log` holds the compiler's build log."""

    def __init__(self, message: str, log_text: str):
        super().__init__(message)
        self.log = log_text


def _pyopencl() -> Any:
    try:
        import pyopencl
    except ImportError as error:
        raise OpenCLUnavailableError(
            f"the OpenCL device needs pyopencl, which cannot be imported ({error}); "
            "pip install 'fastrun[opencl]' (a GPU's driver), 'fastrun[pocl]' (PoCL, a CPU "
            "platform), or use device 'cpu'"
        ) from None
    return pyopencl


def _platform_devices(cl: Any) -> list[tuple[Any, list[Any]]]:
    """Every platform with its devices, in the ICD loader's order (what the indices mean)."""
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # PLATFORM_NOT_FOUND_KHR: the ICD loader found no vendor file
        return []
    found = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:  # DEVICE_NOT_FOUND: a platform with nothing attached
            devices = []
        found.append((platform, devices))
    return found


def _type_text(cl: Any, device: Any) -> str:
    kinds = [name for name, flag in (("GPU", cl.device_type.GPU), ("CPU", cl.device_type.CPU),
                                     ("accelerator", cl.device_type.ACCELERATOR))
             if device.type & flag]
    return "/".join(kinds) or "other"


def describe_devices() -> list[str]:
    """One line per OpenCL device, 'P:D name (type) on platform', for messages and
    ``fastrun config``.  Empty when there is no platform; raises without pyopencl."""
    cl = _pyopencl()
    lines = []
    for p, (platform, devices) in enumerate(_platform_devices(cl)):
        if not devices:
            lines.append(f"{p}:- (no devices) on {platform.name.strip()}")
        for d, device in enumerate(devices):
            lines.append(f"{p}:{d} {device.name.strip()} ({_type_text(cl, device)}) on "
                         f"{platform.name.strip()}, {device.version.strip()}")
    return lines


def _pick(cl: Any, found: list[tuple[Any, list[Any]]],
          indices: tuple[int, int] | None) -> tuple[int, int]:
    """The indices to open: the requested pair if it exists, else the first GPU, else the
    first device."""
    if not any(devices for _, devices in found):
        raise OpenCLUnavailableError(
            "no OpenCL platform with a device was found: pyopencl is installed, but the ICD "
            "loader lists no usable vendor (files in /etc/OpenCL/vendors/). pip install "
            f"'pyopencl[pocl]' gives a CPU platform; {_NVIDIA_ICD_HINT}")
    if indices is not None:
        p, d = indices
        if p < len(found) and d < len(found[p][1]):
            return p, d
        listing = "\n".join(f"  {line}" for line in describe_devices())
        raise OpenCLUnavailableError(
            f"OpenCL device {p}:{d} does not exist; available (PLATFORM:DEVICE):\n{listing}")
    for p, (_, devices) in enumerate(found):
        for d, device in enumerate(devices):
            if device.type & cl.device_type.GPU:
                return p, d
    return next((p, 0) for p, (_, devices) in enumerate(found) if devices)


_devices: dict[tuple[int, int], OpenCLDevice] = {}
_devices_lock = threading.Lock()


def open_device(indices: tuple[int, int] | None = None) -> OpenCLDevice:
    """The OpenCL device at ``indices`` (platform, device); None: the pair
    FASTRUN_OPENCL_DEVICE names, else the first GPU, else the first device.

    Opened once per process and pair, so sessions share its context, queue and programs.
    """
    cl = _pyopencl()
    if indices is None:
        indices = configured_indices()
    found = _platform_devices(cl)
    chosen = _pick(cl, found, indices)
    with _devices_lock:
        device = _devices.get(chosen)
        if device is None:
            devices = found[chosen[0]][1]
            device = OpenCLDevice(devices[chosen[1]], chosen[0], chosen[1])
            _devices[chosen] = device
        return device


def configured_indices(explicit: str | None = None) -> tuple[int, int] | None:
    """(platform index, device index) of the OpenCL device to use; None: let fastrun pick."""
    return OPENCL_DEVICE.get(explicit)


@functools.lru_cache(maxsize=4096)
def _c_layout(shape: tuple[int, ...], itemsize: int,
              ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(the shape as Python ints, C-order strides in bytes, element count) of an array of
    ``shape`` (whose extents may be numpy integers)."""
    shape = tuple(int(d) for d in shape)
    strides = []
    step = itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(1, extent)
    return shape, tuple(reversed(strides)), math.prod(shape)


class OpenCLDevice(Device):
    """One OpenCL device with its own context and in-order queues (one with profiling, for
    :meth:`measure`).

    Algorithms with ``device_kind = "opencl"`` take and return ``pyopencl.array.Array``
    values (the profiler converts its inputs with :meth:`to_device`), build their kernels
    with :meth:`build` and enqueue them on :attr:`queue`.
    """

    kind = "opencl"
    host_memory = False

    def __init__(self, cl_device: Any, platform_index: int, device_index: int):
        cl = _pyopencl()
        self._cl = cl
        self.cl_device = cl_device
        self.platform_index = platform_index
        self.device_index = device_index
        self.name = cl_device.name.strip()
        try:
            self.context = cl.Context([cl_device])
            # Two in-order queues: the one everything is enqueued on, without profiling, and
            # the one :meth:`measure` swaps in for the call it times.  On an NVIDIA H200
            # (driver 580) an enqueue took 15.8 us of host time on a profiling queue and 9.5
            # us on a plain one; a batch-1 model waits for its host's enqueues.
            self._run_queue = cl.CommandQueue(self.context, cl_device)
            self._timing_queue = cl.CommandQueue(
                self.context, cl_device,
                properties=cl.command_queue_properties.PROFILING_ENABLE)
            self.queue = self._run_queue
        except cl.Error as error:
            raise OpenCLUnavailableError(
                f"cannot open OpenCL device {self.spec} ({self.name}): {error}") from None
        self.max_work_group_size: int = cl_device.max_work_group_size
        self.local_mem_size: int = cl_device.local_mem_size
        self.max_compute_units: int = cl_device.max_compute_units
        self._category = device_text([
            (DEVICE, "opencl"),
            ("platform", cl_device.platform.name),
            ("model", self.name),
            ("driver", cl_device.driver_version),
            ("cl", cl_device.version),
            ("units", self.max_compute_units),
        ])
        self._programs: dict[tuple[str, tuple[str, ...], str, str], Any] = {}
        self._kernels: dict[tuple[str, str, tuple[str, ...]], Any] = {}
        #: id(kernel) -> (the kernel, the scalar argument types declared to pyopencl) (see
        #: :meth:`launch`); holding the kernel keeps its id from going to another one
        self._arg_types: dict[int, tuple[Any, tuple]] = {}
        self._build_lock = threading.Lock()
        #: program key -> the lock its builder holds (see :meth:`build`)
        self._building: dict[tuple[str, tuple[str, ...], str, str], threading.Lock] = {}
        from pyopencl import array as cl_array
        from pyopencl import tools as cl_tools

        self._array_class = cl_array.Array  # checked on every step of a model: no import then
        self._pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(self.queue))
        self._fast_arrays = True  # see :meth:`empty`
        #: (shape, strides) -> the pyopencl flags of arrays of that layout (:meth:`_fast_array`)
        self._layout_flags: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = {}
        #: "markers" while the driver reports marker profiling times, else "host" (see
        #: :meth:`measure`).
        self.timer = "markers"
        #: the open :class:`~fastrun.devices.opencl.replay.Recording`, if any
        self._recording: Any = None
        #: the build helpers while :meth:`parallel_builds` is open (None: build here alone)
        self._helpers: Any = None
        self._parallel_depth = 0
        #: opens a timed call's gate left shut too long (see :meth:`measure`)
        self._gate_watch = _GateWatch()

    @property
    def spec(self) -> str:
        """The spec that selects this device again: 'opencl:P:D'."""
        return f"opencl:{self.platform_index}:{self.device_index}"

    def fleet_specs(self) -> list[str]:
        """This device and every other of its platform and type (all the platform's GPUs),
        unless FASTRUN_OPENCL_DEVICE names one: a tune on a machine with several GPUs runs one
        worker on each.  A GPU of another model or driver is listed too; the tune's category
        check refuses its worker and says which fact differs."""
        if configured_indices() is not None:
            return [self.spec]
        devices = _platform_devices(self._cl)[self.platform_index][1]
        mine = devices[self.device_index].type
        others = [f"opencl:{self.platform_index}:{index}" for index, device in enumerate(devices)
                  if index != self.device_index and device.type == mine]
        return [self.spec, *others]

    @classmethod
    def open(cls, options: str) -> OpenCLDevice:
        """'opencl' (``options`` empty: FASTRUN_OPENCL_DEVICE, else the first GPU, else the
        first device) or 'opencl:PLATFORM:DEVICE' (indices)."""
        return open_device(parse_opencl_indices(options) if options else None)

    @classmethod
    def describe_devices(cls) -> list[str]:
        return describe_devices()

    def array_type(self) -> type:
        from pyopencl import array as cl_array

        return cl_array.Array

    def cast(self, array: Any, dtype: Any) -> Any:
        """A device cast kernel (:func:`fastrun.devices.opencl.steps.cast`)."""
        from fastrun.devices.opencl import steps

        return steps.cast(self, array, np.dtype(dtype))

    def view_function(self, step: Any) -> Callable[[Any], Any]:
        """Reshapes as views of the same buffer, casts as a kernel, host-only functions on a
        host copy (:mod:`fastrun.devices.opencl.steps`)."""
        from fastrun.devices.opencl import steps

        return steps.view_function(step, self)

    @property
    def category(self) -> str:
        return self._category

    # -- memory --------------------------------------------------------------------------------
    def to_device(self, array: Any) -> Any:
        """A ``pyopencl.array.Array`` on this device: a contiguous copy of a host array, or
        a device array as it is (so converting twice costs nothing)."""
        if isinstance(array, self._array_class):
            return array
        from pyopencl import array as cl_array

        if self._recording is not None:
            self._recording.note_transfer("uploads a host array")
        return cl_array.to_device(self.queue, np.ascontiguousarray(array))

    def to_host(self, value: Any) -> np.ndarray:
        """A numpy array from a device array (read after the queued work that writes it) or
        from anything numpy takes."""
        from pyopencl import array as cl_array

        if isinstance(value, cl_array.Array):
            if self._recording is not None:
                self._recording.note_transfer("downloads a device array")
            return value.get(queue=self.queue)
        return np.asarray(value)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised device array, its buffer from :attr:`_pool`.

        Every model step and every timed call allocates its output: creating an OpenCL
        buffer each time cost more than the small kernels themselves.  The pool keeps freed
        buffers for reuse (safe on the in-order queue: a reused buffer's next writer runs
        after its last reader) and, when an allocation fails, frees what it holds and tries
        again.

        The array is made through pyopencl's fast constructor (the one its own views use),
        with the C-order strides worked out once per shape: the public constructor validates
        the shape with numpy calls that took 25 us per array, more than a small kernel.
        Should a pyopencl release drop that constructor, the public one is used instead.
        """
        dtype = np.dtype(dtype)
        if self._fast_arrays:
            try:
                return self._fast_array(tuple(shape), dtype, allocator=self._pool)
            except TypeError as error:
                log.warning("pyopencl's fast array constructor is not available (%s); "
                            "allocating through the public one", error)
                self._fast_arrays = False
        from pyopencl import array as cl_array

        return cl_array.empty(self.queue, tuple(int(d) for d in shape), dtype,
                              allocator=self._pool)

    def reshaped(self, array: Any, shape: tuple[int, ...]) -> Any:
        """``array`` with another shape, sharing its buffer: a model's Flatten or Reshape.

        A C-contiguous array is re-wrapped with the fast constructor (:meth:`empty`'s):
        pyopencl's ``reshape`` took 14 us, a model step's worth, to make the same view.
        Anything else goes through ``reshape``."""
        if (self._fast_arrays and array.flags.c_contiguous
                and math.prod(shape) == array.size):
            return self._fast_array(tuple(shape), array.dtype, data=array.base_data,
                                    offset=array.offset)
        return array.reshape(shape)

    def _fast_array(self, shape: tuple[int, ...], dtype: np.dtype, **storage: Any) -> Any:
        """A C-contiguous array through pyopencl's fast constructor, with its ``flags`` shared
        by every array of its layout: pyopencl works them out on first access (4.6 us on
        PoCL), and every launch reads them to check that its arguments are contiguous."""
        shape, strides, size = _c_layout(shape, dtype.itemsize)
        flags = self._layout_flags.get((shape, strides))
        array = self._array_class(None, shape, dtype, strides=strides, _flags=flags,
                                  _fast=True, _size=size, _context=self.context,
                                  _queue=self.queue, **storage)
        if flags is None:
            self._layout_flags[(shape, strides)] = array.flags
        return array

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A zeroed device array: split-K's counters per tile, which an algorithm keeps from
        call to call (its kernel leaves them zeroed), or the flag of :meth:`same_bits`.  The
        fill is set-up, not a step's work: it is enqueued before any later launch and never
        recorded in a launch plan, so nothing that must start from zeros on every call of a
        model step may rely on it."""
        out = self.empty(shape, dtype)
        if out.size:
            pattern = np.zeros(1, np.dtype(dtype))
            self._cl.enqueue_fill_buffer(self.queue, out.base_data, pattern, out.offset,
                                         out.size * out.dtype.itemsize)
        return out

    def copy(self, value: Any) -> Any:
        """A contiguous copy of a device array, made on the device."""
        if not value.flags.c_contiguous:
            return super().copy(value)
        out = self.empty(value.shape, value.dtype)
        if value.size:
            self._cl.enqueue_copy(self.queue, out.base_data, value.base_data,
                                  byte_count=value.size * value.dtype.itemsize,
                                  src_offset=value.offset, dst_offset=out.offset)
        return out

    def same_bits(self, a: Any, b: Any) -> bool:
        """Compared on the device (a kernel; only a flag is downloaded) when both are
        contiguous device arrays, else on host copies."""
        array = self._array_class
        if not (isinstance(a, array) and isinstance(b, array)):
            return super().same_bits(a, b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not (a.flags.c_contiguous and b.flags.c_contiguous):
            return super().same_bits(a, b)
        from fastrun.devices.opencl import steps

        return steps.same_bits(self, a, b)

    def synchronize(self) -> None:
        self.queue.finish()

    # -- programs ------------------------------------------------------------------------------
    def build(self, source: str, options: Sequence[str] = ()) -> Any:
        """The compiled ``pyopencl.Program`` for ``source`` and compiler ``options``.

        Built once per process: the key is the source's sha256, the options, the device name
        and the driver version, so an algorithm may call this on every run and pay a dict
        lookup.  (pyopencl also keeps compiled binaries on disk between processes.)  A failed
        build raises :class:`OpenCLBuildError` carrying the compiler's log.
        """
        cl = self._cl
        key = (hashlib.sha256(source.encode()).hexdigest(), tuple(options), self.name,
               self.cl_device.driver_version)
        program = self._programs.get(key)
        if program is not None:
            return program
        # One lock per program, so that threads building different programs (the search's
        # build-ahead) compile at once, and two asking for the same one compile it once.
        with self._build_lock:
            lock = self._building.setdefault(key, threading.Lock())
        with lock:
            program = self._programs.get(key)
            if program is not None:
                return program
            helpers = self._helpers
            binary = helpers.binary(source, options) if helpers is not None else None
            if binary is not None:
                try:
                    program = cl.Program(self.context, [self.cl_device], [binary])
                    program.build(options=list(options), devices=[self.cl_device])
                    self._programs[key] = program
                    return program
                except cl.Error as error:  # not expected: then the source build says why
                    log.debug("a build helper's binary did not load: %s", error)
            program = cl.Program(self.context, source)
            try:
                program.build(options=list(options), devices=[self.cl_device])
            except cl.Error as error:
                try:
                    log_text = program.get_build_info(self.cl_device,
                                                      cl.program_build_info.LOG).strip()
                except cl.Error:
                    log_text = ""
                log_text = log_text or str(error)
                first_line = source.strip().splitlines()[0] if source.strip() else "(empty)"
                raise OpenCLBuildError(
                    f"OpenCL program failed to build on {self.name} (options: "
                    f"{' '.join(options) or 'none'}; source begins {first_line[:60]!r}); "
                    f"build log:\n{log_text}", log_text) from None
            self._programs[key] = program
            return program

    def default_build_processes(self) -> int:
        """Build helpers when ``FASTRUN_BUILD_PROCESSES`` does not say: on a GPU one per CPU
        but the searching process's, at most 12 (eight cut a batch-32 search's builds on a
        16-core host from about 80 s to 42 s), and one per 4 GiB of the GPU's memory (each
        helper holds a context there while the search runs).  None on a CPU device: PoCL
        compiles a kernel when it first runs, so a helper's binary saves nothing."""
        if not self.cl_device.type & self._cl.device_type.GPU:
            return 0
        cpus = os.cpu_count() or 1
        return max(0, min(12, cpus - 1, self.cl_device.global_mem_size // (4 << 30)))

    @contextlib.contextmanager
    def parallel_builds(self) -> Iterator[None]:
        """While open, a program :meth:`build` lacks is compiled in a helper process first
        (:mod:`fastrun.devices.opencl.builders`), so threads building at once compile at once.
        Nested contexts share one pool of helpers, stopped when the outermost closes; with
        ``FASTRUN_BUILD_PROCESSES`` at 0 or 1 (a CPU device's default) nothing changes."""
        from fastrun.devices.opencl.builders import BuildHelpers

        with self._build_lock:
            if self._parallel_depth == 0:
                processes = BUILD_PROCESSES.get(default=self.default_build_processes())
                if processes > 1:
                    self._helpers = BuildHelpers(self.platform_index, self.device_index,
                                                 processes)
            self._parallel_depth += 1
        try:
            yield
        finally:
            with self._build_lock:
                self._parallel_depth -= 1
                helpers = self._helpers if self._parallel_depth == 0 else None
                if helpers is not None:
                    self._helpers = None
            if helpers is not None:
                helpers.close()

    def launch(self, kernel: Any, args: Sequence[Any], global_size: tuple[int, ...],
               local_size: tuple[int, ...] | None = None) -> Any:
        """Set ``kernel``'s arguments and enqueue it on :attr:`queue`; returns its event.

        Scalars are passed as numpy scalars (np.int64, np.float32, ...).  Their types are
        declared to pyopencl on a kernel's first launch (its source fixes them, so later
        launches skip working them out again): undeclared numpy scalars go
        through pyopencl's generic path, measured at 150 us for 25 arguments against 2 us
        declared, which made every small elementwise step of a model cost 0.3 ms.  A struct
        argument is passed as a one-element numpy array of the struct's layout.
        """
        declared = self._arg_types.get(id(kernel))
        if declared is None:  # the source fixes the types: declare once
            signature = tuple(a.dtype if isinstance(a, np.generic) else None for a in args)
            kernel.set_scalar_arg_dtypes(list(signature))
            declared = self._arg_types[id(kernel)] = (kernel, signature)
        kernel.set_args(*args)
        if self._recording is not None:
            self._recording.launches.append((kernel, tuple(args), global_size, local_size,
                                             declared[1]))
        return self._cl.enqueue_nd_range_kernel(self.queue, kernel, global_size, local_size)

    def recording(self) -> Any:
        """A context that records the launches enqueued inside it, for a
        :class:`~fastrun.devices.opencl.replay.LaunchPlan` (``recording.plan()``)."""
        from fastrun.devices.opencl.replay import Recording

        return Recording(self)

    def kernel(self, source: str, name: str, options: Sequence[str] = ()) -> Any:
        """The ``pyopencl.Kernel`` ``name`` of :meth:`build`'s program, created once.

        ``program.name`` makes a new kernel object on every access (pyopencl warns about the
        cost), so an algorithm that launches on every run should take its kernel from here.
        A kernel object holds its arguments until launch: threads that share a device must
        not launch the same kernel at once.
        """
        key = (source, name, tuple(options))
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = self._cl.Kernel(self.build(source, options), name)
            self._kernels[key] = kernel
        return kernel

    # -- timing --------------------------------------------------------------------------------
    def measure(self, function: Callable[[], T]) -> tuple[int, T]:
        """Run ``function`` (which enqueues work on :attr:`queue`) and return (device
        nanoseconds, its value).

        The call runs on a queue with profiling on, swapped in as :attr:`queue` for its
        duration (every other enqueue goes to a queue without it, which costs the host less).
        A marker is enqueued before and after the call; the time is from the start of the
        first to the end of the last, so an algorithm that launches several kernels (or
        copies) is timed as a whole, gaps between its launches included.

        The queue is held shut while the call enqueues (a marker waits for a user event that
        is set once the last marker is in): the device then runs the call's launches back to
        back, as a replayed launch plan runs them, and the host's Python time between two
        launches is not counted.  Counted, it ranked a two-launch candidate behind a one-launch
        one whose kernel was slower (:data:`GATE_TIMEOUT_S` says what happens to a call that
        waits for its own work).

        Drivers that report no profiling times for markers fall back (logged once) to the
        host clock around the call and a ``finish``; so does a call whose marker times come
        back non-positive.
        """
        cl = self._cl
        if self.timer != "markers":
            return super().measure(function)
        # The call is enqueued on the profiling queue.  Queues do not order each other: what
        # the plain one holds (the call's inputs) completes first, and the call has completed
        # when the plain one is handed back.
        self._run_queue.finish()
        self.queue = self._timing_queue
        gate = _Gate(cl, self.context)
        try:
            host_start = time.perf_counter_ns()
            cl.enqueue_marker(self.queue, wait_for=[gate.event])
            first = cl.enqueue_marker(self.queue)
            self._gate_watch.watch(gate)
            value = function()
            last = cl.enqueue_marker(self.queue)
            if not gate.open():
                log.debug("a timed call waited for its own work: timed with its host gaps")
            last.wait()
            host_ns = time.perf_counter_ns() - host_start
        finally:
            self._gate_watch.done(gate)
            gate.open()  # also after a call that raised mid-way
            self._timing_queue.finish()
            self.queue = self._run_queue
        try:
            elapsed = last.profile.end - first.profile.start
        except cl.Error as error:
            log.warning("%s reports no profiling times for markers (%s); timing with the host "
                        "clock from now on", self.name, error)
            self.timer = "host"
            return host_ns, value
        return (elapsed if elapsed > 0 else host_ns), value

    def __str__(self) -> str:
        return f"{self.spec} ({self.name})"

    def __repr__(self) -> str:
        return f"<OpenCLDevice {self} units={self.max_compute_units}>"


#: How long a timed call may enqueue before :meth:`OpenCLDevice.measure` opens the queue
#: anyway.  A call that waits for its own work (a blocking read, a ``finish``) would otherwise
#: wait for ever; opened late, its time counts its host gaps, as without the gate.
GATE_TIMEOUT_S = 0.05


class _Gate:
    """A user event that holds a queue shut until :meth:`open` (by the timed call's end, or
    by :class:`_GateWatch` past :data:`GATE_TIMEOUT_S`)."""

    def __init__(self, cl: Any, context: Any):
        self._cl = cl
        self.event = cl.UserEvent(context)
        self._lock = threading.Lock()
        self._opened = False

    def open(self) -> bool:
        """Open the queue; True if this call opened it (not the watch, nor an earlier call)."""
        with self._lock:
            if self._opened:
                return False
            self._opened = True
        self.event.set_status(self._cl.command_execution_status.COMPLETE)
        return True


class _GateWatch:
    """One daemon thread per device that opens the gate of a timed call still enqueueing
    :data:`GATE_TIMEOUT_S` after it began.  Why one thread, kept: a ``threading.Timer`` per
    timed call made an empty timed call cost 330 us of host time on the 2-core VM instead of
    about 120, more than many a kernel it timed, and every repeat of a search paid it.
    :meth:`OpenCLDevice.measure` times one call at a time, so one gate is watched at a time."""

    def __init__(self):
        self._condition = threading.Condition()
        self._gate: _Gate | None = None
        self._deadline = 0.0
        self._thread: threading.Thread | None = None

    def watch(self, gate: _Gate) -> None:
        with self._condition:
            self._gate, self._deadline = gate, time.monotonic() + GATE_TIMEOUT_S
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fastrun-opencl-gate",
                                                daemon=True)
                self._thread.start()
            self._condition.notify()

    def done(self, gate: _Gate) -> None:
        with self._condition:
            if self._gate is gate:
                self._gate = None

    def _run(self) -> None:
        with self._condition:
            while True:
                if self._gate is None:
                    self._condition.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._condition.wait(remaining)
                    continue
                gate, self._gate = self._gate, None
                gate.open()
