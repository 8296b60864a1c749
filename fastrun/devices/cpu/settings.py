"""The CPU device's settings (declared here, read through ``fastrun.config``)."""

from __future__ import annotations

import os

from fastrun import config


def _affinity_cpus() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cpus or 1


def _thread_count(threads: int) -> int:
    """1 to the machine's CPUs.  More would be written into the cache category while numba's
    pool (one thread per CPU) runs fewer: a category that lies."""
    most = os.cpu_count() or 1
    if not 1 <= threads <= most:
        raise ValueError(f"thread count {threads} is not between 1 and this machine's {most} "
                         "CPUs")
    return threads


def _vector_bits(raw: str) -> str:
    text = raw.strip().lower()
    if text not in ("512", "256", "auto"):
        raise ValueError("expected 512, 256 or auto")
    return text


NUM_THREADS = config.declare(
    "FASTRUN_NUM_THREADS", "thread count the CPU device reports in its category and gives "
    "numba (default: the CPUs this process may run on)", "cpu", int, _affinity_cpus,
    check=_thread_count)
VECTOR_BITS = config.declare(
    "FASTRUN_VECTOR_BITS", "vector width of numba's CPU kernels on AVX-512 processors: 512 "
    "(default), 256, or auto (LLVM's choice for the processor)", "cpu", _vector_bits, "512")
KEEP_PAGES = config.declare(
    "FASTRUN_KEEP_PAGES", "1 (default): a CPU model keeps freed memory mapped for the next "
    "inference (glibc); 0 returns large blocks to the system", "cpu", config.parse_switch, True)
SHARE_CORES = config.declare(
    "FASTRUN_SHARE_CORES", "1 (default): a CPU model's run uses no more threads than the cores "
    "other processes leave idle (a parallel region waits for every worker; docs/runtime.md, A "
    "shared machine); 0 always uses the device's thread count", "cpu", config.parse_switch,
    True)
