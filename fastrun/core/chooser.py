"""AlgoChooser: cache -> profile -> heuristic, with attribute filters and the workspace limit.

Order of business for a problem (MegEngine's Fast Run, with the improvements DESIGN.md names):

1. already decided in this process -> the decision (a dictionary lookup);
2. the persistent cache has an entry that satisfies the strategy and the limit -> take it,
   unless its timing was unstable (:func:`fastrun.cache.low_confidence`) and the strategy
   profiles: then it is measured again;
3. the strategy profiles -> choose the sub-problems of every candidate first (children before
   parents, with a cycle check), time the candidates, write the measurements to the cache at
   once (so an interrupted search resumes), take the fastest eligible one;
4. otherwise, when nothing is searched, the choice of the nearest measured problem within the
   distance limit whose algorithm is usable here (:mod:`fastrun.core.nearest`);
5. otherwise the operator's rule of thumb;
6. nothing left -> :class:`NoUsableAlgorithmError`, naming every candidate and why it was excluded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.base.units import human_bytes
from fastrun.cache import Entry, PersistentCache, entry_order, low_confidence
from fastrun.cache.problems import ProblemRecorder
from fastrun.category import text as category_text
from fastrun.core.nearest import (
    NearestIndex,
    Neighbour,
    blended_entries,
    bracket,
    carried_entries,
)
from fastrun.core.profiler import Failure, Profiler, ProfileResult
from fastrun.core.progress import Progress
from fastrun.core.reasons import Exclusion, Source, Why, why_of
from fastrun.core.strategy import ExecutionPolicy, SearchOptions
from fastrun.core.tuning import budgeted_candidates
from fastrun.devices import Device
from fastrun.operator import Operator, Problem
from fastrun.registry import Registry

log = logging.getLogger(__name__)

#: algorithms of neighbours' picks refused as unusable in this process (warned about once)
_REFUSED: set[str] = set()
_REFUSED_LOCK = threading.Lock()


class NoUsableAlgorithmError(RuntimeError):
    """No algorithm of an operator can compute a problem under the given strategy and limit."""

    def __init__(self, problem: Problem, options: SearchOptions, excluded: dict[str, str]):
        self.problem = problem
        self.options = options
        self.excluded = dict(excluded)
        lines = [f"no usable algorithm for {problem} ({options.describe()})"]
        if excluded:
            lines += [f"  {name}: {reason}" for name, reason in excluded.items()]
        else:
            lines.append("  the operator has no registered algorithms")
        hint = _hint(options, excluded)
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))


def _hint(options: SearchOptions, excluded: dict[str, str]) -> str:
    kinds = {why_of(reason) for reason in excluded.values()}
    if kinds == {Why.OTHER_DEVICE}:
        return "hint: none of the operator's algorithms runs on this device; pick another device"
    if any(why_of(reason) is Why.STRATEGY and AlgoAttribute.NAIVE in reason.attributes
           for reason in excluded.values()):
        return "hint: --full-run (strategy 'full-run') also considers NAIVE algorithms"
    if Why.WORKSPACE in kinds:
        return "hint: raise the workspace limit"
    return ""


class PreparedCall:
    """One problem bound to its chosen algorithm, with constant weights preprocessed once.

    What a runtime holds per node: calling it costs the algorithm's run and nothing else, and
    with weight preprocessing on, the weight transform (e.g. winograd's filter transform) was
    paid when the call was prepared, not on every call.
    """

    def __init__(self, chooser: AlgoChooser, decision: Decision, prepared: Any):
        self.chooser = chooser
        self.decision = decision
        self.problem = decision.problem
        self.algorithm = decision.algorithm
        self.prepared = prepared
        #: the algorithm's bound call (:meth:`fastrun.algorithm.Algorithm.bind`): what does
        #: not change between calls worked out here, once
        self._bound = decision.algorithm.bind(self.problem, chooser, prepared)

    def __call__(self, *inputs: Any) -> Any:
        if not self.chooser._host_memory:
            inputs = tuple(self.chooser.device.to_device(x) for x in inputs)
        return self._bound(*inputs)

    def __repr__(self) -> str:
        return f"<PreparedCall {self.problem} -> {self.algorithm.desc.text}>"


class UndeclaredSubOperatorError(RuntimeError):
    """An algorithm's sub-problems belong to operators its ``sub_operators`` does not name:
    its cache entries would outlive a change to those operators' algorithms."""

    def __init__(self, operators: Sequence[str]):
        self.operators = list(operators)
        super().__init__(f"its sub-problems call {', '.join(self.operators)}, which its "
                         "sub_operators does not declare (the cache could not tell when they "
                         "change)")


class SubProblemCycleError(RuntimeError):
    """An algorithm's sub-problems lead back to a problem that is still being decided."""

    def __init__(self, chain: Sequence[str]):
        self.chain = list(chain)
        super().__init__("sub-problem cycle: " + " -> ".join(self.chain))


@dataclass
class Decision:
    """How one problem was decided; :attr:`policy` is what dispatch follows."""

    problem: Problem
    algorithm: Algorithm
    policy: ExecutionPolicy
    category: str
    #: The ranking the decision was made from: the profiled entries, or the cached ones.
    entries: list[Entry] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: desc text -> why it could not be chosen (usability, attributes, workspace, failures)
    excluded: dict[str, str] = field(default_factory=dict)
    #: Wall time of the search, sub-problems' searches included (0 when not profiled).
    search_seconds: float = 0.0

    @property
    def source(self) -> Source:
        return self.policy.source


@dataclass
class SearchStats:
    profiled: int = 0
    cache_hits: int = 0
    heuristic: int = 0
    #: problems served from the nearest measured problem (nothing searched)
    nearest: int = 0
    #: problems with exactly one eligible algorithm: nothing to look up or time
    single: int = 0
    #: of ``profiled``, problems whose cached pick was low-confidence: measured again
    remeasured: int = 0
    search_seconds: float = 0.0


def _carried_children(children: tuple[ExecutionPolicy, ...]) -> bool:
    """Whether a neighbour's time for an algorithm still holds with these sub-problem
    choices: not when one of them fell to the rule of thumb, for lack of a measured problem
    near it.  The parent's time there included its sub-problem's measured choice; here that
    choice is a guess, often on the far side of a size cliff.  Measured on the 2-core VM:
    ResNet-18's last stage at 5x5 pixels (160-pixel images) took Winograd F(2,3) from 7x7,
    whose product has 16 tiles there and 9 here, and ran it in 2.1 ms against 0.8 ms for
    the direct kernel a search picks."""
    return all(policy.source != Source.HEURISTIC
               for child in children for policy in child.walk())


def _total_workspace(algorithm: Algorithm, problem: Problem,
                     children: tuple[ExecutionPolicy, ...]) -> int:
    """Own workspace plus the largest of the sub-problems' (they run one after another), as
    :attr:`ExecutionPolicy.total_workspace` counts it."""
    return algorithm.workspace_bytes(problem) + max(
        (child.total_workspace for child in children), default=0)


class AlgoChooser:
    """Decides, remembers and dispatches.  Implements :class:`fastrun.algorithm.RunContext`
    (``device`` included: algorithms reach the session's device through ``ctx.device``)."""

    def __init__(self, registry: Registry, device: Device, cache: PersistentCache,
                 options: SearchOptions, clock: Callable[[], int] | None = None,
                 progress: Progress | None = None, recorder: ProblemRecorder | None = None):
        self.registry = registry
        self.device = device
        self.cache = cache
        self.options = options
        #: where problems that miss the cache are recorded (a session's ``record=PATH``)
        self.recorder = recorder
        self.profiler = Profiler(device, options, clock=clock, progress=progress)
        self.nearest = NearestIndex(cache)
        self.stats = SearchStats()
        self._decisions: dict[tuple[str, str], Decision] = {}
        #: call signature -> (algorithm, problem): the dispatch fast path
        self._bound: dict[tuple, tuple[Algorithm, Problem]] = {}
        self._deciding: list[tuple[str, str]] = []
        self._lock = threading.RLock()
        self._host_memory = device.host_memory
        #: called with every new :class:`Decision` (see :meth:`Session.add_listener`)
        self.listeners: list[Callable[[Decision], object]] = []

    # -- public --------------------------------------------------------------------------------
    def category(self, operator: Operator) -> str:
        """Cache namespace: the device's facts, the operator and its algorithm-set version."""
        return category_text(self.device.category, operator.name,
                             self.registry.algorithm_set_version(operator.name, self.device.kind))

    def decide(self, problem: Problem, prelude: Callable[[], object] | None = None) -> Decision:
        """How ``problem`` is computed: decided once per process (see the module docstring).

        ``prelude``: run untimed before each timed call if the problem is profiled now (see
        :meth:`Profiler.profile`); a runtime passes the model's previous step, so candidates
        are timed in the state the model leaves the machine in.
        """
        ident = (problem.operator, problem.key)
        decision = self._decisions.get(ident)
        if decision is not None:
            return decision
        with self._lock:
            decision = self._decisions.get(ident)
            if decision is not None:
                return decision
            if ident in self._deciding:
                chain = [f"{op}({key})" for op, key in self._deciding[self._deciding.index(ident):]]
                raise SubProblemCycleError([*chain, f"{ident[0]}({ident[1]})"])
            self._deciding.append(ident)
            try:
                decision = self._decide(problem, prelude)
            finally:
                self._deciding.pop()
            self._decisions[ident] = decision
            self._tell(decision)
            return decision

    def _tell(self, decision: Decision) -> None:
        """Hand a new decision to the listeners; one that raises is logged and dropped, so
        that watching a search can never break it."""
        for listener in list(self.listeners):
            try:
                listener(decision)
            except Exception as error:
                log.warning("decision listener %r raised %s: %s; it is removed", listener,
                            type(error).__name__, error)
                self.listeners.remove(listener)

    def policy(self, problem: Problem) -> ExecutionPolicy:
        return self.decide(problem).policy

    def decisions(self) -> list[Decision]:
        """Every problem decided so far in this process, sub-problems included, in the order
        the decisions were completed (children before parents)."""
        return list(self._decisions.values())

    def dispatch(self, operator: str, *inputs: Any, **params: Any) -> Any:
        """Compute ``operator`` on ``inputs`` with the chosen algorithm.

        After the first call of a signature this is one tuple build and one dict lookup.  On
        a device with its own memory (OpenCL) host inputs are copied to it first and the
        result stays there (``device.to_host`` reads it back).
        """
        try:
            # Built by appending: measured ~2x cheaper than a comprehension of pairs.
            parts: list[Any] = [operator]
            for x in inputs:
                parts.append(x.shape)
                parts.append(x.dtype)
            if params:
                parts.extend(sorted(params.items()))
            signature: tuple | None = tuple(parts)
            bound = self._bound.get(signature)
        except (AttributeError, TypeError):  # not arrays, or unhashable parameters
            signature, bound = None, None
        if not self._host_memory:
            # Algorithms of an accelerator take its arrays; device arrays pass unchanged.
            inputs = tuple(self.device.to_device(x) for x in inputs)
        if bound is None:
            if self._host_memory:
                inputs = tuple(np.asarray(x) for x in inputs)
            problem = self.registry.operator(operator).problem_for(inputs, **params)
            bound = (self.decide(problem).algorithm, problem)
            if signature is not None:
                self._bound[signature] = bound
        algorithm, problem = bound
        return algorithm.run(problem, inputs, self)

    def prepare(self, problem: Problem, inputs: Sequence[Any],
                prelude: Callable[[], object] | None = None) -> PreparedCall:
        """Decide ``problem`` (see :meth:`decide` for ``prelude``) and bind it, preprocessing
        the constant inputs in ``inputs`` once when the problem has weight preprocessing on."""
        decision = self.decide(problem, prelude)
        if not self._host_memory:
            # None stands for an input only known at run time (the runtime's activations).
            inputs = [None if x is None else self.device.to_device(x) for x in inputs]
        prepared = (decision.algorithm.preprocess(problem, inputs)
                    if problem.weight_preprocess else None)
        return PreparedCall(self, decision, prepared)

    def call(self, problem: Problem, *inputs: Any) -> Any:
        """RunContext: compute a (sub-)problem with the algorithm decided for it."""
        return self.decide(problem).algorithm.run(problem, inputs, self)

    def candidates(self, problem: Problem) -> list[Algorithm]:
        """The algorithms a search of ``problem`` would time: usable here, of this device's
        kind, not forbidden by the strategy."""
        return self._candidates(problem, {})

    def rank(self, problem: Problem, prelude: Callable[[], object] | None = None,
             only: Sequence[str] | None = None) -> tuple[ProfileResult, dict[str, str]]:
        """Time every candidate of ``problem`` now and return the full, unpruned ranking and
        why candidates were not timed or failed (desc text -> reason: sub-problem cycle or
        no usable sub-problem algorithm, workspace limit, raised, numerical error).

        What ``fastrun rank`` records: the same candidates, order and sub-problem decisions as
        a search (:meth:`_from_profile`), but the problem is always measured afresh, and
        neither the cache nor this process's decisions are touched by the result, so a
        ranking run never changes what dispatch does.  Sub-problems are decided (and, under
        a profiling strategy, searched and cached) exactly as for a search, so a parent is
        timed with the children it would have in production.

        ``only``: time just these candidates (desc texts): one part of a problem whose
        candidates a fleet spreads over several workers (:mod:`fastrun.fleet`).
        """
        operator = self.registry.operator(problem.operator)
        operator.validate(problem)
        excluded: dict[str, str] = {}
        with self._lock:
            # On the stack of problems being decided, so a candidate whose sub-problems lead
            # back to this problem is excluded as a cycle, as in a search.
            self._deciding.append((problem.operator, problem.key))
            try:
                # Unusable and strategy-forbidden algorithms are not candidates at all; only
                # candidates that could not be timed, and why, are reported.
                candidates = self._candidates(problem, {})
                if only is not None:
                    candidates = [c for c in candidates if c.desc.text in only]
                timed, workspace = self._timed_candidates(problem, operator, candidates,
                                                          excluded)
            finally:
                self._deciding.pop()
            result = self.profiler.profile(problem, operator, timed, self, workspace, prelude)
        for failure in result.failures:
            excluded[failure.algorithm] = Exclusion(Why.FAILED, failure.reason)
        return result, excluded

    # -- deciding ------------------------------------------------------------------------------
    def _decide(self, problem: Problem, prelude: Callable[[], object] | None) -> Decision:
        operator = self.registry.operator(problem.operator)
        operator.validate(problem)
        category = self.category(operator)
        excluded: dict[str, str] = {}
        candidates = self._candidates(problem, excluded)

        decision = self._only_choice(problem, category, candidates, excluded)
        if decision is not None:
            self.stats.single += 1
        else:
            decision = self._from_cache(problem, category, candidates, excluded)
            if decision is None and self.recorder is not None:
                self.recorder.record(problem.operator, problem.shapes, problem.dtypes,
                                     problem.params, problem.key, category)
        if decision is not None:
            if decision.source is Source.CACHE:
                self.stats.cache_hits += 1
        elif self.options.strategy.profiles:
            started = time.perf_counter()
            decision = self._from_profile(problem, operator, category, candidates, excluded,
                                          prelude)
            # Sub-problems searched on the way are part of this problem's search time.
            decision.search_seconds = time.perf_counter() - started
            self.stats.profiled += 1
            if len(self._deciding) == 1:  # nested searches are inside their parent's time
                self.stats.search_seconds += decision.search_seconds
        else:
            decision = self._from_nearest(problem, operator, category, candidates, excluded)
            if decision is not None:
                self.stats.nearest += 1
            else:
                decision = self._from_heuristic(problem, operator, category, candidates,
                                                 excluded)
                self.stats.heuristic += 1
        log.debug("%s -> %s [%s]", problem, decision.policy.algorithm, decision.source)
        return decision

    def _candidates(self, problem: Problem, excluded: dict[str, str]) -> list[Algorithm]:
        """Usable algorithms of the device's kind whose attributes the strategy does not
        forbid."""
        forbidden = self.options.strategy.forbidden()
        candidates = []
        kind = self.device.kind
        for algorithm in self.registry.algorithms(problem.operator):
            if algorithm.device_kind != kind:
                # Checked first: usability rules of another device's algorithms may ask
                # things (work-group limits, ...) only a device of their kind can answer.
                excluded[algorithm.desc.text] = Exclusion.other_device(algorithm.device_kind)
                continue
            reason = (algorithm.unusable_reason(problem)
                      or algorithm.device_unusable_reason(self.device, problem))
            if reason is not None:
                excluded[algorithm.desc.text] = Exclusion(Why.UNUSABLE, f"not usable: {reason}")
            elif algorithm.attributes & forbidden:
                excluded[algorithm.desc.text] = Exclusion(
                    Why.STRATEGY, f"{(algorithm.attributes & forbidden).text()} excluded by "
                    f"strategy {self.options.strategy.text()}",
                    attributes=algorithm.attributes & forbidden)
            else:
                candidates.append(algorithm)
        return candidates

    def _timed_candidates(self, problem: Problem, operator: Operator,
                          candidates: Sequence[Algorithm], excluded: dict[str, str]
                          ) -> tuple[list[Algorithm], dict[str, int]]:
        """What a search and :meth:`rank` time, in one place: the candidates in the operator's
        heuristic order (best guess first, so early stopping drops the rest quickly), each
        with its sub-problems decided, and each one's total workspace (own plus
        sub-problems'); a candidate that cannot be timed gets its reason in ``excluded``.
        Every candidate the strategy does not forbid is timed, including those it will not
        *choose* (REPRODUCIBLE), so that one cache serves both kinds of run."""
        timed: list[Algorithm] = []
        workspace: dict[str, int] = {}
        for algorithm in operator.heuristic_order(problem, candidates):
            children = self._fit(algorithm, problem, excluded, check_required=False)
            if children is not None:
                timed.append(algorithm)
                workspace[algorithm.desc.text] = _total_workspace(algorithm, problem, children)
        return timed, workspace

    def _children(self, algorithm: Algorithm, problem: Problem) -> tuple[ExecutionPolicy, ...]:
        """Decide every distinct sub-problem first (children before parents)."""
        unique = {(sub.operator, sub.key): sub for sub in algorithm.sub_problems(problem)}
        undeclared = sorted({operator for operator, _ in unique} - set(algorithm.sub_operators))
        if undeclared:
            raise UndeclaredSubOperatorError(undeclared)
        return tuple(self.decide(sub).policy for sub in unique.values())

    def _fit(self, algorithm: Algorithm, problem: Problem, excluded: dict[str, str],
             check_required: bool = True) -> tuple[ExecutionPolicy, ...] | None:
        """Children of a candidate if it may be chosen, else None (reason in ``excluded``)."""
        name = algorithm.desc.text
        required = self.options.strategy.required()
        if check_required and (algorithm.attributes & required) != required:
            excluded[name] = Exclusion(Why.STRATEGY, f"lacks {required.text()} required by "
                                                     f"strategy {self.options.strategy.text()}",
                                       attributes=required)
            return None
        try:
            children = self._children(algorithm, problem)
        except SubProblemCycleError as error:
            excluded[name] = Exclusion(Why.SUB_PROBLEM, str(error))
            log.warning("%s on %s excluded: %s", name, problem, error)
            return None
        except NoUsableAlgorithmError as error:
            excluded[name] = Exclusion(Why.SUB_PROBLEM,
                                       f"sub-problem {error.problem} has no usable algorithm")
            return None
        except UndeclaredSubOperatorError as error:
            excluded[name] = Exclusion(Why.SUB_PROBLEM, str(error))
            log.warning("%s on %s excluded: %s", name, problem, error)
            return None
        total = _total_workspace(algorithm, problem, children)
        limit = self.options.workspace_limit
        if limit is not None and total > limit:
            excluded[name] = Exclusion(Why.WORKSPACE, f"needs {human_bytes(total)} of workspace, "
                                                      f"over the limit of {human_bytes(limit)}")
            return None
        return children

    def _policy(self, algorithm: Algorithm, problem: Problem, source: str,
                children: tuple[ExecutionPolicy, ...], time_s: float | None) -> ExecutionPolicy:
        return ExecutionPolicy(problem.operator, problem.key, algorithm.desc.text, source,
                               time_s, algorithm.workspace_bytes(problem), children)

    def _pick(self, problem: Problem, entries: Sequence[Entry], candidates: Sequence[Algorithm],
              excluded: dict[str, str], source: str,
              accept: Callable[[tuple[ExecutionPolicy, ...]], bool] | None = None,
              ) -> tuple[Algorithm, ExecutionPolicy] | None:
        """The fastest entry that names a current candidate and fits strategy and limit (and
        whose sub-problems' policies ``accept`` takes, when given).  Ties in time go the way
        the cache orders them (:func:`entry_order`: smaller workspace, then the name), so a
        search and a later cache lookup pick the same one."""
        by_name = {c.desc.text: c for c in candidates}
        for entry in sorted(entries, key=entry_order):
            algorithm = by_name.get(entry.algorithm)
            if algorithm is None:
                continue
            children = self._fit(algorithm, problem, excluded)
            if children is not None and (accept is None or accept(children)):
                return algorithm, self._policy(algorithm, problem, source, children, entry.time_s)
        return None

    def _only_choice(self, problem: Problem, category: str, candidates: list[Algorithm],
                     excluded: dict[str, str]) -> Decision | None:
        """The decision when exactly one algorithm is eligible under every strategy: timing a
        lone candidate, or caching it, cannot change the choice (a Relu with only its numpy
        algorithm), and a model search should not spend time on it."""
        if len(candidates) != 1:
            return None
        algorithm = candidates[0]
        probe: dict[str, str] = {}
        children = self._fit(algorithm, problem, probe)
        if children is None:
            return None  # the regular paths report why
        policy = self._policy(algorithm, problem, Source.ONLY, children, None)
        return Decision(problem, algorithm, policy, category, [], [], excluded)

    def _from_cache(self, problem: Problem, category: str, candidates: list[Algorithm],
                    excluded: dict[str, str]) -> Decision | None:
        entries = self.cache.get(category, problem.key)
        if not entries:
            return None
        if self.options.strategy.profiles and low_confidence(entries) is not None:
            log.info("the cached pick for %s was timed unstably (low-confidence); measuring "
                     "it again", problem)
            self.stats.remeasured += 1
            return None
        picked = self._pick(problem, entries, candidates, excluded, Source.CACHE)
        if picked is None:
            log.info("cache entries for %s satisfy neither strategy nor limit; ignoring them",
                     problem)
            return None
        algorithm, policy = picked
        return Decision(problem, algorithm, policy, category, list(entries), [], excluded)

    def _from_profile(self, problem: Problem, operator: Operator, category: str,
                      candidates: list[Algorithm], excluded: dict[str, str],
                      prelude: Callable[[], object] | None = None) -> Decision:
        # A problem too large to allocate is refused before any sub-problem is searched.
        self.profiler.check_sizes(problem, operator)
        timed, workspace = self._timed_candidates(problem, operator, candidates, excluded)
        # Spaces larger than the tuning budget are sampled and halved first (fastrun.core.tuning).
        timed = budgeted_candidates(problem, operator, timed, self.profiler, self, workspace,
                                    excluded, prelude)
        result: ProfileResult = self.profiler.profile(problem, operator, timed, self, workspace,
                                                      prelude)
        for failure in result.failures:
            excluded[failure.algorithm] = Exclusion(Why.FAILED, failure.reason)
        if result.entries:
            self.cache.put(category, problem.key, result.entries)
        if result.interrupted:  # Ctrl-C: what was measured is saved; stop the search
            raise KeyboardInterrupt
        picked = self._pick(problem, result.entries, timed, excluded, Source.PROFILED)
        if picked is None:
            raise NoUsableAlgorithmError(problem, self.options, excluded)
        algorithm, policy = picked
        return Decision(problem, algorithm, policy, category, result.entries, result.failures,
                        excluded)

    def _from_nearest(self, problem: Problem, operator: Operator, category: str,
                      candidates: list[Algorithm], excluded: dict[str, str]) -> Decision | None:
        """The choice of the measured problems nearest to ``problem`` whose entries name an
        algorithm usable here, under this strategy and limit (:mod:`fastrun.core.nearest`):
        the rankings of two neighbours on either side of it blended, where the cache has such
        a pair, else the nearest neighbour's; None when there is none within the limit."""
        by_name = {c.desc.text: c for c in candidates}
        measured = [(n, entries) for n in self.nearest.neighbours(category, problem,
                                                                  self.options.nearest, operator)
                    if (entries := self.cache.get(category, n.key))]

        def carried(neighbour: Neighbour, entries: list[Entry]) -> list[Entry]:
            """The neighbour's ranking carried here, its refused pick said (it is consulted)."""
            ranking = carried_entries(entries, problem, neighbour.problem(problem),
                                      operator.work, by_name)
            self._refuse_unusable(problem, neighbour.key, ranking, excluded)
            return ranking

        pair = bracket([n for n, _ in measured], problem, operator)
        if pair is not None:
            first, second = pair
            entries = {n.key: e for n, e in measured}
            blended = blended_entries(carried(first, entries[first.key]), first.distance,
                                      carried(second, entries[second.key]), second.distance)
            decision = self._nearest_decision(problem, category, blended, candidates, excluded,
                                              first, second)
            if decision is not None:
                return decision
        for neighbour, entries in measured:
            decision = self._nearest_decision(problem, category, carried(neighbour, entries),
                                              candidates, excluded, neighbour, None)
            if decision is not None:
                return decision
        return None

    def _nearest_decision(self, problem: Problem, category: str, entries: list[Entry],
                          candidates: list[Algorithm], excluded: dict[str, str],
                          neighbour: Neighbour, far_side: Neighbour | None) -> Decision | None:
        picked = self._pick(problem, entries, candidates, excluded, Source.NEAREST,
                            accept=_carried_children)
        if picked is None:
            return None
        algorithm, policy = picked
        # The neighbours' times measured other problems: carried here, they are an estimate.
        policy = replace(policy, time_s=None, estimate_s=policy.time_s, neighbour=neighbour.key,
                         distance=neighbour.distance,
                         bracket=None if far_side is None else far_side.key,
                         bracket_distance=None if far_side is None else far_side.distance)
        log.info("%s: no measurement; served by %s, %s", problem, algorithm.desc.text,
                 policy.neighbour_text())
        return Decision(problem, algorithm, policy, category, [], [], excluded)

    def _refuse_unusable(self, problem: Problem, key: str, entries: Sequence[Entry],
                         excluded: dict[str, str]) -> None:
        """Say when a neighbour's pick cannot compute ``problem`` (a kernel limited to
        smaller sizes, say): it is refused, and the next usable entry serves.  A warning the
        first time an algorithm is refused in a process, so that a model served from
        neighbours prints one line per algorithm, not one per layer; info after that."""
        fastest = min(entries, key=entry_order, default=None)
        why = None if fastest is None else excluded.get(fastest.algorithm)
        if getattr(why, "why", None) is not Why.UNUSABLE:
            return
        with _REFUSED_LOCK:
            first = fastest.algorithm not in _REFUSED
            _REFUSED.add(fastest.algorithm)
        log.log(logging.WARNING if first else logging.INFO,
                "%s: the pick of its measured neighbour %s, %s, cannot compute it (%s); "
                "refused, the next usable algorithm of that ranking serves", problem, key,
                fastest.algorithm, why)

    def _from_heuristic(self, problem: Problem, operator: Operator, category: str,
                        candidates: list[Algorithm], excluded: dict[str, str]) -> Decision:
        for algorithm in operator.heuristic_order(problem, candidates):
            children = self._fit(algorithm, problem, excluded)
            if children is not None:
                policy = self._policy(algorithm, problem, Source.HEURISTIC, children, None)
                return Decision(problem, algorithm, policy, category, [], [], excluded)
        raise NoUsableAlgorithmError(problem, self.options, excluded)
