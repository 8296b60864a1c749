"""Progress of long searches: always to the log, and as a bar when a person is watching.

The profiler only calls :class:`Progress`; whether that draws a bar is decided by whoever
creates the session (a terminal, ``FASTRUN_PROGRESS``), so library code never writes to the
screen on its own.

Two levels: a *job* (a model's problems searched one after another: ``job`` / ``job_item`` /
``job_end``) and the *problem* being profiled (``begin`` / ``step`` / ``end``, nested when a
candidate's sub-problems are searched first).  The bar is tqdm's (sized to the terminal,
redrawn in place, with elapsed time and an ETA): over the job's problems when there is a job,
else over the candidates of the outermost problem; the current problem and candidate go after
it.  Counts never pass their totals: confirmation rounds and sub-problems are not counted as
candidates.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

from fastrun import config

log = logging.getLogger("fastrun.search")


class Progress:
    """Logs each search step; subclasses may also draw."""

    #: Where the search stands in a larger job, e.g. "[3/21 layer1.0.conv1]" while a runtime
    #: searches a model's problems one after another; shown before each problem in the log.
    context: str = ""

    def job(self, total: int, title: str) -> None:
        """A sequence of ``total`` problems begins (a model's search)."""
        log.info("%s: %d problem(s)", title, total)

    def job_item(self, index: int, total: int, label: str) -> None:
        """Problem ``index`` (from 1) of the job, e.g. a model's step, is being decided."""
        self.context = f"[{index}/{total} {label}]"

    def job_end(self) -> None:
        self.context = ""

    def begin(self, title: str, total: int) -> None:
        log.info("%ssearching %s: %d candidate(s)", _prefix(self.context), title, total)

    def step(self, label: str, outcome: str) -> None:
        log.info("  %s: %s", label, outcome)

    def end(self, summary: str) -> None:
        log.info("  -> %s", summary)


#: The label of the profiler's confirmation round: not a candidate of its own.
CONFIRMATION = "confirmed"


class TerminalProgress(Progress):
    """tqdm's bar on ``stream``: ``3/21  14%|█▍        | 00:04<00:28 layer1.0.conv1:
    conv(...) 5/12 winograd_f4x3``: problems (or candidates) done, elapsed time and ETA, then
    where the search is, the problem, its candidates done and the last one timed."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._bar: Any = None
        self._redirect: Any = None  # console logging sent through tqdm while a bar is up
        self._where = ""  # the job's current item, or "searching"
        self._job = False
        self._depth = 0
        self._title = ""
        self._done = 0
        self._total = 0

    def _new_bar(self, total: int, unit: str, description: str) -> None:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._close()
        # A warning written while the bar is drawn would be glued to the bar's line: console
        # log records go through tqdm, which clears the bar, writes the record on a line of
        # its own and draws the bar again below it.
        self._redirect = logging_redirect_tqdm()
        self._redirect.__enter__()
        # The counts and times first, then what is being searched (tqdm cuts the line at the
        # terminal's width, so a long node or problem name loses its end, not the figures).
        self._bar = tqdm(total=total, unit=unit, desc=description, file=self.stream,
                         dynamic_ncols=True, leave=False, mininterval=0.1,
                         bar_format="{n_fmt}/{total_fmt} {percentage:3.0f}%|{bar:10}| "
                                    "{elapsed}<{remaining} {desc}")
        self._where = description

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None

    def job(self, total: int, title: str) -> None:
        super().job(total, title)
        self._job = True
        self._new_bar(total, "problem", title)

    def job_item(self, index: int, total: int, label: str) -> None:
        super().job_item(index, total, label)
        self._where = label
        if self._bar is not None:
            self._bar.n = min(index - 1, total)  # the ones before it are decided
            self._bar.refresh()

    def job_end(self) -> None:
        super().job_end()
        self._job = False
        self._close()

    def begin(self, title: str, total: int) -> None:
        super().begin(title, total)
        self._depth += 1
        if self._depth == 1:
            self._title, self._done, self._total = title, 0, total
            if not self._job:
                self._new_bar(total, "candidate", "searching")
        self._show("")

    def step(self, label: str, outcome: str) -> None:
        super().step(label, outcome)
        if self._depth == 1 and label != CONFIRMATION and self._done < self._total:
            self._done += 1
            if not self._job and self._bar is not None:
                self._bar.update(1)
        self._show(label)

    def end(self, summary: str) -> None:
        super().end(summary)
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and not self._job:
            self._close()

    def _show(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(
                f"{self._where}: {self._title} {self._done}/{self._total} {label}".rstrip())


class LineProgress(Progress):
    """Progress for a log file or a pipe, where a bar would be debris: a line on ``stream``
    every :data:`LINE_INTERVAL_S` at most while a job (a model's search) runs, with the
    problems decided, the elapsed time and an ETA from the mean time per problem so far;
    and a last line when it ends, if any was written.  A search shorter than the interval
    writes nothing."""

    def __init__(self, stream: TextIO, interval_s: float | None = None, clock=time.monotonic):
        self.stream = stream
        self.interval_s = LINE_INTERVAL_S if interval_s is None else interval_s
        self.clock = clock
        self._started = self._last = 0.0
        self._title = ""
        self._wrote = False

    def job(self, total: int, title: str) -> None:
        super().job(total, title)
        self._started = self._last = self.clock()
        self._title, self._wrote = title, False

    def job_item(self, index: int, total: int, label: str) -> None:
        super().job_item(index, total, label)
        now = self.clock()
        if now - self._last < self.interval_s:
            return
        self._last = now
        done, elapsed = index - 1, now - self._started
        eta = (f", about {_clock_text(elapsed / done * (total - done))} left" if done
               else "")
        self._write(f"{self._title}: {done}/{total} problem(s) decided, "
                    f"{_clock_text(elapsed)} elapsed{eta}; now {label}")

    def job_end(self) -> None:
        super().job_end()
        if self._wrote:
            self._write(f"{self._title}: done in {_clock_text(self.clock() - self._started)}")

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()
        self._wrote = True


#: Seconds between two lines of :class:`LineProgress`.
LINE_INTERVAL_S = 10.0


def _clock_text(seconds: float) -> str:
    hours, rest = divmod(max(0, round(seconds)), 3600)
    minutes = f"{rest // 60:02d}" if hours else f"{rest // 60}"
    return (f"{hours}:" if hours else "") + f"{minutes}:{rest % 60:02d}"


def _prefix(context: str) -> str:
    return f"{context} " if context else ""


def make_progress(enabled: bool | None = None, stream: TextIO | None = None) -> Progress:
    """A bar when forced on, or when unset and ``stream`` (stderr) is a terminal; when unset
    and it is not (a log file, a pipe), a line now and then (:class:`LineProgress`); nothing
    but the log when turned off (``--no-progress``, ``FASTRUN_PROGRESS=0``)."""
    stream = stream or sys.stderr
    wanted = config.PROGRESS.get(enabled)
    if wanted is None:
        if not (hasattr(stream, "isatty") and stream.isatty()):
            return LineProgress(stream)
        wanted = True
    return TerminalProgress(stream) if wanted else Progress()
