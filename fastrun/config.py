"""The one place where fastrun reads its settings.

Explicit arguments win; otherwise a ``FASTRUN_*`` environment variable; otherwise the default.
Variables are read when a setting is used, never at import, so that a test or an embedding
program can change them at any time.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Every variable fastrun reads, with its meaning (shown by ``fastrun config``).
VARIABLES: dict[str, str] = {
    "FASTRUN_STRATEGY": "default strategy of fastrun.call outside a session (heuristic, "
    "fast-run, full-run, optionally +reproducible)",
    "FASTRUN_CACHE": "path of a cache file used as the default process-wide cache",
    "FASTRUN_RECORD": "path of a problems file every session appends its cache misses to "
                      "(docs/fleet.md)",
    "FASTRUN_NEAREST": "largest shape distance at which a cache-only or heuristic run serves a "
    "problem the cache lacks from the nearest measured one (default 1.0: one axis doubled; "
    "0 turns it off; fastrun.core.nearest)",
    "FASTRUN_CACHE_MAX_BYTES": "largest cache file fastrun reads (default 1GiB); a larger file "
    "is left alone and the run keeps its results in memory",
    "FASTRUN_CACHE_LOCK_TIMEOUT": "seconds a cache write waits for another process's lock "
    "before the run goes on in memory (default 60); the message names the holder's pid",
    "FASTRUN_MEMORY_LIMIT": "largest tensor a model or fastrun profile may allocate, e.g. "
    "64GiB (default: this machine's memory); larger ones are refused before allocation, "
    "naming the node",
    "FASTRUN_WORKSPACE_LIMIT": "default workspace limit, e.g. 64MiB",
    "FASTRUN_NUM_THREADS": "thread count the CPU device reports in its category and gives numba",
    "FASTRUN_PROFILE_SECONDS": "seconds of timed repeats per candidate (default 0.2; "
    "formerly FASTRUN_PROFILE_BUDGET, still read with a deprecation warning)",
    "FASTRUN_PROGRESS": "1 forces a progress bar, 0 hides it (default: on a terminal)",
    "FASTRUN_TUNING_CANDIDATES": "candidates of one problem timed fully (formerly "
    "FASTRUN_TUNING_BUDGET, still read with a deprecation warning); larger spaces are sampled "
    "and halved first (default 24, 0 = time all)",
    "FASTRUN_VECTOR_BITS": "vector width of numba's CPU kernels on AVX-512 processors: 512 "
    "(default), 256, or auto (LLVM's choice for the processor)",
    "FASTRUN_KEEP_PAGES": "1 (default): a CPU model keeps freed memory mapped for the next "
    "inference (glibc); 0 returns large blocks to the system",
    "FASTRUN_SHARE_CORES": "1 (default): a CPU model's run uses no more threads than the cores "
    "other processes leave idle (a parallel region waits for every worker; docs/runtime.md, A "
    "shared machine); 0 always uses the device's thread count",
    "FASTRUN_BLOCKED_LAYOUT": "1: a CPU model's search may run convolutions in the "
    "channel-blocked layout where that is measured to pay, and keeps that plan only if whole "
    "inferences run faster than all NCHW (docs/runtime.md, Layouts); 0 (default) keeps every "
    "step NCHW",
    "FASTRUN_REPLAY": "1 (default): a model on the OpenCL device records its kernel launches "
    "once, checks the recording against an ordinary run and replays it on every later run "
    "(docs/runtime.md, Launch plans); 0 issues every step through its algorithm",
    "FASTRUN_BUILD_PROCESSES": "helper processes that compile a search's OpenCL programs at "
    "once (default on a GPU: one per CPU but one, at most 12 and one per 4 GiB of its memory; "
    "none on a CPU device, whose driver compiles when a kernel first runs; 0 turns them off; "
    "docs/opencl.md, Building kernels during a search)",
    "FASTRUN_OPENCL_DEVICE": "PLATFORM:DEVICE indices of the device 'opencl' selects, e.g. 0:1 "
    "(default: the first GPU, else the first device)",
}


def markdown_table() -> str:
    """:data:`VARIABLES` as the Markdown table of ``docs/settings.md``: the page shows what
    ``fastrun config`` shows, and a test keeps the two equal, so the meanings are written
    once, here."""
    rows = ["| variable | meaning |", "| --- | --- |"]
    rows += [f"| `{name}` | {meaning.replace('|', '/')} |" for name, meaning in VARIABLES.items()]
    return "\n".join(rows) + "\n"


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
}


def parse_size(text: str | int | None) -> int | None:
    """Parse '64MiB', '1.5GB', '4096' into bytes; None, '', 'none' and 'inf' mean unlimited."""
    if text is None or isinstance(text, int):
        return text
    raw = text.strip().lower()
    if raw in ("", "none", "inf", "unlimited"):
        return None
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", raw)
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ValueError(
            f"cannot read size {text!r}: expected a number of bytes with an optional unit "
            "(B, KB, KiB, MB, MiB, GB, GiB), e.g. 64MiB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def renamed(variable: str, old: str) -> str:
    """The variable to read: ``variable``, or the ``old`` name it replaced when only that is
    set (with a DeprecationWarning: a budget's name now says its unit)."""
    if variable not in os.environ and old in os.environ:
        warnings.warn(f"{old} is deprecated; use {variable}", DeprecationWarning, stacklevel=3)
        return old
    return variable


def setting(explicit: T | None, variable: str, default: T, parse: Callable[[str], T]) -> T:
    """Resolve one setting: explicit argument, then environment variable, then default."""
    if explicit is not None:
        return explicit
    raw = os.environ.get(variable)
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except ValueError as error:
        raise ValueError(f"environment variable {variable}={raw!r}: {error}") from None


def num_threads(explicit: int | None = None) -> int:
    """The CPU device's thread count: 1 to the machine's CPUs.  More would be written into the
    cache category while numba's pool (one thread per CPU) runs fewer: a category that lies."""
    default = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = setting(explicit, "FASTRUN_NUM_THREADS", default or 1, int)
    most = os.cpu_count() or 1
    if not 1 <= threads <= most:
        raise ValueError(f"thread count {threads} is not between 1 and this machine's {most} "
                         "CPUs")
    return threads


def profile_budget(explicit: float | None = None) -> float:
    budget = setting(explicit, renamed("FASTRUN_PROFILE_SECONDS", "FASTRUN_PROFILE_BUDGET"),
                     0.2, float)
    if not 0 < budget < float("inf"):
        raise ValueError(f"profiling budget {budget} is not a positive number of seconds")
    return budget


def tuning_budget(explicit: int | None = None, default: int = 24) -> int:
    """Candidates timed fully per problem (see fastrun.core.tuning); 0 or less: no budget."""
    return setting(explicit, renamed("FASTRUN_TUNING_CANDIDATES", "FASTRUN_TUNING_BUDGET"),
                   default, int)


def vector_bits(explicit: str | None = None) -> str:
    """'512', '256' or 'auto' (see fastrun.devices.cpu.vectors)."""
    return setting(explicit, "FASTRUN_VECTOR_BITS", "512", _parse_vector_bits)


def _parse_vector_bits(raw: str) -> str:
    text = raw.strip().lower()
    if text not in ("512", "256", "auto"):
        raise ValueError("expected 512, 256 or auto")
    return text


def keep_pages(explicit: bool | None = None) -> bool:
    """Whether a CPU model asks glibc to keep freed pages (see fastrun.devices.cpu.memory)."""
    return setting(explicit, "FASTRUN_KEEP_PAGES", True, _parse_switch)


def share_cores(explicit: bool | None = None) -> bool:
    """Whether a CPU model's run leaves the cores other processes use to them
    (fastrun.devices.cpu.share)."""
    return setting(explicit, "FASTRUN_SHARE_CORES", True, _parse_switch)


def blocked_layout(explicit: bool | None = None) -> bool:
    """Whether a CPU model may choose the channel-blocked layout (fastrun.runtime.layout).
    Off by default: on the 16-core host the models it was measured on ran no faster with it
    (docs/performance.md)."""
    return setting(explicit, "FASTRUN_BLOCKED_LAYOUT", False, _parse_switch)


def replay(explicit: bool | None = None) -> bool:
    """Whether a model on a queued device (OpenCL) records its launches once and replays
    them (fastrun.devices.opencl.replay).  On by default: it cut the host cost per step,
    which a batch-1 model on a GPU waits for (docs/performance.md)."""
    return setting(explicit, "FASTRUN_REPLAY", True, _parse_switch)


def build_processes(explicit: int | None = None, default: int = 0) -> int:
    """Helper processes that compile OpenCL programs during a search
    (fastrun.devices.opencl.builders); 0 or 1: none, the searching process builds alone.
    ``default`` is the device's own choice (:meth:`OpenCLDevice.parallel_builds`)."""
    processes = setting(explicit, "FASTRUN_BUILD_PROCESSES", default, int)
    if processes < 0:
        raise ValueError(f"build helper count {processes} (FASTRUN_BUILD_PROCESSES) is negative; "
                         "0 turns the helpers off")
    return processes


def _parse_switch(raw: str) -> bool:
    text = raw.strip().lower()
    if text not in ("0", "1", "true", "false", "on", "off"):
        raise ValueError("expected 1 or 0")
    return text in ("1", "true", "on")


def workspace_limit(explicit: int | str | None = None) -> int | None:
    if explicit is not None:
        return parse_size(explicit)
    return parse_size(os.environ.get("FASTRUN_WORKSPACE_LIMIT"))


def strategy_text(explicit: str | None = None) -> str:
    return setting(explicit, "FASTRUN_STRATEGY", "heuristic", str)


def cache_path(explicit: str | None = None) -> str | None:
    return setting(explicit, "FASTRUN_CACHE", None, str)


def record_path(explicit: str | None = None) -> str | None:
    """The problems file a session records its cache misses into; None: no recording."""
    return setting(explicit, "FASTRUN_RECORD", None, str) or None


def nearest_limit(explicit: float | None = None) -> float:
    """Largest distance of a nearest measured neighbour (fastrun.core.nearest); 0: none."""
    limit = setting(explicit, "FASTRUN_NEAREST", 1.0, float)
    if not 0 <= limit < float("inf"):
        raise ValueError(f"nearest-neighbour limit {limit} is not a distance (0 turns it off, "
                         "1.0 is the default)")
    return limit


def memory_limit(explicit: int | str | None = None, default: int | None = None) -> int | None:
    if explicit is not None:
        return parse_size(explicit)
    raw = os.environ.get("FASTRUN_MEMORY_LIMIT")
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse_size(raw)
    except ValueError as error:
        raise ValueError(f"environment variable FASTRUN_MEMORY_LIMIT={raw!r}: {error}") from None


def cache_max_bytes(explicit: int | str | None = None) -> int:
    if explicit is not None:
        return parse_size(explicit) or (1 << 30)
    return parse_size(os.environ.get("FASTRUN_CACHE_MAX_BYTES") or "1GiB") or (1 << 30)


def cache_lock_timeout(explicit: float | None = None) -> float:
    return setting(explicit, "FASTRUN_CACHE_LOCK_TIMEOUT", 60.0, _positive_seconds)


def _positive_seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError("expected a positive number of seconds")
    return value


def progress(explicit: bool | None = None) -> bool | None:
    """True/False when forced; None means 'decide by whether stderr is a terminal'."""
    return setting(explicit, "FASTRUN_PROGRESS", None, lambda raw: raw.strip() not in ("0", ""))
