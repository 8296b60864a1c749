"""Which job a free worker takes next, what a failure does, and a fleet replayed on paper.

Order: a job is ready when every job it needs is done.  Among the ready ones, a free worker
takes the one with the longest remaining path: its own expected time plus the longest chain of
jobs waiting on it (a parent waits for its sub-problems).  With no dependencies that is plain
longest-first, which keeps the last worker from starting a long job when the others are done;
with them, the jobs that gate others go first.  Expected times come from an earlier tune's
times log where it has the job; other jobs are scaled from their size (the product of their
sizes, :meth:`fastrun.operator.Operator.size_axes`) by the median seconds per unit of size of
the known ones.

Failures: a job whose search raised, whose worker died or ran past the timeout goes back to the
queue, for another worker when there is one.  After :attr:`Scheduler.max_failures` failures it
is recorded as failed with every error, and so is every job that needed it (their searches
would have to search it themselves, and fail the same way).

Parts: with several workers, a problem much longer than the rest is split into parts, each
timing some of its candidates (:func:`split`), so that no worker is left with one long problem
while the others idle; its parents wait for every part.

The same :class:`Scheduler` drives a real tune (:mod:`fastrun.fleet.driver`) and
:func:`simulate`, which replays recorded times on any number of workers without running a
kernel: what ``fastrun tune --simulate`` prints.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from fastrun.fleet.jobs import Ident, TuneJob

Uid = tuple[str, str, int]


def expected_seconds(jobs: Iterable[TuneJob]) -> dict[Uid, float]:
    """Each job's expected search time: from an earlier tune (a part: the time outside the
    candidates plus its own candidates'), else scaled from its size by the known ones (a
    part: its share of the candidates)."""
    jobs = list(jobs)
    known = [job.estimate_s / 2 ** job.work for job in jobs
             if job.estimate_s is not None and job.parts == 1]
    per_unit = statistics.median(known) if known else 1e-6
    expected = {}
    for job in jobs:
        whole = job.estimate_s if job.estimate_s is not None else per_unit * 2 ** job.work
        if job.parts > 1 and job.candidate_s and job.overhead_s is not None:
            expected[job.uid] = job.overhead_s + sum(job.candidate_s.get(name, 0.0)
                                                     for name in job.algorithms)
        elif job.parts > 1:
            expected[job.uid] = whole * len(job.algorithms) / max(len(job.candidates), 1)
        else:
            expected[job.uid] = whole
    return expected


def split(jobs: Iterable[TuneJob], workers: int, parts_per_worker: int = 3,
          max_candidates: int = 24) -> list[TuneJob]:
    """Jobs with the long problems split into parts, each timing some of the candidates, so that no
    part is much longer than ``1 / (workers * parts_per_worker)`` of all the work.

    Why: a fleet finishes no sooner than its longest job, and one problem (VGG-16's 25088 x 4096
    GEMV) took 23 s of the 180 s the zoo's 473 problems took on one worker; 64 workers would
    wait on it for 13% of the tune. Candidates are packed into parts longest first, from their
    times in an earlier tune (else as equals), candidates that need the same sub-problems
    together: a part waits only for its own candidates' sub-problems, so a conv's direct kernels
    are timed while the GEMM that its Winograd candidates call is still being tuned. Each part
    pays the problem's fixed cost (inputs, reference) again. A part's candidates are timed
    against each other only, and the merged entries decide: the fleet's machines are of one
    kind, which is what lets their measurements share one cache. Not split: one worker; problems
    with fewer than two candidates, or more than ``max_candidates`` (a budgeted search samples
    those, which only works on the whole space).
    """
    jobs = list(jobs)
    if workers < 2:
        return jobs
    expected = expected_seconds(jobs)
    chunk = sum(expected.values()) / (workers * parts_per_worker)
    out = []
    for job in jobs:
        seconds = expected[job.uid]
        count = min(len(job.candidates), math.ceil(seconds / chunk) if chunk > 0 else 1)
        if count < 2 or len(job.candidates) > max_candidates:
            out.append(job)
            continue
        costs = {name: job.candidate_s.get(name, 1.0) for name in job.candidates}
        order = {name: i for i, name in enumerate(job.candidates)}
        groups = []
        # candidates that wait for the same children go together, so that those waiting for
        # none start at once; each set gets parts in proportion to its time
        by_needs: dict[tuple, list[str]] = {}
        for name in job.candidates:
            by_needs.setdefault(job.candidate_children.get(name, ()), []).append(name)
        total = sum(costs.values()) or 1.0
        for needs, names in by_needs.items():
            share = sum(costs[n] for n in names) / total
            for part in _pack(names, costs, max(1, round(count * share))):
                groups.append((needs, sorted(part, key=order.get)))
        if len(groups) < 2:
            out.append(job)
            continue
        for index, (needs, names) in enumerate(groups):
            out.append(replace(job, algorithms=tuple(names), children=needs, part=index,
                               parts=len(groups), attempts=[]))
    return out


def _pack(names: list[str], costs: dict[str, float], count: int) -> list[list[str]]:
    """``names`` into at most ``count`` groups of similar total cost, longest first."""
    bins: list[tuple[float, int, list[str]]] = [(0.0, i, []) for i in range(min(count,
                                                                                len(names)))]
    for name in sorted(names, key=lambda n: -costs[n]):
        load, index, members = heapq.heappop(bins)
        members.append(name)
        heapq.heappush(bins, (load + costs[name], index, members))
    return [members for _, _, members in sorted(bins, key=lambda b: b[1]) if members]


class Scheduler:
    """The tune's bookkeeping: pending, running, done and failed jobs (a problem's parts each
    count), and priorities.  Dependencies and failures are per problem: a parent waits for
    every part of each child, and a part that fails for good fails its whole problem."""

    def __init__(self, jobs: Iterable[TuneJob], done: Iterable[Ident] = (),
                 max_failures: int = 2):
        self.jobs = {job.uid: job for job in jobs}
        self.parts: dict[Ident, list[Uid]] = {}
        for uid, job in self.jobs.items():
            self.parts.setdefault(job.ident, []).append(uid)
        self.max_failures = max_failures
        finished = set(done)
        self.done: set[Uid] = {uid for uid, job in self.jobs.items() if job.ident in finished}
        #: problem ident -> why it failed
        self.failed: dict[Ident, list[str]] = {}
        self.running: dict[Uid, str] = {}
        #: worker names a job failed on (it is not handed to them again while others remain)
        self.failed_on: dict[Uid, list[str]] = {}
        self.expected = expected_seconds(self.jobs.values())
        self.priority = self._levels()
        self._waiting_for: dict[Uid, set[Uid]] = {
            uid: {c for child in job.children for c in self.parts.get(child, ())
                  if c not in self.done}
            for uid, job in self.jobs.items() if uid not in self.done}
        self._ready: list[tuple[float, str, int, Uid]] = []
        for uid, waits in self._waiting_for.items():
            if not waits:
                self._push(uid)

    def _levels(self) -> dict[Uid, float]:
        """Expected time from a job's start to the end of the longest chain waiting on it."""
        parents: dict[Ident, list[Uid]] = {}
        for uid, job in self.jobs.items():
            for child in job.children:
                parents.setdefault(child, []).append(uid)
        level: dict[Uid, float] = {}

        def of(uid: Uid, seen: frozenset = frozenset()) -> float:
            if uid not in level:
                ident = uid[:2]
                chain = [of(p, seen | {ident}) for p in parents.get(ident, ())
                         if p[:2] not in seen]
                level[uid] = self.expected[uid] + max(chain, default=0.0)
            return level[uid]

        for uid in self.jobs:
            of(uid)
        return level

    def _push(self, uid: Uid) -> None:
        heapq.heappush(self._ready, (-self.priority[uid], uid[1], uid[2], uid))

    def _closed(self, uid: Uid) -> bool:
        return uid in self.done or uid[:2] in self.failed

    # -- questions -------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Jobs neither done nor failed (running ones included)."""
        return sum(1 for uid in self.jobs if not self._closed(uid))

    @property
    def finished(self) -> bool:
        return self.pending == 0

    def problem_done(self, ident: Ident) -> bool:
        """Whether every part of a problem is done."""
        return all(uid in self.done for uid in self.parts.get(ident, ()))

    def next_for(self, worker: str, workers: int = 1) -> TuneJob | None:
        """The ready job ``worker`` should run now, or None (nothing ready for it).  A job is
        not handed back to a worker it failed on while ``workers`` > 1."""
        skipped = []
        chosen = None
        while self._ready:
            entry = heapq.heappop(self._ready)
            uid = entry[3]
            if self._closed(uid) or uid in self.running:
                continue
            tried = self.failed_on.get(uid, ())
            if workers > 1 and worker in tried and len(set(tried)) < workers:
                skipped.append(entry)
                continue
            chosen = uid
            break
        for entry in skipped:
            heapq.heappush(self._ready, entry)
        if chosen is None:
            return None
        self.running[chosen] = worker
        return self.jobs[chosen]

    # -- events ----------------------------------------------------------------------------------
    def finish(self, uid: Uid) -> list[Uid]:
        """A job is done (a whole problem stored, or a part's result kept); returns the jobs
        that became ready."""
        self.running.pop(uid, None)
        if self._closed(uid):
            return []
        self.done.add(uid)
        ready = []
        for parent, waits in self._waiting_for.items():
            if uid in waits:
                waits.discard(uid)
                if not waits and not self._closed(parent):
                    self._push(parent)
                    ready.append(parent)
        return ready

    def fail(self, uid: Uid, worker: str, error: str) -> bool:
        """A job failed on ``worker`` (raised, died, timed out).  True when it will be tried
        again; False when its problem is now recorded as failed (and so are the problems that
        needed it)."""
        self.running.pop(uid, None)
        self.jobs[uid].attempts.append(f"{worker}: {error}")
        self.failed_on.setdefault(uid, []).append(worker)
        if len(self.failed_on[uid]) < self.max_failures:
            self._push(uid)
            return True
        self._give_up(uid[:2], list(self.jobs[uid].attempts))
        return False

    def _give_up(self, ident: Ident, errors: list[str]) -> None:
        self.failed[ident] = errors
        for uid in self.parts.get(ident, ()):
            self.running.pop(uid, None)
        for parent, waits in self._waiting_for.items():
            if any(w[:2] == ident for w in waits) and parent[:2] not in self.failed \
                    and parent not in self.done:
                self._give_up(parent[:2], [f"needs {ident[1]}, which failed"])

    def lost(self, worker: str, error: str) -> list[tuple[Uid, bool]]:
        """A worker is gone: its running jobs fail with ``error`` (each: uid, retried)."""
        return [(uid, self.fail(uid, worker, error))
                for uid, owner in list(self.running.items()) if owner == worker]


@dataclass
class Simulation:
    """A tune replayed on paper: how long it would take on ``workers`` workers."""

    workers: int
    jobs: int
    #: sum of every job's time: one worker's wall time
    serial_s: float
    #: wall time on ``workers`` workers
    makespan_s: float
    #: the longest chain of dependent jobs: no fleet finishes sooner
    critical_path_s: float
    busy_s: dict[str, float] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.serial_s / self.makespan_s if self.makespan_s else 1.0

    @property
    def efficiency(self) -> float:
        """Speed-up per worker: 1.0 when no worker ever waits."""
        return self.speedup / self.workers


def simulate(jobs: Iterable[TuneJob], workers: int) -> Simulation:
    """Replay ``jobs`` (their expected times as durations) on ``workers`` workers, split into
    parts as a tune on that many workers splits them, through the same scheduler a tune uses,
    without running anything."""
    if workers < 1:
        raise ValueError(f"a fleet needs at least one worker, not {workers}")
    whole = list(jobs)
    serial = sum(expected_seconds(whole).values())
    scheduler = Scheduler(split(whole, workers))
    names = [f"w{i}" for i in range(workers)]
    idle = list(names)
    now = 0.0
    events: list[tuple[float, str, Uid]] = []
    busy = dict.fromkeys(names, 0.0)
    while not scheduler.finished:
        while idle:
            job = scheduler.next_for(idle[0], workers)
            if job is None:
                break
            worker = idle.pop(0)
            duration = scheduler.expected[job.uid]
            busy[worker] += duration
            heapq.heappush(events, (now + duration, worker, job.uid))
        if not events:
            break  # nothing running and nothing ready: jobs waiting on jobs that are not here
        now, worker, uid = heapq.heappop(events)
        scheduler.finish(uid)
        idle.append(worker)
    critical = max(scheduler.priority.values(), default=0.0)
    return Simulation(workers, len(whole), serial, now, critical, busy)
