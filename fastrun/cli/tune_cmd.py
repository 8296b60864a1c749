"""``fastrun tune``: tune the problems of models, suites and recorded problems files into one
cache, on local processes or one worker per node of a Ray cluster; or, with ``--simulate``,
replay an earlier tune's times on fleets of any size (docs/fleet.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from fastrun.cli import unsaved
from fastrun.cli.options import add_search_limits


def add_parser(commands) -> None:
    tune = commands.add_parser(
        "tune", help="tune models', suites' or recorded problems into one cache, on several "
                     "workers (local processes or a Ray cluster)",
        description="Search every problem of the given models, suites and problems files that "
                    "the cache does not hold yet, one worker per machine (Ray) or per local "
                    "process, sub-problems before their parents, writing each result into the "
                    "cache as it arrives (an interrupted tune resumes). With --simulate, replay "
                    "the search times an earlier tune logged on fleets of the given sizes.")
    tune.add_argument("models", nargs="*", metavar="MODEL",
                      help="zoo:NAME (zoo:NAME@PIXELS for another image size) or model.onnx")
    tune.add_argument("--suite", action="append", default=[], metavar="NAME",
                      help="a built-in problem suite (repeatable; fastrun rank --help lists "
                           "them)")
    tune.add_argument("--problems", action="append", default=[], metavar="FILE",
                      help="a problems file recorded with load_and_run --record or "
                           "FASTRUN_RECORD (repeatable)")
    tune.add_argument("--algo-policy", dest="algo_policy", metavar="CACHE",
                      help="the cache file to tune into (created if needed; required unless "
                           "--simulate)")
    tune.add_argument("--batch", type=int, default=None,
                      help="batch size of the models' symbolic batch (default 1)")
    tune.add_argument("--device", default="cpu",
                      help="each worker's device: cpu (default), cpu:THREADS, opencl[:P:D]; "
                           "the target category is this device's on the driver's machine")
    tune.add_argument("--ray", metavar="ADDRESS",
                      help="run one worker per node of the Ray cluster at ADDRESS ('auto': "
                           "the cluster this machine belongs to); needs pip install "
                           "'fastrun[ray]'")
    tune.add_argument("--workers", default=None, metavar="N",
                      help="local worker processes (default 1, or one per GPU with --device "
                           "opencl on a machine of several); with --ray, use at most N "
                           "workers; with --simulate, fleet sizes to replay, e.g. 2,8,64,512")
    tune.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                      help="a job running longer on a worker is handed to another (default: "
                           "no limit)")
    add_search_limits(tune)
    tune.add_argument("--times", metavar="FILE",
                      help="the search-times log read for ordering and appended to (default: "
                           "CACHE.times.jsonl)")
    tune.add_argument("--simulate", metavar="TIMES",
                      help="run nothing: replay the times log TIMES on --workers fleet sizes")
    tune.add_argument("--list", action="store_true",
                      help="print the jobs (problems with their sub-problems) and stop")
    tune.add_argument("--no-progress", action="store_true",
                      help="no progress line (the summary is still printed)")
    tune.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    tune.set_defaults(handler=run)


def _counts(text: str | None, default: list[int]) -> list[int]:
    if text is None:
        return default
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"--workers {text!r}: expected a positive number (or, with "
                         "--simulate, a list such as 2,8,64,512)")
    return counts


def _simulate(args: argparse.Namespace) -> int:
    from fastrun.fleet.tune import simulate_times

    if not os.path.exists(args.simulate):
        raise ValueError(f"times log {args.simulate} does not exist (fastrun tune writes "
                         "CACHE.times.jsonl beside its cache)")
    results = simulate_times(args.simulate, _counts(args.workers, [2, 8, 64, 512]))
    first = results[0]
    print(f"simulated  {first.jobs} jobs from {args.simulate}: {first.serial_s:.1f} s on one "
          "worker; per fleet, the longest chain of dependent jobs is the least wall time any "
          "schedule could reach (more workers split long problems into more parts, so it "
          "shrinks)")
    print("| workers | wall s | longest chain s | speed-up | parallel efficiency |")
    print("| --- | --- | --- | --- | --- |")
    for result in results:
        print(f"| {result.workers} | {result.makespan_s:.1f} | {result.critical_path_s:.1f} | "
              f"{result.speedup:.2f} | {result.efficiency:.0%} |")
    if args.json:
        _write_json(args.json, [{"workers": r.workers, "jobs": r.jobs, "serial_s": r.serial_s,
                                 "makespan_s": r.makespan_s, "speedup": r.speedup,
                                 "efficiency": r.efficiency,
                                 "critical_path_s": r.critical_path_s} for r in results])
    return 0


def _write_json(path: str, data) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(data, stream, indent=1)


def run(args: argparse.Namespace) -> int:
    if args.simulate:
        return _simulate(args)
    if not args.algo_policy:
        raise ValueError("fastrun tune needs --algo-policy CACHE: the cache file to tune into")
    if not (args.models or args.suite or args.problems):
        raise ValueError("nothing to tune: give models (zoo:resnet18, model.onnx), --suite NAME "
                         "or --problems FILE")
    # before any work: the numbers, and the paths the tune writes to
    problem = (unsaved.number_error("--batch", args.batch, 1)
               or unsaved.number_error("--timeout", args.timeout, 0, strictly=True)
               or unsaved.cache_path_error(args.algo_policy, remedy="name another file")
               or unsaved.output_paths_error(args, ("json", "times")))
    if problem:
        raise ValueError(problem)
    from fastrun.fleet.engines import quiet_interrupts
    from fastrun.fleet.tune import collect, tune

    quiet_interrupts()  # the summary reports a Ctrl-C; no echo of it from native callbacks
    workers = _counts(args.workers, [1])
    if len(workers) > 1:
        raise ValueError("--workers takes one number unless --simulate is given")
    stream = None if args.no_progress else sys.stderr
    jobs = collect(args.models, args.suite, args.problems, device=args.device,
                   batch=args.batch, workspace_limit=args.workspace_limit, stream=sys.stderr)
    if args.list:
        for job in jobs:
            print(f"{job.operator}({job.key})  [{job.label}]"
                  + (f"  needs {len(job.children)}" if job.children else ""))
        print(f"{len(jobs)} job(s)")
        return 0
    print(f"tune       {len(jobs)} problem(s) for {args.device} into {args.algo_policy}, "
          + (f"Ray at {args.ray}" if args.ray else
             "local workers" if args.workers is None else f"{workers[0]} local worker(s)"),
          flush=True)
    from fastrun.fleet.driver import TuneError
    from fastrun.fleet.engines import EngineError

    try:
        summary = tune(jobs, args.algo_policy, device=args.device,
                       workers=None if args.workers is None else workers[0],
                       ray=args.ray, timeout_s=args.timeout, budget_s=args.budget,
                       workspace_limit=args.workspace_limit, times_path=args.times,
                       stream=stream)
    except (TuneError, EngineError) as error:
        print(f"fastrun tune: error: {error}", file=sys.stderr)
        return 2
    for line in summary.lines():
        print(line)
    if args.json:
        _write_json(args.json, {
            "jobs": summary.jobs, "skipped": summary.skipped, "tuned": summary.tuned,
            "failed": {f"{c}\t{k}": errors for (c, k), errors in summary.failed.items()},
            "wall_s": summary.wall_s, "serial_s": summary.serial_s,
            "speedup": summary.speedup, "interrupted": summary.interrupted,
            "close_calls": summary.close_calls, "low_confidence": summary.low_confidence,
            "workers": [vars(w) for w in summary.workers]})
    if summary.interrupted:
        return 130
    return 1 if summary.failed else 0
