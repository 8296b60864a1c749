"""Launch plans: a model's kernel launches recorded once, then replayed with nothing else.

A model step on the OpenCL device costs the host far more than its enqueue: the algorithm's
Python, an output array from the pool, the kernel's arguments set one by one.  A batch-1
model on a large GPU waits for that host time, not for its kernels.  But every run of a
prepared model enqueues the same kernels with the same arguments on buffers of the same
sizes, so the runtime records one run and replays it:

- while a :class:`Recording` is open, :meth:`OpenCLDevice.launch` notes each launch (kernel,
  arguments, sizes) besides enqueueing it;
- :class:`LaunchPlan` gives every launch a kernel object of its own with its arguments set
  once, and keeps every buffer the recorded run used (its inputs, intermediates and outputs
  stay where they were, so a replay writes the same buffers in the same order);
- :meth:`LaunchPlan.replay` enqueues those kernels and nothing else, with no events.

What a recording cannot replay makes it *unreplayable* (with the reason): an upload or a
download in the middle of the run (a host-only step), which a replay would skip.  Work enqueued
behind the device's back (pyopencl calls an algorithm makes itself) cannot be seen here; the
runtime checks each plan against an ordinary run on other inputs before it uses it.

The enqueue itself goes through pyopencl, or straight to ``clEnqueueNDRangeKernel`` through
ctypes without asking for an event (pyopencl always makes one).  Which is cheaper depends on
the driver, so the plan times both and keeps the faster (:meth:`LaunchPlan.choose_enqueue`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fastrun.devices import UnreplayableError

log = logging.getLogger(__name__)


class Recording:
    """The launches enqueued while it is open (``with device.recording() as recording``)."""

    def __init__(self, device: Any):
        self.device = device
        #: (kernel, arguments, global size, local size, scalar argument types), in order
        self.launches: list[tuple[Any, tuple[Any, ...], tuple[int, ...],
                                  tuple[int, ...] | None, tuple]] = []
        #: why the recorded run cannot be replayed (empty: it can)
        self.reasons: list[str] = []

    def note_transfer(self, what: str) -> None:
        """A copy between host and device happened inside the recorded run."""
        if what not in self.reasons:
            self.reasons.append(what)

    def __enter__(self) -> Recording:
        if self.device._recording is not None:
            raise RuntimeError("a recording is already open on this device")
        self.device._recording = self
        return self

    def __exit__(self, *exc: Any) -> None:
        self.device._recording = None

    def plan(self, inputs: list[Any], outputs: list[Any]) -> LaunchPlan:
        """The launches as a :class:`LaunchPlan` that reads the device arrays ``inputs`` and
        writes ``outputs`` (those the recorded run did); raises :class:`UnreplayableError`."""
        if self.reasons:
            raise UnreplayableError("the run " + "; ".join(self.reasons))
        if not self.launches:
            raise UnreplayableError("the run launched no kernel")
        not_contiguous = [a.shape for a in inputs if not a.flags.c_contiguous]
        if not_contiguous:
            raise UnreplayableError(f"the run's inputs of shapes {not_contiguous} are not "
                                    "contiguous")
        return LaunchPlan(self.device, self.launches, inputs, outputs)


class LaunchPlan:
    """Kernels with their arguments set once, enqueued in the recorded order by :meth:`replay`.

    Holds every argument of every launch, so the buffers a recorded run wrote are never handed
    to anything else: a plan's memory is the sum of the run's tensors, not the peak of the
    tensors live at once.  One plan must not be replayed from two threads at once (they would
    write the same buffers); the runtime serialises its runs.
    """

    def __init__(self, device: Any, launches: list, inputs: list[Any],
                 outputs: list[Any]) -> None:
        cl = device._cl
        self.device = device
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._lock = threading.Lock()
        self._arguments = [args for _, args, _, _, _ in launches]  # keeps the buffers alive
        self._kernels = []
        self._sizes = []
        for kernel, args, global_size, local_size, arg_types in launches:
            own = cl.Kernel(kernel.program, kernel.function_name)
            own.set_scalar_arg_dtypes(list(arg_types))
            own.set_args(*args)
            self._kernels.append(own)
            self._sizes.append((tuple(global_size),
                                None if local_size is None else tuple(local_size)))
        self._pyopencl_calls = [
            functools.partial(cl.enqueue_nd_range_kernel, device._run_queue, kernel, glob, loc)
            for kernel, (glob, loc) in zip(self._kernels, self._sizes, strict=True)]
        self._direct_calls = _direct_calls(device._run_queue, self._kernels, self._sizes)
        #: "pyopencl" or "direct": how :meth:`replay` enqueues (see :meth:`choose_enqueue`)
        self.enqueue = "pyopencl"
        self._replay: Callable[[], None] = self._replay_pyopencl

    @property
    def launch_count(self) -> int:
        return len(self._kernels)

    @property
    def kernel_names(self) -> list[str]:
        """The kernels a replay enqueues, in order: what a run costs the host, by name."""
        return [kernel.function_name for kernel in self._kernels]

    def run(self, feeds: list[Any]) -> tuple[list[np.ndarray], float]:
        """(the outputs, downloaded, of a replay on ``feeds``, the host seconds the replay's
        enqueues took).  ``feeds``: host or device arrays of the inputs' shapes and dtypes,
        in order."""
        with self._lock:
            self.write_inputs(feeds)
            started = time.perf_counter()
            self.replay()
            issued = time.perf_counter() - started
            return self.read_outputs(), issued

    def run_resident(self, feeds: list[Any]) -> list[Any]:
        """A replay on ``feeds`` whose outputs stay on the device: the plan's own output
        arrays, which the next replay overwrites.  Not waited for."""
        with self._lock:
            self.write_inputs(feeds)
            self.replay()
            return list(self.outputs)

    def write_inputs(self, feeds: list[Any]) -> None:
        """Copy ``feeds`` into the recorded run's input buffers: a host array before this
        returns, a device array on the queue."""
        cl = self.device._cl
        queue = self.device._run_queue
        for target, feed in zip(self.inputs, feeds, strict=True):
            if isinstance(feed, np.ndarray):
                cl.enqueue_copy(queue, target.base_data, np.ascontiguousarray(feed),
                                dst_offset=target.offset, is_blocking=True)
            elif feed.base_data is not target.base_data or feed.offset != target.offset:
                cl.enqueue_copy(queue, target.base_data, feed.base_data,
                                byte_count=target.nbytes, src_offset=feed.offset,
                                dst_offset=target.offset)

    def read_outputs(self) -> list[np.ndarray]:
        """The recorded run's outputs, downloaded once the queue reaches them."""
        queue = self.device._run_queue
        return [output.get(queue=queue) for output in self.outputs]

    def replay(self) -> None:
        """Enqueue every launch on the device's queue, in order; waits for nothing."""
        self._replay()

    def _replay_pyopencl(self) -> None:
        for call in self._pyopencl_calls:
            call()

    def _replay_direct(self) -> None:
        for function, args in self._direct_calls:
            self._check(function(*args))

    def _check(self, status: int) -> None:
        if status:
            raise self.device._cl.Error(
                f"clEnqueueNDRangeKernel failed with status {status} on replay")

    def timed_replay(self) -> list[float]:
        """One replay, enqueued the way :meth:`replay` does, returning each launch's host
        seconds: where a run's host time goes, by launch (with :attr:`kernel_names`;
        ``benchmarks/probe_replay_launches.py``)."""
        seconds = []
        clock = time.perf_counter
        with self._lock:
            if self.enqueue == "direct":
                for function, args in self._direct_calls:
                    started = clock()
                    status = function(*args)
                    seconds.append(clock() - started)
                    self._check(status)
            else:
                for call in self._pyopencl_calls:
                    started = clock()
                    call()
                    seconds.append(clock() - started)
        return seconds

    def choose_enqueue(self, rounds: int = 5) -> dict[str, float]:
        """Time :meth:`replay`'s host cost both ways, keep the cheaper; returns the host
        seconds per replay of each way timed (the best of ``rounds``)."""
        ways = {"pyopencl": self._replay_pyopencl}
        if self._direct_calls is not None:
            ways["direct"] = self._replay_direct
        queue = self.device._run_queue
        seconds = {}
        for name, replay in ways.items():
            replay()  # warm-up
            queue.finish()
            best = float("inf")
            for _ in range(rounds):
                started = time.perf_counter()
                replay()
                best = min(best, time.perf_counter() - started)
                queue.finish()
            seconds[name] = best
        self.enqueue = min(seconds, key=seconds.__getitem__)
        self._replay = ways[self.enqueue]
        return seconds


@functools.cache
def _enqueue_function() -> Any | None:
    """``clEnqueueNDRangeKernel`` of the OpenCL library pyopencl loaded, or None.

    The library is found in the process's memory map, so the call goes to the very loader
    pyopencl uses (a wheel ships its own copy under a hashed name)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libOpenCL" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            function = ctypes.CDLL(path).clEnqueueNDRangeKernel
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_int
        return function
    return None


def _direct_calls(queue: Any, kernels: list, sizes: list) -> list | None:
    """Per launch, (function, its ctypes arguments) for a direct enqueue without an event;
    None where the OpenCL library cannot be found."""
    function = _enqueue_function()
    if function is None:
        return None
    calls = []
    queue_pointer = ctypes.c_void_p(queue.int_ptr)
    for kernel, (global_size, local_size) in zip(kernels, sizes, strict=True):
        dims = len(global_size)
        global_array = (ctypes.c_size_t * dims)(*global_size)
        local_array = None if local_size is None else (ctypes.c_size_t * dims)(*local_size)
        calls.append((function, (queue_pointer, ctypes.c_void_p(kernel.int_ptr),
                                 ctypes.c_uint(dims), None, global_array, local_array,
                                 ctypes.c_uint(0), None, None)))
    return calls
