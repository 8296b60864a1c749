"""Progress of long searches: always to the log, and as a bar when a person is watching.

The profiler only calls :class:`Progress`; whether that draws a bar is decided by whoever
creates the session (a terminal, ``FASTRUN_PROGRESS``), so library code never writes to the
screen on its own.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from fastrun import config

log = logging.getLogger("fastrun.search")


class Progress:
    """Logs each search step; subclasses may also draw."""

    #: Where the search stands in a larger job, e.g. "[3/21 layer1.0.conv1]" while a runtime
    #: searches a model's problems one after another; shown before each problem.
    context: str = ""

    def begin(self, title: str, total: int) -> None:
        log.info("%ssearching %s: %d candidate(s)", _prefix(self.context), title, total)

    def step(self, label: str, outcome: str) -> None:
        log.info("  %s: %s", label, outcome)

    def end(self, summary: str) -> None:
        log.info("  -> %s", summary)


class TerminalProgress(Progress):
    """A one-line bar redrawn in place: ``[#####-----] 5/10 matmul(...) blocked(...)``."""

    def __init__(self, stream: TextIO, width: int = 24):
        self.stream = stream
        self.width = width
        self.total = 0
        self.done = 0
        self.title = ""
        self._last_draw = 0.0

    def begin(self, title: str, total: int) -> None:
        super().begin(title, total)
        self.title, self.total, self.done = title, total, 0
        self._draw("", force=True)

    def step(self, label: str, outcome: str) -> None:
        super().step(label, outcome)
        self.done += 1
        self._draw(label)

    def end(self, summary: str) -> None:
        super().end(summary)
        self.stream.write("\r\x1b[2K")
        self.stream.flush()

    def _draw(self, label: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < 0.05 and self.done < self.total:
            return
        self._last_draw = now
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        text = f"[{bar}] {self.done}/{self.total} {_prefix(self.context)}{self.title} {label}"
        self.stream.write("\r\x1b[2K" + text[:160])
        self.stream.flush()


def _prefix(context: str) -> str:
    return f"{context} " if context else ""


def make_progress(enabled: bool | None = None, stream: TextIO | None = None) -> Progress:
    """A bar when forced on, or when unset and ``stream`` (stderr) is a terminal."""
    stream = stream or sys.stderr
    wanted = config.progress(enabled)
    if wanted is None:
        wanted = hasattr(stream, "isatty") and stream.isatty()
    return TerminalProgress(stream) if wanted else Progress()
