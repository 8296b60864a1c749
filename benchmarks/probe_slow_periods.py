"""Blocks against interleaved rounds: whether a machine has slow periods long enough to spoil a
whole block of repeats (the reason the profiler keeps each candidate's smaller median).

Two pairs of candidates (Winograd's batched product of ResNet-18's layer1, and layer4's strided
3x3 conv) are timed in blocks of ``--calls`` calls each, then alternating, without and with a
conv run before each call (as the in-context search's prelude does); minor page faults per call
are printed too.  On the 16-core host whole blocks ran 10x slower than the alternation that
followed them (docs/history/many-cores-issue-13-2026-11-25-to-27.md, second session).

    python -m benchmarks.probe_slow_periods [--threads 16] [--calls 40]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np

from benchmarks._common import header
from fastrun.api import Session


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed_call(algorithm, problem, inputs, ctx, before) -> float:
    """Microseconds of one call, after ``before()`` (untimed) when given."""
    if before is not None:
        before()
    started = time.perf_counter_ns()
    algorithm.run(problem, inputs, ctx, None)
    return (time.perf_counter_ns() - started) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--calls", type=int, default=40, help="calls per block")
    args = parser.parse_args()
    device = f"cpu:{args.threads}" if args.threads else "cpu"
    session = Session(device=device, strategy="heuristic")
    registry = session.registry
    rng = np.random.default_rng(0)

    def array(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    cases = {
        "winograd product 36x(64x64 @ 64x196)": (
            "matmul", [array(36, 64, 64), array(36, 64, 196)], {},
            ("blas_split", "register_tiled")),
        "layer4 3x3 stride 2, 256 -> 512 at 14x14": (
            "conv", [array(1, 256, 14, 14), array(512, 256, 3, 3), array(512)],
            {"pads": (1, 1, 1, 1), "strides": (2, 2), "activation": "relu"},
            ("implicit_gemm", "im2col")),
    }
    prelude_inputs = (array(1, 64, 56, 56), array(64, 64, 3, 3))
    prelude = session.prepare("conv", *prelude_inputs, pads=(1, 1, 1, 1))
    print(header(f"slow periods: blocks of {args.calls} calls, then alternating, {device}"))
    print("| problem | prelude | phase | " + " | ".join(["candidate", "median us"] * 2)
          + " | faults per call |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for title, (operator, inputs, params, names) in cases.items():
        problem = registry.operator(operator).problem_for(inputs, **params)
        algorithms = [a for a in registry.algorithms(operator) if a.desc.text in names]

        ctx = session.chooser
        for algorithm in algorithms:
            _timed_call(algorithm, problem, inputs, ctx, None)  # compile, warm up
        for with_prelude in (False, True):
            before = (lambda: prelude(*prelude_inputs)) if with_prelude else None
            phases: dict[str, dict[str, list[float]]] = {"blocks": {}, "alternating": {}}
            faults = {}
            began = _faults()
            for algorithm in algorithms:
                times = phases["blocks"].setdefault(algorithm.desc.text, [])
                for _ in range(args.calls):
                    times.append(_timed_call(algorithm, problem, inputs, ctx, before))
            faults["blocks"] = (_faults() - began) / (args.calls * len(algorithms))
            began = _faults()
            for _ in range(args.calls):
                for algorithm in algorithms:
                    phases["alternating"].setdefault(algorithm.desc.text, []).append(
                        _timed_call(algorithm, problem, inputs, ctx, before))
            faults["alternating"] = (_faults() - began) / (args.calls * len(algorithms))
            for phase, samples in phases.items():
                cells = " | ".join(f"{name} | {statistics.median(times):.0f}"
                                   for name, times in samples.items())
                print(f"| {title} | {'yes' if with_prelude else 'no'} | {phase} | {cells} | "
                      f"{faults[phase]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
