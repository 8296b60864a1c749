"""Timing candidates: warm-up, repeats within a budget, median and spread, early stop, the
numerical check against the operator's reference, and an interleaved confirmation of the
close candidates.

Each candidate is first timed in a block of repeats.  On a shared machine a whole block can
fall into a slow period (another process, a vCPU descheduled, a thread pool gone to sleep):
on the 2-core development VM one Winograd kernel measured 0.93 ms in one block and 1.78 ms in
the next, and the search picked an algorithm 40% slower for it.  So the candidates whose
block medians are within :attr:`SearchOptions.confirm_ratio` of the best (at most
:data:`CONFIRM_MAX`), and the first candidate (the heuristic's pick), are timed again in
rounds, one call of each per round in rotating order (:attr:`SearchOptions.confirm_rounds`
rounds, fewer when a round outlasts the budget).  Each keeps the smaller of its two medians,
block or rounds: a slow period only ever adds time, so the smaller is the better estimate.
Ranking by the rounds alone went wrong on the 16-core host, where a slow period can last a
tenth of a second: one fell on the rounds of a batched matmul (blocks 0.075 and 0.106 ms,
rounds 1.04 and 1.11 ms), and a candidate that had been stopped early at 0.29 ms then ranked
first.  The heuristic's pick takes part even when its block looks slow, so that a slow period
during its block cannot make the search choose worse than the heuristic would have.

The profiler times what it is given; *which* candidates and in what order is the chooser's
business.  Sub-problems are not its concern either: when a candidate calls ``ctx.call``, the
chooser dispatches to the algorithm already chosen for that sub-problem.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fastrun._version import __version__
from fastrun.algorithm import Algorithm, RunContext
from fastrun.cache import Entry
from fastrun.device import Device
from fastrun.operator import Operator, Problem
from fastrun.progress import Progress
from fastrun.strategy import SearchOptions

log = logging.getLogger(__name__)

#: Most candidates the interleaved confirmation times (the fastest by their block medians).
CONFIRM_MAX = 4
#: Rounds the confirmation always runs, however long they take.
CONFIRM_MIN_ROUNDS = 3


@dataclass(frozen=True)
class Failure:
    """A candidate that cannot be chosen: it raised, or its output disagreed with the reference."""

    algorithm: str
    reason: str
    error: float | None = None


@dataclass
class ProfileResult:
    problem: Problem
    #: Every timed candidate, fastest first (not pruned: the full ranking).
    entries: list[Entry] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: Candidates whose timing stopped early because they were clearly slower than the best.
    early_stopped: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class _Timing:
    times_ns: list[int]
    early_stopped: bool

    @property
    def median_s(self) -> float:
        return float(np.median(self.times_ns)) * 1e-9

    @property
    def spread_s(self) -> float:
        if len(self.times_ns) < 2:
            return 0.0
        q75, q25 = np.percentile(self.times_ns, [75, 25])
        return float(q75 - q25) * 1e-9


class Profiler:
    def __init__(self, device: Device, options: SearchOptions,
                 clock: Callable[[], int] | None = None, progress: Progress | None = None):
        self.device = device
        self.options = options
        #: Nanosecond host clock the budget is spent on (timings come from
        #: ``device.measure``); injectable so tests can drive it deterministically.
        self.clock = clock or device.clock_ns
        self.progress = progress or Progress()

    def profile(self, problem: Problem, operator: Operator, candidates: Sequence[Algorithm],
                ctx: RunContext, workspace: Mapping[str, int],
                prelude: Callable[[], object] | None = None) -> ProfileResult:
        """Time ``candidates`` (best guess first) on random inputs of ``problem``.

        ``workspace`` maps an algorithm's desc text to its total workspace (own plus
        sub-problems'), which is what its cache entry records.  ``prelude``, when given, runs
        untimed before every timed call: what precedes the problem where it is used (a model's
        previous layer), so each call starts from the thread pools and caches that layer
        leaves behind instead of from its own previous call.  Its time counts against the
        budget, so it cannot make a search much longer.
        """
        started = time.perf_counter()
        result = ProfileResult(problem)
        rng = np.random.default_rng(self.options.seed)
        host_inputs = operator.random_inputs(problem, rng)
        reference = (operator.reference(problem, host_inputs) if self.options.check_numerics
                     else None)
        # Copied to the device once per problem: every candidate reads the same arrays, and
        # no transfer is timed.
        inputs = [self.device.to_device(x) for x in host_inputs]
        tolerance = operator.tolerance(problem)
        best_ns: float | None = None

        self.progress.begin(str(problem), len(candidates))
        #: desc text -> (algorithm, its prepared weights), for the confirmation round
        timed: dict[str, tuple[Algorithm, object]] = {}
        for algorithm in candidates:
            label = algorithm.desc.text
            try:
                prepared = (algorithm.preprocess(problem, inputs) if problem.weight_preprocess
                            else None)
                timing, output = self._time(algorithm, problem, inputs, ctx, best_ns, prelude,
                                            prepared)
            except Exception as error:  # an algorithm that raises is skipped, never fatal
                reason = f"raised {type(error).__name__}: {error}"
                log.warning("%s on %s %s", label, problem, reason)
                result.failures.append(Failure(label, reason))
                self.progress.step(label, reason)
                continue

            error_value = None
            if reference is not None:
                error_value = operator.error(problem, self.device.to_host(output), reference)
                if not error_value <= tolerance:  # also catches NaN
                    reason = f"numerical error {error_value:.3g} exceeds tolerance {tolerance:.3g}"
                    log.warning("%s on %s: %s; excluded", label, problem, reason)
                    result.failures.append(Failure(label, reason, error_value))
                    self.progress.step(label, reason)
                    continue

            median_ns = timing.median_s * 1e9
            if not timing.early_stopped and (best_ns is None or median_ns < best_ns):
                best_ns = median_ns
            if timing.early_stopped:
                result.early_stopped.append(label)
            else:
                timed[label] = (algorithm, prepared)
            result.entries.append(Entry(
                algorithm=label,
                attributes=algorithm.attributes,
                time_s=timing.median_s,
                spread_s=timing.spread_s,
                workspace_bytes=workspace[label],
                error=error_value,
                repeats=len(timing.times_ns),
                measured_at=time.time(),
                version=__version__,
            ))
            stopped = " (stopped early: clearly slower)" if timing.early_stopped else ""
            self.progress.step(label, f"{timing.median_s * 1e3:.4f} ms "
                                      f"x{len(timing.times_ns)}{stopped}")

        result.entries.sort(key=lambda e: e.time_s)
        guess = candidates[0].desc.text if candidates else None
        self._confirm(problem, result, timed, inputs, ctx, prelude, guess)
        result.seconds = time.perf_counter() - started
        winner = result.entries[0].algorithm if result.entries else "nothing usable"
        self.progress.end(f"{winner} ({result.seconds:.2f} s)")
        return result

    def _confirm(self, problem: Problem, result: ProfileResult,
                 timed: Mapping[str, tuple[Algorithm, object]], inputs: list[object],
                 ctx: RunContext, prelude: Callable[[], object] | None,
                 guess: str | None) -> None:
        """Re-time the close candidates and the heuristic's pick (``guess``) in interleaved
        rounds; each keeps the smaller of its block and rounds medians (see the module
        docstring), and its entry the median, spread and count of that phase."""
        options = self.options
        if options.confirm_rounds <= 0 or not result.entries:
            return
        best = result.entries[0].time_s
        contenders = [e for e in result.entries
                      if e.algorithm in timed and e.time_s <= options.confirm_ratio * best]
        contenders = contenders[:CONFIRM_MAX]
        if guess in timed and all(e.algorithm != guess for e in contenders):
            contenders.append(next(e for e in result.entries if e.algorithm == guess))
        if len(contenders) < 2:
            return
        calls = []
        for entry in contenders:
            algorithm, prepared = timed[entry.algorithm]
            calls.append((entry.algorithm, lambda a=algorithm, w=prepared:
                          a.run(problem, inputs, ctx, w)))
        samples: dict[str, list[int]] = {label: [] for label, _ in calls}
        sync, measure = self.device.synchronize, self.device.measure
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            began = self.clock()
            for round_index in range(options.confirm_rounds):
                for offset in range(len(calls)):
                    label, call = calls[(round_index + offset) % len(calls)]
                    if prelude is not None:
                        prelude()
                        sync()
                    samples[label].append(measure(call)[0])
                elapsed_s = (self.clock() - began) * 1e-9
                if round_index + 1 >= CONFIRM_MIN_ROUNDS and elapsed_s >= options.budget_s:
                    break
        except Exception as error:  # a candidate that ran before raised now: keep the blocks
            log.warning("confirmation of %s stopped: %s raised %s: %s; keeping the first "
                        "ranking", problem, label, type(error).__name__, error)
            return
        finally:
            if gc_was_enabled:
                gc.enable()
        confirmed = {label: _Timing(times, early_stopped=False)
                     for label, times in samples.items()}
        result.entries = sorted(
            (replace(e, time_s=confirmed[e.algorithm].median_s,
                     spread_s=confirmed[e.algorithm].spread_s,
                     repeats=len(confirmed[e.algorithm].times_ns))
             if e.algorithm in confirmed and confirmed[e.algorithm].median_s <= e.time_s
             else e for e in result.entries),
            key=lambda e: e.time_s)
        self.progress.step("confirmed", ", ".join(
            f"{label} {confirmed[label].median_s * 1e3:.4f} ms" for label, _ in calls)
            + f" (interleaved, {len(samples[calls[0][0]])} rounds)")

    def _time(self, algorithm: Algorithm, problem: Problem, inputs: list[object],
              ctx: RunContext, best_ns: float | None,
              prelude: Callable[[], object] | None,
              prepared: object = None) -> tuple[_Timing, object]:
        options, clock, sync = self.options, self.clock, self.device.synchronize
        measure = self.device.measure

        def once() -> object:
            return algorithm.run(problem, inputs, ctx, prepared)

        # Warm-up: numba compiles and OpenCL drivers build kernels (and specialise them for
        # their work-group size) on the first call, so its time is never a measurement.  One
        # algorithm is one kernel configuration, so this warms each configuration up before
        # it is timed.  Its output is the one checked against the reference.
        output = once()
        sync()

        times: list[int] = []
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            began = clock()
            while True:
                if prelude is not None:
                    prelude()
                    sync()
                # The device's own clock: perf_counter_ns on the CPU, markers on OpenCL.
                times.append(measure(once)[0])
                # The budget is host time: what the search costs the user.
                elapsed_s = (clock() - began) * 1e-9
                # Clearly slower: its fastest run (of two, or of one that alone outlasted the
                # budget) is early_stop_ratio times the best median so far.
                if best_ns is not None and min(times) > options.early_stop_ratio * best_ns \
                        and (len(times) >= 2 or elapsed_s >= options.budget_s):
                    return _Timing(times, early_stopped=True), output
                if len(times) >= options.max_repeats:
                    break
                if elapsed_s >= options.budget_s and (
                        len(times) >= options.min_repeats or elapsed_s >= 4 * options.budget_s):
                    break
        finally:
            if gc_was_enabled:
                gc.enable()
        return _Timing(times, early_stopped=False), output
