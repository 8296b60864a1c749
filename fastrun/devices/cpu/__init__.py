"""The CPU device: numba's and OpenBLAS's threads on this machine's processor.

Its category names everything that changes a CPU kernel's time: the processor and its
instruction set level, the thread count, numpy and its BLAS (with its threads), numba, the
vector width numba compiles for and numba's threading layer.

The package holds everything the CPU device sets up for the process: the thread pools'
defaults (``threads``), the vector width (``vectors``), numpy's OpenBLAS (``openblas``), the
memory settings (``memory``) and the cores other processes leave idle (``share``).

What it may import: the device protocol, the base modules (``config``, ``category``), numpy,
and numba and llvmlite inside functions (``import fastrun`` stays light).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from fastrun.category import DEVICE, device_text
from fastrun.devices import Device
from fastrun.devices.cpu.memory import keep_freed_pages, turn_off_huge_page_advice
from fastrun.devices.cpu.settings import KEEP_PAGES, NUM_THREADS, SHARE_CORES
from fastrun.devices.cpu.share import IdleCores, threads_to_use
from fastrun.devices.cpu.threads import blas_threads, configure_threads, threading_layer
from fastrun.devices.cpu.vectors import cpu_model_and_flags


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


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
    model, flags = cpu_model_and_flags()
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
        turn_off_huge_page_advice()
        # Before numba starts its pool (activate): without this, numba's own choice ran where
        # TBB's library is not on the loader's path (OpenMP), while the category named TBB.
        threading_layer()
        self.threads = NUM_THREADS.get(threads)
        #: the cores other processes keep busy (fastrun.devices.cpu.share), made on first use
        self._idle: IdleCores | None = None
        #: the thread count the last model run used (see sharing)
        self.shared_threads = self.threads

    @property
    def category(self) -> str:
        from fastrun.devices.cpu import vectors

        return _cpu_category(self.threads, vectors.category_fact())

    def activate(self) -> None:
        """Run numba kernels on the thread count the category promises."""
        import numba

        numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))

    def model_loaded(self) -> None:
        """Keep freed pages mapped for the next inference (``FASTRUN_KEEP_PAGES``, default
        on; :mod:`fastrun.devices.cpu.memory`)."""
        if KEEP_PAGES.get():
            keep_freed_pages()

    @contextlib.contextmanager
    def sharing(self) -> Iterator[None]:
        """Around a model run: use no more threads than the cores other processes leave idle
        (``FASTRUN_SHARE_CORES``, default on; :mod:`fastrun.devices.cpu.share`), so that no
        parallel region waits for workers that have no core; the category's count again
        after, so that a search in between times at it."""
        wanted = self._threads_to_share()
        if wanted == self.threads:
            yield
            return
        import numba

        numba.set_num_threads(min(wanted, numba.config.NUMBA_NUM_THREADS))
        try:
            yield
        finally:
            numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))

    def _threads_to_share(self) -> int:
        if self.threads == 1 or not SHARE_CORES.get():
            return self.threads
        if self._idle is None:
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
            self._idle = IdleCores(cpus or set(range(os.cpu_count() or 1)))
        self.shared_threads = threads_to_use(self.threads, len(self._idle.cpus),
                                             self._idle.update())
        return self.shared_threads

    @classmethod
    def open(cls, options: str) -> CPUDevice:
        """'cpu' (``options`` empty: FASTRUN_THREADS, else every core) or 'cpu:THREADS'."""
        try:
            threads = int(options) if options else None
        except ValueError:
            raise ValueError(f"bad device 'cpu:{options}': expected cpu:THREADS, e.g. cpu:4"
                             ) from None
        return cls(threads)

    @property
    def spec(self) -> str:
        return f"cpu:{self.threads}"

    @classmethod
    def describe_devices(cls) -> list[str]:
        model, _ = cpu_model_and_flags()
        return [f"{model}, {NUM_THREADS.get()} threads by default "
                f"(cpu:THREADS picks another count)"]
