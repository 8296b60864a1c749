"""Search progress: log lines always, a bar when a person watches."""

import io
import logging

from fastrun.cache import InMemoryCache
from fastrun.core.chooser import AlgoChooser
from fastrun.core.strategy import SearchOptions, Strategy
from fastrun.progress import Progress, TerminalProgress, make_progress
from tests.framework.fakes import FakeAlgo, FakeClock, FakeDevice, make_registry, problem


def _search(progress):
    clock = FakeClock()
    registry = make_registry(*(FakeAlgo("fake", f"a{i}", (i + 1) * 1000, clock)
                               for i in range(3)))
    options = SearchOptions(strategy=Strategy.parse("fast-run"), budget_s=0.0001)
    AlgoChooser(registry, FakeDevice(clock), InMemoryCache(), options, clock=clock,
                progress=progress).decide(problem())


def test_terminal_bar_counts_every_candidate_and_clears_its_line():
    stream = io.StringIO()
    _search(TerminalProgress(stream))
    text = stream.getvalue()
    assert "0/3   0%" in text and "fake(float64[8]) 0/3" in text
    assert "3/3 100%" in text and "fake(float64[8]) 3/3 a2" in text
    assert "4/3" not in text  # the confirmation round is no candidate
    assert text.endswith("\r")  # the bar is cleared when the search ends


def test_search_is_logged_whatever_the_display(caplog):
    with caplog.at_level(logging.INFO, logger="fastrun.search"):
        _search(Progress())
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "searching fake(float64[8]): 3 candidate(s)"
    assert any(m.startswith("  a0: 0.0010 ms") for m in messages)
    assert messages[-1].startswith("  -> a0")


def test_bar_only_on_a_terminal_unless_forced(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("FASTRUN_PROGRESS", raising=False)
    assert type(make_progress(None, io.StringIO())) is Progress
    assert isinstance(make_progress(None, Terminal()), TerminalProgress)
    assert type(make_progress(False, Terminal())) is Progress
    monkeypatch.setenv("FASTRUN_PROGRESS", "1")
    assert isinstance(make_progress(None, io.StringIO()), TerminalProgress)
    monkeypatch.setenv("FASTRUN_PROGRESS", "0")
    assert type(make_progress(None, Terminal())) is Progress
