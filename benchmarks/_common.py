"""Shared by the benchmark scripts: machine description and robust timing."""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable


def machine() -> str:
    from fastrun.devices.cpu import _cpu_model_and_flags

    model, _ = _cpu_model_and_flags()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, Python {platform.python_version()}"


def header(title: str) -> str:
    today = datetime.date.today().isoformat()
    return f"# {title}\n# {today} on {machine()}"


def time_calls(function: Callable[[], object], number: int) -> float:
    """Seconds per call over ``number`` back-to-back calls, garbage collector off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            function()
        return (time.perf_counter() - start) / number
    finally:
        if was_enabled:
            gc.enable()


def call_times(function: Callable[[], object], calls: int) -> list[float]:
    """Seconds of each of ``calls`` back-to-back calls: a steady loop as a user runs it,
    timed call by call so that medians and tails can be read from it (warm up first)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def interleaved_samples(functions: dict[str, Callable[[], object]], rounds: int,
                        number: int, settle_s: float = 0.0) -> dict[str, list[float]]:
    """Seconds per call of each function, one sample per round, measured in alternating
    rounds so that drift of a shared machine hits every function alike.

    ``settle_s``: before each sample, run the function untimed for this long, so that thread
    pools the previous function used (OpenBLAS workers spin for about 0.1 s after a call) have
    gone idle and each function is measured in its own steady state.
    """
    samples: dict[str, list[float]] = {name: [] for name in functions}
    names = list(functions)
    for index in range(rounds):
        # Each round starts with another function, so that none always follows the same one
        # (a peer whose threads keep spinning after a call would slow whatever comes next).
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            function = functions[name]
            deadline = time.perf_counter() + settle_s
            while time.perf_counter() < deadline:
                function()
            samples[name].append(time_calls(function, number))
    return samples


def interleaved_medians(functions: dict[str, Callable[[], object]], rounds: int,
                        number: int, settle_s: float = 0.0) -> dict[str, float]:
    """Median seconds per call of each function over :func:`interleaved_samples`' rounds."""
    return medians(interleaved_samples(functions, rounds, number, settle_s))


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    """Each function's median over its samples."""
    return {name: statistics.median(values) for name, values in samples.items()}


def paired_ratio(samples: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of the two functions' ratio within the round.

    Why not the ratio of the medians: a burst of load that lasts a few rounds moves both
    functions' samples of those rounds, so a ratio taken inside a round cancels it, while the
    two medians can each land on a different round's noise.
    """
    return statistics.median(a / b for a, b in zip(samples[numerator], samples[denominator],
                                                   strict=True))
