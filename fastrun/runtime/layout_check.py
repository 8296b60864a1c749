"""A layout plan checked end to end: the blocked plan runs only where whole inferences are faster.

Why.  :func:`fastrun.runtime.layout.choose_layouts` decides from isolated times, summed.  In a
model a kernel finds its input where the step before left it, and a conversion is one more
parallel step, so the sum can promise a gain that whole inferences do not deliver (on the
16-core host, blocked islands between two conversions ran slower in the model than their
isolated times said).  So when a plan blocks any step, the search runs both programs, the
blocked plan and the same model all in NCHW, as whole inferences alternating in rounds, and
keeps the faster; a tie keeps NCHW, which converts nothing.

The decision is cached like a measurement: under the pseudo-operator :data:`OPERATOR`, keyed by
the model's NCHW steps (:func:`plan_key`), one :class:`~fastrun.cache.Entry` per plan with its
median time over the rounds.  A run from the cache reads it back and repeats the choice without
timing anything; a run that may not time (heuristic strategy) and finds no decision keeps the
estimated plan, as before this check existed.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence

from fastrun._version import __version__
from fastrun.api import Session
from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry
from fastrun.category import text as category_text
from fastrun.runtime.lowering import Step

#: The pseudo-operator the decisions are cached under (``fastrun cache show`` lists it).
OPERATOR = "layout_plan"
#: Changes when what is compared changes, so that older decisions are not reused.
VERSION = "1"
#: The two plans, as the entries name them.
BLOCKED, NCHW = "nchw16c", "nchw"
#: Alternating rounds, and timed inferences per plan in a round (after one untimed).
ROUNDS = 5
RUNS = 8


def plan_key(nchw_steps: Sequence[Step]) -> str:
    """What identifies a model's plans: its NCHW steps' problems in order (a view step by its
    output shape), hashed."""
    digest = hashlib.sha256()
    for step in nchw_steps:
        text = (f"{step.operator}:{step.problem.key}" if step.problem is not None
                else f"view:{step.output.shape}")
        digest.update(text.encode())
        digest.update(b"\n")
    return f"steps={len(nchw_steps)};sha256={digest.hexdigest()[:32]}"


def category(session: Session) -> str:
    return category_text(session.device.category, OPERATOR, VERSION)


def cached_choice(session: Session, key: str) -> tuple[str, float] | None:
    """The cached decision (the faster plan and its time in seconds), or None."""
    entries = session.cache.get(category(session), key)
    if not entries:
        return None
    fastest = min(entries, key=lambda entry: entry.time_s)
    return fastest.algorithm, fastest.time_s


def time_plans(plans: dict[str, Callable[[], object]], rounds: int = ROUNDS,
               runs: int = RUNS) -> dict[str, list[float]]:
    """Each plan's median seconds per round, the plans alternating within each round (and
    their order alternating between rounds), so that a drift of the machine touches both."""
    names = list(plans)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            run = plans[name]
            run()
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                run()
                times.append(time.perf_counter() - started)
            medians[name].append(statistics.median(times))
    return medians


def decide(medians: dict[str, list[float]]) -> str:
    """The blocked plan only if its median over the rounds is below NCHW's."""
    blocked, nchw = (statistics.median(medians[name]) for name in (BLOCKED, NCHW))
    return BLOCKED if blocked < nchw else NCHW


def store(session: Session, key: str, medians: dict[str, list[float]]) -> None:
    """Both plans' times as cache entries (the cache keeps what its pruning keeps: the
    faster, since both need no workspace)."""
    now = time.time()
    entries = []
    for name, values in medians.items():
        quartiles = statistics.quantiles(values, n=4) if len(values) >= 2 else [0.0, 0.0, 0.0]
        entries.append(Entry(algorithm=name, attributes=AlgoAttribute.NONE,
                             time_s=statistics.median(values),
                             spread_s=quartiles[2] - quartiles[0],
                             workspace_bytes=0, error=None, repeats=len(values) * RUNS,
                             measured_at=now, version=__version__))
    session.cache.put(category(session), key, entries)
