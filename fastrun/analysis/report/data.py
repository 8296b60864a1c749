"""The report's data: a cache or rankings file read into :class:`ReportData`, and a searched
model's step reports into :class:`LayerRow` values (:func:`model_rows`).

A cache is read with :func:`fastrun.cache.read_cache_file` rather than opened as a
:class:`~fastrun.cache.FileCache`, which would move a damaged file aside; a rankings file with
:func:`fastrun.analysis.rankings.load_rankings`, so the report accepts exactly what fastrun
accepts.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from fastrun import cache as cache_module
from fastrun import category as category_module
from fastrun.base.formats import RANKINGS_FORMAT
from fastrun.cache import Entry
from fastrun.cache import file as cachefile

#: Problems drawn by default: a page of a 10,000-problem cache would be tens of megabytes and
#: unusable in a browser; the most expensive problems are the interesting ones.
DEFAULT_MAX_PROBLEMS = 400


class ReportInputError(ValueError):
    """The report's input file cannot be read as a fastrun cache or rankings file.

    A ValueError so that the ``fastrun`` command reports it as a usage error (exit status 2).
    """


# --------------------------------------------------------------------------------------------
# Data


@dataclass
class ProblemData:
    """One problem (one key of one category) and its measurements, fastest first."""

    operator: str
    category: str
    key: str
    entries: list[Entry]
    label: str = ""
    weight: float | None = None
    #: (algorithm, reason) for candidates that could not be measured
    failures: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.entries = sorted(self.entries, key=lambda m: (m.time_s, m.workspace_bytes,
                                                          m.algorithm))

    @property
    def chosen(self) -> Entry | None:
        """What an unrestricted search picks: the fastest entry (as the chooser does)."""
        return self.entries[0] if self.entries else None

    @property
    def device(self) -> str:
        return category_module.split(self.category)[0]

    @property
    def anchor(self) -> str:
        return problem_anchor(self.category, self.key)


@dataclass
class ReportData:
    """Everything the page shows about the input file."""

    path: str
    kind: str  #: "cache" or "rankings"
    problems: list[ProblemData]
    #: file-level facts to show in the header (suite, budget, creation date, ...)
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def devices(self) -> list[str]:
        return sorted({p.device for p in self.problems})

    @property
    def versions(self) -> list[str]:
        return sorted({m.version for p in self.problems for m in p.entries if m.version})

    def measured_range(self) -> tuple[float, float] | None:
        times = [m.measured_at for p in self.problems for m in p.entries if m.measured_at]
        return (min(times), max(times)) if times else None

    def to_cache(self) -> cache_module.InMemoryCache:
        """The measurements as a cache, so that a model can be decided from exactly them."""
        memory = cache_module.InMemoryCache()
        memory.put_many((p.category, p.key, p.entries) for p in self.problems if p.category)
        return memory


@dataclass(frozen=True)
class LayerRow:
    """One model step's decision, as the model section shows it."""

    index: int
    node: str
    op_type: str
    operator: str
    algorithm: str
    source: str  #: "cache", "heuristic", "only", "profiled", "nearest"
    time_s: float | None
    category: str = ""
    key: str = ""
    #: source "nearest": which measured problem's choice it is ("to KEY (distance D)")
    neighbour: str = ""


@dataclass
class ModelData:
    name: str
    device: str  #: the category the model was decided for (this machine's)
    layers: list[LayerRow]
    views: int = 0  #: steps that are views (reshape, cast), not decided
    run_ms: float | None = None  #: median of the timed inferences (None: not run)
    iterations: int = 0  #: inferences timed for run_ms
    #: what the measured choices gain over the heuristic's, as analysis.gain.gain_over_heuristic
    gain: dict[str, Any] | None = None


def problem_anchor(category: str, key: str) -> str:
    """A stable, HTML-safe id for a problem (keys contain brackets, commas, '=')."""
    digest = hashlib.sha1(f"{category}\0{key}".encode()).hexdigest()[:12]
    return f"p-{digest}"


# --------------------------------------------------------------------------------------------
# Reading


def read_input(path: str | os.PathLike[str]) -> ReportData:
    """Read a cache or rankings file, told apart by their first bytes (a cache's header, or
    the rankings document's ``format`` field).

    Raises :class:`ReportInputError` naming the file for anything that is not one of them. The
    file is only read: never locked, rewritten or moved aside.
    """
    name = os.fspath(path)
    try:
        found = cachefile.probe(name)
    except OSError as error:
        raise ReportInputError(f"cannot read {name}: {error.strerror or error}") from None
    if found.kind == cachefile.MISSING:
        raise ReportInputError(f"cannot read {name}: no such file")
    if found.kind == cachefile.EMPTY:
        raise ReportInputError(f"{name} is empty: not a fastrun cache or rankings file")
    if found.kind in (cachefile.CURRENT, cachefile.FORMAT1, cachefile.DAMAGED):
        return _from_cache(name)
    if found.kind != cachefile.FOREIGN:
        raise ReportInputError(f"{name} {found.detail}")
    try:
        with open(name, "rb") as file:
            document = msgpack.unpackb(file.read(), raw=False, strict_map_key=False)
    except OSError as error:
        raise ReportInputError(f"cannot read {name}: {error.strerror or error}") from None
    except Exception:  # msgpack raises several unrelated types for bad input
        document = None
    kind = document.get("format") if isinstance(document, dict) else None
    if kind == RANKINGS_FORMAT:
        return _from_rankings(name)
    raise ReportInputError(f"{name} is not a fastrun cache or rankings file "
                           f"({found.detail.partition('(')[2].rstrip(')') or 'unknown content'})")


def _operator_of(category: str) -> str:
    return category_module.operator_of(category) or "?"


def _from_cache(name: str) -> ReportData:
    # The cache module's own reader, so that the report accepts exactly what fastrun accepts.
    try:
        contents = cache_module.read_cache_file(name)
    except OSError as error:
        raise ReportInputError(f"cannot read {name}: {error.strerror or error}") from None
    except cache_module.CacheFormatError as problem:
        raise ReportInputError(f"{name} is not a readable fastrun cache: {problem}") from None
    problems = []
    for category, keys in contents.items():
        for key, cached in keys.items():
            problems.append(ProblemData(_operator_of(category), category, key, list(cached)))
    return ReportData(name, "cache", problems)


def _from_rankings(name: str) -> ReportData:
    """Read a rankings file with :func:`fastrun.analysis.rankings.load_rankings` (its own checks and
    messages) and adapt it to the page's data."""
    from fastrun.analysis.rankings import load_rankings

    try:
        rankings = load_rankings(name)
    except ValueError as problem:
        raise ReportInputError(str(problem)) from None
    problems = [
        ProblemData(
            operator=p.operator, category=p.category or f"{rankings.device}|{p.operator}",
            key=p.key, label=p.label, weight=float(p.weight),
            entries=list(p.entries),
            failures=[(f.algorithm, f.reason) for f in p.failures])
        for p in rankings.problems]
    meta = {}
    for label, value in (("suite", rankings.suite), ("strategy", rankings.strategy),
                         ("created", date_text(rankings.created_at)),
                         ("budget", f"{rankings.budget_s:g} s per candidate")):
        if value:
            meta[label] = str(value)
    return ReportData(name, "rankings", problems, meta)


def _timestamp(value: Any) -> float | None:
    """A unix time from a number or an ISO 8601 text (rankings write either)."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def date_text(value: Any) -> str | None:
    stamp = _timestamp(value)
    if stamp is None:
        return None if value is None else str(value)
    moment = datetime.datetime.fromtimestamp(stamp, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def model_rows(reports: Iterable[Any]) -> tuple[list[LayerRow], int]:
    """Layer rows from a searched model's :class:`~fastrun.runtime.model.StepReport` list.

    Returns the rows of decided steps and the number of view steps (nothing to decide).
    """
    rows, views = [], 0
    for report in reports:
        step, decision = report.step, report.decision
        if decision is None:
            views += 1
            continue
        problem = step.problem
        rows.append(LayerRow(
            index=len(rows) + 1, node=str(step.node), op_type=str(step.op_type),
            operator=problem.operator, algorithm=report.algorithm, source=report.source,
            time_s=decision.policy.time_s, category=decision.category, key=problem.key,
            neighbour=decision.policy.neighbour_text()))
    return rows, views
