"""Why a candidate was left out, and where a decision came from: structured, not parsed.

A search explains itself in words ("needs 3.0 MiB of workspace, over the limit of 1.0 MiB"),
and tools used to find out what happened by searching those words for "NAIVE", "workspace" or
"runs on ".  Each exclusion now carries its kind (:class:`Why`) beside its text, and a
decision's source is a :class:`Source`.  Both are ``str`` subclasses, so the text is what
prints, what JSON holds and what existing comparisons (``source == "cache"``) see, while code
that needs the kind reads ``.why`` (or compares the member) instead of the message.
"""

from __future__ import annotations

import enum

from fastrun.attribute import AlgoAttribute


class Source(enum.StrEnum):
    """Where a decision came from."""

    #: the only eligible algorithm: nothing to choose, nothing timed or cached
    ONLY = "only"
    #: a cache entry measured on this device category
    CACHE = "cache"
    #: timed now
    PROFILED = "profiled"
    #: not measured itself: the choice of the nearest measured problem (fastrun.core.nearest)
    NEAREST = "nearest"
    #: the operator's rule of thumb (no measurement)
    HEURISTIC = "heuristic"


class Why(enum.Enum):
    """The kind of an exclusion."""

    #: written for another kind of device (its usability is not even asked)
    OTHER_DEVICE = "other device"
    #: the algorithm cannot compute this problem
    UNUSABLE = "unusable"
    #: the strategy forbids its attributes, or requires attributes it lacks
    STRATEGY = "strategy"
    #: its workspace (sub-problems included) is over the limit
    WORKSPACE = "workspace"
    #: a sub-problem cannot be decided (no usable algorithm, a cycle, an undeclared operator)
    SUB_PROBLEM = "sub-problem"
    #: it raised, or its result disagreed with the reference, while it was timed
    FAILED = "failed"
    #: a budgeted search left it out (not sampled, or dropped by successive halving)
    BUDGET = "budget"


class Exclusion(str):
    """An exclusion's text, with its kind in :attr:`why`; for :attr:`Why.OTHER_DEVICE` the
    device kind the algorithm runs on in :attr:`device_kind`, for :attr:`Why.STRATEGY` the
    attributes at issue (forbidden or missing) in :attr:`attributes`."""

    why: Why
    device_kind: str | None
    attributes: AlgoAttribute

    def __new__(cls, why: Why, text: str, device_kind: str | None = None,
                attributes: AlgoAttribute = AlgoAttribute.NONE) -> Exclusion:
        self = super().__new__(cls, text)
        self.why = why
        self.device_kind = device_kind
        self.attributes = attributes
        return self

    @classmethod
    def other_device(cls, device_kind: str) -> Exclusion:
        return cls(Why.OTHER_DEVICE, f"runs on {device_kind} devices", device_kind)

    def __reduce__(self) -> tuple:  # pickles (multiprocessing, Ray) keep the kind
        return (Exclusion, (self.why, str(self), self.device_kind, self.attributes))


def why_of(reason: str) -> Why | None:
    """The kind of an exclusion, None for a plain text (one read back from a file)."""
    return reason.why if isinstance(reason, Exclusion) else None
