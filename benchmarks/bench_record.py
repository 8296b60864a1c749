"""What recording cache misses costs (issue 17: "recording costs no measurable time per call").

Two figures, each against the same work without recording, in the same run:

1. warm dispatch: ``session.call("matmul", a, b)`` on a decided 16x16 problem, recording on and
   off, interleaved rounds of ``--number`` calls (a call never reaches the recorder: the miss
   happened once, when the problem was decided);
2. a miss: deciding ``--problems`` new matmul problems heuristically, with and without a
   problems file (the recorder takes the file's lock, catches up and appends one line).

    python -m benchmarks.bench_record [--rounds 9] [--number 20000] [--problems 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from benchmarks._common import header


def _session(record: str | None):
    import fastrun
    from fastrun.cache import InMemoryCache

    return fastrun.Session(cache=InMemoryCache(), strategy="heuristic", record=record,
                           progress=False)


def _per_call_us(session, a, number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        session.call("matmul", a, a)
    return (time.perf_counter() - start) / number * 1e6


def _miss_us(record: str | None, count: int, offset: int) -> float:
    session = _session(record)
    problems = [session.problem("matmul", [(n, 8), (8, n)], ["float32"] * 2)
                for n in range(offset + 1, offset + count + 1)]
    start = time.perf_counter()
    for problem in problems:
        session.decide(problem)
    return (time.perf_counter() - start) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--problems", type=int, default=200)
    args = parser.parse_args()
    print(header("recording cache misses: cost per call and per miss"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "problems.jsonl")
        a = np.ones((16, 16), np.float32)
        sessions = {"off": _session(None), "on": _session(path)}
        for session in sessions.values():
            _per_call_us(session, a, 1000)  # decide and warm up
        calls: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for name, session in sessions.items():
                calls[name].append(_per_call_us(session, a, args.number))
        off, on = statistics.median(calls["off"]), statistics.median(calls["on"])
        print(f"warm call: {off:.3f} us without recording, {on:.3f} us with, "
              f"ratio {on / off:.3f}")
        misses: dict[str, list[float]] = {"off": [], "on": []}
        for round_ in range(3):
            offset = round_ * args.problems
            misses["off"].append(_miss_us(None, args.problems, offset))
            misses["on"].append(_miss_us(path, args.problems, offset + 10_000))
        off, on = statistics.median(misses["off"]), statistics.median(misses["on"])
        print(f"a miss (heuristic decision): {off:.1f} us without recording, {on:.1f} us "
              f"with, ratio {on / off:.2f} (+{on - off:.1f} us, once per problem and process)")


if __name__ == "__main__":
    main()
