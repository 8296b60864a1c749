"""Many cores: fastrun against onnxruntime at each thread count, each setup in its own process.

What a user sees is what counts: a model loaded once, then a steady loop of inferences.  For
every model, batch and thread count this script

1. searches a fast-run cache at that thread count, in a process of its own (wall time shown;
   ``--heuristic`` skips it and runs heuristic-only);
2. runs ``--pairs`` alternating rounds of processes, fastrun (every variant, reading that
   cache: nothing is profiled), onnxruntime (CPU provider, the same intra-op thread count,
   sequential execution) and OpenVINO where it is installed (the ``bench`` extra; its CPU
   plugin with the same inference threads, one stream, the latency hint), each warming up and
   then timing ``--iters`` inferences;
3. prints each process's median, the ratios fastrun / onnxruntime and fastrun / OpenVINO
   (median of fastrun's process medians over the median of the peer's) and the steadiness of
   each engine: its largest process median over its smallest (target <= 1.15).

``--load N`` (or ``half``, ``all``) keeps N other processes busy, one core each, while the
timed rounds run (the searches run before, unloaded): a server shared with other work.

A ``--models`` entry ending in ``.onnx`` is a model file (a torchvision export, say), named in
the table and the cache files by its file name; the others are zoo models.

Variants compare fastrun settings in the same alternation: ``--variant wide:`` and
``--variant narrow:FASTRUN_VECTOR_BITS=256`` run two fastrun setups, each with its own cache;
``--variant "old:PYTHONPATH=OLD/algorithms:OLD"`` runs the tree at OLD (a ``git worktree`` of
an older commit), framework and compute library, beside this one.
Both engines get the same threads and no pinning.  Weight preprocessing is on, as a runtime
that loads a model once would run it.

    python -m benchmarks.bench_scaling [--models resnet18,resnet50,mobilenet_v2,squeezenet]
        [--batches 1,8] [--threads 1,2,4,8,all] [--pairs 3] [--iters 40] [--load N|half|all]
        [--no-openvino] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from dataclasses import dataclass, field

from benchmarks._common import (
    BackgroundLoad,
    fastrun_search,
    fastrun_steady_loop,
    header,
    model_label,
    model_spec,
    openvino_available,
    openvino_steady_loop,
    ort_steady_loop,
    run_worker,
)

MODELS = "resnet18,resnet50,mobilenet_v2,squeezenet"


@dataclass
class Variant:
    """A fastrun setup: a name and the environment its processes get on top of ours."""

    name: str
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        name, _, settings = text.partition(":")
        env = {}
        for item in filter(None, settings.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"bad --variant {text!r}: expected NAME:KEY=VALUE,...")
            env[key] = value
        return cls(name or "fastrun", env)


# -- the worker processes ------------------------------------------------------------------------

def worker_search(args: argparse.Namespace) -> dict:
    return fastrun_search(model_spec(args.model), args.batch, args.threads, args.cache,
                          budget_s=args.budget)


def worker_fastrun(args: argparse.Namespace) -> dict:
    return fastrun_steady_loop(model_spec(args.model), args.batch, args.threads, args.cache,
                               args.iters, args.warmup, budget_s=args.budget)


def worker_ort(args: argparse.Namespace) -> dict:
    return ort_steady_loop(model_spec(args.model), args.batch, args.threads, args.iters,
                           args.warmup)


def worker_openvino(args: argparse.Namespace) -> dict:
    return openvino_steady_loop(model_spec(args.model), args.batch, args.threads, args.iters,
                                args.warmup)


WORKERS = {"search": worker_search, "fastrun": worker_fastrun, "ort": worker_ort,
           "openvino": worker_openvino}


# -- the driver ----------------------------------------------------------------------------------

def _spawn(kind: str, model: str, batch: int, threads: int, args: argparse.Namespace,
           cache: str | None, env: dict[str, str]) -> dict:
    arguments = ["--worker", kind, "--model", model, "--batch", str(batch),
                 "--thread-count", str(threads), "--iters", str(args.iters),
                 "--warmup", str(args.warmup)]
    if cache:
        arguments += ["--cache", cache]
    if args.budget is not None:
        arguments += ["--budget", str(args.budget)]
    return run_worker("benchmarks.bench_scaling", arguments,
                      f"{kind} worker for {model} batch {batch}, {threads} threads", env)


def _spread(values: list[float]) -> float:
    return max(values) / min(values)


def measure(model: str, batch: int, threads: int, variants: list[Variant],
            args: argparse.Namespace, cache_dir: str) -> dict:
    row: dict = {"model": model_label(model), "batch": batch, "threads": threads, "variants": {}}
    caches = {}
    for index, variant in enumerate(variants):
        cache = None
        search = None
        if not args.heuristic and args.shared_search and index > 0:
            cache = caches[variants[0].name]  # the first variant's search serves them all
        elif not args.heuristic:
            cache = os.path.join(cache_dir,
                                 f"{model_label(model)}-b{batch}-t{threads}-{variant.name}.bin")
            search = _spawn("search", model, batch, threads, args, cache, variant.env)
        caches[variant.name] = cache
        row["variants"][variant.name] = {"search": search, "shared": cache is not None and
                                         search is None, "runs": []}
    peers = ["ort", *(["openvino"] if args.openvino else [])]
    for peer in peers:
        row[peer] = []
    with BackgroundLoad(args.load_processes):
        for _ in range(args.pairs):
            for variant in variants:
                result = _spawn("fastrun", model, batch, threads, args, caches[variant.name],
                                variant.env)
                row["variants"][variant.name]["runs"].append(result)
            for peer in peers:
                row[peer].append(_spawn(peer, model, batch, threads, args, None, {}))
    for peer in peers:
        times = [r["median_ms"] for r in row[peer]]
        row[f"{peer}_median_ms"] = statistics.median(times)
        row[f"{peer}_spread"] = _spread(times)
    for variant in variants:
        data = row["variants"][variant.name]
        mine = [r["median_ms"] for r in data["runs"]]
        data["median_ms"] = statistics.median(mine)
        data["ratio"] = data["median_ms"] / row["ort_median_ms"]
        if args.openvino:
            data["ratio_openvino"] = data["median_ms"] / row["openvino_median_ms"]
        data["spread"] = _spread(mine)
    return row


def _print_row(row: dict, variants: list[Variant]) -> None:
    ort = ", ".join(f"{r['median_ms']:.2f}" for r in row["ort"])
    openvino = ", ".join(f"{r['median_ms']:.2f}" for r in row.get("openvino", []))
    for variant in variants:
        data = row["variants"][variant.name]
        mine = ", ".join(f"{r['median_ms']:.2f}" for r in data["runs"])
        faults = statistics.median(r["faults_per_iter"] for r in data["runs"])
        search = data["search"]
        searched = (f"{search['search_s']:6.1f} s ({search['profiled']})" if search
                    else "shared" if data["shared"] else "heuristic")
        misses = max(r["cache_misses"] for r in data["runs"]) if search or data["shared"] else 0
        versus_openvino = (f"{openvino} | **{data['ratio_openvino']:.2f}** | "
                           f"{row['openvino_spread']:.2f}" if "ratio_openvino" in data
                           else "- | - | -")
        print(f"| {row['model']} | {row['batch']} | {row['threads']} | {variant.name} | "
              f"{searched} | {mine} | {ort} | **{data['ratio']:.2f}** | {data['spread']:.2f} | "
              f"{row['ort_spread']:.2f} | {versus_openvino} | {faults:.0f} | {misses} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", default="1,2,4,8,all",
                        help="thread counts; 'all' is every core this process may use")
    parser.add_argument("--pairs", type=int, default=3, help="alternating process pairs")
    parser.add_argument("--iters", type=int, default=40, help="timed inferences per process")
    parser.add_argument("--warmup", type=int, default=5, help="untimed inferences first")
    parser.add_argument("--budget", type=float, default=None,
                        help="profiling budget per candidate in the search (default: fastrun's)")
    parser.add_argument("--heuristic", action="store_true",
                        help="no search: fastrun runs heuristic-only (a quick diagnostic)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="a fastrun setup (environment) to compare; repeatable")
    parser.add_argument("--shared-search", action="store_true",
                        help="search once, with the first variant's setup, and run every "
                        "variant from that cache (for variants that differ only in how a "
                        "searched model runs, e.g. FASTRUN_BLOCKED_LAYOUT=0)")
    parser.add_argument("--cache-dir", help="where the searched caches go (default: temporary)")
    parser.add_argument("--load", default="0",
                        help="busy processes beside the timed rounds: a number, 'half' or "
                             "'all' (one per core this process may use)")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false",
                        help="leave OpenVINO out even where it is installed")
    parser.add_argument("--json", help="write every measurement to this file")
    # worker mode (one process per measurement)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--thread-count", dest="threads_one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.threads = args.threads_one
        print(json.dumps(WORKERS[args.worker](args)))
        return

    cores = len(os.sched_getaffinity(0))
    counts = sorted({cores if t == "all" else int(t) for t in args.threads.split(",")})
    variants = [Variant.parse(v) for v in args.variant] or [Variant("fastrun")]
    args.load_processes = {"all": cores, "half": cores // 2}.get(args.load) or int(args.load)
    if args.openvino and not openvino_available():
        print("# OpenVINO is not installed (pip install '.[bench]'): left out", flush=True)
        args.openvino = False
    peers = "onnxruntime" + (" and OpenVINO" if args.openvino else "")
    load = f", {args.load_processes} busy processes beside" if args.load_processes else ""
    print(header(f"scaling: fastrun vs {peers}, {args.pairs} alternating process rounds "
                 f"of {args.iters} inferences, threads {counts}{load}"))
    print("| model | batch | threads | fastrun | search (problems) | fastrun ms per process "
          "| onnxruntime ms per process | fastrun/ort | fastrun spread | ort spread "
          "| OpenVINO ms per process | fastrun/OpenVINO | OpenVINO spread "
          "| page faults per inference | cache misses |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
          "| --- |")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        cache_dir = args.cache_dir or scratch
        os.makedirs(cache_dir, exist_ok=True)
        for model in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                for threads in counts:
                    row = measure(model, batch, threads, variants, args, cache_dir)
                    rows.append(row)
                    _print_row(row, variants)
                    if args.json:
                        with open(args.json, "w") as stream:
                            json.dump(rows, stream, indent=1)


if __name__ == "__main__":
    main()
