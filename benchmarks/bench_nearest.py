"""Serving unseen shapes from the nearest measured problem: what it is worth, end to end.

A deployment searched its model at 224x224 pixels (``--base-sizes``: more sizes, such as
128,224,320, give neighbours on both sides of the sizes run), batch 1 and batch 8.  Then it
meets inputs nobody searched: other image sizes (160, 192, 256, 288) and batches (2, 4).  For
each such setup this script runs, each in a process of its own and alternating for
``--pairs`` rounds, a steady loop of ``--iters`` inferences with

* **nearest L**: the deployment's cache, nothing searched; a missed problem takes the choice
  of its nearest measured problem within distance L (``--limits``; fastrun's default 1.0);
* **heuristic**: the same cache with nearest serving off (``nearest=0``): a missed problem
  takes the rule of thumb, what fastrun did before;
* **fresh**: a cache searched for this very setup (the deployment's, plus a fast-run search
  of the new shapes): the best fastrun can do, at the price of a search;
* **onnxruntime**: CPU provider, the same intra-op threads, sequential.

It prints each process's median and three ratios of medians: nearest / heuristic (target <=
1.0), nearest / fresh (target <= 1.05) and fresh / onnxruntime, plus how many of the missed
problems each nearest run served from a neighbour.

    python -m benchmarks.bench_nearest [--models resnet18,mobilenet_v2] [--threads N]
        [--sizes 160,192,256,288] [--batches 2,4] [--base-sizes 224] [--limits 1.0,2.0]
        [--pairs 3] [--iters 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile

from benchmarks._common import (
    fastrun_search,
    fastrun_steady_loop,
    header,
    ort_steady_loop,
    run_worker,
)

BASE_SIZE = 224
BASE_BATCHES = (1, 8)


def _spec(model: str, size: int) -> str:
    return f"zoo:{model}" if size == BASE_SIZE else f"zoo:{model}@{size}"


# -- the worker processes ------------------------------------------------------------------------

def worker_search(args: argparse.Namespace) -> dict:
    return fastrun_search(_spec(args.model, args.size), args.batch, args.threads, args.cache)


def worker_fastrun(args: argparse.Namespace) -> dict:
    return fastrun_steady_loop(_spec(args.model, args.size), args.batch, args.threads,
                               args.cache, args.iters, args.warmup, nearest=args.nearest)


def worker_ort(args: argparse.Namespace) -> dict:
    return ort_steady_loop(_spec(args.model, args.size), args.batch, args.threads,
                           args.iters, args.warmup)


WORKERS = {"search": worker_search, "fastrun": worker_fastrun, "ort": worker_ort}


# -- the driver ----------------------------------------------------------------------------------

def _spawn(kind: str, model: str, size: int, batch: int, args: argparse.Namespace,
           cache: str | None = None, nearest: float = 1.0) -> dict:
    arguments = ["--worker", kind, "--model", model, "--size", str(size), "--batch", str(batch),
                 "--threads", str(args.threads), "--iters", str(args.iters),
                 "--warmup", str(args.warmup), "--nearest-limit", str(nearest)]
    if cache:
        arguments += ["--cache", cache]
    return run_worker("benchmarks.bench_nearest", arguments,
                      f"{kind} worker for {model} at {size} px, batch {batch}")


def measure(model: str, size: int, batch: int, base: str, args: argparse.Namespace,
            scratch: str) -> dict:
    fresh = os.path.join(scratch, f"{model}-{size}-b{batch}.bin")
    shutil.copyfile(base, fresh)
    search = _spawn("search", model, size, batch, args, fresh)
    setups = {**{f"nearest {limit:g}": (base, limit) for limit in args.limits},
              "heuristic": (base, 0.0), "fresh": (fresh, args.limits[0])}
    runs: dict[str, list[dict]] = {name: [] for name in [*setups, "ort"]}
    for _ in range(args.pairs):
        for name, (cache, limit) in setups.items():
            runs[name].append(_spawn("fastrun", model, size, batch, args, cache, limit))
        runs["ort"].append(_spawn("ort", model, size, batch, args))
    medians = {name: statistics.median(r["median_ms"] for r in results)
               for name, results in runs.items()}
    row = {"model": model, "size": size, "batch": batch, "fresh_search": search, "runs": runs,
           "medians_ms": medians, "fresh_over_ort": medians["fresh"] / medians["ort"],
           "limits": {}}
    for limit in args.limits:
        name = f"nearest {limit:g}"
        first = runs[name][0]
        row["limits"][name] = {
            "served": first["nearest"], "missed": first["nearest"] + first["heuristic"],
            "over_heuristic": medians[name] / medians["heuristic"],
            "over_fresh": medians[name] / medians["fresh"]}
    return row


def _print_row(row: dict) -> None:
    def cell(name: str) -> str:
        return ", ".join(f"{r['median_ms']:.2f}" for r in row["runs"][name])

    for name, figures in row["limits"].items():
        print(f"| {row['model']} | {row['size']} | {row['batch']} | {name} | "
              f"{figures['served']} of {figures['missed']} | {cell(name)} | "
              f"{cell('heuristic')} | {cell('fresh')} | {cell('ort')} | "
              f"**{figures['over_heuristic']:.3f}** | **{figures['over_fresh']:.3f}** | "
              f"{row['fresh_over_ort']:.2f} | {row['fresh_search']['search_s']:.1f} s |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2")
    parser.add_argument("--sizes", default="160,192,256,288",
                        help="image sizes run at batch 1 (searched: 224)")
    parser.add_argument("--base-sizes", default=str(BASE_SIZE),
                        help="image sizes the deployment searched, at each base batch (default "
                             "224; the batches run are run at 224)")
    parser.add_argument("--batches", default="2,4",
                        help="batches run at 224 pixels (searched: 1 and 8)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--pairs", type=int, default=3, help="alternating rounds of processes")
    parser.add_argument("--iters", type=int, default=20, help="timed inferences per process")
    parser.add_argument("--warmup", type=int, default=3, help="untimed inferences first")
    parser.add_argument("--limits", default="1.0", type=lambda text: [
                            float(x) for x in text.split(",")],
                        help="nearest-neighbour distance limits, one nearest run each (the "
                             "first also serves the fresh cache's misses; default 1.0)")
    parser.add_argument("--cache-dir", help="keep the searched caches here (default: temporary)")
    parser.add_argument("--json", help="write every measurement to this file")
    # worker mode (one process per measurement)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--nearest-limit", dest="nearest", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return

    setups = ([(int(s), 1) for s in args.sizes.split(",") if s]
              + [(BASE_SIZE, int(b)) for b in args.batches.split(",") if b])
    base_sizes = [int(s) for s in args.base_sizes.split(",") if s]
    print(header(f"nearest measured neighbour: {args.threads} threads, {args.pairs} "
                 f"alternating rounds of {args.iters} inferences; searched at "
                 f"{', '.join(map(str, base_sizes))} px, batches {BASE_BATCHES}"))
    print("| model | pixels | batch | limit | served by nearest | nearest ms | heuristic ms "
          "| fresh ms | onnxruntime ms | nearest/heuristic | nearest/fresh | fresh/ort "
          "| fresh search |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        cache_dir = args.cache_dir or scratch
        os.makedirs(cache_dir, exist_ok=True)
        for model in args.models.split(","):
            base = os.path.join(cache_dir, f"{model}-base.bin")
            searches = [_spawn("search", model, size, batch, args, base)
                        for size in base_sizes for batch in BASE_BATCHES]
            print(f"| {model} | {', '.join(map(str, base_sizes))} | "
                  f"{', '.join(map(str, BASE_BATCHES))} | the "
                  f"deployment's search: {sum(s['search_s'] for s in searches):.1f} s, "
                  f"{sum(s['profiled'] for s in searches)} problems | | | | | | | | | |",
                  flush=True)
            for size, batch in setups:
                row = measure(model, size, batch, base, args, cache_dir)
                rows.append(row)
                _print_row(row)
                if args.json:
                    with open(args.json, "w") as stream:
                        json.dump(rows, stream, indent=1)
    for limit in args.limits if rows else ():
        name = f"nearest {limit:g}"
        worst_heuristic = max(r["limits"][name]["over_heuristic"] for r in rows)
        worst_fresh = max(r["limits"][name]["over_fresh"] for r in rows)
        print(f"limit {limit:g}: worst nearest/heuristic {worst_heuristic:.3f} (target <= 1.0); "
              f"worst nearest/fresh {worst_fresh:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
