"""``fastrun report``: one self-contained HTML page of a cache or rankings file.

The page is built by :mod:`fastrun.analysis.report`; this module only parses arguments, loads the
optional model and writes the file. With ``--model``, the model is decided in cache-only mode
(the heuristic strategy: no problem is searched) from exactly the measurements the page shows,
so its per-layer section says what a cache-only run of the model would dispatch to on this
machine; then the model runs ``--iterations`` times on random inputs, so that the section can
show the run's measured total beside the layers' profiled times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from fastrun.base.files import atomic_write
from fastrun.cli import unsaved

#: As fastrun.analysis.report.DEFAULT_MAX_PROBLEMS; not imported from there so that building the
#: command-line parser stays cheap and independent of the report module.
DEFAULT_MAX_PROBLEMS = 400


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Register the ``report`` sub-command on ``build_parser``'s sub-parsers."""
    parser = commands.add_parser(
        "report", help="write a self-contained HTML report of a cache or rankings file",
        description="Draw every problem of a cache (or rankings) file: algorithm times with "
                    "spread whiskers, the time-vs-workspace Pareto front, and with --model the "
                    "per-layer decisions of a model read from it. The page has no scripts and "
                    "loads nothing; the input file is only read.")
    parser.add_argument("input", metavar="CACHE_OR_RANKINGS",
                        help="a fastrun cache file or a rankings file (told apart by content)")
    parser.add_argument("-o", "--output", required=True, metavar="HTML",
                        help="the HTML file to write")
    parser.add_argument("--model", metavar="MODEL",
                        help="an ONNX file or zoo:NAME: show its per-layer decisions, looked up "
                             "in the input (cache-only, nothing is searched), its measured run "
                             "and what the measured choices gain over the heuristic's")
    parser.add_argument("--iterations", type=int, default=10, metavar="N",
                        help="with --model: time N inferences on random inputs for the run's "
                             "measured total (default 10; 0 = do not run the model)")
    parser.add_argument("--batch", type=int, default=None,
                        help="with --model: the batch size (default: the model's, or 1)")
    parser.add_argument("--operator", action="append", default=None, metavar="NAME",
                        help="only problems of this operator (repeatable)")
    parser.add_argument("--max-problems", type=int, default=DEFAULT_MAX_PROBLEMS, metavar="N",
                        help="draw at most N problems, the most expensive ones (default "
                             f"{DEFAULT_MAX_PROBLEMS}; 0 = all)")
    parser.add_argument("--title", help="the page title (default: 'fastrun report: FILE')")
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from fastrun.analysis import report

    if os.path.abspath(args.output) == os.path.abspath(args.input):
        raise ValueError(f"the output {args.output} is the input file; choose another name")
    problem = (unsaved.number_error("--batch", args.batch, 1)  # before the model is timed
               or unsaved.number_error("--max-problems", args.max_problems, 0)
               or unsaved.output_paths_error(args, ("output",)))
    if problem:
        raise ValueError(problem)
    data = report.read_input(args.input)
    if args.operator:
        wanted = set(args.operator)
        data.problems = [p for p in data.problems if p.operator in wanted]
    if args.iterations < 0:
        raise ValueError(f"--iterations must be 0 or more, got {args.iterations}")
    model = _model_data(args.model, data, args.batch, args.iterations) if args.model else None
    page = report.render(data, model,
                         max_problems=args.max_problems if args.max_problems > 0 else None,
                         title=args.title, generated_at=time.time())
    try:
        atomic_write(args.output, page)
    except OSError as error:
        print(f"fastrun: error: cannot write {args.output}: {error.strerror or error}",
              file=sys.stderr)
        return 2
    shown = len(data.problems) if args.max_problems <= 0 else min(len(data.problems),
                                                                  args.max_problems)
    layers = f", {len(model.layers)} model layers" if model is not None else ""
    print(f"wrote {args.output}: {shown} of {len(data.problems)} problems{layers}")
    return 0


def _model_data(spec: str, data: Any, batch: int | None, iterations: int) -> Any:
    """Load and decide the model from the input's measurements, searching nothing, then time
    ``iterations`` inferences (after one to warm up) on random inputs.

    The session's cache is an in-memory copy of what the page shows (the same entries a
    ``fastrun.session(cache=path, strategy="heuristic")`` would read), so that a rankings file
    works too and the input file is never opened for writing.
    """
    from fastrun.analysis.report import ModelData, model_rows
    from fastrun.api import Session
    from fastrun.runtime import load

    session = Session(cache=data.to_cache(), strategy="heuristic", progress=False)
    model = load(spec, session, batch=batch)
    rows, views = model_rows(model.search())
    name = spec if spec.startswith("zoo:") else os.path.basename(spec)
    run_ms = None
    if iterations:
        from fastrun.cli.options import time_iterations

        _, times, _ = time_iterations(model, model.random_inputs(seed=0), iterations, 1, False)
        run_ms = statistics.median(times) * 1e3
    # every measurement of the input, not the Pareto front the session's cache kept of them
    measurements = {(p.category, p.key): {m.algorithm: m.time_s for m in p.entries}
                    for p in data.problems}
    from fastrun.analysis.gain import gain_over_heuristic

    gain = gain_over_heuristic(
        model,
        lambda decision: measurements.get((decision.category, decision.problem.key), {}))
    return ModelData(name=name, device=session.device.category, layers=rows, views=views,
                     run_ms=run_ms, iterations=iterations if run_ms is not None else 0,
                     gain=gain)
