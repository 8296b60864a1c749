"""Dispatch overhead with a warm cache: fastrun.call versus calling the chosen algorithm
directly, per call.  Target: under 5 microseconds.

    python benchmarks/bench_dispatch.py
"""

from __future__ import annotations

import argparse

import numpy as np

import fastrun
from benchmarks._common import header, interleaved_medians


def measure(session, m: int, k: int, n: int, rounds: int, number: int) -> tuple[str, dict]:
    """Seconds per call of the chosen algorithm called directly and through fastrun.call."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    fastrun.call("matmul", a, b)  # search once
    problem = session.registry.operator("matmul").problem_for((a, b))
    algorithm, chooser, inputs = session.decide(problem).algorithm, session.chooser, (a, b)
    medians = interleaved_medians({
        "direct": lambda: algorithm.run(problem, inputs, chooser),
        "fastrun": lambda: fastrun.call("matmul", a, b),
    }, rounds, number)
    return algorithm.desc.text, medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    print(header("dispatch overhead, warm cache"))
    print(f"{'shape':<22} {'chosen':<28} {'direct us':>10} {'fastrun us':>11} "
          f"{'overhead us':>12} {'ratio':>7}")
    worst = 0.0
    with fastrun.session(strategy="fast-run", cache=fastrun.InMemoryCache(), budget_s=0.05,
                         progress=False) as session:
        for m, k, n in [(4, 4, 4), (16, 16, 16), (64, 64, 64)]:
            chosen, medians = measure(session, m, k, n, args.rounds, args.number)
            overhead = (medians["fastrun"] - medians["direct"]) * 1e6
            worst = max(worst, overhead)
            shape = f"{m}x{k} @ {k}x{n}"
            print(f"{shape:<22} {chosen:<28} {medians['direct'] * 1e6:>10.2f} "
                  f"{medians['fastrun'] * 1e6:>11.2f} {overhead:>12.2f} "
                  f"{medians['fastrun'] / medians['direct']:>7.2f}")
    print(f"worst dispatch overhead: {worst:.2f} us per call (target < 5 us)")


if __name__ == "__main__":
    main()
