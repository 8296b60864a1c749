"""The report's page: inline CSS, the header cards, the index, the sections of problems and
of a model, and :func:`render`, which puts them together into one self-contained HTML string."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

from fastrun import category as category_module
from fastrun.analysis.report.charts import (
    CHOSEN,
    EARLY,
    FRONT,
    OTHER,
    bar_chart,
    esc,
    fmt_bytes,
    fmt_time,
    model_chart,
    pareto_front,
    scatter_chart,
    shorten,
)
from fastrun.analysis.report.data import (
    DEFAULT_MAX_PROBLEMS,
    ModelData,
    ProblemData,
    ReportData,
    date_text,
    problem_anchor,
)
from fastrun.base.units import plural

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
.flag { color: #b45309; }
section.problem { background: #fff; border: 1px solid #e2e8f0; border-radius: 10px;
  padding: 14px 16px; margin: 0 0 16px; }
.meta { color: #475569; font-size: 12.5px; margin: 0 0 8px; }
.badge { display: inline-block; border-radius: 999px; padding: 0 8px; font-size: 11.5px;
  font-weight: 600; background: #e2e8f0; color: #334155; margin-right: 4px; }
.badge.chosen { background: #dbeafe; color: #1d4ed8; }
.badge.cache { background: #dbeafe; color: #1d4ed8; }
.badge.profiled { background: #ede9fe; color: #6d28d9; }
.badge.heuristic { background: #fef3c7; color: #b45309; }
.badge.nearest { background: #ccfbf1; color: #0f766e; }
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
                       f'{esc(shorten(_problem_title(problem), 60))}</a> → {detail}</li>')
        out.append("</ol></details>")
    out.append("</nav>")
    return "".join(out)


#: A measured run this many times above or below its layers' profiled sum is flagged.
FAR_APART = 2.0


def _far_apart(model: ModelData, run_s: float, profiled_s: float) -> str:
    """A flag, with the likely reasons, when the run and the layers' profiled sum are more
    than :data:`FAR_APART` times apart ('' otherwise): a gap that large is no longer the
    ordinary difference between a layer alone and a layer in a run."""
    if profiled_s <= 0 or 1 / FAR_APART <= run_s / profiled_s <= FAR_APART:
        return ""
    sources = Counter(row.source for row in model.layers)
    unmeasured = sources.get("heuristic", 0) + sources.get("only", 0)
    if run_s > profiled_s:
        why = ["layers in the run but not in the sum "
               f"({plural(unmeasured, 'layer')} decided without a measurement)"
               if unmeasured else "",
               "each layer's cold caches and sleeping threads in the run",
               "measurements made on a faster machine, or at more threads, than this run"]
        direction = f"{run_s / profiled_s:.1f}x above"
    else:
        nearest = sources.get("nearest", 0)
        why = ["measurements made under other conditions than this run: a busier machine, "
               "fewer threads, another batch or image size",
               f"times carried from the nearest measured problem ({plural(nearest, 'layer')}),"
               " which are estimates" if nearest else ""]
        direction = f"{profiled_s / run_s:.1f}x below"
    reasons = "; ".join(reason for reason in why if reason)
    return (f' <b class="flag">The run is {direction} the profiled sum</b>, far more than a '
            f"layer alone and in a run differ; likely: {esc(reasons)}.")


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
            line += _far_apart(model, model.run_ms / 1e3, sum(profiled))
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
           'nearest: not in the input, the choice of its nearest measured problem (named in '
           'the table) · heuristic: not in the input, a rule of thumb chose · only: a single '
           'eligible algorithm. Layers without a measured time are drawn as dashed boxes.</p>']
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
                   f'<td><span class="badge {esc(r.source)}">{esc(r.source)}</span>'
                   + (f' <span class="mono">{esc(r.neighbour)}</span>' if r.neighbour else "")
                   + '</td>'
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
        first, last = date_text(span[0]), date_text(span[1])
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
    stamp = date_text(generated_at) if generated_at is not None else None
    out.append(f"<footer>Generated by fastrun {esc(__version__)}"
               f"{f' on {esc(stamp)}' if stamp else ''}. A self-contained page: no scripts, "
               "fonts or external resources.</footer>")
    out.append("</main></body></html>")
    return "\n".join(out)
