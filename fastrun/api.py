"""The public entry point: a session binds a device, a cache and a strategy to a chooser.

``with fastrun.session(strategy="fast-run", cache="cache.bin"):`` makes every ``fastrun.call``
inside it search (once per problem) and dispatch through that session.  Outside any ``with``,
calls go to a process-wide default session configured from ``FASTRUN_*`` variables.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fastrun import config
from fastrun.cache import FileCache, InMemoryCache, PersistentCache, default_cache
from fastrun.cache.problems import ProblemRecorder
from fastrun.core.chooser import AlgoChooser, Decision, PreparedCall
from fastrun.core.progress import Progress, make_progress
from fastrun.core.strategy import ExecutionPolicy, SearchOptions, Strategy
from fastrun.devices import Device, get_device
from fastrun.operator import Problem
from fastrun.registry import Registry, default_registry


def open_cache(cache: PersistentCache | str | os.PathLike | None,
               read_only: bool = False) -> PersistentCache:
    """A cache from a path, an existing cache, or None (the process-wide default).
    ``read_only``: a run that searches nothing never moves or writes the file."""
    if cache is None:
        return default_cache()
    if isinstance(cache, (str, os.PathLike)):
        return FileCache(os.fspath(cache), read_only=read_only)
    return cache


class Session:
    def __init__(self, device: str | Device | None = None,
                 cache: PersistentCache | str | os.PathLike | None = None,
                 strategy: str | Strategy | None = None,
                 workspace_limit: int | str | None = None,
                 registry: Registry | None = None,
                 progress: Progress | bool | None = None,
                 budget_s: float | None = None, record: str | os.PathLike | None = None,
                 **options: Any):
        self.device = get_device(device)
        self.device.activate()
        self.options = SearchOptions.create(strategy, workspace_limit, budget_s, **options)
        self.cache = open_cache(cache, read_only=not self.options.strategy.profiles)
        self.registry = registry or default_registry()
        if not isinstance(progress, Progress):
            progress = make_progress(progress)
        record_path = config.RECORD.get(os.fspath(record) if record is not None else None)
        #: appends the problems that miss the cache (``record=PATH``, ``FASTRUN_RECORD``)
        self.recorder = ProblemRecorder(record_path) if record_path else None
        self.chooser = AlgoChooser(self.registry, self.device, self.cache, self.options,
                                   progress=progress, recorder=self.recorder)
        self._rules: dict[str, AlgoChooser] = {}
        self._tokens: list[contextvars.Token] = []

    def rules(self, device: Device | None = None) -> AlgoChooser:
        """The session's rules of thumb on ``device`` (default: the session's): a chooser that
        decides every problem by the heuristic under the session's workspace limit, with no
        cache and no timing, built once per device.  The runtime's constant folder computes
        with it (on the CPU where the session's device has no host memory), and the gain over
        the heuristic (``fastrun.analysis.gain``) asks it what the rules would have picked."""
        device = device or self.device
        chooser = self._rules.get(device.spec)
        if chooser is None:
            options = SearchOptions(strategy=Strategy.HEURISTIC,
                                    workspace_limit=self.options.workspace_limit)
            chooser = AlgoChooser(self.registry, device, InMemoryCache(), options)
            self._rules[device.spec] = chooser
        return chooser

    # -- computing -----------------------------------------------------------------------------
    def call(self, operator: str, *inputs: Any, **params: Any) -> Any:
        """Compute ``operator`` on ``inputs`` with the fastest allowed algorithm."""
        return self.chooser.dispatch(operator, *inputs, **params)

    # -- inspecting ----------------------------------------------------------------------------
    def problem(self, operator: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        return self.registry.operator(operator).problem(shapes, dtypes, **params)

    def decide(self, problem: Problem) -> Decision:
        """Decide a problem (searching if the strategy says so) and return how it was decided."""
        return self.chooser.decide(problem)

    def prepare(self, operator: str, *inputs: Any, **params: Any) -> PreparedCall:
        """Decide once and return a callable for repeated calls with these shapes.

        With ``weight_preprocess=True`` among the parameters, the algorithm's weight transform
        runs now, on the given (constant) weights; later calls pass the same inputs and skip it.
        """
        problem = self.registry.operator(operator).problem_for(inputs, **params)
        return self.chooser.prepare(problem, inputs)

    def policy(self, operator: str, *inputs: Any, **params: Any) -> ExecutionPolicy:
        """The execution policy a call with these inputs follows."""
        problem = self.registry.operator(operator).problem_for(inputs, **params)
        return self.chooser.policy(problem)

    @property
    def stats(self):
        return self.chooser.stats

    @property
    def progress(self) -> Progress:
        """Where the session's searches report as they go (log lines, or a bar)."""
        return self.chooser.profiler.progress

    def add_listener(self, listener: Callable[[Decision], object]) -> None:
        """Call ``listener`` with every problem this session decides from now on, sub-problems
        included, once each, as soon as it is decided: the :class:`Decision` says the problem,
        the pick (``algorithm``, ``policy``), the candidates' measured times (``entries``),
        the search's duration (``search_seconds``, 0 when nothing was timed) and where the
        pick came from (``source``: profiled, cache, nearest, heuristic or only).  What a
        platform team records to see which picks production makes.  A listener that raises is
        logged and removed; it never stops a search."""
        self.chooser.listeners.append(listener)

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> Session:
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        _current.reset(self._tokens.pop())

    def __repr__(self) -> str:
        return f"<fastrun.Session {self.device} {self.options.describe()} cache={self.cache!r}>"


_current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "fastrun_session", default=None)
_default_session: Session | None = None
_default_lock = threading.Lock()


def session(device: str | Device | None = None,
            cache: PersistentCache | str | os.PathLike | None = None,
            strategy: str | Strategy | None = None,
            workspace_limit: int | str | None = None, **options: Any) -> Session:
    """Create a session; use it with ``with`` to make it current for :func:`call`.

    ``strategy``: 'heuristic' (default), 'fast-run', 'full-run', optionally '+reproducible'.
    ``cache``: a path (a shared, resumable :class:`FileCache`), a cache object, or None for the
    process-wide default cache.  ``workspace_limit``: bytes or text such as '64MiB'.
    """
    return Session(device, cache, strategy, workspace_limit, **options)


def current_session() -> Session:
    """The innermost ``with`` session, or the process-wide default one."""
    active = _current.get()
    if active is not None:
        return active
    global _default_session
    with _default_lock:
        if _default_session is None:
            _default_session = Session()
        return _default_session


def reset_default_session() -> None:
    """Forget the default session (after changing FASTRUN_* variables, e.g. in tests)."""
    global _default_session
    with _default_lock:
        _default_session = None


def call(operator: str, *inputs: Any, **params: Any) -> Any:
    """Compute ``operator`` on ``inputs`` through the current session."""
    active = _current.get() or current_session()
    return active.chooser.dispatch(operator, *inputs, **params)
