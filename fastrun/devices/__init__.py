"""Devices as plugins: the ``Device`` protocol, and opening a device from a spec.

What it may import: the base modules (``fastrun.config``, ``fastrun.category``), never the
core, the cache, the runtime or the tools; a backend may import its own libraries (the OpenCL
one imports pyopencl, only when a device is opened), and nothing outside a backend does.

A backend is a :class:`Device` subclass registered in the ``fastrun.devices`` entry point
group under its kind: ``cpu`` (:mod:`fastrun.devices.cpu`) and ``opencl``
(:mod:`fastrun.devices.opencl`) are fastrun's own, and an installed package adds another kind
the same way, with no framework edit (``docs/adding-a-device.md``).  The category is the cache
namespace for a device: measurements taken on one processor, thread count or library build
say nothing about another, so everything that changes timings belongs in it and nothing that
doesn't (hostnames, paths) may appear.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

import numpy as np

from fastrun import config

T = TypeVar("T")

#: The entry point group device backends register in: ``KIND = "module:DeviceClass"``.
DEVICE_GROUP = "fastrun.devices"

#: What a search is timing while it calls :meth:`Device.measure`: (operator, problem key,
#: algorithm desc text), else None.  Set by the profiler around each timed call, so that a
#: device that replays recorded times (:mod:`fastrun.devices.simulated`) knows which time to
#: give, without the measure call changing for every other device.
measuring: contextvars.ContextVar[tuple[str, str, str] | None] = contextvars.ContextVar(
    "fastrun_measuring", default=None)


#: Bytes compared at once by :func:`same_bits`: small enough to stay out of a large temporary.
_CHUNK_BYTES = 1 << 23


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same shape, dtype and bits (a NaN equals itself, -0 is not
    +0: a candidate that wrote either did write).  Compared as bytes in chunks: on VGG-16's
    400 MB classifier weight, ``array_equal(equal_nan=True)`` took 0.57 s per candidate and
    input, most of that problem's check, for temporaries of the whole array."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    left = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    right = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    for start in range(0, left.size, _CHUNK_BYTES):
        stop = start + _CHUNK_BYTES
        if not np.array_equal(left[start:stop], right[start:stop]):
            return False
    return True


class UnreplayableError(RuntimeError):
    """A recorded run did something a replay of its launches would not repeat (an upload or
    a download between steps), so the model keeps running step by step."""


class Device:
    """Where algorithms run: its category namespaces the cache, its clock times candidates.

    The defaults describe a device that computes in host memory (numpy arrays) and finishes
    its work before a call returns; an accelerator overrides the memory methods and
    :meth:`measure`.  ``kind`` is matched against :attr:`Algorithm.device_kind`, so only
    algorithms written for this kind of device are candidates on it.
    """

    kind: str = ""
    #: True when algorithms take and return numpy arrays, so inputs need no conversion.
    host_memory: bool = True

    @property
    def category(self) -> str:
        """The device's facts as one text (:func:`fastrun.category.device_text`)."""
        raise NotImplementedError

    def clock_ns(self) -> int:
        """The host clock: budgets and (on synchronous devices) timings are taken with it."""
        return time.perf_counter_ns()

    def synchronize(self) -> None:
        """Wait until queued work is done (a no-op for synchronous devices)."""

    def sharing(self) -> contextlib.AbstractContextManager[None]:
        """Around each model run: adapt to what else the machine runs (the CPU device uses
        only the cores other processes leave idle).  Nothing by default."""
        return contextlib.nullcontext()

    def measure(self, function: Callable[[], T]) -> tuple[int, T]:
        """Run ``function`` once and return (nanoseconds it took on this device, its value).

        The device's own notion of time: here the host clock around the call and a
        synchronize, so asynchronous work is counted; an OpenCL device times with markers on
        its queue instead.
        """
        start = self.clock_ns()
        value = function()
        self.synchronize()
        return self.clock_ns() - start, value

    def to_device(self, array: Any) -> Any:
        """``array`` in the memory this device's algorithms take (here: a numpy array, not
        copied, so profiling a CPU algorithm times the arrays it would get in production)."""
        return np.asarray(array)

    def to_host(self, value: Any) -> np.ndarray:
        """A result as a numpy array, for the numerical check and for the caller."""
        return np.asarray(value)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array in this device's memory."""
        return np.empty(shape, dtype)

    def copy(self, value: Any) -> Any:
        """A copy of an array of this device's memory, in its memory: what each candidate of
        a search gets as its inputs, so one that writes into them spoils nothing else."""
        return self.to_device(np.array(self.to_host(value)))

    def same_bits(self, a: Any, b: Any) -> bool:
        """Whether two arrays of this device's memory hold the same shape, dtype and bits
        (:func:`same_bits`).  A device with its own memory compares them there, so the
        search's checks need not download every output and input of every candidate."""
        return same_bits(np.asarray(self.to_host(a)), np.asarray(self.to_host(b)))

    # -- what a backend adds: how it is opened and listed, and its runtime steps --------------
    def activate(self) -> None:
        """Called when a session starts on this device: set up what its timings assume (the
        CPU sets numba's thread count).  Nothing by default."""

    def model_loaded(self) -> None:
        """Called when a model is loaded to run on this device: set up what its steady
        inferences assume (the CPU keeps freed pages mapped).  Nothing by default."""

    @classmethod
    def open(cls, options: str) -> Device:
        """The device a spec selects: ``options`` is the text after 'KIND:' ('' for 'KIND')."""
        raise NotImplementedError

    @classmethod
    def describe_devices(cls) -> list[str]:
        """One line per device of this kind that :meth:`open` can select (``fastrun config``
        prints them)."""
        return []

    @property
    def spec(self) -> str:
        """The spec that selects this device again."""
        return self.kind

    def fleet_specs(self) -> list[str]:
        """The devices of this machine that a local tune gives one worker each when the user
        named the kind alone (``--device opencl``): this device by default.  A backend with
        several devices of one kind lists them all, this one first, so that no two workers
        time on one device (the CPU's workers get cores of their own instead)."""
        return [self.spec]

    def array_type(self) -> type:
        """The type of the arrays this device's algorithms take and return (the runtime
        accepts inputs already of this type without a copy)."""
        return np.ndarray

    def cast(self, array: Any, dtype: Any) -> Any:
        """A new array of this device's memory: ``array`` converted as numpy's ``astype``."""
        return self.to_device(self.to_host(array).astype(dtype))

    def view_function(self, step: Any) -> Callable[[Any], Any]:
        """What a runtime view step (a reshape, a cast, a host-only function) runs on this
        device's arrays.  By default the step's own numpy function, which serves any device
        whose arrays are numpy's (:attr:`host_memory`)."""
        return step.view

    def parallel_builds(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the device may compile the programs asked of it several at once,
        in helper processes (a search's build-ahead opens it).  Nothing by default: a device
        without compiled programs has nothing to spread."""
        return contextlib.nullcontext()

    def recording(self) -> Any | None:
        """A context that records the launches a model run enqueues inside it, so the run
        can be replayed without its per-step host cost (``recording.plan()``, see
        :mod:`fastrun.devices.opencl.replay`); None where the device cannot (the default: a
        device that computes as it is called has no queue to replay onto)."""
        return None

    def __str__(self) -> str:
        return self.kind


@functools.cache
def device_backends() -> dict[str, Any]:
    """The registered device kinds and their entry points (loaded when a device is opened)."""
    return {entry.name: entry for entry in entry_points(group=DEVICE_GROUP)}


def device_class(kind: str) -> type[Device]:
    """The :class:`Device` subclass registered for ``kind``."""
    backends = device_backends()
    if kind not in backends:
        raise ValueError(f"unknown device kind {kind!r}: the installed kinds are "
                         f"{', '.join(sorted(backends)) or 'none'} (the {DEVICE_GROUP!r} "
                         f"entry points)")
    try:
        backend = backends[kind].load()
    except Exception as error:  # a broken plugin: say which, keep the cause
        raise ValueError(f"the {kind!r} device backend ({backends[kind].value}) failed to "
                         f"load: {type(error).__name__}: {error}") from error
    if not (isinstance(backend, type) and issubclass(backend, Device)):
        raise ValueError(f"the {kind!r} device backend ({backends[kind].value}) is not a "
                         f"fastrun Device class")
    return backend


def declared_settings() -> list[Any]:
    """Every declared setting (``fastrun.config.Setting``): the framework's and those of each
    installed device kind, whose package declares them when it loads.  A backend that fails
    to load is left out of the list (opening it says why)."""
    for kind in device_backends():
        try:
            device_class(kind)
        except ValueError:
            continue
    return config.declared()


def get_device(spec: str | Device | None = None) -> Device:
    """A device from a spec: a Device, or 'KIND[:OPTIONS]' for a registered kind: 'cpu' (the
    default), 'cpu:THREADS', 'opencl' (the device FASTRUN_OPENCL_DEVICE names, else the first
    GPU, else the first device), 'opencl:PLATFORM:DEVICE' (indices), or a plugin's kind.

    An unknown kind, or options its backend cannot read, raise a ValueError saying which; an
    OpenCL spec without pyopencl or a platform raises
    :class:`fastrun.devices.opencl.OpenCLUnavailableError` (a ValueError).
    """
    if isinstance(spec, Device):
        return spec
    kind, options = split_spec(spec)
    return device_class(kind).open(options)


def split_spec(spec: str | None) -> tuple[str, str]:
    """(kind, options) of a device spec: ``'opencl:0:1'`` -> ``('opencl', '0:1')``, ``'cpu'``
    and None -> ``('cpu', '')``.  The one reading of a spec's shape: the options name one
    device (or a thread count), their absence lets a tune take every device of the kind."""
    kind, _, options = (spec or "cpu").strip().lower().partition(":")
    return kind, options

