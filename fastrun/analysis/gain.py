"""What a model's measured choices gain over the rules of thumb (``load_and_run``'s ``gain``
line and the report's model summary).

Why here: it is an analysis of a searched model, not part of running one; the runtime's
:class:`~fastrun.runtime.model.Model` keeps only what an inference needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastrun.core.chooser import Decision
from fastrun.core.reasons import Source
from fastrun.runtime.model import Model


def gain_over_heuristic(model: Model, measured: Callable[[Decision], Mapping[str, float]]
                        | None = None) -> dict[str, Any] | None:
    """What the measured choices gain over the rules of thumb, where both were measured:
    for every searched or cached step whose heuristic pick is among its measured entries,
    the sum of those picks' profiled times over the sum of the chosen ones'.  ``steps``
    counts those steps, ``unmatched`` the measured steps whose heuristic pick was not
    among the entries (a cache keeps only each problem's Pareto front; a rankings file
    from ``fastrun rank`` keeps every candidate).  None when no step qualifies.

    ``measured(decision)`` gives a step's times by algorithm (default: the decision's
    entries, which the cache pruned); the report passes its input's unpruned ones."""
    rules = model.session.rules()
    heuristic_s = chosen_s = 0.0
    steps = unmatched = 0
    for report in model.search():
        decision = report.decision
        if decision is None or decision.source not in (Source.PROFILED, Source.CACHE) \
                or decision.policy.time_s is None:
            continue
        times = (measured(decision) if measured is not None
                 else {e.algorithm: e.time_s for e in decision.entries})
        picked = rules.decide(decision.problem).policy.algorithm
        if picked not in times:
            unmatched += 1
            continue
        heuristic_s += times[picked]
        chosen_s += decision.policy.time_s
        steps += 1
    if not steps or not chosen_s:
        return None
    return {"steps": steps, "unmatched": unmatched, "heuristic_ms": heuristic_s * 1e3,
            "chosen_ms": chosen_s * 1e3, "speedup": heuristic_s / chosen_s}
