"""How many cores other processes leave idle: what a model run on a shared machine may use.

Why: a parallel region of numba's pool waits for every one of its workers.  On a machine whose
cores other processes keep busy, each worker waits for a time slice first, and an empty region
at 16 threads cost 3.6-4.0 ms instead of 8 us on the lent Xeon with 16 busy processes beside:
resnet18 ran 4-9x slower at 16 threads than at one (``docs/performance.md``).  A model run
therefore asks for no more threads than there are cores the others leave idle.

The others' load is the busy time of the cores this process may run on (``/proc/stat``) less
this process's own CPU time (``/proc/self/stat``: its spinning workers are its own), over the
last :data:`INTERVAL_S` at least; reading both files costs tens of microseconds, so a run reads
them at most once per interval.  A load counts once it held over two intervals in a row (the
smaller of the last two readings): a process that starts or ends beside a quiet run does not
take its threads away for a moment.  Where the files cannot be read (not Linux), nothing
changes.
"""

from __future__ import annotations

import math
import os
import time

#: Shortest time between two readings of the load: /proc/stat counts in ticks of 10 ms.
INTERVAL_S = 0.05


def _read(path: str) -> str:
    with open(path) as stream:
        return stream.read()


class IdleCores:
    """An estimate of the cores of ``cpus`` that other processes keep busy, renewed at most
    every ``interval_s`` (``read`` is the file reader, replaceable for tests)."""

    def __init__(self, cpus: set[int], interval_s: float = INTERVAL_S, read=_read,
                 clock=time.monotonic) -> None:
        self.cpus = {f"cpu{index}" for index in cpus}
        self.interval_s, self._read, self._clock = interval_s, read, clock
        self._ticks_per_s = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: tuple[float, int, int] | None = None
        self._previous: float | None = None  # the reading of the interval before
        #: the estimate: cores the other processes kept busy over the last two intervals
        #: (None: not known yet)
        self.others: float | None = None

    def _sample(self) -> tuple[float, int, int] | None:
        """(now, busy ticks of our cores, this process's ticks), or None if unreadable."""
        try:
            busy = 0
            for line in self._read("/proc/stat").splitlines():
                fields = line.split()
                if fields and fields[0] in self.cpus:
                    # user nice system idle iowait irq softirq steal ...
                    values = [int(v) for v in fields[1:9]]
                    busy += sum(values) - values[3] - values[4]
            fields = self._read("/proc/self/stat").rsplit(")", 1)[1].split()
            own = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, ValueError, IndexError):
            return None
        return self._clock(), busy, own

    def update(self) -> float | None:
        """The estimate, read anew once the interval has passed since the last reading."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return self.others
        sample = self._sample()
        if sample is None:
            return self.others
        if self._last is not None:
            seconds = sample[0] - self._last[0]
            ticks = (sample[1] - self._last[1]) - (sample[2] - self._last[2])
            reading = max(0.0, ticks / self._ticks_per_s / seconds)
            if self._previous is not None:
                self.others = min(reading, self._previous)
            self._previous = reading
        self._last = sample
        return self.others


def threads_to_use(wanted: int, cores: int, others: float | None) -> int:
    """The threads a run may use: ``wanted``, but no more than the cores the others leave idle,
    and at least one.  The others' load is rounded to whole cores: a busy process that competes
    with this run's threads gets only part of a core (on 2 cores beside 2 threads, about two
    thirds), so counting only whole cores never saw it; a daemon's occasional fraction of a core
    stays below one half, and is filtered by the two-interval reading besides."""
    if others is None:
        return wanted
    return max(1, min(wanted, cores - math.floor(others + 0.5)))
