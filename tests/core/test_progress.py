"""Search progress: log lines always, a bar when a person watches."""

import io
import logging

from fastrun.cache import InMemoryCache
from fastrun.core.chooser import AlgoChooser
from fastrun.core.progress import LineProgress, Progress, TerminalProgress, make_progress
from fastrun.core.strategy import SearchOptions, Strategy
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, make_registry, problem


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
    assert isinstance(make_progress(None, io.StringIO()), LineProgress)  # a log file
    assert type(make_progress(False, io.StringIO())) is Progress  # --no-progress
    assert isinstance(make_progress(None, Terminal()), TerminalProgress)
    assert type(make_progress(False, Terminal())) is Progress
    monkeypatch.setenv("FASTRUN_PROGRESS", "1")
    assert isinstance(make_progress(None, io.StringIO()), TerminalProgress)
    monkeypatch.setenv("FASTRUN_PROGRESS", "0")
    assert type(make_progress(None, Terminal())) is Progress


def test_a_log_gets_a_line_now_and_then_with_the_count_and_an_eta():
    """Not a terminal: nothing for a job shorter than the interval; a longer one writes a line
    at most every interval, with the problems decided, the time and an ETA from the mean time
    per problem, and a last line."""
    now = [0.0]
    stream = io.StringIO()
    progress = LineProgress(stream, interval_s=10, clock=lambda: now[0])
    progress.job(3, "resnet18")
    for index in (1, 2, 3):
        progress.job_item(index, 3, f"conv{index}")
        now[0] += 1
    progress.job_end()
    assert stream.getvalue() == ""
    now[0] = 0.0
    progress.job(8, "resnet18")
    for index in range(1, 9):
        now[0] = (index - 1) * 6.0  # six seconds per problem
        progress.job_item(index, 8, f"conv{index}")
    now[0] = 48.0
    progress.job_end()
    lines = stream.getvalue().splitlines()
    assert lines == ["resnet18: 2/8 problem(s) decided, 0:12 elapsed, about 0:36 left; now conv3",
                     "resnet18: 4/8 problem(s) decided, 0:24 elapsed, about 0:24 left; now conv5",
                     "resnet18: 6/8 problem(s) decided, 0:36 elapsed, about 0:12 left; now conv7",
                     "resnet18: done in 0:48"]


def test_a_warning_during_the_bar_gets_a_line_of_its_own(monkeypatch):
    """A console log record written while the bar is up (a busy machine's timing warning)
    goes through tqdm: the bar is cleared first and drawn again after it, so the record
    starts its own line and no bar text is glued to it; the handlers are restored after."""
    screen = io.StringIO()
    monkeypatch.setattr("sys.stderr", screen)
    handler = logging.StreamHandler(screen)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    progress = TerminalProgress(screen)
    progress.job(2, "model")
    progress.job_item(1, 2, "conv1")
    logging.getLogger("fastrun.profile").warning("timing is unstable on this machine")
    assert root.handlers != [handler]  # redirected while the bar is up
    progress.job_end()
    assert root.handlers == [handler]
    lines = screen.getvalue().replace("\r", "\n").split("\n")
    warning = [line for line in lines if "timing is unstable" in line]
    assert warning == ["WARNING fastrun.profile: timing is unstable on this machine"]
