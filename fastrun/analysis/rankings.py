"""Full algorithm rankings of a problem suite, their file, and the noise-aware regression check.

A cache keeps only what dispatch needs (pruned entries); a *ranking* keeps every timed
candidate of every problem with its median, spread and repeats, and every failure with its
reason, so that two runs can be compared algorithm by algorithm: ``fastrun rank`` writes one,
``fastrun regress`` measures again and compares with :func:`compare`. ``docs/regression.md``
describes the file and the rule.

File format (msgpack, ``use_bin_type=True``)::

    {"format": "fastrun-rankings", "version": 1, "suite": str, "device": device category,
     "fastrun_version": str, "created_at": unix time, "budget_s": float,
     "strategy": str, "rounds": int,
     "problems": [{"operator": str, "category": str, "key": str, "label": str, "weight": int,
                   "entries": [{"algorithm": str, "time_s": float, "spread_s": float,
                                "repeats": int, "workspace_bytes": int, "error": float | None,
                                "attributes": [names], "early_stopped": bool,
                                "measured_at": unix time, "version": str}, ...],
                   "failures": [{"algorithm": str, "reason": str}, ...]}, ...]}

Entries are sorted by time, fastest first; each is a :class:`fastrun.cache.Entry`, the record
the cache keeps (a file without ``measured_at`` and ``version`` per entry, written before they
were, takes the file's ``created_at`` and ``fastrun_version``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from fastrun import category as category_module
from fastrun.attribute import AlgoAttribute
from fastrun.base.files import atomic_write
from fastrun.base.formats import RANKINGS_FORMAT, RANKINGS_VERSION
from fastrun.cache import Entry
from fastrun.operator import Problem

if TYPE_CHECKING:
    from fastrun.analysis.suites import Suite, SuiteProblem
    from fastrun.api import Session


#: Default relative margin of the regression rule (see :func:`compare`).
DEFAULT_MARGIN = 0.25

#: Rounds with which :func:`confirm` re-measures the problems that regressed.
DEFAULT_CONFIRM_ROUNDS = 3
#: Seconds :func:`confirm` waits before each of its rounds, so that they spread over several
#: seconds: a burst of load on CI's machine outlasted three back-to-back rounds.
CONFIRM_PAUSE_S = 1.0

#: Relative spread assumed, at least, for a time that rests on an early-stopped candidate's
#: two runs: their interquartile range says nothing about how far the next two would land
#: (medians of such pairs moved by 2-3x between runs on the development machine).
EARLY_STOP_NOISE = 0.5


def _normal_category(text: str) -> str:
    """A category as this fastrun writes it (rankings files of older versions kept the
    format-1 form)."""
    try:
        return category_module.normalize(text)
    except category_module.CategoryError:
        return text


class RankingsError(ValueError):
    """A rankings file is missing, unreadable, or not a fastrun rankings file."""


def noise(entry: Entry) -> float:
    """The relative uncertainty the regression rule allows an entry's time: its spread, and at
    least :data:`EARLY_STOP_NOISE` when timing stopped early."""
    spread = entry.relative_spread
    return max(spread, EARLY_STOP_NOISE) if entry.early_stopped else spread


@dataclass
class RankedFailure:
    """A candidate that could not be timed or chosen, and why."""

    algorithm: str
    reason: str


@dataclass
class RankedProblem:
    operator: str
    category: str
    key: str
    label: str
    weight: int
    entries: list[Entry] = field(default_factory=list)
    failures: list[RankedFailure] = field(default_factory=list)

    @property
    def ident(self) -> tuple[str, str]:
        return (self.operator, self.key)

    @property
    def winner(self) -> Entry | None:
        return self.entries[0] if self.entries else None

    def entry(self, algorithm: str) -> Entry | None:
        return next((e for e in self.entries if e.algorithm == algorithm), None)

    def title(self) -> str:
        return f"{self.operator}({self.key})"

    def to_dict(self) -> dict[str, Any]:
        """The file's form: each entry the cache's record (:meth:`Entry.to_dict`) plus
        ``early_stopped``."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)
                   if f.name not in ("entries", "failures")},
                "entries": [{**e.to_dict(), "early_stopped": e.early_stopped}
                            for e in self.entries],
                "failures": [asdict(f) for f in self.failures]}


@dataclass
class Rankings:
    suite: str
    device: str
    fastrun_version: str
    created_at: float
    budget_s: float
    problems: list[RankedProblem] = field(default_factory=list)
    strategy: str = ""
    #: how many times the suite was measured (see :func:`rank`)
    rounds: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"format": RANKINGS_FORMAT, "version": RANKINGS_VERSION,
                **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "problems"},
                "problems": [problem.to_dict() for problem in self.problems]}

    @classmethod
    def from_dict(cls, data: Any, source: str = "rankings") -> Rankings:
        """Rebuild from :meth:`to_dict`'s shape; RankingsError names ``source`` otherwise."""
        if not isinstance(data, dict) or data.get("format") != RANKINGS_FORMAT:
            kind = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise RankingsError(f"{source} is not a fastrun rankings file (format: {kind!r}; "
                                f"expected {RANKINGS_FORMAT!r}, written by 'fastrun rank')")
        version = data.get("version")
        if version != RANKINGS_VERSION:
            raise RankingsError(f"{source} is rankings format version {version!r}; this fastrun "
                                f"reads version {RANKINGS_VERSION}")
        try:
            problems = [
                RankedProblem(
                    str(p["operator"]), _normal_category(str(p["category"])), str(p["key"]),
                    str(p["label"]),
                    int(p["weight"]),
                    [Entry(str(e["algorithm"]),
                           AlgoAttribute.from_names([str(a) for a in e["attributes"]]),
                           float(e["time_s"]), float(e["spread_s"]), int(e["workspace_bytes"]),
                           None if e["error"] is None else float(e["error"]),
                           int(e["repeats"]),
                           float(e.get("measured_at", data["created_at"])),
                           str(e.get("version", data["fastrun_version"])),
                           bool(e["early_stopped"]))
                     for e in p["entries"]],
                    [RankedFailure(str(f["algorithm"]), str(f["reason"]))
                     for f in p["failures"]])
                for p in data["problems"]]
            device = str(data["device"])
            if any(category_module.is_legacy(str(p["category"])) for p in data["problems"]):
                device = category_module.normalize_device(device)  # written by fastrun 0.1
            return cls(str(data["suite"]), device, str(data["fastrun_version"]),
                       float(data["created_at"]), float(data["budget_s"]), problems,
                       str(data.get("strategy", "")), int(data.get("rounds", 1)))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise RankingsError(f"{source} is a malformed rankings file "
                                f"({type(error).__name__}: {error})") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically: a temporary file in the same folder, then ``os.replace``, so a
        reader (or a crash) never sees a half-written file."""
        import msgpack

        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        atomic_write(path, msgpack.packb(self.to_dict(), use_bin_type=True))


def load_rankings(path: str | os.PathLike) -> Rankings:
    """Read a rankings file; RankingsError, naming the file, when it is missing, unreadable,
    corrupt, or another kind of file (a cache file, say)."""
    import msgpack

    path = os.fspath(path)
    try:
        with open(path, "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        raise RankingsError(f"rankings file {path!r} does not exist") from None
    except OSError as error:
        raise RankingsError(f"cannot read rankings file {path!r}: {error}") from None
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as error:  # msgpack raises several unrelated types on garbage
        raise RankingsError(f"{path!r} is not a fastrun rankings file (cannot be decoded: "
                            f"{type(error).__name__})") from None
    return Rankings.from_dict(data, repr(path))


def recorded_times(rankings: Rankings) -> dict[tuple[str, str], dict[str, float]]:
    """Each ranked problem's timed algorithms and their seconds, keyed by (operator, problem
    key): what :class:`fastrun.devices.simulated.SimulatedDevice` replays.  Entries stopped
    early keep the time they had when they were stopped, as a search would have seen it."""
    return {(p.operator, p.key): {e.algorithm: e.time_s for e in p.entries}
            for p in rankings.problems}


# --------------------------------------------------------------------------------------------
# Ranking


def _raw_items(problems: Suite | Iterable[SuiteProblem | Problem]
               ) -> list[SuiteProblem | Problem]:
    from fastrun.analysis.suites import Suite

    return list(problems.problems if isinstance(problems, Suite) else problems)


def _items(problems: Suite | Iterable[SuiteProblem | Problem], registry: Any
           ) -> list[tuple[str, int, Problem]]:
    from fastrun.analysis.suites import SuiteProblem

    items = []
    for item in _raw_items(problems):
        if isinstance(item, SuiteProblem):
            items.append((item.label, item.weight, item.problem(registry)))
        elif isinstance(item, Problem):
            items.append((str(item), 1, item))
        else:
            raise TypeError(f"cannot rank {item!r}: expected a SuiteProblem or a Problem")
    return items


def rank(session: Session, problems: Suite | Iterable[SuiteProblem | Problem],
         progress: Callable[[int, int, RankedProblem], None] | None = None,
         suite: str | None = None, rounds: int = 1) -> Rankings:
    """Profile every problem with ``session``'s strategy and keep the full ranking of each.

    Each problem is measured afresh through :meth:`AlgoChooser.rank` (sub-problems are
    decided first, as a search does; the session's cache is neither read nor written for the
    ranked problems themselves). Problems are built first, so a bad suite fails before
    anything is timed.

    ``rounds`` > 1 measures the whole suite that many times, one round after another, and
    keeps for each algorithm its fastest round (see :func:`_combine`): on a shared machine a
    burst of someone else's work slows the few milliseconds one candidate is timed in, and
    spreading the rounds over the run lets the undisturbed round through.
    ``progress(done, total, ranked)`` is called after each problem of each round, with that
    round's ranking.
    """
    from fastrun._version import __version__
    from fastrun.analysis.suites import Suite

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    name = suite if suite is not None else (problems.name if isinstance(problems, Suite)
                                             else "custom")
    items = _items(problems, session.registry)
    result = Rankings(name, session.device.category, __version__, time.time(),
                      session.options.budget_s, [], session.options.strategy.text(), rounds)
    measured: list[list[RankedProblem]] = [[] for _ in items]
    bar = session.progress
    total = rounds * len(items)
    try:
        for round_index in range(rounds):
            for index, (label, weight, problem) in enumerate(items):
                bar.context = f"[{round_index * len(items) + index + 1}/{total} {label}]"
                ranked = _rank_once(session, problem, label, weight)
                measured[index].append(ranked)
                if progress is not None:
                    progress(round_index * len(items) + index + 1, total, ranked)
    finally:
        bar.context = ""
    result.problems = [_combine(runs) for runs in measured]
    return result


def _rank_once(session: Session, problem: Problem, label: str, weight: int) -> RankedProblem:
    chooser = session.chooser
    measured, excluded = chooser.rank(problem)
    early = set(measured.early_stopped)
    timed = {e.algorithm for e in measured.entries}
    return RankedProblem(
        problem.operator, chooser.category(session.registry.operator(problem.operator)),
        problem.key, label, weight,
        [replace(e, early_stopped=e.algorithm in early) for e in measured.entries],
        [RankedFailure(algorithm, reason) for algorithm, reason in excluded.items()
         if algorithm not in timed])


def _combine(runs: list[RankedProblem]) -> RankedProblem:
    """One ranking from several rounds of one problem.

    Per algorithm: the round with the smallest median (load only ever adds time, so the
    fastest round is the least disturbed one), its spread, and the repeats of all rounds;
    early-stopped only if it stopped early in every round. A failure in any round is kept.
    """
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    by_algorithm: dict[str, list[Entry]] = {}
    failures: dict[str, str] = {}
    for run in runs:
        for entry in run.entries:
            by_algorithm.setdefault(entry.algorithm, []).append(entry)
        for failure in run.failures:
            failures.setdefault(failure.algorithm, failure.reason)
    entries = []
    for measured in by_algorithm.values():
        best = min(measured, key=lambda e: e.time_s)
        entries.append(replace(
            best, repeats=sum(e.repeats for e in measured),
            error=max((e.error for e in measured if e.error is not None), default=None),
            early_stopped=all(e.early_stopped for e in measured)))
    entries.sort(key=lambda e: e.time_s)
    return RankedProblem(first.operator, first.category, first.key, first.label, first.weight,
                         entries, [RankedFailure(a, r) for a, r in failures.items()])


# --------------------------------------------------------------------------------------------
# Comparing two rankings


@dataclass
class AlgorithmChange:
    """How one algorithm's time relative to a reference algorithm of the same run moved."""

    algorithm: str
    reference: str
    ratio_then: float  #: time / reference's time, in the baseline
    ratio_now: float  #: the same ratio, now
    #: ratio_now / ratio_then: above 1 means the algorithm got slower relative to the reference
    change: float
    #: the change that counts: 1 + margin + the four relative spreads involved
    threshold: float
    then_s: float
    now_s: float

    @property
    def regressed(self) -> bool:
        return self.change > self.threshold


@dataclass
class ProblemComparison:
    operator: str
    key: str
    label: str
    verdict: str  #: 'ok', 'regression', 'new', 'missing'
    winner_then: str | None = None
    winner_now: str | None = None
    spearman: float | None = None
    changes: list[AlgorithmChange] = field(default_factory=list)
    #: why the verdict is a regression: one line per finding
    reasons: list[str] = field(default_factory=list)
    #: findings that do not count (a winner change within noise, algorithms gone or new)
    notes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return self.verdict == "regression"


@dataclass
class Comparison:
    baseline_suite: str
    baseline_device: str
    device: str
    margin: float
    problems: list[ProblemComparison] = field(default_factory=list)
    #: problems that regressed at first and were measured again (see :func:`confirm`)
    remeasured: list[str] = field(default_factory=list)
    confirm_rounds: int = 0
    #: fresh processes the remaining regressions were checked in (``fastrun regress
    #: --processes``), and the problems those processes cleared
    processes_checked: int = 0
    cleared_by_processes: list[str] = field(default_factory=list)

    @property
    def cross_device(self) -> bool:
        return self.baseline_device != self.device

    @property
    def regressions(self) -> list[ProblemComparison]:
        return [p for p in self.problems if p.regressed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline_suite": self.baseline_suite, "baseline_device": self.baseline_device,
            "device": self.device, "cross_device": self.cross_device, "margin": self.margin,
            "method": "within-run ratios between algorithms",
            "remeasured": self.remeasured, "confirm_rounds": self.confirm_rounds,
            "processes_checked": self.processes_checked,
            "cleared_by_processes": self.cleared_by_processes,
            "regressed": bool(self.regressions),
            "problems": [{**asdict(p), "regressed": p.regressed} for p in self.problems],
        }


def spearman(first: Sequence[float], second: Sequence[float]) -> float | None:
    """Spearman rank correlation of two paired samples (average ranks for ties); None when it
    is undefined (fewer than two pairs, or a constant sample)."""
    if len(first) != len(second) or len(first) < 2:
        return None

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        result = [0.0] * len(values)
        start = 0
        while start < len(order):
            end = start
            while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
                end += 1
            for position in range(start, end + 1):
                result[order[position]] = (start + end) / 2
            start = end + 1
        return result

    a, b = ranks(first), ranks(second)
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    var_a = sum((x - mean_a) ** 2 for x in a)
    var_b = sum((y - mean_b) ** 2 for y in b)
    if var_a == 0 or var_b == 0:
        return None
    return cov / (var_a * var_b) ** 0.5


def _compare_problem(then: RankedProblem, now: RankedProblem, margin: float
                     ) -> ProblemComparison:
    result = ProblemComparison(now.operator, now.key, now.label or then.label, "ok")
    old = {e.algorithm: e for e in then.entries}
    new = {e.algorithm: e for e in now.entries}
    # Baseline order, so the fastest algorithm of the baseline comes first.
    common = [e.algorithm for e in then.entries if e.algorithm in new]
    result.winner_then = then.winner.algorithm if then.winner else None
    result.winner_now = now.winner.algorithm if now.winner else None
    result.spearman = spearman([old[a].time_s for a in common], [new[a].time_s for a in common])
    if category_module.split(then.category)[1] != category_module.split(now.category)[1]:
        result.notes.append(f"algorithm set changed: {then.category.split('|', 1)[-1]} then, "
                            f"{now.category.split('|', 1)[-1]} now")

    failed_now = {f.algorithm: f.reason for f in now.failures}
    for name in old:
        if name in failed_now:
            result.reasons.append(f"{name} was timed in the baseline and now fails: "
                                  f"{failed_now[name]}")
        elif name not in new:
            result.notes.append(f"{name} was timed in the baseline and is not a candidate now")
    for name in new:
        if name not in old:
            result.notes.append(f"{name} is new (not timed in the baseline)")

    # Winner change: counts only when the old winner is now slower than the new one by more
    # than both measured spreads plus the margin.
    w_old, w_new = result.winner_then, result.winner_now
    if w_old and w_new and w_old != w_new and w_old in new:
        slow, fast = new[w_old], new[w_new]
        excess = slow.time_s - fast.time_s
        allowed = noise(slow) * slow.time_s + noise(fast) * fast.time_s + margin * fast.time_s
        text = (f"winner changed: {w_old} -> {w_new}; {w_old} is now "
                f"{slow.time_s / fast.time_s:.2f}x {w_new}")
        if excess > allowed:
            result.reasons.append(f"{text} (beyond spreads + margin: "
                                  f"{(fast.time_s + allowed) / fast.time_s:.2f}x)")
        else:
            result.notes.append(f"{text}, within spreads + margin")

    # Relative slowdowns: each algorithm against a reference algorithm of the same run, the
    # baseline's fastest other common algorithm, so the winner is checked against the runner-up.
    for name in common:
        others = [a for a in common if a != name]
        if not others:
            break
        reference = others[0]
        ratio_then = old[name].time_s / old[reference].time_s
        ratio_now = new[name].time_s / new[reference].time_s
        change = ratio_now / ratio_then
        threshold = 1 + margin + (noise(old[name]) + noise(old[reference])
                                  + noise(new[name]) + noise(new[reference]))
        item = AlgorithmChange(name, reference, ratio_then, ratio_now, change, threshold,
                               old[name].time_s, new[name].time_s)
        result.changes.append(item)
        if item.regressed:
            result.reasons.append(
                f"{name} slowed relative to {reference}: {ratio_then:.2f}x -> {ratio_now:.2f}x "
                f"its time ({change:.2f}x, counts above {threshold:.2f}x)")
    if result.reasons:
        result.verdict = "regression"
    return result


def compare(baseline: Rankings, current: Rankings, margin: float = DEFAULT_MARGIN
            ) -> Comparison:
    """Compare two rankings of (mostly) the same problems; see ``docs/regression.md``.

    Only ratios between algorithms measured in the same run are compared, never absolute
    times, so a machine that is uniformly slower or busier today (or a different device) does
    not read as a regression. A finding counts only when it exceeds the measured spreads
    (relative interquartile ranges) of everything involved plus ``margin``:

    * winner change: the old winner is now slower than the new winner by more than both
      their spreads plus ``margin`` times the new winner's time;
    * relative slowdown: ``(t_now(a) / t_now(ref)) / (t_then(a) / t_then(ref))`` exceeds
      ``1 + margin`` plus the relative spreads of ``a`` and ``ref`` in both runs, where
      ``ref`` is the baseline's fastest common algorithm other than ``a`` (an early-stopped
      time counts with a relative spread of at least :data:`EARLY_STOP_NOISE`);
    * an algorithm timed in the baseline that now fails.
    """
    result = Comparison(baseline.suite, baseline.device, current.device, margin)
    old = {p.ident: p for p in baseline.problems}
    seen = set()
    for problem in current.problems:
        seen.add(problem.ident)
        then = old.get(problem.ident)
        if then is None:
            result.problems.append(ProblemComparison(
                problem.operator, problem.key, problem.label, "new",
                winner_now=problem.winner.algorithm if problem.winner else None,
                notes=["not in the baseline"]))
        else:
            result.problems.append(_compare_problem(then, problem, margin))
    for problem in baseline.problems:
        if problem.ident not in seen:
            result.problems.append(ProblemComparison(
                problem.operator, problem.key, problem.label, "missing",
                winner_then=problem.winner.algorithm if problem.winner else None,
                notes=["in the baseline, not in this run's suite"]))
    return result


def confirm(session: Session, baseline: Rankings, current: Rankings,
            problems: Suite | Iterable[SuiteProblem | Problem], margin: float = DEFAULT_MARGIN,
            rounds: int = DEFAULT_CONFIRM_ROUNDS,
            progress: Callable[[int, int, RankedProblem], None] | None = None,
            pause_s: float = CONFIRM_PAUSE_S) -> tuple[Comparison, Rankings]:
    """Compare, re-measure the problems that regressed ``rounds`` more times, compare again.

    Why: bursts of other processes' load on a shared machine can last seconds, long enough to
    hit every round of one candidate (a CI run measured ``winograd_f2x3`` at 80 us in all three
    rounds, against 56 us before and after on unchanged code). Load only ever adds time, so
    folding the new rounds in (each algorithm keeps its fastest round over all of them, as
    :func:`rank` does) clears a burst, while a real slowdown is slow in every round and stays.
    Each round waits ``pause_s`` first, so the rounds spread over seconds (one burst on the
    development machine outlasted three back-to-back rounds).
    ``problems`` is what ``current`` was ranked from. Returns the final comparison, whose
    problems that were flagged at first carry a note saying whether the regression held, and
    the rankings with the extra rounds folded in.
    """
    comparison = compare(baseline, current, margin)
    flagged = {(p.operator, p.key): p for p in comparison.regressions}
    if not flagged or rounds < 1:
        return comparison, current
    registry = session.registry
    subset = [item for item in _raw_items(problems)
              if _ident(item, registry) in flagged]
    extra: dict[tuple[str, str], list[RankedProblem]] = {}
    for round_index in range(rounds):
        time.sleep(pause_s)

        def report(done: int, total: int, ranked: RankedProblem, offset=round_index) -> None:
            if progress is not None:
                progress(offset * total + done, rounds * total, ranked)

        for ranked in rank(session, subset, report, current.suite).problems:
            extra.setdefault(ranked.ident, []).append(ranked)
    folded = Rankings(current.suite, current.device, current.fastrun_version,
                      current.created_at, current.budget_s,
                      [_combine([p, *extra[p.ident]]) if p.ident in extra else p
                       for p in current.problems],
                      current.strategy, current.rounds)
    final = compare(baseline, folded, margin)
    final.remeasured = [flagged[ident].label for ident in extra]
    final.confirm_rounds = rounds
    for item in final.problems:
        first = flagged.get((item.operator, item.key))
        if first is None:
            continue
        if item.regressed:
            item.notes.append(f"confirmed: still a regression after {rounds} more round(s)")
        else:
            item.notes.append(f"not confirmed: flagged after the first {current.rounds} "
                              f"round(s) ({first.reasons[0]}), within the limits after "
                              f"{rounds} more; a burst of load, not the code")
    return final, folded


def _ident(item: SuiteProblem | Problem, registry: Any) -> tuple[str, str]:
    problem = item if isinstance(item, Problem) else item.problem(registry)
    return (problem.operator, problem.key)
