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

import concurrent.futures
import gc
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fastrun._version import __version__
from fastrun.algorithm import Algorithm, RunContext
from fastrun.cache import Entry, low_confidence, unstable
from fastrun.core import limits
from fastrun.core.progress import Progress
from fastrun.core.strategy import SearchOptions
from fastrun.devices import Device, measuring
from fastrun.operator import Operator, Problem

log = logging.getLogger(__name__)

_unstable_warned = threading.Event()


def _warn_unstable_once(problem: Problem, entry: Entry) -> None:
    """One warning per process: a busy machine makes many problems unstable at once."""
    if _unstable_warned.is_set():
        return
    _unstable_warned.set()
    log.warning("timing is unstable on this machine: %s on %s spread over %.0f%% of its "
                "median (%.4f ms) after it was timed again; its pick, and any other that stays "
                "unstable, is marked low-confidence in the cache, and fastrun tune or a later "
                "search measures it again (a quieter machine, or fewer threads, times "
                "steadier)", entry.algorithm, problem, 100 * entry.relative_spread,
                entry.time_s * 1e3)

#: Most candidates the interleaved confirmation times (the fastest by their block medians),
#: and most candidates timed again for unstable timing.
CONFIRM_MAX = 4
#: Rounds the confirmation always runs, however long they take.
CONFIRM_MIN_ROUNDS = 3
#: Batch items a large problem's numerical check covers (the first, middle and last), where
#: its operator names its batch inputs (:meth:`Operator.batch_inputs`).
CHECK_ITEMS = 3
#: Output elements from which the check covers :data:`CHECK_ITEMS` items only.  Every conv of
#: ResNet-18 at batch 32 has more (its last, 32x512x7x7, has 0.8 million); at 1 << 22 only its
#: first five were sampled, and the float64 references of the others still took 30 s of an
#: H200 search.
CHECK_ITEMS_FROM = 1 << 18
#: Threads that build candidates' kernels ahead of their timing (:meth:`Profiler._build_ahead`).
BUILD_THREADS = min(16, os.cpu_count() or 1)


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
    #: The user pressed Ctrl-C: the candidates after the one running then were not timed
    #: (the caller saves what was measured, then stops).
    interrupted: bool = False


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

    @staticmethod
    def check_sizes(problem: Problem, operator: Operator) -> None:
        """Refuse a problem whose inputs or output would not fit the memory limit
        (:mod:`fastrun.core.limits`): nothing is allocated, and the message names the tensor."""
        for index, (shape, dtype) in enumerate(zip(problem.shapes, problem.dtypes, strict=True)):
            limits.check_tensor(shape, dtype, f"{problem} input {index}")
        try:
            output = operator.output_shape(problem), operator.output_dtype(problem)
        except NotImplementedError:  # an operator that does not say: its inputs are checked
            return
        limits.check_tensor(*output, f"{problem} output")

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
        self.check_sizes(problem, operator)
        host_inputs = operator.random_inputs(problem, rng)
        check = _OutputCheck(problem, operator, host_inputs, self.options.check_numerics,
                             self.device)
        other_check, others = self._other_inputs_check(problem, operator)
        best_ns: float | None = None
        # On the device once: every candidate's inputs are copies of these, made there, and
        # its inputs are compared with these there.
        originals = [self.device.to_device(x) for x in host_inputs]
        self._build_ahead(problem, candidates)

        self.progress.begin(str(problem), len(candidates))
        #: desc text -> (algorithm, its prepared weights, its inputs), for the confirmation
        timed: dict[str, tuple[Algorithm, object, list[object]]] = {}
        with _UserInterrupts() as interrupts:
            for algorithm in candidates:
                if interrupts.by_user:  # a Ctrl-C that a finalizer swallowed (see _handler)
                    result.interrupted = True
                    break
                label = algorithm.desc.text
                # Each candidate gets its own copy, made on the device and untimed: one that
                # writes into its inputs must not spoil the next candidate's check.
                inputs = [self.device.copy(x) for x in originals]
                try:
                    prepared = (algorithm.preprocess(problem, inputs)
                                if problem.weight_preprocess else None)
                    timing, outputs = self._time(algorithm, problem, inputs, ctx, best_ns,
                                                 prelude, prepared)
                    reason, error_value = self._checked(
                        algorithm, problem, ctx, inputs, originals, outputs,
                        (check, other_check, others))
                except (KeyboardInterrupt, SystemExit) as error:
                    if interrupts.by_user:  # Ctrl-C: stop here, keep what was measured
                        log.info("search of %s interrupted during %s", problem, label)
                        result.interrupted = True
                        break
                    reason, error_value = f"raised {type(error).__name__}: {error}", None
                except Exception as error:  # an algorithm that raises is skipped, never fatal
                    reason, error_value = f"raised {type(error).__name__}: {error}", None
                if reason is not None:
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
                    timed[label] = (algorithm, prepared, inputs)
                self._record(result, algorithm, timing, workspace[label], error_value)
            result.interrupted = result.interrupted or interrupts.by_user

        result.entries.sort(key=lambda e: e.time_s)
        guess = candidates[0].desc.text if candidates else None
        if not result.interrupted:
            self._confirm(problem, result, timed, ctx, prelude, guess)
            self._retime_unstable(problem, result, timed, ctx, prelude)
        result.seconds = time.perf_counter() - started
        winner = result.entries[0].algorithm if result.entries else "nothing usable"
        self.progress.end(f"{winner} ({result.seconds:.2f} s)")
        return result

    def _record(self, result: ProfileResult, algorithm: Algorithm, timing: _Timing,
                workspace_bytes: int, error: float | None) -> None:
        """A timed candidate's entry, and its line of progress."""
        label = algorithm.desc.text
        result.entries.append(Entry(
            algorithm=label, attributes=algorithm.attributes, time_s=timing.median_s,
            spread_s=timing.spread_s, workspace_bytes=workspace_bytes, error=error,
            repeats=len(timing.times_ns), measured_at=time.time(), version=__version__))
        stopped = " (stopped early: clearly slower)" if timing.early_stopped else ""
        self.progress.step(label, f"{timing.median_s * 1e3:.4f} ms "
                                  f"x{len(timing.times_ns)}{stopped}")

    def _other_inputs_check(self, problem: Problem, operator: Operator
                            ) -> tuple[_OutputCheck | None, list[object]]:
        """A second draw of inputs, on the device, with its check: every candidate is also run
        once on them, so one that returns its first result whatever it is given, or hands
        every call one shared output buffer, is caught (see :meth:`_on_other_inputs`)."""
        if not self.options.check_numerics:
            return None, []
        other_inputs = operator.random_inputs(problem, np.random.default_rng(
            [self.options.seed, 1]))
        return (_OutputCheck(problem, operator, other_inputs, True, self.device),
                [self.device.to_device(x) for x in other_inputs])

    def _checked(self, algorithm: Algorithm, problem: Problem, ctx: RunContext,
                 inputs: list[object], originals: list[object], outputs: dict[str, object],
                 checks: tuple[_OutputCheck, _OutputCheck | None, list[object]]
                 ) -> tuple[str | None, float | None]:
        """Why a timed candidate is excluded (None: it is not), and its numerical error: its
        inputs first (one that wrote into them also spoils its own output), then its
        outputs, then one call on the other inputs."""
        check, other_check, others = checks
        reason = check.inputs_unchanged(inputs, originals)
        error_value = None
        if reason is None:
            reason, error_value = check.outputs(outputs)
        if reason is None and other_check is not None:
            reason, other_error = self._on_other_inputs(algorithm, problem, ctx, outputs,
                                                        other_check, others)
            if other_error is not None and error_value is not None:
                error_value = max(error_value, other_error)
        return reason, error_value

    def _confirm(self, problem: Problem, result: ProfileResult,
                 timed: Mapping[str, tuple[Algorithm, object, list[object]]],
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
            algorithm, prepared, inputs = timed[entry.algorithm]
            calls.append((entry.algorithm, lambda a=algorithm, w=prepared, x=inputs:
                          a.run(problem, x, ctx, w)))
        samples: dict[str, list[int]] = {label: [] for label, _ in calls}
        sync = self.device.synchronize
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
                    samples[label].append(self._measure(problem, label, call)[0])
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

    def _retime_unstable(self, problem: Problem, result: ProfileResult,
                         timed: Mapping[str, tuple[Algorithm, object, list[object]]],
                         ctx: RunContext, prelude: Callable[[], object] | None) -> None:
        """Time the candidates whose timing was unstable (:func:`fastrun.cache.unstable`; at
        most :data:`CONFIRM_MAX`, fastest first) again, in a block each.  Each keeps the
        steadier block, or of two alike the smaller median, with that block's spread and
        repeats.  A pick still unstable after that is warned about once per process; its entry
        keeps its spread, which marks the problem low-confidence in the cache
        (:func:`fastrun.cache.low_confidence`), so that ``fastrun tune`` and later searches
        measure it again."""
        shaky = [e for e in result.entries if e.unstable and e.algorithm in timed]
        if not shaky:
            return
        again: dict[str, _Timing] = {}
        for entry in shaky[:CONFIRM_MAX]:
            algorithm, prepared, inputs = timed[entry.algorithm]
            try:
                again[entry.algorithm], _ = self._time(algorithm, problem, inputs, ctx, None,
                                                       prelude, prepared)
            except Exception as error:  # it ran before: keep its first block
                log.warning("re-timing %s on %s stopped: %s: %s", entry.algorithm, problem,
                            type(error).__name__, error)

        def better(entry: Entry) -> Entry:
            timing = again.get(entry.algorithm)
            if timing is None:
                return entry
            steady = not unstable(timing.median_s, timing.spread_s)
            if (steady, -timing.median_s) <= (not entry.unstable, -entry.time_s):
                return entry
            return replace(entry, time_s=timing.median_s, spread_s=timing.spread_s,
                           repeats=len(timing.times_ns))

        result.entries = sorted((better(e) for e in result.entries), key=lambda e: e.time_s)
        self.progress.step("re-timed", ", ".join(
            f"{label} {timing.median_s * 1e3:.4f} ms" for label, timing in again.items())
            + " (unstable timing)")
        shaky_pick = low_confidence(result.entries)
        if shaky_pick is not None:
            _warn_unstable_once(problem, shaky_pick)

    def _on_other_inputs(self, algorithm: Algorithm, problem: Problem, ctx: RunContext,
                         outputs: Mapping[str, object], check: _OutputCheck,
                         others: Sequence[object]) -> tuple[str | None, float | None]:
        """(why the candidate fails on a second draw of inputs or None, its error there).

        Every timed call used the same inputs, so a candidate that returns its first result
        whatever it is given passed them all; and a candidate that returns one buffer from
        every call passed too, though at dispatch each call overwrites the result of the one
        before.  One call on other inputs catches both: its result is checked against their
        own reference, and the earlier call's output, copied first, must still hold its bits.
        """
        earlier = list(outputs.values())[-1]
        kept = self.device.copy(earlier)
        inputs = [self.device.copy(x) for x in others]
        prepared = algorithm.preprocess(problem, inputs) if problem.weight_preprocess else None
        value = algorithm.run(problem, inputs, ctx, prepared)
        self.device.synchronize()
        if not self.device.same_bits(earlier, kept):
            return ("its call on other inputs overwrote the output of its call before (one "
                    "output buffer shared by every call)"), None
        return check.outputs({"other inputs'": value})

    def _build_ahead(self, problem: Problem, candidates: Sequence[Algorithm]) -> None:
        """Let every candidate compile what it will run (:meth:`Algorithm.build`), several at
        once: a GPU driver's compiler takes tenths of a second per kernel configuration, and
        a tuned family has dozens per problem.  A candidate whose build fails is left to fail
        again, and be reported, when it is timed."""
        device = self.device
        pending = [a for a in candidates if type(a).build is not Algorithm.build]
        if len(pending) < 2:
            return

        def build(algorithm: Algorithm) -> None:
            try:
                algorithm.build(problem, device)
            except Exception as error:  # reported when the candidate runs
                log.debug("building %s ahead failed: %s", algorithm.desc.text, error)

        workers = min(len(pending), BUILD_THREADS)
        with device.parallel_builds(), concurrent.futures.ThreadPoolExecutor(workers) as pool:
            list(pool.map(build, pending))

    def _measure(self, problem: Problem, label: str,
                 call: Callable[[], object]) -> tuple[int, object]:
        """One timed call on the device's clock, with what is being timed made known
        (:data:`fastrun.devices.measuring`): the seam where a simulated device gives a
        recorded time instead (:mod:`fastrun.devices.simulated`)."""
        token = measuring.set((problem.operator, problem.key, label))
        try:
            return self.device.measure(call)
        finally:
            measuring.reset(token)

    def _time(self, algorithm: Algorithm, problem: Problem, inputs: list[object],
              ctx: RunContext, best_ns: float | None,
              prelude: Callable[[], object] | None,
              prepared: object = None) -> tuple[_Timing, dict[str, object]]:
        """The candidate's timing, and its outputs by call: the warm-up, the first timed call
        and the last one (all three are checked: an algorithm correct only on its first call,
        or only once warm, is caught)."""
        options, clock, sync = self.options, self.clock, self.device.synchronize
        label = algorithm.desc.text

        def once() -> object:
            return algorithm.run(problem, inputs, ctx, prepared)

        # Warm-up: numba compiles and OpenCL drivers build kernels (and specialise them for
        # their work-group size) on the first call, so its time is never a measurement.  One
        # algorithm is one kernel configuration, so this warms each configuration up before
        # it is timed.
        outputs = {"warm-up": once()}
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
                elapsed_ns, value = self._measure(problem, label, once)
                times.append(elapsed_ns)
                outputs["first timed" if len(times) == 1 else "last timed"] = value
                # The budget is host time: what the search costs the user.
                elapsed_s = (clock() - began) * 1e-9
                # Clearly slower: its fastest run (of two, or of one that alone outlasted the
                # budget) is early_stop_ratio times the best median so far.
                if best_ns is not None and min(times) > options.early_stop_ratio * best_ns \
                        and (len(times) >= 2 or elapsed_s >= options.budget_s):
                    return _Timing(times, early_stopped=True), outputs
                if len(times) >= options.max_repeats:
                    break
                if elapsed_s >= options.budget_s and (
                        len(times) >= options.min_repeats or elapsed_s >= 4 * options.budget_s):
                    break
        finally:
            if gc_was_enabled:
                gc.enable()
        return _Timing(times, early_stopped=False), outputs


class _OutputCheck:
    """What a candidate's results must be: the problem's dtype and shape, within tolerance of
    the reference (when numerics are checked), and its inputs left as they were."""

    def __init__(self, problem: Problem, operator: Operator, inputs: Sequence[np.ndarray],
                 numerics: bool, device: Device):
        self.problem, self.operator, self.device = problem, operator, device
        self.dtype = np.dtype(operator.output_dtype(problem))
        try:
            self.shape: tuple[int, ...] | None = tuple(operator.output_shape(problem))
        except NotImplementedError:  # an operator that does not say
            self.shape = None
        self.tolerance = operator.tolerance(problem)
        #: the batch items checked (None: the whole output)
        self.items: list[int] | None = None
        #: the problem the reference is computed for: ``problem``, or its checked items
        self.checked_problem = problem
        self.reference: np.ndarray | None = None
        if not numerics:
            return
        self.items = self._items(inputs)
        if self.items is not None:
            batched = operator.batch_inputs(problem)
            inputs = [x[self.items] if i in batched else x for i, x in enumerate(inputs)]
            self.checked_problem = replace(problem, shapes=tuple(
                tuple(np.shape(x)) for x in inputs))
        self.reference = operator.reference(self.checked_problem, inputs)
        if self.shape is None and self.items is None:  # the reference's shape, then
            self.shape = tuple(np.shape(self.reference))

    def _items(self, inputs: Sequence[np.ndarray]) -> list[int] | None:
        """The batch items to check, where the output is large and the operator says which
        inputs carry the batch; else None."""
        batched = self.operator.batch_inputs(self.problem)
        if not batched or self.shape is None or math.prod(self.shape) < CHECK_ITEMS_FROM:
            return None
        count = self.shape[0]
        if count <= CHECK_ITEMS or any(np.shape(inputs[i])[0] != count for i in batched):
            return None
        return sorted({0, count // 2, count - 1})

    def _host(self, value: object) -> np.ndarray:
        """The output's checked part, downloaded: the checked items only, where sampled."""
        if self.items is None:
            return self.device.to_host(value)
        return np.concatenate([self.device.to_host(value[i:i + 1])  # type: ignore[index]
                               for i in self.items])

    def outputs(self, outputs: Mapping[str, object]) -> tuple[str | None, float | None]:
        """(why the outputs are wrong or None, the largest numerical error).

        Only what must be is downloaded: shapes and dtypes are read from the arrays, and an
        output with the same bits as one already checked (the usual case: every call of a
        deterministic kernel) is compared with it on the device.  A batch-32 search on a GPU
        spent a third of its time downloading outputs before this."""
        worst: float | None = None
        checked: object = None
        for call, value in outputs.items():
            dtype, shape = self._described(value)
            want = self.shape if self.shape is not None else shape
            if dtype != self.dtype or shape != want:
                return (f"returned {dtype}{list(shape)} on its {call} call; the "
                        f"problem's output is {self.dtype}{list(want)}"), None
            if self.reference is None:
                continue
            if checked is not None and self.device.same_bits(value, checked):
                continue
            error = self.operator.error(self.checked_problem, self._host(value),
                                        self.reference)
            if not error <= self.tolerance:  # also catches NaN
                return (f"numerical error {error:.3g} exceeds tolerance "
                        f"{self.tolerance:.3g} on its {call} call"), error
            worst = error if worst is None else max(worst, error)
            checked = value
        return None, worst

    def _described(self, value: object) -> tuple[np.dtype, tuple[int, ...]]:
        """(dtype, shape) of an output: read from the array where it says (numpy's and
        pyopencl's do), else from its download."""
        try:
            return np.dtype(value.dtype), tuple(int(d) for d in value.shape)  # type: ignore
        except (AttributeError, TypeError):
            host = self.device.to_host(value)
            return host.dtype, tuple(host.shape)

    def inputs_unchanged(self, inputs: Sequence[object],
                         originals: Sequence[object]) -> str | None:
        """Why a candidate's inputs differ from the originals (compared on the device)."""
        for index, (value, original) in enumerate(zip(inputs, originals, strict=True)):
            if not self.device.same_bits(value, original):
                return f"wrote into its input {index}"
        return None


class _UserInterrupts:
    """Tells a Ctrl-C (SIGINT) apart from a KeyboardInterrupt a candidate raises itself: the
    first stops the search, the second only that candidate.  Active in the main thread, where
    Python's default handler is installed; elsewhere no signal can arrive."""

    def __init__(self) -> None:
        self.by_user = False
        self._previous: object = None

    def _handler(self, signum: int, frame: object) -> None:
        # Remembered as well as raised: raised inside an object's finalizer (numba compiling
        # a kernel frees llvmlite objects that way), the exception is printed and dropped, and
        # the search stops at the next candidate instead.
        self.by_user = True
        raise KeyboardInterrupt

    def __enter__(self) -> _UserInterrupts:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
