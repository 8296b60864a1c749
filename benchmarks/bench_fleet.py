"""Fleet tuning: what a second worker buys, whether the picks hold, and fleets on paper.

1. Collects the zoo models' problems (``fastrun tune``'s jobs, sub-problems included) at
   ``--device cpu:1``.
2. Tunes them into an empty cache with one local worker, then into another empty cache with
   ``--workers`` workers (each pinned to a core of its own), in this run: the ratio of the two
   wall times is the speed-up (target: at least 1.8x with 2 workers on 2 cores).
3. Compares the picks: for every problem both tunes measured, the one-worker pick against the
   many-worker pick.  Where they differ, the two picks are timed again against each other in
   this process (3 rankings; the cache keeps only each problem's Pareto front, so the other
   run's time of a pick is often not there), and the difference counts as noise when the
   slower is within ``--noise`` of the faster.
   The same comparison between two one-worker tunes (``--repeat``, on by default) measures
   how often a tune disagrees with itself: the floor the many-worker disagreements are read
   against.
4. Replays the one-worker tune's times on 2, 8, 64 and 512 workers (``fastrun tune
   --simulate``): predicted wall time, speed-up and parallel efficiency (target: at least
   80% at 64 workers).

    python -m benchmarks.bench_fleet [--models resnet18,...] [--workers 2] [--budget 0.05]
        [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from benchmarks._common import header, model_spec

ZOO = "resnet18,resnet50,mobilenet_v2,squeezenet,vgg16"
DEVICE = "cpu:1"


def _tune(jobs, cache: str, workers: int, budget: float) -> tuple[float, object]:
    from fastrun.fleet.tune import tune

    started = time.perf_counter()
    summary = tune(jobs, cache, device=DEVICE, workers=workers, budget_s=budget, stream=None)
    return time.perf_counter() - started, summary


def _agreement(jobs, first: str, second: str, noise: float, rounds: int = 3) -> dict:
    """Same picks, and where they differ, whether the difference is noise: both picks are
    timed again against each other in this process (``rounds`` rankings, interleaved by the
    profiler's confirmation), and the pick of the slower of them is within ``noise`` of the
    faster's."""
    import statistics

    import fastrun
    from fastrun.cache import FileCache, InMemoryCache

    a, b = FileCache(first), FileCache(second)
    referee = fastrun.Session(device=DEVICE, cache=InMemoryCache(), strategy="fast-run",
                              progress=False, nearest=0.0)
    known = {}
    for cache in (a, b):  # the referee decides sub-problems as the tunes did
        for category, key, entries in cache:
            known.setdefault((category, key), entries)
    for (category, key), entries in known.items():
        referee.cache.put(category, key, entries)
    same = noisy = differ = 0
    disagreements = []
    for job in jobs:
        ea, eb = a.get(*job.ident), b.get(*job.ident)
        if not ea or not eb:
            continue
        pick_a = min(ea, key=lambda e: e.time_s).algorithm
        pick_b = min(eb, key=lambda e: e.time_s).algorithm
        if pick_a == pick_b:
            same += 1
            continue
        times: dict[str, list[float]] = {pick_a: [], pick_b: []}
        for _ in range(rounds):
            result, _ = referee.chooser.rank(job.problem(), only=[pick_a, pick_b])
            for entry in result.entries:
                times[entry.algorithm].append(entry.time_s)
        medians = {name: statistics.median(t) for name, t in times.items() if t}
        ratio = (max(medians.values()) / min(medians.values()) if len(medians) == 2
                 else float("inf"))
        if ratio <= 1 + noise:
            noisy += 1
        else:
            differ += 1
            disagreements.append({"problem": f"{job.operator}({job.key})",
                                  "one_worker": pick_a, "many_workers": pick_b,
                                  "referee_s": medians, "ratio": ratio})
    return {"same": same, "within_noise": noisy, "outside_noise": differ,
            "disagreements": disagreements}


def _print_agreement(against: str, agreement: dict, noise: float) -> None:
    print(f"picks      {against} against 1 worker: {agreement['same']} same, "
          f"{agreement['within_noise']} different within {noise:.0%} noise, "
          f"{agreement['outside_noise']} different beyond it")
    for item in agreement["disagreements"][:10]:
        print(f"  {item['problem'][:90]}: 1 worker {item['one_worker']}, {against} "
              f"{item['many_workers']}, timed again: {item['ratio']:.2f}x apart")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=ZOO)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.05,
                        help="seconds of timed repeats per candidate (fastrun's default is 0.2; "
                             "less keeps the two tunes short, the ratio is what counts)")
    parser.add_argument("--noise", type=float, default=0.10,
                        help="relative time difference counted as noise between the picks")
    parser.add_argument("--no-repeat", dest="repeat", action="store_false",
                        help="skip the second one-worker tune (the self-disagreement floor)")
    parser.add_argument("--keep", help="keep the caches and times logs in this directory")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    from fastrun.fleet.tune import collect, default_times_path, simulate_times

    models = [model_spec(m) for m in args.models.split(",")]
    print(header(f"fleet tuning at --device {DEVICE}: 1 worker, then {args.workers}, "
                 f"budget {args.budget} s per candidate"))
    jobs = collect(models, device=DEVICE)
    print(f"jobs       {len(jobs)} problems of {', '.join(models)} (sub-problems included)")
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.keep or scratch
        os.makedirs(directory, exist_ok=True)
        one_cache = os.path.join(directory, "one-worker.bin")
        many_cache = os.path.join(directory, f"{args.workers}-workers.bin")
        again_cache = os.path.join(directory, "one-worker-again.bin")
        for path in (one_cache, many_cache, again_cache):
            for stale in (path, default_times_path(path)):
                if os.path.exists(stale):
                    os.remove(stale)
        one_s, one = _tune(collect(models, device=DEVICE), one_cache, 1, args.budget)
        print(f"1 worker   {one_s:.1f} s wall, {one.tuned} tuned, {len(one.failed)} failed",
              flush=True)
        many_s, many = _tune(collect(models, device=DEVICE), many_cache, args.workers,
                             args.budget)
        counts = ", ".join(f"{w.name} {w.tuned}" for w in many.workers)
        print(f"{args.workers} workers  {many_s:.1f} s wall, {many.tuned} tuned, "
              f"{len(many.failed)} failed ({counts})")
        speedup = one_s / many_s
        print(f"speed-up   **{speedup:.2f}x** with {args.workers} workers over 1 "
              f"(target >= 1.8 for 2 workers on 2 cores)")
        agreement = _agreement(jobs, one_cache, many_cache, args.noise)
        _print_agreement(f"{args.workers} workers", agreement, args.noise)
        repeat = None
        if args.repeat:
            again_s, _ = _tune(collect(models, device=DEVICE), again_cache, 1, args.budget)
            repeat = _agreement(jobs, one_cache, again_cache, args.noise)
            print(f"1 worker again {again_s:.1f} s wall: the floor a tune disagrees with itself")
            _print_agreement("1 worker again", repeat, args.noise)
        simulated = simulate_times(default_times_path(one_cache), [2, 8, 64, 512])
        print("\n| workers | predicted wall s | speed-up | parallel efficiency |")
        print("| --- | --- | --- | --- |")
        for result in simulated:
            print(f"| {result.workers} | {result.makespan_s:.1f} | {result.speedup:.2f} | "
                  f"{result.efficiency:.0%} |")
        print(f"(one worker: {simulated[0].serial_s:.1f} s of search; the longest chain of "
              f"dependent jobs: {simulated[0].critical_path_s:.1f} s)")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as stream:
                json.dump({"jobs": len(jobs), "one_worker_s": one_s, "many_workers_s": many_s,
                           "workers": args.workers, "speedup": speedup,
                           "agreement": agreement, "repeat_agreement": repeat,
                           "simulated": [{"workers": r.workers, "makespan_s": r.makespan_s,
                                          "speedup": r.speedup, "efficiency": r.efficiency}
                                         for r in simulated]}, stream, indent=1)


if __name__ == "__main__":
    main()
