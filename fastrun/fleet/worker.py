"""What runs on a worker: a session of its own that searches the jobs it is handed.

Why a separate session per worker, with an in-memory cache: a worker's results go back to the
driver, which alone writes the shared cache (one writer, no lock traffic across machines, and a
result is stored only after its worker's category was checked).  The job brings the
measurements of the sub-problems its search needs, so the worker times only the job itself.

Settings reach a worker explicitly (:class:`WorkerSettings`): the device, the strategy, the
profiling budget, the workspace limit, and the driver's ``FASTRUN_*`` variables.  PyTorch
TunableOp's users found that settings made in the driver's Python never reached its tuning
processes; here nothing is left to what a worker happens to inherit, except the machine's own
facts, which is what the category check is for.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fastrun.core.progress import Progress

#: The driver's variables forwarded to every worker (settings, not facts of the machine).
FORWARDED_PREFIX = "FASTRUN_"
#: Not forwarded: they name the driver's files.
NOT_FORWARDED = ("FASTRUN_CACHE", "FASTRUN_RECORD")
#: A search's pick is a close call when its runner-up's median is within this factor of its
#: own: another timing of the same problem could turn it over (the tune's summary counts them).
CLOSE_CALL = 1.1


def close_call(times_s: list[float]) -> bool:
    """Whether a problem's ranking (its candidates' medians) is a close call."""
    ranked = sorted(times_s)
    return len(ranked) >= 2 and ranked[1] <= CLOSE_CALL * ranked[0]


@dataclass(frozen=True)
class WorkerSettings:
    device: str = "cpu"
    strategy: str = "fast-run"
    budget_s: float | None = None
    workspace_limit: int | None = None
    #: the driver's FASTRUN_* variables (:func:`forwarded_environment`)
    environment: Mapping[str, str] = field(default_factory=dict)
    #: CPUs this worker's process is pinned to (local workers sharing a machine), or None
    cpus: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["environment"] = dict(self.environment)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerSettings:
        values = dict(data)
        if values.get("cpus") is not None:
            values["cpus"] = tuple(values["cpus"])
        return cls(**values)


def forwarded_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items()
            if name.startswith(FORWARDED_PREFIX) and name not in NOT_FORWARDED}


def tuning_session(device: str, strategy: str = "fast-run", budget_s: float | None = None,
                   workspace_limit: int | None = None, progress: Progress | None = None):
    """A session of a tune's own: a private in-memory cache (results go back to the driver,
    which alone writes the shared one), no progress bar, and no nearest-neighbour serving (a
    tune measures).  The driver collects jobs with one, each worker searches with one."""
    from fastrun.api import Session
    from fastrun.cache import InMemoryCache

    return Session(device=device, cache=InMemoryCache(), strategy=strategy, budget_s=budget_s,
                   workspace_limit=workspace_limit,
                   progress=progress if progress is not None else False, nearest=0.0)


class Worker:
    """One worker, living in the worker's process: its settings applied once, then a fresh
    session per job (a job's sub-problems come with it; what an earlier job decided must not
    stand in for them)."""

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        os.environ.update(settings.environment)
        if settings.cpus is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, settings.cpus)

    def session(self, progress: Progress | None = None):
        return tuning_session(self.settings.device, self.settings.strategy,
                              self.settings.budget_s, self.settings.workspace_limit, progress)

    def info(self) -> dict[str, Any]:
        """Who this worker is and what its measurements are valid for: the device's category
        and, per operator, the full cache category (the algorithm set's version included)."""
        session = self.session()
        registry = session.registry
        return {"host": socket.gethostname(), "pid": os.getpid(),
                "device": session.device.category,
                "categories": {name: session.chooser.category(registry.operator(name))
                               for name in registry.operators()}}

    def tune(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Search one job (a whole problem, or the candidates ``payload["algorithms"]`` of
        one); returns its measurements (and any sub-problem it had to search itself) as raw
        cache entries, the seconds each candidate took and the rest, or the error.  Never
        raises: a failure is a result."""
        from fastrun.cache import entry_from_raw, entry_to_raw
        from fastrun.fleet.jobs import problem_from_payload

        started = time.perf_counter()
        clock = CandidateClock()
        try:
            session = self.session(clock)
            cache = session.cache
            given = set()
            for category, key, raws in payload.get("known", ()):
                cache.put(category, key, [entry_from_raw(raw) for raw in raws])
                given.add((category, key))
            problem = problem_from_payload(payload)
            operator = session.registry.operator(problem.operator)
            operator.validate(problem)
            category = session.chooser.category(operator)
            close = False
            if payload.get("algorithms") is not None:
                result, excluded = session.chooser.rank(problem, only=payload["algorithms"])
                if not result.entries:
                    reasons = "; ".join(f"{name}: {why}" for name, why in excluded.items())
                    raise RuntimeError(f"no candidate of this part could be timed ({reasons})")
                mine = [[category, problem.key, [entry_to_raw(e) for e in result.entries]]]
            else:
                close = close_call([e.time_s for e in session.decide(problem).entries])
                mine = []
            produced = mine + [[c, k, [entry_to_raw(e) for e in entries]]
                               for c, k, entries in cache if (c, k) not in given]
            seconds = time.perf_counter() - started
            costs = clock.costs.get(str(problem), {})
            return {"ok": True, "seconds": seconds, "category": category, "entries": produced,
                    "close_call": close,
                    "candidate_s": costs, "overhead_s": max(0.0, seconds - sum(costs.values()))}
        except Exception as error:  # any failure of a search is reported back
            return {"ok": False, "seconds": time.perf_counter() - started,
                    "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc(limit=8)}


class CandidateClock(Progress):
    """Seconds spent on each candidate of each problem searched: the profiler reports each
    candidate when it is done with it (:meth:`Progress.step`), so the time since the previous
    report (or since the problem began) is that candidate's, warm-up and checks included."""

    def __init__(self):
        self.costs: dict[str, dict[str, float]] = {}
        self._open: list[tuple[str, float]] = []

    def begin(self, title: str, total: int) -> None:
        self._open.append((title, time.perf_counter()))

    def step(self, label: str, outcome: str) -> None:
        if not self._open:
            return
        title, since = self._open[-1]
        now = time.perf_counter()
        mine = self.costs.setdefault(title, {})
        mine[label] = mine.get(label, 0.0) + now - since
        self._open[-1] = (title, now)

    def end(self, summary: str) -> None:
        if self._open:
            self._open.pop()
