"""``load_and_run``: load an ONNX model, search (or look up) its algorithms, run and time it.

The flags follow MegEngine's ``load_and_run``: ``--fast-run``/``--full-run`` search on cache
misses; ``--algo-policy FILE`` alone reads the cache and falls back to heuristics without timing
anything; both together resume a search in FILE, writing each result as it is measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from fastrun._version import __version__
from fastrun.base.formats import PROFILE_FORMAT, PROFILE_VERSION
from fastrun.cli import formatting, pipes, unsaved
from fastrun.cli.options import (
    TimingInterrupted,
    add_strategy_arguments,
    strategy_from,
    time_iterations,
)

log = logging.getLogger("fastrun.load_and_run")

#: When more than this share of a cache-only run's decisions missed the cache, the cache was
#: most likely made for another model, device or fastrun version: say so.
MISMATCH_SHARE = 0.5


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="load_and_run",
        description="Run an ONNX model (a file, or zoo:NAME for a built-in one) with fastrun's "
                    "algorithm selection, and time it.")
    parser.add_argument("model", help="model.onnx, or zoo:NAME (zoo:resnet18, zoo:resnet50, "
                                      "zoo:mobilenet_v2, zoo:vgg16, zoo:squeezenet)")
    parser.add_argument("--version", action="version", version=f"fastrun {__version__}")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an input from a .npy file (repeatable); others are random")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size for inputs whose first dimension is symbolic")
    parser.add_argument("--shapes", type=_parse_shapes, default={}, metavar="NAME:DIMS,...",
                        help="input shapes, e.g. input:1x3x224x224,mask:1x128 (for symbolic "
                             "dimensions other than the batch)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    add_strategy_arguments(parser)
    parser.add_argument("--weight-preprocess", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="transform constant weights once at load, e.g. Winograd's "
                             "filters (default: on; --no-weight-preprocess transforms them in "
                             "every call)")
    parser.add_argument("--record", metavar="PATH",
                        help="append every problem that misses the cache to this problems file "
                             "(default: FASTRUN_RECORD), to tune them later with fastrun tune "
                             "--problems (docs/fleet.md)")
    parser.add_argument("--blocked-layout", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="let the search run convolutions in the channel-blocked layout "
                        "where that is measured to pay, or keep every step NCHW with "
                        "--no-blocked-layout (default: FASTRUN_BLOCKED_LAYOUT, on)")
    parser.add_argument("--no-replay", action="store_true",
                        help="on the OpenCL device, issue every step through its algorithm on "
                        "every run instead of replaying the recorded launches (default: "
                        "FASTRUN_REPLAY, on)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cpu:THREADS, "
                        "opencl[:PLATFORM:DEVICE]")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads: the same as --device cpu:N")
    parser.add_argument("--iter", type=int, default=10, help="timed iterations (default 10)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="time iterations for this long instead of --iter of them")
    parser.add_argument("--warmup-iter", type=int, default=1,
                        help="untimed iterations first (default 1)")
    parser.add_argument("--sort", choices=("graph", "time"), default=None,
                        help="print the per-layer table (as --verbose does) in graph order "
                             "(default) or slowest step first")
    parser.add_argument("--wide", action="store_true",
                        help="print the per-layer table without cutting it to 100 columns")
    parser.add_argument("--time-peer", action="store_true",
                        help="with --check: also time onnxruntime on the same inputs, the "
                             "same number of iterations, and print the ratio")
    parser.add_argument("--verbose", action="store_true",
                        help="per-node table and search log")
    parser.add_argument("--dump-output", metavar="FILE.npz", help="save the outputs")
    parser.add_argument("--check", action="store_true",
                        help="compare the outputs with onnxruntime (exit 1 on a mismatch; needs "
                             "onnxruntime: pip install 'fastrun[check]')")
    parser.add_argument("--summary-json", metavar="FILE", help="write the summary as JSON")
    parser.add_argument("--profile-json", metavar="FILE",
                        help="write each step's algorithm, source, profiled time and in-run "
                             "time as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for item in filter(None, text.split(",")):
        name, sep, dims = item.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) < 0:
            raise argparse.ArgumentTypeError(
                f"bad --shapes item {item!r}: expected NAME:DIMS, e.g. input:1x3x224x224")
        shapes[name] = shape
    return shapes


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _read_inputs(specs: Sequence[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"bad --input {spec!r}: expected NAME=FILE.npy")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read --input {name}={path}: {error}") from None
    return feeds


#: The per-layer table's columns and their widths within 100 columns (``--wide``: uncut; the
#: input shapes are shown only there)
TABLE_COLUMNS = ("node", "op", "output", "algorithm", "source", "profiled", "in run", "share")
NARROW_WIDTHS = (15, 10, 11, 18, 9, 9, 9, 5)


def _node_table(model, step_times: list[list[float]], sort: str = "graph",
                wide: bool = False) -> str:
    """The per-layer table: each step's algorithm, where its decision came from, its time in
    the search and inside whole inferences, and that time's share of their sum; in graph
    order or slowest first (``sort="time"``), within 100 columns unless ``wide``."""
    medians = (np.median(np.asarray(step_times), axis=0) if step_times
               else [None] * len(model.reports))
    total = sum(m for m in medians if m is not None)
    rows = []
    for report, seconds in zip(model.reports, medians, strict=True):
        step = report.step
        output = "x".join(map(str, step.output.shape))
        if wide:
            output = ",".join("x".join(map(str, v.shape)) + ("c" if v.is_const else "")
                              for v in step.inputs) + " -> " + output
        profiled = None if report.decision is None else report.decision.policy.time_s
        share = f"{seconds / total:.0%}" if seconds is not None and total > 0 else ""
        rows.append((seconds, (step.node, step.op_type, output, report.algorithm,
                               report.source, formatting.human_seconds(profiled),
                               formatting.human_seconds(seconds), share)))
    if sort == "time":
        rows.sort(key=lambda row: (row[0] is None, -(row[0] or 0.0)))  # untimed last
    header = TABLE_COLUMNS if not wide else ("node", "op", "inputs -> output",
                                             *TABLE_COLUMNS[3:])
    table = [header, *(cells for _, cells in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    if not wide:
        widths = [min(width, cap) for width, cap in zip(widths, NARROW_WIDTHS, strict=True)]
    lines = []
    for row in table:
        cells = [cell if len(cell) <= width else cell[:width - 1] + "~"
                 for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(cells, widths,
                                                                         strict=True)).rstrip())
    for report in model.reports:
        if report.decision is not None and report.decision.policy.neighbour is not None:
            lines.append(f"{report.step.node}: nearest {report.decision.policy.neighbour_text()}")
    lines.extend(textwrap.wrap(
        "profiled: the search's time for the step alone, its inputs in cache and its threads "
        "awake; in run: its median inside whole inferences, after the step before it "
        "(docs/runtime.md says why they differ); share: of the steps' sum"
        + ("" if wide else "; --wide: uncut, with the input shapes"), 100))
    return "\n".join(lines)


def _onnxruntime_session(model_spec: str, threads: int | None = None) -> Any:
    """onnxruntime's CPU session for the model (``threads`` intra-op threads, else its
    default)."""
    try:
        import onnxruntime
    except ImportError:
        raise ValueError(no_onnxruntime()) from None
    from fastrun.runtime.graph import load_model_proto

    proto = load_model_proto(model_spec)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(proto.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def _time_onnxruntime(model_spec: str, feeds, iterations: int, warmup: int,
                      threads: int | None) -> tuple[str, list[float]]:
    """(onnxruntime's version, its seconds per inference) on the same inputs, the same counts
    of warm-up and timed runs, in this process after fastrun's loop: a diagnostic beside the
    run (two runtimes' thread pools in one process can hold each other up;
    ``benchmarks/bench_scaling.py`` times each in its own)."""
    import onnxruntime

    session = _onnxruntime_session(model_spec, threads)
    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return onnxruntime.__version__, times


def _check_with_onnxruntime(model_spec: str, model, feeds, outputs
                            ) -> tuple[bool, str, float | None]:
    """(every output within tolerance, the report, the largest relative difference)."""
    session = _onnxruntime_session(model_spec)
    try:
        expected = session.run(None, feeds)
    except Exception as error:  # onnxruntime's own error types; the message says what
        raise ValueError(f"--check: onnxruntime could not run the model: {error}") from None
    lines, ok, worst = [], True, None
    for name, reference in zip(model.graph.outputs, expected, strict=True):
        got = outputs[name]
        if got.shape != reference.shape:
            ok = False
            lines.append(f"  {name}: shape {list(got.shape)}, onnxruntime {list(reference.shape)}")
            continue
        scale = float(np.max(np.abs(reference))) if reference.size else 0.0
        diff = float(np.max(np.abs(got.astype(np.float64) - reference))) if got.size else 0.0
        relative = diff / max(scale, 1e-30)
        tolerance = {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 1e-3}.get(got.dtype,
                                                                                1e-9)
        good = relative <= tolerance or diff == 0.0
        ok &= good
        worst = relative if worst is None else max(worst, relative)
        lines.append(f"  {name}: max abs diff {diff:.3g} ({relative:.2e} of the largest "
                     f"output), {'ok' if good else 'MISMATCH'} (tolerance {tolerance:g})")
    return ok, "check against onnxruntime:\n" + "\n".join(lines), worst


def no_onnxruntime() -> str:
    """The error for --check without onnxruntime, naming the install command that works for
    this install: from a checkout (an editable install), its ``check`` extra there; otherwise
    onnxruntime itself (a package named fastrun on the public index is another project)."""
    import fastrun

    checkout = os.path.dirname(os.path.dirname(os.path.abspath(fastrun.__file__)))
    if os.path.isfile(os.path.join(checkout, "pyproject.toml")):
        command = f"pip install -e '{checkout}[check]'"
    else:
        command = "pip install onnxruntime"
    return f"--check compares with onnxruntime, which is not installed: {command}"


def _has_onnxruntime() -> bool:
    try:
        return importlib.util.find_spec("onnxruntime") is not None
    except ValueError:  # imported as None (a test hiding it)
        return False


def _cache_mismatches(session: Any) -> list[str]:
    """For each operator whose entries in the cache were made for another category: which
    facts differ from this device's, e.g. ``conv: threads 16 (cache) vs 2 (this device)``."""
    from fastrun import category

    cached = session.cache.categories()
    lines = []
    for name in session.registry.operators():
        wanted = session.chooser.category(session.registry.operator(name))
        if wanted not in cached:
            why = category.explain(cached, wanted)
            if why:
                lines.append(f"{name}: {category.printable(why)}")
    return lines


#: output arguments whose file is written after the run: checked before it starts
OUTPUT_PATHS = ("summary_json", "profile_json", "dump_output", "record", "save_cache_to")


def argument_error(args: argparse.Namespace) -> str | None:
    """What is wrong with an argument that would otherwise fail only after the load, the
    search and the timing (minutes on a large model), or None.  A search's cache path must be
    one it can write its results to, unless ``--save-cache-to`` names where they go instead; a
    file that is not a cache fastrun reads is refused here, before its lock file would be made
    beside it."""
    problem = (unsaved.number_error("--batch", args.batch, 1)
               or unsaved.number_error("--threads", args.threads, 1))
    if problem:
        return problem
    if args.threads is not None:
        kind, _, count = args.device.partition(":")
        if kind != "cpu":
            return f"--threads sets the CPU's threads, but --device is {args.device}"
        if count and count != str(args.threads):
            return f"--threads {args.threads} and --device {args.device} disagree"
    if args.time_peer and not args.check:
        return "--time-peer times onnxruntime beside --check's comparison: add --check"
    problem = unsaved.output_paths_error(args, OUTPUT_PATHS)
    if problem:
        return problem
    if args.algo_policy and (args.fast_run or args.full_run) and not (args.save_cache_to
                                                                      or args.no_save):
        return unsaved.cache_path_error(args.algo_policy)
    return None


def run(args: argparse.Namespace) -> int:
    """Load, search, time, then report; returns the exit status (130 when Ctrl-C ended the
    timing, after reporting what was timed)."""
    from fastrun.runtime import load

    if args.check and not _has_onnxruntime():
        raise ValueError(no_onnxruntime())  # before the search, not after it
    session = _session(args)
    given = _read_inputs(args.input)
    started = time.perf_counter()
    model = load(args.model, session,
                 input_shapes={**args.shapes, **{name: a.shape for name, a in given.items()}},
                 batch=args.batch, weight_preprocess=args.weight_preprocess,
                 blocked_layout=args.blocked_layout,
                 replay=False if args.no_replay else None)
    load_seconds = time.perf_counter() - started
    feeds = {**model.random_inputs(args.seed), **given}
    started = time.perf_counter()
    try:
        model.search()
    finally:
        unsaved.finish(session.cache, args.save_cache_to, "load_and_run")
    search_wall = time.perf_counter() - started
    table = args.verbose or args.sort is not None or args.wide
    interrupted = False
    try:
        outputs, totals, step_times = time_iterations(
            model, feeds, max(args.iter, 1), args.warmup_iter,
            table or bool(args.profile_json), args.duration)
    except TimingInterrupted as stop:
        if not stop.totals:
            raise
        outputs, totals, step_times, interrupted = (stop.outputs, stop.totals,
                                                    stop.step_times, True)
    if table:
        print(_node_table(model, step_times, args.sort or "graph", args.wide))
        print()
    summary = _summary(args, model, session, load_seconds, search_wall, totals)
    _print_summary(args, model, session, summary, search_wall, interrupted)
    if interrupted:  # what was timed is reported; the rest of the run is not done
        print(f"load_and_run: interrupted during the timing; the figures above are from the "
              f"{len(totals)} iteration(s) timed before it", file=sys.stderr)
        return 130
    status = 0
    if args.check:
        ok, text, worst = _check_with_onnxruntime(args.model, model, feeds, outputs)
        print(text)
        summary["check"] = "ok" if ok else "mismatch"
        summary["check_max_relative_diff"] = worst
        status = 0 if ok else 1
        if args.time_peer:
            _print_peer(args, model, session, feeds, summary)
    if args.dump_output:
        np.savez(args.dump_output, **outputs)
    stats = session.stats
    from fastrun.analysis.gain import gain_over_heuristic

    gain = gain_over_heuristic(model) if stats.profiled or stats.cache_hits else None
    summary["gain_over_heuristic"] = gain
    if gain is not None:
        left_out = (f"; {gain['unmatched']} other measured step(s) left out: their "
                    "heuristic pick is not among the entries kept (a cache keeps each "
                    "problem's Pareto front of time and workspace, not every candidate)"
                    if gain["unmatched"] else "")
        print(f"gain       {gain['speedup']:.2f}x over the heuristic's picks on the "
              f"{gain['steps']} step(s) where both were measured (profiled times: "
              f"{gain['heuristic_ms']:.3f} ms -> {gain['chosen_ms']:.3f} ms){left_out}")
    if args.summary_json:
        with open(args.summary_json, "w") as stream:
            json.dump(summary, stream, indent=2)
    if args.profile_json:
        with open(args.profile_json, "w") as stream:
            json.dump(_profile(model, step_times), stream, indent=2)
    return status


def _session(args: argparse.Namespace) -> Any:
    """The session the arguments ask for (kept in ``args.session`` for the Ctrl-C message)."""
    from fastrun.api import Session

    cache_only = args.algo_policy and not (args.fast_run or args.full_run)
    if cache_only and not os.path.exists(args.algo_policy):
        print(f"load_and_run: warning: cache {args.algo_policy} does not exist; every choice "
              "falls back to the heuristic (add --fast-run to search and create it)",
              file=sys.stderr)
    args.session = Session(device=args.device, cache=unsaved.session_cache(args),
                           strategy=strategy_from(args), workspace_limit=args.workspace_limit,
                           budget_s=args.budget, record=args.record, nearest=args.nearest,
                           progress=False if args.no_progress else None)
    return args.session


def _summary(args: argparse.Namespace, model, session, load_seconds: float,
             search_wall: float, totals: list[float]) -> dict[str, Any]:
    """What ``--summary-json`` writes (the run's figures in milliseconds)."""
    stats = session.stats
    plan = model.layout_plan
    milliseconds = np.asarray(totals) * 1e3
    return {
        "model": args.model,
        "inputs": {name: list(v.shape) for name, v in model.inputs.items()},
        "device": session.device.category,
        "strategy": session.options.strategy.text(),
        "algo_policy": args.algo_policy,
        "steps": len(model.steps),
        "computed_in_float32": model.graph.float16,
        "load_seconds": load_seconds,
        "search_seconds": stats.search_seconds,
        "search_wall_seconds": search_wall,
        "profiled": stats.profiled,
        "remeasured": stats.remeasured,
        "cache_hits": stats.cache_hits,
        "nearest": stats.nearest,
        "heuristic": stats.heuristic,
        "single_choice": stats.single,
        "blocked_steps": plan.blocked_steps if plan and plan.kept else 0,
        "layout_conversions": plan.reorders if plan and plan.kept else 0,
        "layout_check": plan.end_to_end if plan else "",
        "launches": model.replay_note if model.on_device else None,
        "iterations": len(totals),
        "iter_ms_median": float(np.median(milliseconds)),
        "iter_ms_mean": float(np.mean(milliseconds)),
        "iter_ms_std": float(np.std(milliseconds)),
        "iter_ms_min": float(np.min(milliseconds)),
        "iter_ms_max": float(np.max(milliseconds)),
        "iter_ms_p50": _percentile(milliseconds, 50),
        "iter_ms_p90": _percentile(milliseconds, 90),
        "iter_ms_p99": _percentile(milliseconds, 99),
        "inferences_per_second": len(totals) / sum(totals),
        "samples_per_second": len(totals) * _batch(model) / sum(totals),
        "iter_ms": milliseconds.tolist(),
        "fastrun_version": __version__,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _print_summary(args: argparse.Namespace, model, session, summary: dict[str, Any],
                   search_wall: float, interrupted: bool) -> None:
    """The model, strategy, search, layout, launch and run lines, and the cache warnings."""
    stats = session.stats
    plan = model.layout_plan
    half = set(model.graph.float16_inputs)
    print(f"model      {args.model}  inputs "
          + ", ".join(f"{n} {'float16' if n in half else v.dtype}{list(v.shape)}"
                      for n, v in model.inputs.items()))
    if model.graph.float16:
        print("dtype      float16, computed in float32 (fastrun has no float16 kernels): "
              "float16 inputs are converted, float16 outputs cast back")
    print(f"strategy   {summary['strategy']}"
          + (f", cache {args.algo_policy}" if args.algo_policy else ""))
    print(f"search     {search_wall:.2f} s: {stats.profiled} problem(s) profiled"
          + (f" ({stats.remeasured} low-confidence cached pick(s) measured again)"
             if stats.remeasured else "") + ", "
          f"{stats.cache_hits} cache hit(s), "
          + (f"{stats.nearest} from the nearest measured problem, " if stats.nearest else "")
          + f"{stats.heuristic} heuristic, {stats.single} with a single algorithm")
    if plan is not None and plan.blocked_steps:
        kept = (f"{plan.blocked_steps} step(s) in nchw16c, {plan.reorders} conversion(s)"
                if plan.kept else f"all NCHW (a plan of {plan.blocked_steps} blocked step(s) "
                "was slower end to end)")
        print(f"layout     {kept}" + (f"; {plan.end_to_end}" if plan.end_to_end else ""))
    if model.on_device:
        print(f"launches   {model.replay_note or 'issued step by step'}")
    stopped = " (interrupted)" if interrupted else ""
    print(f"run        {summary['iterations']} iteration(s){stopped}: median "
          f"{summary['iter_ms_median']:.3f} ms, mean {summary['iter_ms_mean']:.3f} ms "
          f"(std {summary['iter_ms_std']:.3f}), min {summary['iter_ms_min']:.3f} ms; "
          f"p90 {summary['iter_ms_p90']:.3f} ms, p99 {summary['iter_ms_p99']:.3f} ms; "
          f"{summary['inferences_per_second']:.1f} inferences/s "
          f"({summary['samples_per_second']:.1f} samples/s)")
    _warn_about_the_cache(args, session)


def _warn_about_the_cache(args: argparse.Namespace, session) -> None:
    """A cache-only run that mostly missed its cache says which facts differ (on stderr);
    ``--verbose`` lists them anyway."""
    stats = session.stats
    cache_only = args.algo_policy and not (args.fast_run or args.full_run)
    decided = stats.cache_hits + stats.heuristic + stats.profiled + stats.nearest
    mismatches = _cache_mismatches(session) if args.algo_policy else []
    unusable = getattr(session.cache, "unwritable", None) is not None and not len(session.cache)
    if args.algo_policy and decided and stats.cache_hits < MISMATCH_SHARE * decided \
            and cache_only and not unusable:  # an unusable file was reported already
        print(f"load_and_run: warning: {decided - stats.cache_hits} of {decided} problems were "
              f"not in {args.algo_policy}; was it made for another model, device "
              f"({session.device.category}) or fastrun version? Search with --fast-run to "
              "add them.", file=sys.stderr)
        for line in mismatches:
            print(f"  {line}", file=sys.stderr)
    elif args.verbose and mismatches:
        print("cache entries that do not apply to this device:")
        for line in mismatches:
            print(f"  {line}")


def _print_peer(args: argparse.Namespace, model, session, feeds,
                summary: dict[str, Any]) -> None:
    """``--time-peer``: onnxruntime (CPU, the model's thread count on a CPU device) timed on
    the same inputs and counts, and the ratio of the medians."""
    threads = getattr(session.device, "threads", None)
    version, times = _time_onnxruntime(args.model, feeds, summary["iterations"],
                                       args.warmup_iter, threads)
    peer_ms = float(np.median(times) * 1e3)
    ratio = summary["iter_ms_median"] / peer_ms
    summary.update(peer="onnxruntime " + version, peer_ms_median=peer_ms,
                   peer_ms_mean=float(np.mean(times) * 1e3), ratio_vs_peer=ratio)
    where = f"CPU, {threads} thread(s)" if threads else "CPU, its default threads"
    print(f"peer       onnxruntime {version} ({where}): median {peer_ms:.3f} ms over "
          f"{len(times)} iteration(s); fastrun/onnxruntime {ratio:.2f} (both in this process, "
          "one after the other: a diagnostic; benchmarks/bench_scaling.py times each in its "
          "own processes)")


def _batch(model) -> int:
    """The first input's first dimension: samples per inference."""
    shapes = [v.shape for v in model.inputs.values()]
    return int(shapes[0][0]) if shapes and shapes[0] else 1


def _profile(model, step_times: list[list[float]]) -> dict[str, Any]:
    """Each step's choice with its profiled time (what the search measured, the problem alone,
    inputs warm in cache) beside its in-run time (the median inside whole inferences, after
    the previous step): the two differ by the state each step inherits."""
    medians = np.median(np.asarray(step_times), axis=0) if step_times else []
    steps = []
    for index, report in enumerate(model.reports):
        step, decision = report.step, report.decision
        in_run = float(medians[index]) if len(medians) else None
        profiled = None if decision is None else decision.policy.time_s
        steps.append({
            "node": step.node, "op_type": step.op_type, "operator": step.operator,
            "key": None if step.problem is None else step.problem.key,
            "algorithm": report.algorithm, "source": report.source,
            "profiled_ms": None if profiled is None else profiled * 1e3,
            "in_run_ms": None if in_run is None else in_run * 1e3,
        })
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "iterations": len(step_times),
            "steps": steps}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    unsaved.quiet_warnings()
    unsaved.quiet_interrupted_finalizers()
    if args.duration is not None and not 0 < args.duration < float("inf"):
        print("load_and_run: error: --duration must be a positive number of seconds",
              file=sys.stderr)
        return 2
    if args.iter < 1 or args.warmup_iter < 0:
        print("load_and_run: error: --iter must be >= 1 and --warmup-iter >= 0", file=sys.stderr)
        return 2
    problem = argument_error(args)
    if problem:
        print(f"load_and_run: error: {problem}", file=sys.stderr)
        return 2
    if args.threads is not None:
        args.device = f"cpu:{args.threads}"
    from fastrun.core.chooser import NoUsableAlgorithmError
    from fastrun.registry import RegistryError

    try:
        return run(args)
    except BrokenPipeError:
        return pipes.closed()
    except (NoUsableAlgorithmError, RegistryError, ValueError, OSError) as error:
        print(f"load_and_run: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return unsaved.interrupted(getattr(args, "session", None), args.algo_policy,
                                   "load_and_run")


if __name__ == "__main__":
    sys.exit(main())
