"""Selection quality and search cost on a suite of matmul shapes.

For every shape: fast-run searches it (into a fresh cache file), then an *oracle* measures every
fast-run candidate with many interleaved repeats; the figure is the time of fast-run's pick
divided by the oracle's best, both measured in this run (target: within 5% on every shape).
Then a second session re-runs the suite with the complete cache (target: nothing profiled).

    python benchmarks/bench_selection.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import fastrun
from benchmarks._common import header, interleaved_medians
from fastrun.analysis.suites import MATMUL_SHAPES
from fastrun.attribute import AlgoAttribute

SUITE = MATMUL_SHAPES  # (label, shape of A, shape of B, dtype), shared with fastrun.analysis.suites
QUICK = {"tiny 4", "64", "256", "skinny 4096x16x16", "batched 32x(64x64)"}


def oracle(session, problem, seconds_per_sample: float, rounds: int) -> dict[str, float]:
    """Median time of every fast-run candidate, many interleaved repeats."""
    operator = session.registry.operator("matmul")
    inputs = operator.random_inputs(problem, np.random.default_rng(1))
    chooser = session.chooser
    candidates = [a for a in session.registry.algorithms("matmul")
                  if a.usable(problem) and not a.attributes & AlgoAttribute.NAIVE]
    functions = {}
    slowest = 0.0
    for algorithm in candidates:
        def run(algorithm=algorithm):
            return algorithm.run(problem, inputs, chooser)
        run()  # warm-up (compilation)
        start = time.perf_counter()
        run()
        slowest = max(slowest, time.perf_counter() - start)
        functions[algorithm.desc.text] = run
    # one call count for all, sized on the slowest so that every sample is long enough
    number = max(1, int(seconds_per_sample / max(slowest, 1e-7)))
    return interleaved_medians(functions, rounds, number, settle_s=0.15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a five-shape subset")
    parser.add_argument("--rounds", type=int, default=5, help="oracle rounds per algorithm")
    parser.add_argument("--sample", type=float, default=0.05, help="oracle seconds per sample")
    args = parser.parse_args()
    suite = [s for s in SUITE if not args.quick or s[0] in QUICK]
    print(header("matmul selection quality: fast-run pick / oracle best (same run)"))

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cache.bin")
        session = fastrun.session(strategy="fast-run", cache=path, progress=False)
        problems = []
        search_total = 0.0
        for label, a_shape, b_shape, dtype in suite:
            problem = session.problem("matmul", [a_shape, b_shape], [dtype, dtype])
            start = time.perf_counter()
            decision = session.decide(problem)
            search_total += time.perf_counter() - start
            problems.append((label, problem, decision))

        print(f"\n{'shape':<32} {'pick':<28} {'oracle best':<28} {'pick ms':>9} "
              f"{'best ms':>9} {'ratio':>6}")
        worst = 0.0
        for label, problem, decision in problems:
            # the oracle measures with the same chooser, so strassen's sub-products dispatch
            # exactly as they do for fast-run
            medians = oracle(session, problem, args.sample, args.rounds)
            best_name = min(medians, key=medians.get)
            pick = decision.algorithm.desc.text
            ratio = medians[pick] / medians[best_name]
            worst = max(worst, ratio)
            print(f"{label:<32} {pick:<28} {best_name:<28} {medians[pick] * 1e3:>9.4f} "
                  f"{medians[best_name] * 1e3:>9.4f} {ratio:>6.3f}")

        print(f"\nworst pick/oracle ratio: {worst:.3f} (target <= 1.05)")
        print(f"search of {len(suite)} shapes (sub-problems included): {search_total:.1f} s, "
              f"{session.stats.profiled} problems profiled")

        rerun = fastrun.session(strategy="fast-run", cache=path, progress=False)
        start = time.perf_counter()
        for _, problem, _ in problems:
            rerun.decide(problem)
        elapsed = time.perf_counter() - start
        print(f"re-run with the complete cache: {elapsed * 1e3:.1f} ms, "
              f"{rerun.stats.profiled} problems profiled, {rerun.stats.cache_hits} cache hits "
              f"(target: 0 profiled)")


if __name__ == "__main__":
    main()
