"""The tune's driver: checks the workers, hands out jobs, stores each result as it arrives.

Why the driver alone writes the cache: it checks every result's category against the target
before storing it (a worker on another kind of machine is refused when it reports in, and a
result that still names another category is dropped), and each result is put into the cache
file the moment it arrives, so a tune killed at any point resumes with only what is missing
(XLA's sharded autotuning broke when ranks started from different caches, xla#22164; here there
is one cache and one writer).

The target category is the driver's own device's (``--device`` on the driver's machine): run
the driver on a machine of the fleet's kind, e.g. the Ray head node.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from fastrun.cache import PersistentCache, entry_from_raw, entry_to_raw, low_confidence
from fastrun.category import explain
from fastrun.fleet.engines import EngineError
from fastrun.fleet.jobs import Ident, TuneJob, append_time
from fastrun.fleet.scheduler import Scheduler, split
from fastrun.fleet.worker import close_call


class TuneError(RuntimeError):
    """The tune cannot run: no worker passed the category check, or none is left."""


@dataclass
class WorkerReport:
    name: str
    host: str = ""
    tuned: int = 0
    failed: int = 0
    busy_s: float = 0.0
    refused: str = ""
    lost: str = ""


@dataclass
class TuneSummary:
    jobs: int
    skipped: int
    tuned: int
    failed: dict[Ident, list[str]]
    workers: list[WorkerReport]
    wall_s: float
    #: the sum of the tuned jobs' search times: what one worker would have taken
    serial_s: float
    interrupted: bool = False
    labels: dict[Ident, str] = field(default_factory=dict)
    #: tuned problems whose runner-up came within 10% of the pick in the worker's search
    #: (:data:`fastrun.fleet.worker.CLOSE_CALL`; the profiler re-timed such candidates in
    #: interleaved rounds before it picked)
    close_calls: int = 0
    #: tuned problems whose pick stayed unstable (:func:`fastrun.cache.low_confidence`)
    low_confidence: int = 0

    @property
    def speedup(self) -> float:
        return self.serial_s / self.wall_s if self.wall_s > 0 else 1.0

    def lines(self) -> list[str]:
        active = [w for w in self.workers if not w.refused]
        out = [f"tuned      {self.tuned} problem(s) in {_clock(self.wall_s)} on {len(active)} "
               f"worker(s); {self.skipped} already in the cache, {len(self.failed)} failed"
               + (" (interrupted: run the same command again to resume)"
                  if self.interrupted else "")]
        if self.tuned:
            clear = self.tuned - self.close_calls - self.low_confidence
            out.append(f"picks      {clear} clear, {self.close_calls} close call(s) (runner-up "
                       f"within 10%, re-timed in rounds), {self.low_confidence} "
                       "low-confidence (unstable timing)")
            out.append(f"speed-up   {self.speedup:.2f}x over one worker (the jobs' search times "
                       f"sum to {_clock(self.serial_s)}; parallel efficiency "
                       f"{self.speedup / max(len(active), 1):.0%})")
        for worker in self.workers:
            if worker.refused:
                out.append(f"worker     {worker.name}: refused: {worker.refused}")
                continue
            line = (f"worker     {worker.name} ({worker.host}): {worker.tuned} job(s) done, "
                    f"{worker.failed} failed, busy {_clock(worker.busy_s)}")
            out.append(line + (f"; lost: {worker.lost}" if worker.lost else ""))
        for ident, errors in self.failed.items():
            label = self.labels.get(ident, "")
            out.append(f"failed     {ident[1]}" + (f" ({label})" if label else "") + ": "
                       + " | ".join(errors))
        return out


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return (f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours
            else f"{rest // 60}:{rest % 60:02d}")


class ProgressLine:
    """One overall line: done/total, workers busy, elapsed, ETA.  Redrawn in place on a
    terminal; elsewhere printed every ``every_s`` seconds and at the end."""

    def __init__(self, stream: TextIO | None, every_s: float = 10.0):
        self.stream = stream
        self.every_s = every_s
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._last = 0.0
        self._width = 0

    def show(self, text: str, final: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if self.tty:
            padded = text.ljust(self._width)
            self._width = len(text)
            self.stream.write("\r" + padded + ("\n" if final else ""))
            self.stream.flush()
        elif final or now - self._last >= self.every_s:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last = now


def _known_entries(cache: PersistentCache, job: TuneJob, jobs: dict[Ident, TuneJob]
                   ) -> list[list[Any]]:
    """The cached measurements of every job ``job`` needs, transitively: a sub-problem's
    choice decides its own sub-problems too."""
    out, stack, seen = [], list(job.children), set()
    while stack:
        ident = stack.pop()
        if ident in seen:
            continue
        seen.add(ident)
        entries = cache.get(*ident)
        if entries:
            out.append([ident[0], ident[1], [entry_to_raw(e) for e in entries]])
        child = jobs.get(ident)
        if child is not None:
            stack.extend(child.children)
    return out


def check_worker(info: dict[str, Any], categories: dict[str, str]) -> str:
    """Why a worker's measurements cannot go into the target's cache ('' when they can):
    the first fact that differs, named, with both sides' values."""
    for operator, wanted in categories.items():
        theirs = info.get("categories", {}).get(operator)
        if theirs is None:
            return f"it has no operator {operator!r} (another fastrun or plugin set)"
        if theirs != wanted:
            why = explain([theirs], wanted, labels=("worker", "target")) or "another category"
            return f"its category differs from the target's: {why}"
    return ""


def run_tune(jobs: list[TuneJob], cache: PersistentCache, engine, target_device: str,
             categories: dict[str, str], *, timeout_s: float | None = None,
             times_path: str | None = None, stream: TextIO | None = sys.stderr,
             max_failures: int = 2, clock: Callable[[], float] = time.monotonic
             ) -> TuneSummary:
    """Tune ``jobs`` into ``cache`` on ``engine``'s workers (see the module docstring).
    ``categories``: operator -> the target's cache category, for every operator the jobs
    touch.  Ctrl-C stops the tune with every finished result stored."""
    started = clock()
    by_ident = {job.ident: job for job in jobs}
    # done: measured, and steadily (a low-confidence pick is measured again)
    done = {ident for ident in by_ident
            if (entries := cache.get(*ident)) and low_confidence(entries) is None}
    scheduler = Scheduler([])  # the real one once the workers are known (parts per worker)
    wanted = set(categories.values())
    reports: dict[str, WorkerReport] = {}
    progress = ProgressLine(stream)
    run = _Run(cache, wanted, times_path)
    interrupted = False
    names = engine.start()
    try:
        active = _check_workers(engine, names, reports, target_device, categories, stream)
        # long problems in parts, for as many workers as passed the check
        pending = [job for job in jobs if job.ident not in done]
        scheduler = Scheduler(split(pending, len(active)), max_failures=max_failures)
        idle = list(active)
        running: dict[str, tuple[TuneJob, float]] = {}
        fleet = _Fleet(engine, scheduler, reports, running, idle, active, run, clock)
        while not scheduler.finished:
            for name in list(idle):
                job = scheduler.next_for(name, len(active))
                if job is None:
                    continue  # nothing for this one (what is ready failed on it); the next?
                payload = job.to_payload()
                payload["known"] = _known_entries(cache, job, by_ident)
                engine.submit(name, payload)
                idle.remove(name)
                running[name] = (job, clock())
            if not running:
                raise TuneError(f"{scheduler.pending} job(s) wait for jobs no worker can run "
                                "(every worker is gone)")
            for event in engine.wait(timeout=_wait_for(running, timeout_s, clock)):
                fleet.take(event)
            if timeout_s is not None:
                fleet.expire(timeout_s)
            progress.show(_progress_text(scheduler, len(by_ident), len(running), len(active),
                                         clock() - started, run))
        progress.show(_progress_text(scheduler, len(by_ident), 0, len(active),
                                     clock() - started, run), final=True)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        engine.close()
    shaky = sum(1 for ident in run.tuned if low_confidence(cache.get(*ident) or ()))
    return TuneSummary(len(by_ident), len(done), len(run.tuned), dict(scheduler.failed),
                       list(reports.values()), clock() - started, run.serial, interrupted,
                       {ident: job.label for ident, job in by_ident.items()},
                       len(run.close_calls), shaky)


@dataclass
class _Fleet:
    """The driver's view of its workers while jobs run: what each runs since when, which are
    idle, which are still in the fleet."""

    engine: Any
    scheduler: Scheduler
    reports: dict[str, WorkerReport]
    running: dict[str, tuple[TuneJob, float]]
    idle: list[str]
    active: list[str]
    run: _Run
    clock: Callable[[], float]

    def take(self, event: Any) -> None:
        """One worker's event: its result stored (or its failure counted), or, for a worker
        that died, its job handed back and the worker restarted or dropped."""
        job, since = self.running.pop(event.worker, (None, 0.0))
        report = self.reports[event.worker]
        if event.kind == "died":
            report.lost = event.error
            if job is not None:
                report.failed += 1
                self.scheduler.fail(job.uid, event.worker, f"worker died ({event.error})")
            self._restart(event.worker)
            return
        self.idle.append(event.worker)
        if job is None:
            return
        report.busy_s += self.clock() - since
        error = self.run.take(job, event.worker, event.result or {}, self.scheduler)
        if error:
            report.failed += 1
            self.scheduler.fail(job.uid, event.worker, error)
        else:
            report.tuned += 1

    def expire(self, timeout_s: float) -> None:
        """Jobs running past ``timeout_s``: failed on their worker, which is restarted."""
        for name, (job, since) in list(self.running.items()):
            if self.clock() - since > timeout_s:
                self.running.pop(name)
                self.reports[name].failed += 1
                self.scheduler.fail(job.uid, name, f"ran past the timeout of {timeout_s:g} s")
                self._restart(name)

    def _restart(self, name: str) -> None:
        if self.engine.restart(name):
            self.idle.append(name)
        else:
            self.active.remove(name)


def _check_workers(engine, names: list[str], reports: dict[str, WorkerReport],
                   target_device: str, categories: dict[str, str],
                   stream: TextIO | None) -> list[str]:
    """Ask each worker who it is; refuse (and stop) those whose category differs.  Returns
    the accepted ones; TuneError when none is."""
    for name in names:
        try:
            info = engine.info(name)
        except EngineError as error:
            info, reason = {}, str(error)
        else:
            reason = check_worker(info, categories)
        report = reports[name] = WorkerReport(name, host=str(info.get("host", "")))
        if reason:
            report.refused = reason
            engine.stop(name)
            if stream is not None:
                stream.write(f"tune: worker {name} refused: {reason}\n")
    active = [name for name in names if not reports[name].refused]
    if not active:
        raise TuneError("no worker can tune for the target category "
                        f"({target_device}): every one was refused")
    if getattr(engine, "shared_cores", False) and stream is not None:
        stream.write("tune: warning: the local workers share CPUs (their threads times their "
                     "number exceed this machine's); timings will disturb each other\n")
    return active


class _Run:
    """What this tune measured: parts kept until their problem is whole, then stored."""

    def __init__(self, cache: PersistentCache, wanted: set[str], times_path: str | None):
        self.cache = cache
        self.wanted = wanted
        self.times_path = times_path
        self.serial = 0.0
        self.tuned: list[Ident] = []
        self.finished: list[tuple[str, str, int]] = []
        self._parts: dict[Ident, list[tuple[dict[str, Any], str]]] = {}
        self.close_calls: set[Ident] = set()

    def take(self, job: TuneJob, worker: str, result: dict[str, Any],
             scheduler: Scheduler) -> str:
        """Keep a job's result (storing its problem once every part is in); returns why it
        cannot be taken, '' when it was."""
        if not result.get("ok"):
            return result.get("error") or "the worker returned no result"
        if result.get("category") != job.category:
            return (f"its result names category {result.get('category')!r}, not the "
                    "target's")
        if not any((c, k) == job.ident for c, k, _ in result.get("entries", ())):
            return "its result holds no measurement of the problem"
        self.serial += float(result.get("seconds", 0.0))
        parts = self._parts.setdefault(job.ident, [])
        parts.append((result, worker))
        if len(parts) == job.parts:
            if _close_call(job, parts):
                self.close_calls.add(job.ident)
            self._store(job, self._parts.pop(job.ident))
            self.tuned.append(job.ident)
        scheduler.finish(job.uid)
        self.finished.append(job.uid)
        return ""

    def _store(self, job: TuneJob, parts: list[tuple[dict[str, Any], str]]) -> None:
        items = [(category, key, [entry_from_raw(raw) for raw in raws])
                 for result, _ in parts for category, key, raws in result.get("entries", ())
                 if category in self.wanted]
        self.cache.put_many(items)
        if self.times_path:
            costs: dict[str, float] = {}
            for result, _ in parts:
                costs.update(result.get("candidate_s") or {})
            overheads = [float(r.get("overhead_s") or 0.0) for r, _ in parts]
            seconds = sum(float(r.get("seconds", 0.0)) for r, _ in parts)
            append_time(self.times_path, job, seconds, [worker for _, worker in parts], costs,
                        sum(overheads) / len(overheads))


def _close_call(job: TuneJob, parts: list[tuple[dict[str, Any], str]]) -> bool:
    """Whether the problem's runner-up came within CLOSE_CALL of its pick: the worker says so
    for a whole problem; for one searched in parts, each part's full ranking is here."""
    if job.parts == 1:
        return bool(parts[0][0].get("close_call"))
    return close_call([raw[2] for result, _ in parts for c, k, raws in result.get("entries", ())
                       if (c, k) == job.ident for raw in raws])


def _wait_for(running: dict[str, tuple[TuneJob, float]], timeout_s: float | None,
              clock: Callable[[], float]) -> float:
    """How long to wait for events: until the next timeout, at most a second (the progress
    line's clock)."""
    if timeout_s is None or not running:
        return 1.0
    soonest = min(since for _, since in running.values()) + timeout_s - clock()
    return max(0.05, min(1.0, soonest))


#: Share of the expected work that must be done before the ETA trusts the jobs' sizes
#: (when no earlier tune timed them): before, it counts jobs.
SIZED_ETA_SHARE = 0.2


def eta_seconds(finished_expected: float, finished_actual: float, finished_count: int,
                remaining_expected: float, remaining_count: int, workers: int,
                timed_before: bool) -> float | None:
    """Seconds left, or None before anything finished.  Where an earlier tune timed the jobs
    (``timed_before``), or once the finished ones hold :data:`SIZED_ETA_SHARE` of the expected
    work, the remaining expected times scaled by how the finished ones compared with theirs;
    before that, the remaining jobs times the mean finished job.  Jobs are sized from their
    arithmetic alone until timed, which misses each search's fixed cost by orders of
    magnitude on small problems: scaled from a first small job, a tune of resnet18 once
    showed an ETA of 29 hours."""
    if not finished_count or not workers:
        return None
    share = finished_expected / max(finished_expected + remaining_expected, 1e-30)
    if (timed_before or share >= SIZED_ETA_SHARE) and finished_expected > 0:
        eta = remaining_expected * finished_actual / finished_expected / workers
    else:
        eta = remaining_count * finished_actual / finished_count / workers
    return eta if math.isfinite(eta) else None


def _progress_text(scheduler: Scheduler, total: int, busy: int, workers: int,
                   elapsed: float, run: _Run) -> str:
    """The progress line: problems done, workers busy, elapsed time and an ETA
    (:func:`eta_seconds`)."""
    done = sum(1 for ident in scheduler.parts if scheduler.problem_done(ident))
    text = (f"tune {done}/{total} problems, {busy}/{workers} workers busy, "
            f"{_clock(elapsed)} elapsed")
    remaining = [uid for uid in scheduler.jobs
                 if uid not in scheduler.done and uid[:2] not in scheduler.failed]
    if remaining:
        timed_before = all(scheduler.jobs[uid].estimate_s is not None
                           for uid in scheduler.jobs)
        eta = eta_seconds(sum(scheduler.expected[uid] for uid in run.finished), run.serial,
                          len(run.finished), sum(scheduler.expected[uid] for uid in remaining),
                          len(remaining), workers, timed_before)
        if eta is not None:
            text += f", ETA {_clock(eta)}"
    if scheduler.failed:
        text += f", {len(scheduler.failed)} failed"
    return text
