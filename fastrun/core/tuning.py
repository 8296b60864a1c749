"""Budgeted search of large candidate spaces: a seeded sample, then successive halving.

A tunable kernel family registers one algorithm per configuration (``cl_gemm`` has a few
hundred); timing each of them fully (warm-up plus ``min_repeats`` to ``max_repeats`` within
``budget_s``) would make a search take minutes.  When a problem has more candidates than the
tuning budget (:attr:`SearchOptions.tuning_budget`, ``FASTRUN_TUNING_CANDIDATES``, default
:data:`DEFAULT_BUDGET`), :func:`budgeted_candidates` narrows them down before the full timing:

1. **sample**: the heuristic's first ``budget`` candidates plus a seeded random sample of the
   rest, ``SAMPLE_FACTOR x budget`` in all (the heuristic's picks keep a good configuration in
   the race; the random ones guard against the heuristic being wrong for this device);
2. **halve**: time the pool briefly (one repeat after the warm-up, no numerical check), keep
   the faster half, time the survivors again with twice the repeats, and so on until at most
   ``budget`` remain.  A round stops a candidate early as the profiler always does (after a
   single run longer than ``budget_s`` that is ``early_stop_ratio`` times the round's best);
3. the chooser then times the survivors fully, checks them against the reference and picks
   the winner as for any problem.

Everything dropped is reported in the decision's ``excluded`` with why, and only fully timed
candidates are written to the cache.  No pyopencl here: the module is device-agnostic and is
tested with the fake clock.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence

from fastrun import config
from fastrun.algorithm import Algorithm, RunContext
from fastrun.core.profiler import Profiler
from fastrun.core.reasons import Exclusion, Why
from fastrun.operator import Operator, Problem

log = logging.getLogger(__name__)

#: Candidates timed fully when the options do not say (FASTRUN_TUNING_CANDIDATES overrides it).
DEFAULT_BUDGET = 24
#: The first round times this many times the budget (heuristic's first ones + random sample).
SAMPLE_FACTOR = 4


def resolve_budget(explicit: int | None) -> int:
    """The tuning budget in effect: the option, else FASTRUN_TUNING_CANDIDATES, else
    :data:`DEFAULT_BUDGET`.  0 (or less) means no budget: every candidate is timed fully."""
    return config.TUNING_CANDIDATES.get(explicit, DEFAULT_BUDGET)


def budgeted_candidates(problem: Problem, operator: Operator, candidates: Sequence[Algorithm],
                        profiler: Profiler, ctx: RunContext, workspace: Mapping[str, int],
                        excluded: dict[str, str],
                        prelude: Callable[[], object] | None = None) -> list[Algorithm]:
    """The candidates (given best guess first) that get the full timing.

    All of them when there are no more than the budget; otherwise the survivors of the
    sampled successive halving described in the module docstring, fastest first.  Every
    candidate left out gets its reason in ``excluded`` (desc text -> reason).
    """
    options = profiler.options
    budget = resolve_budget(options.tuning_budget)
    if budget <= 0 or len(candidates) <= budget:
        return list(candidates)

    pool_size = min(len(candidates), SAMPLE_FACTOR * budget)
    first = list(candidates[:budget])
    rest = list(candidates[budget:])
    sampled = _stable_sample(rest, pool_size - len(first), options.seed)
    chosen = {a.desc.text for a in sampled}
    # The pool keeps the heuristic's order, so the early-stop reference is a good one early.
    pool = first + [a for a in rest if a.desc.text in chosen]
    for algorithm in rest:
        if algorithm.desc.text not in chosen:
            excluded[algorithm.desc.text] = Exclusion(
                Why.BUDGET, f"not in the budgeted search's sample ({pool_size} of "
                f"{len(candidates)} candidates, tuning budget {budget})")
    log.info("%s: %d candidates over the tuning budget of %d; halving a sample of %d",
             problem, len(candidates), budget, len(pool))

    repeats = 1
    #: timed repeats per candidate over all rounds so far (early-stopped ones have fewer)
    done: dict[str, int] = {}
    while len(pool) > budget:
        # max_repeats caps a round; the per-candidate time budget still stops a slow one.
        brief = options.with_(min_repeats=repeats, max_repeats=repeats, check_numerics=False,
                              confirm_rounds=0)
        timer = Profiler(profiler.device, brief, clock=profiler.clock,
                         progress=profiler.progress)
        result = timer.profile(problem, operator, pool, ctx, workspace, prelude)
        for failure in result.failures:
            excluded[failure.algorithm] = Exclusion(Why.FAILED, failure.reason)
        ranked = result.entries  # fastest first; failures are not in it
        for entry in ranked:
            done[entry.algorithm] = done.get(entry.algorithm, 0) + entry.repeats
        keep = max(budget, len(pool) // 2)
        best = ranked[0].time_s if ranked else 0.0
        for entry in ranked[keep:]:
            ratio = entry.time_s / best if best > 0 else float("inf")
            excluded[entry.algorithm] = Exclusion(
                Why.BUDGET, f"dropped by successive halving after {done[entry.algorithm]} "
                f"repeats: {ratio:.1f} times the best")
        survivors = {entry.algorithm for entry in ranked[:keep]}
        order = {entry.algorithm: index for index, entry in enumerate(ranked)}
        pool = sorted((a for a in pool if a.desc.text in survivors),
                      key=lambda a: order[a.desc.text])
        repeats *= 2
    return pool


def _stable_sample(algorithms: Sequence[Algorithm], count: int, seed: int) -> list[Algorithm]:
    """``count`` of ``algorithms``, chosen by a seeded hash of their names rather than by
    their positions: two problems whose usable configurations overlap sample the same ones,
    so a device compiles each configuration once for both.  On an H200 the driver's compiler
    took about 0.35 s per configuration, most of a batch-32 search."""
    def rank(algorithm: Algorithm) -> bytes:
        return hashlib.sha256(f"{seed}:{algorithm.desc.text}".encode()).digest()

    return sorted(algorithms, key=rank)[:count]
