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
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from fastrun._version import __version__
from fastrun.cli import formatting, pipes, unsaved
from fastrun.cli.main import add_strategy_arguments, strategy_from
from fastrun.formats import PROFILE_FORMAT, PROFILE_VERSION

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
    parser.add_argument("--blocked-layout", action="store_true",
                        help="let the search run convolutions in the channel-blocked layout "
                        "where that is measured to pay (default: FASTRUN_BLOCKED_LAYOUT, off)")
    parser.add_argument("--no-replay", action="store_true",
                        help="on the OpenCL device, issue every step through its algorithm on "
                        "every run instead of replaying the recorded launches (default: "
                        "FASTRUN_REPLAY, on)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cpu:THREADS, "
                        "opencl[:PLATFORM:DEVICE]")
    parser.add_argument("--iter", type=int, default=10, help="timed iterations (default 10)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="time iterations for this long instead of --iter of them")
    parser.add_argument("--warmup-iter", type=int, default=1,
                        help="untimed iterations first (default 1)")
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


def time_iterations(model, feeds, iterations: int, warmup: int, per_step: bool,
                     duration: float | None = None,
                     ) -> tuple[dict[str, np.ndarray], list[float], list[list[float]]]:
    """``iterations`` timed runs after ``warmup`` untimed ones, or as many as fit in
    ``duration`` seconds (at least one): what `load_and_run` and `fastrun report --model`
    time."""
    outputs = {}
    for _ in range(warmup):
        outputs = model.run(feeds)
    totals, step_times = [], []
    ends = None if duration is None else time.perf_counter() + duration
    while (len(totals) < iterations) if ends is None else (
            not totals or time.perf_counter() < ends):
        started = time.perf_counter()
        if per_step:
            outputs, times = model.run_timed(feeds)
            step_times.append(times)
        else:
            outputs = model.run(feeds)
        totals.append(time.perf_counter() - started)
    return outputs, totals, step_times


def _node_table(model, step_times: list[list[float]]) -> str:
    medians = (np.median(np.asarray(step_times), axis=0) if step_times
               else [None] * len(model.reports))
    rows = [("node", "op", "inputs -> output", "algorithm", "source", "profiled", "in run")]
    for report, seconds in zip(model.reports, medians, strict=True):
        step = report.step
        shapes = ",".join("x".join(map(str, v.shape)) + ("c" if v.is_const else "")
                          for v in step.inputs)
        shapes += " -> " + "x".join(map(str, step.output.shape))
        profiled = None if report.decision is None else report.decision.policy.time_s
        rows.append((step.node, step.op_type, shapes, report.algorithm, report.source,
                     formatting.human_seconds(profiled), formatting.human_seconds(seconds)))
    widths = [min(max(len(r[i]) for r in rows), cap)
              for i, cap in enumerate((28, 28, 48, 40, 9, 12, 12))]
    lines = []
    for row in rows:
        cells = [cell if len(cell) <= width else cell[:width - 1] + "~"
                 for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(cells, widths,
                                                                         strict=True)))
    for report in model.reports:
        if report.decision is not None and report.decision.policy.neighbour is not None:
            lines.append(f"{report.step.node}: nearest {report.decision.policy.neighbour_text()}")
    lines.append("profiled: the search's time for the step alone, its inputs in cache and its "
                 "threads awake; in run: its median inside whole inferences, after the step "
                 "before it (docs/runtime.md says why they differ)")
    return "\n".join(lines)


def _check_with_onnxruntime(model_spec: str, model, feeds, outputs
                            ) -> tuple[bool, str, float | None]:
    """(every output within tolerance, the report, the largest relative difference)."""
    try:
        import onnxruntime
    except ImportError:
        raise ValueError(NO_ONNXRUNTIME) from None
    from fastrun.runtime.graph import load_model_proto

    proto = load_model_proto(model_spec)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(proto.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
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
        tolerance = 1e-3 if got.dtype == np.float32 else 1e-9
        good = relative <= tolerance or diff == 0.0
        ok &= good
        worst = relative if worst is None else max(worst, relative)
        lines.append(f"  {name}: max abs diff {diff:.3g} ({relative:.2e} of the largest "
                     f"output), {'ok' if good else 'MISMATCH'} (tolerance {tolerance:g})")
    return ok, "check against onnxruntime:\n" + "\n".join(lines), worst


NO_ONNXRUNTIME = ("--check compares with onnxruntime, which is not installed: "
                  "pip install 'fastrun[check]' (or pip install onnxruntime)")


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
    if args.batch is not None and args.batch < 1:
        return f"--batch must be >= 1, got {args.batch}"
    for name in OUTPUT_PATHS:
        path = getattr(args, name, None)
        if path:
            problem = _unwritable(path)
            if problem:
                return f"--{name.replace('_', '-')} {path}: {problem}"
    if args.algo_policy and (args.fast_run or args.full_run) and not args.save_cache_to:
        from fastrun.cache import file as cache_file

        found = cache_file.probe(args.algo_policy)
        unusable = found.detail if found.kind in (
            cache_file.NOT_A_FILE, cache_file.FOREIGN, cache_file.NEWER, cache_file.TOO_LARGE,
            cache_file.UNREADABLE) else None
        if found.kind in cache_file.READABLE and not os.access(args.algo_policy, os.W_OK):
            unusable = "is read-only"
        if unusable:
            return (f"--algo-policy {args.algo_policy} {unusable}: the search's results "
                    "could not be saved there (name another file, or add --save-cache-to "
                    "FILE to save them elsewhere)")
        if found.kind == cache_file.MISSING:
            problem = _unwritable(args.algo_policy)
            if problem:
                return f"--algo-policy {args.algo_policy}: {problem}"
    return None


def _unwritable(path: str) -> str | None:
    """Why a file could not be written at ``path`` (a directory there, or no directory to hold
    it), or None."""
    if os.path.isdir(path):
        return "is a directory, not a file"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {folder} is not writable"
    return None


def run(args: argparse.Namespace) -> int:
    from fastrun.api import Session
    from fastrun.cache import InMemoryCache
    from fastrun.runtime import load

    if args.check and not _has_onnxruntime():
        raise ValueError(NO_ONNXRUNTIME)  # before the search, not after it
    cache_only = args.algo_policy and not (args.fast_run or args.full_run)
    if cache_only and not os.path.exists(args.algo_policy):
        print(f"load_and_run: warning: cache {args.algo_policy} does not exist; every choice "
              "falls back to the heuristic (add --fast-run to search and create it)",
              file=sys.stderr)
    session = Session(device=args.device,
                      cache=args.algo_policy if args.algo_policy else InMemoryCache(),
                      strategy=strategy_from(args), workspace_limit=args.workspace_limit,
                      budget_s=args.budget, record=args.record, nearest=args.nearest,
                      progress=False if args.no_progress else None)
    args.session = session  # for the Ctrl-C message
    given = _read_inputs(args.input)
    started = time.perf_counter()
    model = load(args.model, session,
                 input_shapes={**args.shapes, **{name: a.shape for name, a in given.items()}},
                 batch=args.batch, weight_preprocess=args.weight_preprocess,
                 blocked_layout=True if args.blocked_layout else None,
                 replay=False if args.no_replay else None)
    load_seconds = time.perf_counter() - started
    feeds = {**model.random_inputs(args.seed), **given}
    started = time.perf_counter()
    try:
        model.search()
    finally:
        unsaved.finish(session.cache, args.save_cache_to, "load_and_run")
    search_wall = time.perf_counter() - started
    stats = session.stats
    outputs, totals, step_times = time_iterations(
        model, feeds, max(args.iter, 1), args.warmup_iter,
        args.verbose or bool(args.profile_json), args.duration)

    if args.verbose:
        print(_node_table(model, step_times))
        print()
    decided = stats.cache_hits + stats.heuristic + stats.profiled + stats.nearest
    plan = model.layout_plan
    summary: dict[str, Any] = {
        "model": args.model,
        "inputs": {name: list(v.shape) for name, v in model.inputs.items()},
        "device": session.device.category,
        "strategy": session.options.strategy.text(),
        "algo_policy": args.algo_policy,
        "steps": len(model.steps),
        "load_seconds": load_seconds,
        "search_seconds": stats.search_seconds,
        "search_wall_seconds": search_wall,
        "profiled": stats.profiled,
        "cache_hits": stats.cache_hits,
        "nearest": stats.nearest,
        "heuristic": stats.heuristic,
        "single_choice": stats.single,
        "blocked_steps": plan.blocked_steps if plan and plan.kept else 0,
        "layout_conversions": plan.reorders if plan and plan.kept else 0,
        "layout_check": plan.end_to_end if plan else "",
        "launches": model.replay_note if model.on_device else None,
        "iterations": len(totals),
        "iter_ms_median": float(np.median(totals) * 1e3),
        "iter_ms_min": float(np.min(totals) * 1e3),
        "iter_ms_max": float(np.max(totals) * 1e3),
        "iter_ms_p50": _percentile(totals, 50) * 1e3,
        "iter_ms_p90": _percentile(totals, 90) * 1e3,
        "iter_ms_p99": _percentile(totals, 99) * 1e3,
        "inferences_per_second": len(totals) / sum(totals),
        "samples_per_second": len(totals) * _batch(model) / sum(totals),
        "iter_ms": [t * 1e3 for t in totals],
        "fastrun_version": __version__,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    print(f"model      {args.model}  inputs "
          + ", ".join(f"{n} {v.dtype}{list(v.shape)}" for n, v in model.inputs.items()))
    print(f"strategy   {summary['strategy']}"
          + (f", cache {args.algo_policy}" if args.algo_policy else ""))
    print(f"search     {search_wall:.2f} s: {stats.profiled} problem(s) profiled, "
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
    print(f"run        {len(totals)} iteration(s): median {summary['iter_ms_median']:.3f} ms, "
          f"min {summary['iter_ms_min']:.3f} ms; p90 {summary['iter_ms_p90']:.3f} ms, "
          f"p99 {summary['iter_ms_p99']:.3f} ms; {summary['inferences_per_second']:.1f} "
          f"inferences/s ({summary['samples_per_second']:.1f} samples/s)")
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
    status = 0
    if args.check:
        ok, text, worst = _check_with_onnxruntime(args.model, model, feeds, outputs)
        print(text)
        summary["check"] = "ok" if ok else "mismatch"
        summary["check_max_relative_diff"] = worst
        status = 0 if ok else 1
    if args.dump_output:
        np.savez(args.dump_output, **outputs)
    gain = model.gain_over_heuristic() if stats.profiled or stats.cache_hits else None
    summary["gain_over_heuristic"] = gain
    if gain is not None:
        print(f"gain       {gain['speedup']:.2f}x over the heuristic's picks on the "
              f"{gain['steps']} step(s) where both were measured (profiled times: "
              f"{gain['heuristic_ms']:.3f} ms -> {gain['chosen_ms']:.3f} ms)")
    if args.summary_json:
        with open(args.summary_json, "w") as stream:
            json.dump(summary, stream, indent=2)
    if args.profile_json:
        with open(args.profile_json, "w") as stream:
            json.dump(_profile(model, step_times), stream, indent=2)
    return status


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
