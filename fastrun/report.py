"""A self-contained HTML report of a cache or rankings file: what was measured, what wins.

``fastrun report`` turns the numbers of a persistent cache (or of a rankings file written by
``fastrun rank``) into one HTML page that can be attached to a CI run or mailed around: inline CSS
and inline SVG only, no scripts, fonts, images or other files, so it shows the same everywhere,
offline, and cannot leak anything by loading a URL.

The module is pure: readers turn a file into :class:`ReportData`, :func:`model_rows` turns a
searched model's step reports into :class:`LayerRow` values, and :func:`render` turns those into
an HTML string. Nothing here prints, writes files or touches the input file (a cache is read with
:func:`fastrun.cache.read_cache_file` rather than opened as a :class:`~fastrun.cache.FileCache`,
which would move a damaged file aside).

Sections of the page: a header (file, kind, device categories, fastrun versions, dates, counts),
an index of problems grouped by operator, optionally the per-layer decisions of a model, then for
every problem a bar chart of the algorithm times with spread whiskers (the chosen one
highlighted), a time-vs-workspace scatter with its Pareto front, and a table of the entries.
"""

from __future__ import annotations

import datetime
import hashlib
import html
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from fastrun import cache as cache_module
from fastrun import cachefile
from fastrun import category as category_module
from fastrun.cache import Entry
from fastrun.formats import RANKINGS_FORMAT
from fastrun.units import plural

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
    source: str  #: "cache", "heuristic", "only", "profiled"
    time_s: float | None
    category: str = ""
    key: str = ""


@dataclass
class ModelData:
    name: str
    device: str  #: the category the model was decided for (this machine's)
    layers: list[LayerRow]
    views: int = 0  #: steps that are views (reshape, cast), not decided
    run_ms: float | None = None  #: median of the timed inferences (None: not run)
    iterations: int = 0  #: inferences timed for run_ms
    #: what the measured choices gain over the heuristic's, as Model.gain_over_heuristic
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
    """Read a rankings file with :func:`fastrun.rankings.load_rankings` (its own checks and
    messages) and adapt it to the page's data."""
    from fastrun.rankings import load_rankings

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
                         ("created", _date_text(rankings.created_at)),
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


def _date_text(value: Any) -> str | None:
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
            time_s=decision.policy.time_s, category=decision.category, key=problem.key))
    return rows, views


# --------------------------------------------------------------------------------------------
# Formatting


def fmt_time(seconds: float | None) -> str:
    """Three significant digits in the unit that fits (ns, µs, ms, s)."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{_three(seconds / scale)} {unit}"
    return f"{_three(seconds / 1e-9)} ns"


def fmt_bytes(count: float) -> str:
    if count < 1024:
        return f"{int(count)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        count /= 1024
        if count < 1024 or unit == "TiB":
            return f"{_three(count)} {unit}"
    return f"{count} B"  # pragma: no cover (loop always returns)


def _three(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------------------------
# SVG helpers


#: Colours (Tailwind-like palette): the chosen bar/point, the others, the Pareto front.
CHOSEN = "#2563eb"
OTHER = "#94a3b8"
EARLY = "#cbd5e1"
FRONT = "#e11d48"
GRID = "#e5e7eb"
AXIS = "#6b7280"
SOURCE_COLOURS = {"cache": "#2563eb", "profiled": "#7c3aed", "heuristic": "#f59e0b",
                  "only": "#64748b"}

_FONT = 12  #: px, chart text
_CHAR = 6.6  #: px, an estimate of one character's width at _FONT


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def svg_open(width: float, height: float, label: str) -> str:
    return (f'<svg class="chart" width="{_num(width)}" '
            f'height="{_num(height)}" viewBox="0 0 {_num(width)} {_num(height)}" role="img" '
            f'aria-label="{esc(label)}">')


def svg_text(x: float, y: float, text: str, anchor: str = "start", size: int = _FONT,
             fill: str = "#111827", weight: str = "normal", extra: str = "") -> str:
    return (f'<text x="{_num(x)}" y="{_num(y)}" text-anchor="{anchor}" font-size="{size}" '
            f'fill="{fill}" font-weight="{weight}"{extra}>{esc(text)}</text>')


def svg_line(x1: float, y1: float, x2: float, y2: float, stroke: str = AXIS,
             width: float = 1.0, dash: str | None = None) -> str:
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{_num(x1)}" y1="{_num(y1)}" x2="{_num(x2)}" y2="{_num(y2)}" '
            f'stroke="{stroke}" stroke-width="{_num(width)}"{dashes}/>')


def svg_title(text: str) -> str:
    """A tooltip: browsers show an SVG element's <title> child on hover."""
    return f"<title>{esc(text)}</title>"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k steps) covering [low, high]."""
    if not high > low:
        return [low]
    raw_step = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw_step))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw_step)
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high * (1 + 1e-9) + 1e-300:
        ticks.append(round(value / step) * step)
        value += step
    return ticks


def log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks for a log axis over [low, high] (low > 0), at most about seven."""
    ticks: list[float] = []
    for multipliers in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0 ** k
                 for k in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                 for m in multipliers if low <= m * 10.0 ** k <= high]
        if len(ticks) <= 7:
            break
    return ticks or [low]


class Scale:
    """Maps data values to pixels: linear, log (positive data), or symlog (log of 1 + v, for
    workspaces where 0 is common and sizes span decades)."""

    def __init__(self, low: float, high: float, start: float, end: float, kind: str = "linear"):
        self.kind, self.low, self.high, self.start, self.end = kind, low, high, start, end

    def _t(self, value: float) -> float:
        if self.kind == "log":
            return math.log10(max(value, 1e-300))
        if self.kind == "symlog":
            return math.log10(1.0 + max(value, 0.0))
        return value

    def __call__(self, value: float) -> float:
        low, high = self._t(self.low), self._t(self.high)
        if high == low:
            return (self.start + self.end) / 2
        return self.start + (self._t(value) - low) / (high - low) * (self.end - self.start)

    def ticks(self) -> list[float]:
        if self.kind == "log":
            return log_ticks(self.low, self.high)
        if self.kind == "symlog":
            steps = [0.0] + [float(2 ** p) for p in range(0, 61, 5) if 2 ** p <= self.high]
            while len(steps) > 6:
                steps = steps[:1] + steps[2::2]
            return steps
        if self.kind == "bytes":
            unit = 1024.0 ** max(0, math.floor(math.log(max(self.high, 1.0), 1024)))
            return [t * unit for t in nice_ticks(self.low / unit, self.high / unit, 4)]
        return nice_ticks(self.low, self.high)


def time_scale(values: Sequence[float], start: float, end: float) -> Scale:
    """Log when the times span more than a decade (a 1 µs and a 50 µs algorithm), else linear
    from zero (bars and honest ratios)."""
    positive = [v for v in values if v > 0]
    low, high = (min(positive), max(positive)) if positive else (0.0, 1.0)
    if positive and high / low > 10:
        return Scale(low / 1.3, high * 1.3, start, end, "log")
    return Scale(0.0, (high or 1.0) * 1.12, start, end)


def workspace_scale(values: Sequence[int], start: float, end: float) -> Scale:
    high = max(values, default=0)
    nonzero = [v for v in values if v > 0]
    if high == 0:
        return Scale(0.0, 1.0, start, end, "bytes")
    if min(nonzero) * 30 < high:
        return Scale(0.0, high * 1.5, start, end, "symlog")
    return Scale(0.0, high * 1.1, start, end, "bytes")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points that no other point beats in both coordinates (both minimised).

    A point is dominated when another is no worse in both and better in one; equal points are
    all on the front. The result is sorted by the first coordinate (then the second).
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best_second = math.inf
    last: tuple[float, float] | None = None
    for index in order:
        point = points[index]
        if point[1] < best_second or point == last:
            front.append(index)
            best_second = min(best_second, point[1])
            last = point
    return front


# --------------------------------------------------------------------------------------------
# Charts


def _tooltip(m: Entry, fastest: float | None) -> str:
    ratio = f" (×{m.time_s / fastest:.2f} the fastest)" if fastest else ""
    lines = [m.algorithm,
             f"median {fmt_time(m.time_s)} ± {fmt_time(m.spread_s)}{ratio}",
             f"workspace {fmt_bytes(m.workspace_bytes)}",
             f"attributes {', '.join(m.attributes.names()) or '-'}",
             f"repeats {m.repeats}"]
    if m.error is not None:
        lines.append(f"numerical error {m.error:.2g}")
    if m.early_stopped:
        lines.append("timing stopped early (clearly slower)")
    return "\n".join(lines)


def bar_chart(problem: ProblemData) -> str:
    """Horizontal bars, fastest on top: median time, whiskers median ± spread."""
    entries = problem.entries
    if not entries:
        return '<p class="empty">No measured algorithm.</p>'
    names = [_short(m.algorithm, 34) for m in entries]
    label_width = min(240.0, max(70.0, _CHAR * max(len(n) for n in names) + 14))
    width, right, row, top = 570.0, 128.0, 24.0, 8.0
    plot_end = width - right
    height = top + row * len(entries) + 30
    high = max(m.time_s + m.spread_s for m in entries)
    scale = Scale(0.0, high * 1.04 or 1.0, label_width, plot_end)
    fastest = entries[0].time_s or None
    parts = [svg_open(width, height, f"algorithm times of {problem.operator} {problem.key}")]
    axis_y = top + row * len(entries) + 4
    for tick in nice_ticks(0.0, scale.high, 4):
        x = scale(tick)
        parts.append(svg_line(x, top, x, axis_y, GRID))
        parts.append(svg_text(x, axis_y + 15, fmt_time(tick) if tick else "0", "middle",
                              11, AXIS))
    for number, m in enumerate(entries):
        y = top + row * number
        chosen = number == 0
        colour = CHOSEN if chosen else EARLY if m.early_stopped else OTHER
        bar_end = scale(m.time_s)
        parts.append(f'<g class="bar{" chosen" if chosen else ""}">'
                     + svg_title(_tooltip(m, fastest)))
        parts.append(svg_text(label_width - 8, y + row / 2 + 4, names[number], "end",
                              weight="600" if chosen else "normal",
                              extra=' class="mono"'))
        parts.append(f'<rect x="{_num(label_width)}" y="{_num(y + 4)}" '
                     f'width="{_num(max(bar_end - label_width, 1.5))}" '
                     f'height="{_num(row - 8)}" rx="2" fill="{colour}"/>')
        low_x = scale(max(m.time_s - m.spread_s, 0.0))
        high_x = scale(m.time_s + m.spread_s)
        middle = y + row / 2
        if m.spread_s > 0:
            parts.append(svg_line(low_x, middle, high_x, middle, "#1f2937", 1.2))
            for x in (low_x, high_x):
                parts.append(svg_line(x, middle - 4, x, middle + 4, "#1f2937", 1.2))
        ratio = "" if chosen or not fastest else f"  ×{m.time_s / fastest:.2f}"
        parts.append(svg_text(max(bar_end, high_x) + 6, middle + 4,
                              fmt_time(m.time_s) + ratio, size=11,
                              fill=CHOSEN if chosen else "#374151",
                              weight="600" if chosen else "normal"))
        parts.append("</g>")
    parts.append(svg_line(label_width, axis_y, plot_end, axis_y))
    parts.append("</svg>")
    return "".join(parts)


def scatter_chart(problem: ProblemData) -> str:
    """Time (x) against workspace (y), the Pareto front as a staircase through its points."""
    entries = problem.entries
    if not entries:
        return ""
    width, height = 392.0, 250.0
    left, right, top, bottom = 76.0, 16.0, 14.0, 40.0
    xs = time_scale([m.time_s for m in entries], left, width - right)
    ys = workspace_scale([m.workspace_bytes for m in entries], height - bottom, top)
    parts = [svg_open(width, height,
                      f"time against workspace of {problem.operator} {problem.key}")]
    for tick in xs.ticks():
        x = xs(tick)
        parts.append(svg_line(x, top, x, height - bottom, GRID))
        parts.append(svg_text(x, height - bottom + 15, fmt_time(tick) if tick else "0",
                              "middle", 11, AXIS))
    # No algorithm needs workspace: one tick at 0 (fractions of a byte would read '0 B' again)
    y_ticks = ys.ticks() if any(m.workspace_bytes for m in entries) else [0.0]
    for tick in y_ticks:
        y = ys(tick)
        parts.append(svg_line(left, y, width - right, y, GRID))
        parts.append(svg_text(left - 6, y + 4, fmt_bytes(tick), "end", 11, AXIS))
    parts.append(svg_line(left, height - bottom, width - right, height - bottom))
    parts.append(svg_line(left, top, left, height - bottom))
    parts.append(svg_text((left + width - right) / 2, height - 6,
                          "median time" + (" (log)" if xs.kind == "log" else ""),
                          "middle", 11, AXIS))
    middle_y = (top + height - bottom) / 2
    parts.append(svg_text(11, middle_y, "workspace", "middle", 11, AXIS,
                          extra=f' transform="rotate(-90 11 {_num(middle_y)})"'))
    points = [(m.time_s, float(m.workspace_bytes)) for m in entries]
    front = pareto_front(points)
    on_front = set(front)
    if len(front) > 1:
        path: list[str] = []
        previous_y = 0.0
        for number, index in enumerate(front):
            x, y = xs(points[index][0]), ys(points[index][1])
            if number:
                path.append(f"{_num(x)},{_num(previous_y)}")
            path.append(f"{_num(x)},{_num(y)}")
            previous_y = y
        parts.append(f'<polyline class="front" points="{" ".join(path)}" fill="none" '
                     f'stroke="{FRONT}" stroke-width="1.5" stroke-dasharray="5 3"/>')
    label_all = len(entries) <= 4
    # Labels are placed in order of importance (the chosen point, then the front by time, then
    # the rest) where they overlap no label placed before; one that fits nowhere is left out
    # (its point keeps its tooltip) rather than drawn over another.
    placed: list[tuple[float, float, float, float]] = []
    labels: dict[int, tuple[float, float, str]] = {}
    for index in sorted(range(len(entries)), key=lambda i: (i != 0, i not in on_front, i)):
        if label_all or index in on_front:
            text = _short(entries[index].algorithm, 22)
            box = _place_label(xs(entries[index].time_s), ys(entries[index].workspace_bytes),
                               len(text) * 6.1, placed, (0.0, 0.0, width, height))
            if box is not None:
                placed.append(box)
                labels[index] = (box[0], box[1], text)
    fastest = entries[0].time_s or None
    for index in sorted(range(len(entries)), key=lambda i: i == 0):  # chosen drawn last
        m = entries[index]
        x, y = xs(m.time_s), ys(m.workspace_bytes)
        chosen = index == 0
        fill = CHOSEN if chosen else FRONT if index in on_front else "#ffffff"
        stroke = CHOSEN if chosen else FRONT if index in on_front else OTHER
        parts.append(f'<g class="point{" pareto" if index in on_front else ""}">'
                     + svg_title(_tooltip(m, fastest)
                                 + ("\non the Pareto front" if index in on_front else "")))
        if chosen:
            parts.append(f'<circle cx="{_num(x)}" cy="{_num(y)}" r="8" fill="none" '
                         f'stroke="{CHOSEN}" stroke-width="1.5"/>')
        parts.append(f'<circle cx="{_num(x)}" cy="{_num(y)}" r="4.5" fill="{fill}" '
                     f'stroke="{stroke}" stroke-width="1.5"/>')
        if index in labels:
            label_x, label_y, text = labels[index]
            parts.append(svg_text(label_x, label_y + 9, text, size=10, fill="#374151",
                                  extra=' class="mono"'))
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _place_label(x: float, y: float, text_width: float,
                 placed: Sequence[tuple[float, float, float, float]],
                 bounds: tuple[float, float, float, float]
                 ) -> tuple[float, float, float, float] | None:
    """A box (x, y, w, h) for a point's label inside ``bounds`` that overlaps no placed label:
    right-above, right-below, left-above, left-below, then each of them further away; None
    when none fits."""
    height = 11.0
    low_x, low_y, high_x, high_y = bounds
    candidates = []
    for extra in (0.0, 12.0, 24.0):
        above, below = y - 8 - height - extra, y + 6 + extra
        for bx, by in ((x + 8, above), (x + 8, below), (x - 8 - text_width, above),
                       (x - 8 - text_width, below)):
            candidates.append((bx, by, text_width, height))
    for box in candidates:
        inside = (low_x <= box[0] and box[0] + text_width <= high_x
                  and low_y <= box[1] and box[1] + height <= high_y)
        if inside and not any(_overlaps(box, other) for other in placed):
            return box
    return None


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def model_chart(model: ModelData, shown: set[str]) -> str:
    """Per-layer bars of the chosen algorithms' times, coloured by where the decision came from;
    a stacked bar on top shows each layer's share of the measured total."""
    rows = model.layers
    if not rows:
        return '<p class="empty">The model has no decided layers.</p>'
    names = [_short(f"{r.node} ({r.op_type})", 38) for r in rows]
    label_width = min(280.0, max(90.0, _CHAR * max(len(n) for n in names) + 14))
    width, right, row = 960.0, 290.0, 20.0
    stack_top, stack_height = 24.0, 22.0
    top = stack_top + stack_height + 34
    height = top + row * len(rows) + 30
    plot_end = width - right
    timed = [r.time_s for r in rows if r.time_s]
    high = max(timed, default=0.0)
    scale = Scale(0.0, high * 1.04 or 1.0, label_width, plot_end)
    parts = [svg_open(width, height, f"per-layer decisions of {model.name}")]
    total = sum(timed)
    parts.append(svg_text(label_width - 8, stack_top + 15, "all layers", "end", weight="600"))
    if total > 0:
        x = label_width
        span = plot_end - label_width
        shade = 0
        for r in rows:
            if not r.time_s:
                continue
            w = r.time_s / total * span
            colour = SOURCE_COLOURS.get(r.source, OTHER)
            opacity = "1" if shade % 2 == 0 else "0.72"
            tip = (f"{r.node} ({r.op_type}): {r.algorithm}, {fmt_time(r.time_s)}, "
                   f"{r.time_s / total:.1%} of the total")
            parts.append(
                f'<g class="stack">{svg_title(tip)}'
                f'<rect x="{_num(x)}" y="{_num(stack_top)}" width="{_num(max(w, 0.5))}" '
                f'height="{_num(stack_height)}" fill="{colour}" fill-opacity="{opacity}" '
                f'stroke="#ffffff" stroke-width="0.6"/></g>')
            x += w
            shade += 1
        parts.append(svg_text(plot_end + 8, stack_top + 15,
                              f"{fmt_time(total)} measured in {len(timed)} of {len(rows)} layers",
                              size=11, fill="#374151"))
    else:
        parts.append(svg_text(label_width, stack_top + 15,
                              "no layer has a measured time (none was found in the input)",
                              size=11, fill=AXIS))
    legend_x = label_width
    for source in ("cache", "profiled", "heuristic", "only"):
        if not any(r.source == source for r in rows):
            continue
        parts.append(f'<rect x="{_num(legend_x)}" y="{_num(stack_top + stack_height + 10)}" '
                     f'width="10" height="10" rx="2" fill="{SOURCE_COLOURS[source]}"/>')
        parts.append(svg_text(legend_x + 14, stack_top + stack_height + 19, source, size=11,
                              fill="#374151"))
        legend_x += 24 + _CHAR * len(source) + 10
    axis_y = top + row * len(rows) + 4
    for tick in nice_ticks(0.0, scale.high, 5) if timed else ():
        x = scale(tick)
        parts.append(svg_line(x, top - 4, x, axis_y, GRID))
        parts.append(svg_text(x, axis_y + 15, fmt_time(tick) if tick else "0", "middle", 11,
                              AXIS))
    for number, r in enumerate(rows):
        y = top + row * number
        middle = y + row / 2
        colour = SOURCE_COLOURS.get(r.source, OTHER)
        anchor = problem_anchor(r.category, r.key)
        tip = (f"{r.node} ({r.op_type})\n{r.operator}: {r.algorithm}\nsource {r.source}, "
               f"time {fmt_time(r.time_s)}\n{r.key}")
        label = svg_text(label_width - 8, middle + 4, names[number], "end", 11,
                         extra=' class="mono"')
        if anchor in shown:  # the layer's problem has its own section: link to it
            label = f'<a href="#{anchor}">{label}</a>'
        parts.append(f'<g class="layer">{svg_title(tip)}{label}')
        if r.time_s:
            end = scale(r.time_s)
            parts.append(f'<rect x="{_num(label_width)}" y="{_num(y + 3)}" '
                         f'width="{_num(max(end - label_width, 1.5))}" height="{_num(row - 6)}" '
                         f'rx="2" fill="{colour}"/>')
            text_x = end + 6
            detail = f"{r.algorithm} · {fmt_time(r.time_s)} · {r.source}"
        else:
            parts.append(f'<rect x="{_num(label_width)}" y="{_num(y + 3)}" width="8" '
                         f'height="{_num(row - 6)}" rx="2" fill="none" stroke="{colour}" '
                         f'stroke-width="1.5" stroke-dasharray="2 2"/>')
            text_x = label_width + 14
            detail = f"{r.algorithm} · no time · {r.source}"
        parts.append(svg_text(text_x, middle + 4, _short(detail, 60), size=11,
                              fill="#374151"))
        parts.append("</g>")
    parts.append(svg_line(label_width, axis_y, plot_end, axis_y))
    parts.append("</svg>")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Page


_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f8fafc; color: #111827;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 36px 0 12px; padding-bottom: 6px; border-bottom: 2px solid #e2e8f0; }
h3 { font-size: 15px; margin: 0 0 6px; word-break: break-all; }
a { color: #1d4ed8; text-decoration: none; }
a:hover { text-decoration: underline; }
code, span.mono, a.mono, td.mono { font-family: ui-monospace, "SFMono-Regular", Menlo,
  Consolas, "DejaVu Sans Mono", monospace; font-size: 12px; }
.subtitle { color: #475569; margin: 0 0 18px; word-break: break-all; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr));
  gap: 10px; margin: 0 0 16px; }
.card { background: #fff; border: 1px solid #e2e8f0; border-radius: 8px; padding: 10px 12px; }
.card .value { font-size: 20px; font-weight: 650; }
.card .name { color: #64748b; font-size: 12px; text-transform: uppercase;
  letter-spacing: .04em; }
.facts { background: #fff; border: 1px solid #e2e8f0; border-radius: 8px; padding: 10px 14px;
  margin: 0 0 8px; }
.facts dt { font-weight: 600; color: #334155; }
.facts dd { margin: 0 0 6px 0; word-break: break-all; }
.notice { background: #fffbeb; border: 1px solid #fcd34d; border-radius: 8px;
  padding: 8px 12px; margin: 10px 0; }
nav.index details { background: #fff; border: 1px solid #e2e8f0; border-radius: 8px;
  margin: 0 0 8px; padding: 6px 12px; }
nav.index summary { cursor: pointer; font-weight: 600; }
nav.index ol { margin: 6px 0 4px; padding-left: 22px; columns: 2 420px; column-gap: 28px; }
nav.index li { break-inside: avoid; margin: 1px 0; }
nav.index .time { color: #475569; }
section.problem { background: #fff; border: 1px solid #e2e8f0; border-radius: 10px;
  padding: 14px 16px; margin: 0 0 16px; }
.meta { color: #475569; font-size: 12.5px; margin: 0 0 8px; }
.badge { display: inline-block; border-radius: 999px; padding: 0 8px; font-size: 11.5px;
  font-weight: 600; background: #e2e8f0; color: #334155; margin-right: 4px; }
.badge.chosen { background: #dbeafe; color: #1d4ed8; }
.badge.cache { background: #dbeafe; color: #1d4ed8; }
.badge.profiled { background: #ede9fe; color: #6d28d9; }
.badge.heuristic { background: #fef3c7; color: #b45309; }
.badge.only { background: #e2e8f0; color: #475569; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
svg.chart { display: block; max-width: 100%; height: auto; overflow: visible; }
svg.chart text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; }
svg.chart text.mono { font-family: ui-monospace, Menlo, Consolas, "DejaVu Sans Mono",
  monospace; }
table { border-collapse: collapse; width: 100%; margin-top: 10px; font-size: 12.5px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eef2f7;
  vertical-align: top; }
th { color: #475569; font-weight: 600; background: #f8fafc; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.chosen td { background: #eff6ff; font-weight: 600; }
tr.failure td { color: #b91c1c; }
.legend { color: #475569; font-size: 12px; margin: 4px 0 0; }
.figures { font-size: 13.5px; margin: 6px 0; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  vertical-align: -1px; margin: 0 4px 0 10px; }
.top { float: right; font-size: 12px; }
footer { color: #64748b; font-size: 12px; margin-top: 40px; }
"""


def _card(name: str, value: Any) -> str:
    return (f'<div class="card"><div class="value">{esc(value)}</div>'
            f'<div class="name">{esc(name)}</div></div>')


def _select(problems: list[ProblemData], max_problems: int | None) -> list[ProblemData]:
    """The problems to draw: all, or the most expensive (weight × fastest time)."""
    if max_problems is None or len(problems) <= max_problems:
        return problems

    def cost(p: ProblemData) -> float:
        fastest = p.chosen.time_s if p.chosen else 0.0
        return fastest * (p.weight if p.weight is not None else 1.0)

    return sorted(problems, key=cost, reverse=True)[:max_problems]


def _grouped(problems: Iterable[ProblemData]) -> dict[str, list[ProblemData]]:
    groups: dict[str, list[ProblemData]] = {}
    for problem in sorted(problems, key=lambda p: (p.operator, p.device, _key_order(p.key))):
        groups.setdefault(problem.operator, []).append(problem)
    return groups


def _key_order(key: str) -> tuple[Any, ...]:
    """Sort keys with their numbers as numbers: 8x8 before 16x16 before 128x128."""
    parts: list[Any] = []
    number = ""
    for char in key + "\0":
        if char.isdigit():
            number += char
            continue
        if number:
            parts.append((0, int(number)))
            number = ""
        parts.append((1, char))
    return tuple(parts)


def _problem_title(problem: ProblemData) -> str:
    return problem.label or problem.key


def _problem_section(problem: ProblemData, device_numbers: dict[str, int],
                     many_devices: bool) -> str:
    chosen = problem.chosen
    out = [f'<section class="problem" id="{problem.anchor}">',
           '<a class="top" href="#index">↑ index</a>',
           f'<h3><span class="mono">{esc(problem.operator)}</span> '
           f'<span class="mono">{esc(_problem_title(problem))}</span></h3>']
    meta = []
    if problem.label:
        meta.append(f'key <code>{esc(problem.key)}</code>')
    if many_devices:
        meta.append(f'device D{device_numbers[problem.device]}')
    where = category_module.split(problem.category)[1] or problem.category
    meta.append(f'category <code>{esc(where)}</code>')
    if problem.weight is not None:
        meta.append(f"weight {problem.weight:g}")
    meta.append(f"{len(problem.entries)} measured")
    if problem.failures:
        meta.append(f"{len(problem.failures)} failed")
    if chosen is not None:
        meta.append(f'<span class="badge chosen">chosen: {esc(chosen.algorithm)} · '
                    f'{esc(fmt_time(chosen.time_s))}</span>')
    out.append(f'<p class="meta">{" · ".join(meta)}</p>')
    out.append(f'<div class="charts">{bar_chart(problem)}{scatter_chart(problem)}</div>')
    out.append(_entry_table(problem))
    out.append("</section>")
    return "".join(out)


def _entry_table(problem: ProblemData) -> str:
    entries = problem.entries
    if not entries and not problem.failures:
        return ""
    front = set(pareto_front([(m.time_s, float(m.workspace_bytes)) for m in entries]))
    fastest = entries[0].time_s if entries else 0.0
    rows = ['<table><thead><tr><th class="num">#</th><th>algorithm</th>'
            '<th class="num">median</th><th class="num">spread</th><th class="num">× fastest</th>'
            '<th class="num">workspace</th><th>attributes</th><th class="num">error</th>'
            '<th class="num">repeats</th><th>Pareto</th></tr></thead><tbody>']
    for rank, m in enumerate(entries, 1):
        ratio = f"{m.time_s / fastest:.2f}" if fastest else "–"
        note = " (stopped early)" if m.early_stopped else ""
        rows.append(
            f'<tr class="{"chosen" if rank == 1 else "entry"}">'
            f'<td class="num">{rank}</td><td class="mono">{esc(m.algorithm)}{esc(note)}</td>'
            f'<td class="num">{esc(fmt_time(m.time_s))}</td>'
            f'<td class="num">{esc(fmt_time(m.spread_s))}</td><td class="num">{ratio}</td>'
            f'<td class="num">{esc(fmt_bytes(m.workspace_bytes))}</td>'
            f'<td>{esc(", ".join(m.attributes.names()) or "-")}</td>'
            f'<td class="num">{"–" if m.error is None else f"{m.error:.1e}"}</td>'
            f'<td class="num">{m.repeats}</td><td>{"✓" if rank - 1 in front else ""}</td></tr>')
    for algorithm, reason in problem.failures:
        rows.append(f'<tr class="failure"><td class="num">✗</td><td class="mono">'
                    f'{esc(algorithm)}</td><td colspan="8">failed: {esc(reason)}</td></tr>')
    rows.append("</tbody></table>")
    return "".join(rows)


def _index(groups: dict[str, list[ProblemData]]) -> str:
    out = ['<nav class="index" id="index"><h2>Problems by operator</h2>']
    for operator, problems in groups.items():
        out.append(f'<details open><summary><a href="#op-{esc(operator)}">{esc(operator)}</a> '
                   f'· {len(problems)} problem{"s" if len(problems) != 1 else ""}</summary><ol>')
        for problem in problems:
            chosen = problem.chosen
            detail = (f'{esc(chosen.algorithm)} <span class="time">'
                      f'{esc(fmt_time(chosen.time_s))}</span>' if chosen else "no entry")
            out.append(f'<li><a class="mono" href="#{problem.anchor}">'
                       f'{esc(_short(_problem_title(problem), 60))}</a> → {detail}</li>')
        out.append("</ol></details>")
    out.append("</nav>")
    return "".join(out)


def _model_figures(model: ModelData) -> str:
    """The numbers a user opens the model section for: the run's measured total beside the
    layers' profiled times, and what the measured choices gain over the heuristic's."""
    lines = []
    profiled = [r.time_s for r in model.layers if r.time_s is not None]
    if model.run_ms is not None:
        line = (f"Measured run: <b>{esc(fmt_time(model.run_ms / 1e3))}</b> per inference "
                f"(median of {plural(model.iterations, 'inference')} on random inputs, on "
                "this machine).")
        if profiled:
            line += (f" The profiled times of {plural(len(profiled), 'layer')} sum to "
                     f"{esc(fmt_time(sum(profiled)))}: each was timed alone, its inputs in "
                     "cache and its threads awake, while in the run a layer inherits the "
                     "caches and threads the previous one left (see docs/runtime.md).")
        lines.append(line)
    gain = model.gain
    if gain is not None:
        line = (f"Gain over the heuristic: <b>{gain['speedup']:.2f}x</b> on "
                f"{plural(gain['steps'], 'layer')} where both picks were measured (profiled "
                f"{esc(fmt_time(gain['heuristic_ms'] / 1e3))} &rarr; "
                f"{esc(fmt_time(gain['chosen_ms'] / 1e3))}).")
        if gain.get("unmatched"):
            line += (f" {plural(gain['unmatched'], 'measured layer')} not compared: the "
                     "heuristic's pick is not among the kept measurements (a cache keeps each "
                     "problem's Pareto front; <code>fastrun rank</code> keeps every candidate).")
        lines.append(line)
    elif any(r.source == "cache" for r in model.layers):
        lines.append("Gain over the heuristic: not measurable from this input (no layer's "
                     "heuristic pick is among its kept measurements; <code>fastrun rank</code> "
                     "keeps every candidate).")
    return "".join(f'<p class="figures">{line}</p>' for line in lines)


def _model_section(model: ModelData, shown: set[str]) -> str:
    sources: dict[str, int] = {}
    for row in model.layers:
        sources[row.source] = sources.get(row.source, 0) + 1
    badges = " ".join(f'<span class="badge {esc(s)}">{esc(s)}: {n}</span>'
                      for s, n in sorted(sources.items()))
    views = f" and {plural(model.views, 'view step')}" if model.views else ""
    out = ['<section id="model"><h2>Model: ' + esc(model.name) + "</h2>",
           f'<p class="meta">{plural(len(model.layers), "decided layer")}{views}, decided in '
           f'cache-only mode (nothing searched) for the category '
           f'<code>{esc(model.device)}</code>. {badges}</p>',
           _model_figures(model),
           '<p class="legend">cache: the input measured this problem on this category · '
           'heuristic: not in the input, a rule of thumb chose · only: a single eligible '
           'algorithm. Layers without a measured time are drawn as dashed boxes.</p>']
    if model.layers and not sources.get("cache") and not sources.get("profiled"):
        out.append('<p class="notice">No layer was found in the input: it was probably '
                   "measured on another device category (or for other shapes).</p>")
    out.append(model_chart(model, shown))
    out.append('<table><thead><tr><th class="num">#</th><th>node</th><th>op type</th>'
               '<th>operator</th><th>algorithm</th><th>source</th><th class="num">time</th>'
               "</tr></thead><tbody>")
    for r in model.layers:
        anchor = problem_anchor(r.category, r.key)
        algorithm = esc(r.algorithm)
        if anchor in shown:
            algorithm = f'<a href="#{anchor}">{algorithm}</a>'
        out.append(f'<tr><td class="num">{r.index}</td><td class="mono">{esc(r.node)}</td>'
                   f'<td>{esc(r.op_type)}</td><td>{esc(r.operator)}</td>'
                   f'<td class="mono">{algorithm}</td>'
                   f'<td><span class="badge {esc(r.source)}">{esc(r.source)}</span></td>'
                   f'<td class="num">{esc(fmt_time(r.time_s))}</td></tr>')
    out.append("</tbody></table></section>")
    return "".join(out)


def render(data: ReportData, model: ModelData | None = None,
           max_problems: int | None = DEFAULT_MAX_PROBLEMS, title: str | None = None,
           generated_at: float | None = None) -> str:
    """The whole page as one HTML string (UTF-8 text, no external resources)."""
    from fastrun._version import __version__

    shown_problems = _select(data.problems, max_problems)
    groups = _grouped(shown_problems)
    devices = data.devices
    device_numbers = {device: number for number, device in enumerate(devices, 1)}
    shown = {p.anchor for p in shown_problems}
    name = os.path.basename(data.path) or data.path
    page_title = title or f"fastrun report: {name}"
    entries = sum(len(p.entries) for p in data.problems)
    failures = sum(len(p.failures) for p in data.problems)

    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{esc(page_title)}</title><style>{_CSS}</style></head><body><main>",
           f"<h1>{esc(page_title)}</h1>",
           f'<p class="subtitle">{esc(data.kind)} file <code>{esc(data.path)}</code></p>',
           '<div class="cards">', _card("problems", len(data.problems)),
           _card("measurements", entries),
           _card("operators", len({p.operator for p in data.problems})),
           _card("device categories", len(devices))]
    if failures:
        out.append(_card("failures", failures))
    if model is not None:
        out.append(_card("model layers", len(model.layers)))
        if model.run_ms is not None:
            out.append(_card("model run", fmt_time(model.run_ms / 1e3)))
        if model.gain is not None:
            out.append(_card("gain over heuristic", f"{model.gain['speedup']:.2f}x"))
    out.append("</div>")

    facts = [("device categories",
              "".join(f"<div>{f'D{n}: ' if len(devices) > 1 else ''}<code>{esc(d)}</code></div>"
                      for d, n in device_numbers.items()) or "–"),
             ("fastrun versions", esc(", ".join(data.versions) or "–"))]
    span = data.measured_range()
    if span is not None and data.kind == "cache":
        first, last = _date_text(span[0]), _date_text(span[1])
        facts.append(("measured", esc(first if first == last else f"{first} – {last}")))
    facts.extend((esc(label), esc(value)) for label, value in data.meta.items())
    out.append('<dl class="facts">' + "".join(f"<dt>{label}</dt><dd>{value}</dd>"
                                               for label, value in facts) + "</dl>")
    if data.kind == "cache":
        out.append('<p class="notice">A cache keeps only what a lookup can choose: for each set '
                   "of attributes, the algorithms that no faster one beats on workspace (the "
                   "Pareto front), so a problem often shows one or two. For every candidate's "
                   "time, rank a suite and draw the rankings file instead: <code>fastrun rank "
                   "zoo:resnet18 -o ranks.msgpack; fastrun report ranks.msgpack -o "
                   "report.html</code>.</p>")
    if len(shown_problems) < len(data.problems):
        out.append(f'<p class="notice">Showing the {len(shown_problems)} most expensive of '
                   f'{len(data.problems)} problems (fastest time × weight); use '
                   "<code>--max-problems</code> to show more.</p>")
    out.append('<p class="legend">Bars: median time of each algorithm, fastest on top; whiskers: '
               'median ± spread (the interquartile range of the timed repeats). '
               f'<span class="swatch" style="background:{CHOSEN}"></span>chosen (fastest)'
               f'<span class="swatch" style="background:{OTHER}"></span>other'
               f'<span class="swatch" style="background:{EARLY}"></span>timing stopped early'
               f'<span class="swatch" style="background:{FRONT}"></span>Pareto front (no other '
               "algorithm is both faster and needs less workspace). Hover a bar or point for "
               "details.</p>")
    if model is not None:
        out.append(_model_section(model, shown))
    out.append(_index(groups))
    for operator, problems in groups.items():
        out.append(f'<h2 id="op-{esc(operator)}">{esc(operator)} '
                   f'<span class="meta">({len(problems)} problems)</span></h2>')
        out.extend(_problem_section(p, device_numbers, len(devices) > 1) for p in problems)
    stamp = _date_text(generated_at) if generated_at is not None else None
    out.append(f"<footer>Generated by fastrun {esc(__version__)}"
               f"{f' on {esc(stamp)}' if stamp else ''}. A self-contained page: no scripts, "
               "fonts or external resources.</footer>")
    out.append("</main></body></html>")
    return "\n".join(out)
