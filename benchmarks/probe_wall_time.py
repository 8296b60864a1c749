"""Where one inference's wall time goes: each step's time, the gaps between steps, the total.

``probe_layers_vs_ort`` compares the steps with onnxruntime's nodes; this probe accounts for
the whole wall time of fastrun's own inference, so that what lies *between* the steps
(converting the inputs, the step loop, waking the thread pool, releasing values, the outputs)
is measured rather than inferred from a difference of sums.  Per model, in a process of its own
and a steady loop (after a fast-run search at the thread count, in another process):

* the untraced median of an inference (what a user sees), and onnxruntime's in a process of its
  own (CPU provider, the same intra-op threads): the ratio the issue is about;
* a traced inference (``Model.run_traced``: a clock read before and after every step) split
  into the sum of the steps, the gaps (before the first step, between steps, after the last)
  and the outputs; each the median over the timed inferences;
* page faults per inference (fresh memory: the steady state should need none);
* what an empty parallel region of numba's pool costs at this thread count, back to back and
  after 50 us idle (a step's floor), and how many steps the model runs;
* the steps that take the most time, with their algorithms.

    python -m benchmarks.probe_wall_time [--models resnet18,resnet50,mobilenet_v2]
        [--threads 16] [--batch 1] [--iters 50] [--warmup 10] [--top 8] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile

from benchmarks._common import (
    empty_region_us,
    fastrun_search,
    header,
    model_label,
    model_spec,
    ort_steady_loop,
    run_worker,
    steady_loop,
)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def worker_trace(args: argparse.Namespace) -> dict:
    """In a process of its own: the model from its cache, untraced then traced loops."""
    import fastrun
    from fastrun.runtime import load

    session = fastrun.session(cache=args.cache, strategy="heuristic",
                              device=f"cpu:{args.threads}", progress=False)
    model = load(model_spec(args.model), session, batch=args.batch, weight_preprocess=True)
    feeds = model.random_inputs(seed=1)
    model.search()
    plain = steady_loop(lambda: model.run(feeds), args.iters, args.warmup)
    for _ in range(args.warmup):
        model.run_traced(feeds)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    traces = [model.run_traced(feeds)[1] for _ in range(args.iters)]
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.iters
    steps = list(zip(*(trace.step_ns for trace in traces), strict=True))
    gaps = [trace.gap_ns for trace in traces]
    algorithms = {id(report.step): report.algorithm for report in model.reports}
    names = [(step.node, step.operator, algorithms.get(id(step), "?")) for step in model.steps]
    return {
        "model_ms": plain["median_ms"],
        "model_faults": plain["faults_per_iter"],
        "traced_ms": _median([t.total_ns * 1e-6 for t in traces]),
        "steps_ms": _median([sum(t.step_ns) * 1e-6 for t in traces]),
        "before_ms": _median([g[0] * 1e-6 for g in gaps]),
        "between_ms": _median([sum(g[1:-1]) * 1e-6 for g in gaps]),
        "after_last_ms": _median([g[-1] * 1e-6 for g in gaps]),
        "outputs_ms": _median([(t.ended - t.issued) * 1e-6 for t in traces]),
        "traced_faults": faults,
        "step_count": len(steps),
        "steps": [{"node": node, "op": op, "algorithm": algorithm,
                   "us": _median([x * 1e-3 for x in times])}
                  for (node, op, algorithm), times in zip(names, steps, strict=True)],
        **_empty_region(args.threads),
    }


def _empty_region(threads: int) -> dict:
    """What an empty parallel region of numba's pool costs: back to back, and after an idle
    gap of 50 us (the pool's workers may have gone to sleep)."""
    return {"region_hot_us": empty_region_us(threads),
            "region_after_idle_us": empty_region_us(threads, idle_us=50, calls=500)}


def worker_search(args: argparse.Namespace) -> dict:
    return fastrun_search(model_spec(args.model), args.batch, args.threads, args.cache)


def worker_ort(args: argparse.Namespace) -> dict:
    return ort_steady_loop(model_spec(args.model), args.batch, args.threads, args.iters,
                           args.warmup)


WORKERS = {"trace": worker_trace, "search": worker_search, "ort": worker_ort}


def _spawn(kind: str, model: str, args: argparse.Namespace, cache: str) -> dict:
    return run_worker("benchmarks.probe_wall_time",
                      ["--worker", kind, "--model", model, "--cache", cache,
                       "--threads", str(args.threads), "--batch", str(args.batch),
                       "--iters", str(args.iters), "--warmup", str(args.warmup)],
                      f"{kind} worker for {model}")


def _report(model: str, result: dict, ort: dict, top: int) -> None:
    total = result["traced_ms"]

    def share(ms: float) -> str:
        return f"{ms:.3f} ms ({ms / total:.1%})" if total else f"{ms:.3f} ms"

    print(f"| {model} | {result['model_ms']:.3f} | {ort['median_ms']:.3f} | "
          f"**{result['model_ms'] / ort['median_ms']:.2f}** | {total:.3f} | "
          f"{share(result['steps_ms'])} | {share(result['before_ms'])} | "
          f"{share(result['between_ms'])} | {share(result['after_last_ms'])} | "
          f"{share(result['outputs_ms'])} | {result['step_count']} | "
          f"{result['model_faults']:.0f} / {ort['faults_per_iter']:.0f} | "
          f"{result['region_hot_us']:.1f} / {result['region_after_idle_us']:.1f} |", flush=True)
    slowest = sorted(result["steps"], key=lambda s: -s["us"])[:top]
    for step in slowest:
        print(f"|   | {step['node']} | {step['op']}: {step['algorithm']} | {step['us']:.1f} us "
              f"({step['us'] * 1e-3 / total:.1%}) | | | | | | | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--top", type=int, default=8, help="slowest steps listed per model")
    parser.add_argument("--cache-dir", help="where the searched caches go (default: temporary)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return
    print(header(f"wall time of one inference: steps and gaps, {args.threads} threads, "
                 f"batch {args.batch}, {args.iters} inferences per process"))
    print("| model | fastrun ms | onnxruntime ms | fastrun/ort | traced ms | steps | before "
          "the first | between steps | after the last | outputs | steps run | page faults "
          "per inference (fastrun / ort) | empty parallel region us (hot / after 50 us idle) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.cache_dir or scratch
        os.makedirs(directory, exist_ok=True)
        for model in args.models.split(","):
            # bench_scaling's name for the same search: the two can share a --cache-dir
            name = f"{model_label(model)}-b{args.batch}-t{args.threads}-fastrun.bin"
            cache = os.path.join(directory, name)
            if not os.path.exists(cache):
                _spawn("search", model, args, cache)
            result = _spawn("trace", model, args, cache)
            ort = _spawn("ort", model, args, cache)
            _report(model_label(model), result, ort, args.top)


if __name__ == "__main__":
    main()
