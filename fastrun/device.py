"""Devices and their category strings.

The category is the cache namespace for a device: measurements taken on one processor, thread
count or library build say nothing about another, so everything that changes timings belongs in
it and nothing that doesn't (hostnames, paths) may appear.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

import numpy as np

from fastrun import config
from fastrun._threads import blas_threads, configure_threads, threading_layer
from fastrun.category import DEVICE, device_text

T = TypeVar("T")


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

    def __str__(self) -> str:
        return self.kind


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


def _cpu_model_and_flags() -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Hardware", "CPU part") and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown", flags


def _isa_level(machine: str, flags: set[str]) -> str:
    """x86-64 micro-architecture level (v1..v4) or the ARM feature that matters most."""
    if machine in ("x86_64", "AMD64"):
        if {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags:
            return "x86-64-v4"
        if {"avx2", "fma", "bmi2", "movbe"} <= flags:
            return "x86-64-v3"
        if {"sse4_2", "ssse3", "popcnt"} <= flags:
            return "x86-64-v2"
        return "x86-64-v1"
    if machine in ("aarch64", "arm64"):
        for feature in ("sve2", "sve", "asimddp", "asimd"):
            if feature in flags:
                return f"aarch64-{feature}"
        return "aarch64"
    return machine or "unknown"


def _blas_name() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')}-{blas.get('version', '?')}"
    except Exception:
        return "unknown"


@functools.lru_cache(maxsize=8)
def _cpu_category(threads: int, vectors: str) -> str:
    model, flags = _cpu_model_and_flags()
    return device_text([
        (DEVICE, "cpu"),
        ("processor", model),
        ("isa", _isa_level(platform.machine(), flags)),
        ("threads", threads),
        ("numpy", np.__version__),
        ("blas", _blas_name()),
        ("blas_threads", blas_threads()),
        ("numba", _package_version("numba")),
        ("vectors", vectors),
        ("layer", threading_layer()),
    ])


class CPUDevice(Device):
    kind = "cpu"

    def __init__(self, threads: int | None = None):
        configure_threads()  # before the category reads how many threads OpenBLAS has
        self.threads = config.num_threads(threads)

    @property
    def category(self) -> str:
        from fastrun import vectors

        return _cpu_category(self.threads, vectors.category_fact())

    def apply_threads(self) -> None:
        """Run numba kernels on the thread count the category promises."""
        import numba

        numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))


def get_device(spec: str | Device | None = None) -> Device:
    """A device from a spec: a Device, 'cpu' (the default), 'cpu:THREADS', 'opencl' (the
    device FASTRUN_OPENCL_DEVICE names, else the first GPU, else the first device) or
    'opencl:PLATFORM:DEVICE' (indices).

    An OpenCL spec without pyopencl, without a platform or with an index out of range raises
    :class:`fastrun.opencl.OpenCLUnavailableError` (a ValueError) saying which.
    """
    if isinstance(spec, Device):
        return spec
    text = (spec or "cpu").strip().lower()
    kind, _, rest = text.partition(":")
    if kind == "cpu":
        try:
            threads = int(rest) if rest else None
        except ValueError:
            raise ValueError(f"bad device {spec!r}: expected cpu:THREADS, e.g. cpu:4") from None
        return CPUDevice(threads)
    if kind == "opencl":
        from fastrun import opencl  # pyopencl itself is imported only when a device is opened

        return opencl.open_device(config.parse_opencl_indices(rest) if rest else None)
    raise ValueError(f"unknown device {spec!r}: expected 'cpu', 'cpu:THREADS', 'opencl' or "
                     "'opencl:PLATFORM:DEVICE'")
