"""The report's pictures: number formatting, SVG primitives and scales, and the three charts
(the bar chart of a problem's times, its time-vs-workspace scatter with the Pareto front, and
a model's per-layer chart).  Pure functions from :mod:`.data`'s records to SVG text."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from fastrun.analysis.report.data import (
    ModelData,
    ProblemData,
    problem_anchor,
)
from fastrun.cache import Entry

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


def shorten(text: str, limit: int) -> str:
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
SOURCE_COLOURS = {"cache": "#2563eb", "profiled": "#7c3aed", "nearest": "#0d9488",
                  "heuristic": "#f59e0b", "only": "#64748b"}

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
    names = [shorten(m.algorithm, 34) for m in entries]
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
            text = shorten(entries[index].algorithm, 22)
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


def _share_stack(rows: Sequence[Any], left: float, right: float, top: float,
                 height: float) -> list[str]:
    """The bar of every timed layer's share of the measured total, from ``left`` to
    ``right``, with the total beside it (or a line saying no layer was timed)."""
    timed = [r.time_s for r in rows if r.time_s]
    total = sum(timed)
    parts = [svg_text(left - 8, top + 15, "all layers", "end", weight="600")]
    if total <= 0:
        parts.append(svg_text(left, top + 15, "no layer has a measured time (none was found "
                              "in the input)", size=11, fill=AXIS))
        return parts
    x, span = left, right - left
    for shade, r in enumerate(r for r in rows if r.time_s):
        w = r.time_s / total * span
        colour = SOURCE_COLOURS.get(r.source, OTHER)
        opacity = "1" if shade % 2 == 0 else "0.72"
        tip = (f"{r.node} ({r.op_type}): {r.algorithm}, {fmt_time(r.time_s)}, "
               f"{r.time_s / total:.1%} of the total")
        parts.append(
            f'<g class="stack">{svg_title(tip)}'
            f'<rect x="{_num(x)}" y="{_num(top)}" width="{_num(max(w, 0.5))}" '
            f'height="{_num(height)}" fill="{colour}" fill-opacity="{opacity}" '
            f'stroke="#ffffff" stroke-width="0.6"/></g>')
        x += w
    parts.append(svg_text(right + 8, top + 15,
                          f"{fmt_time(total)} measured in {len(timed)} of {len(rows)} layers",
                          size=11, fill="#374151"))
    return parts


def _source_legend(rows: Sequence[Any], left: float, top: float) -> list[str]:
    """A swatch and a name for each decision source the rows use."""
    parts = []
    for source in SOURCE_COLOURS:
        if not any(r.source == source for r in rows):
            continue
        parts.append(f'<rect x="{_num(left)}" y="{_num(top)}" width="10" height="10" rx="2" '
                     f'fill="{SOURCE_COLOURS[source]}"/>')
        parts.append(svg_text(left + 14, top + 9, source, size=11, fill="#374151"))
        left += 24 + _CHAR * len(source) + 10
    return parts


def model_chart(model: ModelData, shown: set[str]) -> str:
    """Per-layer bars of the chosen algorithms' times, coloured by where the decision came from;
    a stacked bar on top shows each layer's share of the measured total."""
    rows = model.layers
    if not rows:
        return '<p class="empty">The model has no decided layers.</p>'
    names = [shorten(f"{r.node} ({r.op_type})", 38) for r in rows]
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
    parts += _share_stack(rows, label_width, plot_end, stack_top, stack_height)
    parts += _source_legend(rows, label_width, stack_top + stack_height + 10)
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
        parts.append(svg_text(text_x, middle + 4, shorten(detail, 60), size=11,
                              fill="#374151"))
        parts.append("</g>")
    parts.append(svg_line(label_width, axis_y, plot_end, axis_y))
    parts.append("</svg>")
    return "".join(parts)
