"""Would a step run faster on fewer threads than the model's?  Each step timed in the model at
several thread counts, then the model run with each step at its best count.

Small steps on many cores pay a parallel region's fork and join for little work, so giving
each step its own thread count looks like a cheap gain.  This probe measures it, in one
process, on a model searched at ``--threads`` (the cache from ``bench_scaling`` or
``probe_wall_time`` with the same ``--cache-dir``):

* what an empty parallel region costs at each thread count (back to back);
* each step's median time in the model (``Model.run_traced``) with numba's pool set to each
  count for the whole inference;
* the best count per step, and the sum of the steps at their best counts;
* whole inferences in alternating rounds: the model as it runs, and the model with each step
  wrapped to set its best count first (and only where that gained over 10%).

The step wrapping replaces the model's prepared program in this process only: a diagnostic,
not a way to run models.  Sharing the cores (``FASTRUN_SHARE_CORES``) is left off here, so
every count is the one asked for.

    python -m benchmarks.probe_step_threads --cache-dir DIR [--models resnet18,mobilenet_v2]
        [--threads 16] [--counts 16,12,8,4,2,1] [--rounds 6] [--iters 30]
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchmarks._common import call_times, empty_region_us, header


def _with_threads(function, count: int):
    import numba

    set_threads = numba.set_num_threads

    def step(*args):
        set_threads(count)
        return function(*args)
    return step


def probe(model_name: str, cache: str, threads: int, counts: list[int], rounds: int,
          iters: int) -> None:
    import numba

    import fastrun
    from fastrun.runtime import load

    session = fastrun.session(cache=cache, strategy="heuristic", device=f"cpu:{threads}",
                              progress=False)
    model = load(f"zoo:{model_name}", session, batch=1, weight_preprocess=True)
    feeds = model.random_inputs(seed=1)
    model.search()
    program = list(model._program)
    per_count = {}
    for count in counts:
        numba.set_num_threads(count)
        for _ in range(10):
            model.run_traced(feeds)
        traces = [model.run_traced(feeds)[1] for _ in range(iters)]
        per_count[count] = [statistics.median(times) * 1e-3
                            for times in zip(*(trace.step_ns for trace in traces), strict=True)]
    steps = len(program)
    best = [min(counts, key=lambda c: per_count[c][i]) for i in range(steps)]
    print(f"\n{model_name}: steps summed at each count (us): "
          + ", ".join(f"{c}: {sum(per_count[c]):.0f}" for c in counts)
          + f"; each at its best: {sum(per_count[best[i]][i] for i in range(steps)):.0f}; "
          f"{sum(b != threads for b in best)} of {steps} steps faster below {threads}")
    print("| step | " + " | ".join(f"{c} threads us" for c in counts) + " | best |")
    print("| --- | " + " | ".join("---" for _ in counts) + " | --- |")
    for index, step in enumerate(model.steps):
        print(f"| {step.node[:48]} | "
              + " | ".join(f"{per_count[c][index]:.1f}" for c in counts) + f" | {best[index]} |")
    margin = [b if per_count[b][i] < 0.9 * per_count[threads][i] else threads
              for i, b in enumerate(best)]
    programs = {
        "as it runs": program,
        "each step at its best count": [(_with_threads(f, best[i]), a, o, r)
                                        for i, (f, a, o, r) in enumerate(program)],
        "best count where it gains 10%": [(_with_threads(f, margin[i]), a, o, r)
                                          for i, (f, a, o, r) in enumerate(program)],
    }
    medians: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(rounds):
        for name, steps_program in programs.items():
            model._program = steps_program
            numba.set_num_threads(threads)
            for _ in range(5):
                model.run(feeds)
            medians[name].append(statistics.median(call_times(lambda: model.run(feeds), iters))
                                 * 1e3)
    model._program = program
    for name, values in medians.items():
        print(f"{model_name} whole inference, {name}: median of rounds "
              f"{statistics.median(values):.3f} ms ({', '.join(f'{v:.2f}' for v in values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--counts", default=None,
                        help="thread counts to try (default: threads, halved down to 1)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--cache-dir", required=True,
                        help="where {model}-b1-t{threads}-fastrun.bin was searched")
    args = parser.parse_args()
    os.environ["FASTRUN_SHARE_CORES"] = "0"
    counts = ([int(c) for c in args.counts.split(",")] if args.counts else
              sorted({args.threads >> k for k in range(args.threads.bit_length())}, reverse=True))
    print(header(f"per-step thread counts, model searched at {args.threads} threads"))
    print("empty parallel region us: " + ", ".join(
        f"{c} threads {empty_region_us(c):.1f}" for c in counts))
    for model_name in args.models.split(","):
        cache = os.path.join(args.cache_dir, f"{model_name}-b1-t{args.threads}-fastrun.bin")
        if not os.path.exists(cache):
            raise SystemExit(f"no cache {cache}: search it first (python -m "
                             f"benchmarks.bench_scaling --cache-dir {args.cache_dir} ...)")
        probe(model_name, cache, args.threads, counts, args.rounds, args.iters)


if __name__ == "__main__":
    main()
