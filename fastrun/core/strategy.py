"""What the user asks for (:class:`Strategy`, :class:`SearchOptions`) and what was chosen
(:class:`ExecutionPolicy`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from fastrun import config
from fastrun.attribute import AlgoAttribute
from fastrun.base.units import human_bytes


class Strategy(enum.Flag):
    #: Pick by rule of thumb; never time anything.
    HEURISTIC = enum.auto()
    #: Time every usable candidate on a cache miss.
    PROFILE = enum.auto()
    #: Never consider NAIVE algorithms (``--fast-run``).
    OPTIMIZED = enum.auto()
    #: Choose only REPRODUCIBLE algorithms (profiling still times all of them).
    REPRODUCIBLE = enum.auto()

    @classmethod
    def parse(cls, text: str | Strategy) -> Strategy:
        """'heuristic', 'fast-run', 'full-run', 'profile', 'optimized', 'reproducible',
        combined with '+' or ',' (e.g. 'fast-run+reproducible')."""
        if isinstance(text, Strategy):
            return text
        result = cls(0)
        for word in text.replace(",", "+").split("+"):
            word = word.strip().lower().replace("_", "-")
            if not word:
                continue
            if word not in _WORDS:
                raise ValueError(
                    f"unknown strategy {word!r}; expected one of {', '.join(_WORDS)} "
                    "(combine with '+', e.g. fast-run+reproducible)"
                )
            result |= _WORDS[word]
        if not result & (cls.HEURISTIC | cls.PROFILE):
            result |= cls.HEURISTIC
        return result

    @property
    def profiles(self) -> bool:
        return bool(self & Strategy.PROFILE)

    def required(self) -> AlgoAttribute:
        """Attributes a chosen algorithm must have."""
        return AlgoAttribute.REPRODUCIBLE if self & Strategy.REPRODUCIBLE else AlgoAttribute.NONE

    def forbidden(self) -> AlgoAttribute:
        """Attributes that exclude an algorithm from profiling and from the choice."""
        return AlgoAttribute.NAIVE if self & Strategy.OPTIMIZED else AlgoAttribute.NONE

    def text(self) -> str:
        """In the words a user types: ``fast-run``, ``full-run+reproducible``, ``heuristic``
        (:meth:`parse` reads it back)."""
        base = self & ~Strategy.REPRODUCIBLE
        if base & Strategy.PROFILE:
            words = ["fast-run" if base & Strategy.OPTIMIZED else "full-run"]
        else:
            words = [m.name.lower() for m in Strategy
                     if m in base and m is not Strategy.REPRODUCIBLE] or ["heuristic"]
        if self & Strategy.REPRODUCIBLE:
            words.append("reproducible")
        return "+".join(words)


_WORDS = {
    "heuristic": Strategy.HEURISTIC,
    "profile": Strategy.PROFILE,
    "full-run": Strategy.PROFILE,
    "fast-run": Strategy.PROFILE | Strategy.OPTIMIZED,
    "optimized": Strategy.OPTIMIZED,
    "reproducible": Strategy.REPRODUCIBLE,
}


@dataclass(frozen=True)
class SearchOptions:
    """Everything that steers a search.  Defaults come from :mod:`fastrun.config`."""

    strategy: Strategy = Strategy.HEURISTIC
    #: Bytes of workspace an algorithm (with its sub-problems) may use; None = unlimited.
    workspace_limit: int | None = None
    #: Seconds of timed repeats per candidate.
    budget_s: float = 0.2
    min_repeats: int = 3
    max_repeats: int = 100
    #: Stop timing a candidate once its fastest run is this many times the best median so far.
    early_stop_ratio: float = 1.5
    #: Rounds of the interleaved confirmation of the close candidates
    #: (:mod:`fastrun.core.profiler`); 0 turns it off.
    confirm_rounds: int = 7
    #: Candidates within this ratio of the best median take part in the confirmation.
    confirm_ratio: float = 1.6
    #: Check each candidate's output against the operator's reference before it can be chosen.
    check_numerics: bool = True
    #: Seed of the random profiling inputs (and of the budgeted search's sample).
    seed: int = 0
    #: Candidates of one problem timed fully; a problem with more is sampled and narrowed by
    #: successive halving first (:mod:`fastrun.core.tuning`).  None: FASTRUN_TUNING_CANDIDATES,
    #: else 24; 0: time every candidate fully.
    tuning_budget: int | None = None
    #: Largest shape distance at which a run that searches nothing serves a missed problem
    #: from the nearest measured one (:mod:`fastrun.core.nearest`); 0: never.
    nearest: float = 1.0

    @classmethod
    def create(cls, strategy: str | Strategy | None = None,
               workspace_limit: int | str | None = None,
               budget_s: float | None = None, nearest: float | None = None,
               **others: Any) -> SearchOptions:
        return cls(
            strategy=Strategy.parse(strategy if strategy is not None else config.STRATEGY.get()),
            workspace_limit=config.WORKSPACE_LIMIT.get(workspace_limit),
            budget_s=config.PROFILE_SECONDS.get(budget_s),
            nearest=config.NEAREST.get(nearest),
            **others,
        )

    def with_(self, **changes: Any) -> SearchOptions:
        return replace(self, **changes)

    def describe(self) -> str:
        return (f"strategy={self.strategy.text()}, "
                f"workspace limit={human_bytes(self.workspace_limit)}")


@dataclass(frozen=True)
class ExecutionPolicy:
    """The algorithm chosen for one problem and, recursively, for its sub-problems."""

    operator: str
    key: str
    algorithm: str
    #: 'cache', 'profiled', 'nearest', 'heuristic', or 'only' (the one eligible algorithm)
    source: str
    #: the measured time of this problem (None when it was not measured: a rule of thumb, or
    #: a neighbour's measurement, which times another problem; see :attr:`estimate_s`)
    time_s: float | None = None
    workspace_bytes: int = 0
    children: tuple[ExecutionPolicy, ...] = field(default_factory=tuple)
    #: source 'nearest': the key of the measured problem whose choice this is, and its distance
    neighbour: str | None = None
    distance: float | None = None
    #: source 'nearest' from two neighbours on either side of this problem: the other one's
    #: key and distance (their rankings were blended, :func:`fastrun.core.nearest.bracket`)
    bracket: str | None = None
    bracket_distance: float | None = None
    #: source 'nearest': the neighbour's time carried to this problem (its time scaled by the
    #: algorithm's work here over there): an estimate, which plans layouts as a measured time
    #: would, but never stands in for a measurement
    estimate_s: float | None = None

    @property
    def total_workspace(self) -> int:
        """Own workspace plus the largest of the sub-problems' (they run one after another)."""
        return self.workspace_bytes + max((c.total_workspace for c in self.children), default=0)

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def render(self, indent: str = "") -> str:
        timing = f" {self.time_s * 1e3:.3f} ms" if self.time_s is not None else ""
        if self.neighbour is not None:
            timing += f" {self.neighbour_text()}"
        if self.estimate_s is not None:
            timing += f", ~{self.estimate_s * 1e3:.3f} ms estimated"
        lines = [f"{indent}{self.operator}({self.key}) -> {self.algorithm} "
                 f"[{self.source}{timing}, workspace {human_bytes(self.workspace_bytes)}]"]
        lines.extend(child.render(indent + "  ") for child in self.children)
        return "\n".join(lines)

    def neighbour_text(self) -> str:
        """'to KEY (distance D)' for a choice served from a neighbour, else ''."""
        if self.neighbour is None:
            return ""
        text = f"to {self.neighbour} (distance {self.distance:.2f})"
        if self.bracket is not None:
            text += f" and {self.bracket} (distance {self.bracket_distance:.2f}), blended"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "key": self.key,
            "algorithm": self.algorithm,
            "source": self.source,
            "time_s": self.time_s,
            "workspace_bytes": self.workspace_bytes,
            "children": [c.to_dict() for c in self.children],
            **({"neighbour": self.neighbour, "distance": self.distance,
                "estimate_s": self.estimate_s}
               if self.neighbour is not None else {}),
            **({"bracket": self.bracket, "bracket_distance": self.bracket_distance}
               if self.bracket is not None else {}),
        }
