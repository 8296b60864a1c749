"""Fully connected layers: each of ``linear``'s CPU algorithms against onnxruntime's MatMul + Add.

A transformer's projections and MLPs are ``linear`` steps: a product of few rows (128 tokens
for BERT-base, 197 for ViT-B/16) by a constant weight, plus a bias.  This benchmark times each
CPU algorithm of the operator on those shapes as a model runs them (the weight transformed
once, ``weight_preprocess``), and onnxruntime on a MatMul + Add graph of the same shape at the
same thread count, and prints each one's time over onnxruntime's (below 1: fastrun faster).

The fastrun algorithms run in interleaved rounds (median of rounds, ``--number`` calls each);
onnxruntime runs in a block of its own after them, because its workers spin between calls and
would sit on the cores numba's workers need.  An in-process diagnostic of the kernels: whole
models against onnxruntime, each in its own process, are ``benchmarks/bench_scaling.py``.

    python -m benchmarks.bench_linear [--threads 16] [--rounds 9] [--number 20] [--only LABELS]
"""

from __future__ import annotations

import functools
import time

import numpy as np

from benchmarks._common import header, interleaved_medians
from benchmarks.probe_linear_grid import SHAPES, ort_projection_time, projection_arguments


def main() -> None:
    args = projection_arguments(__doc__.split("\n\n")[0])

    import fastrun

    session = fastrun.session(device=f"cpu:{args.threads}", strategy="heuristic",
                              progress=False)
    operator = session.registry.operator("linear")
    algorithms = [a for a in session.registry.algorithms("linear")
                  if a.device_kind == session.device.kind]
    print(header(f"linear's CPU algorithms against onnxruntime's MatMul + Add, "
                 f"{args.threads} threads"))
    print("| projection | M x K x N | " + " | ".join(a.desc.name for a in algorithms)
          + " | onnxruntime us | best / onnxruntime |")
    print("| --- " * (len(algorithms) + 4) + "|")
    rng = np.random.default_rng(0)
    for label, m, k, n in SHAPES:
        if args.wanted and label not in args.wanted:
            continue
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        bias = rng.standard_normal(n, dtype=np.float32)
        problem = operator.problem([x.shape, w.shape, bias.shape], ["float32"] * 3,
                                   weight_preprocess=True)
        reference = x.astype(np.float64) @ w + bias
        calls = {}
        for algorithm in algorithms:
            if algorithm.unusable_reason(problem) is not None:
                continue
            call = algorithm.bind(problem, None, algorithm.preprocess(problem, [x, w, bias]))
            np.testing.assert_allclose(call(x, w, bias), reference, rtol=1e-3, atol=1e-3,
                                       err_msg=algorithm.desc.name)
            calls[algorithm.desc.name] = functools.partial(call, x, w, bias)
        times = interleaved_medians(calls, args.rounds, args.number)
        ort_s = ort_projection_time(x, w, bias, args.threads, args.number, args.rounds)
        time.sleep(0.2)  # let onnxruntime's workers stop spinning
        flops = 2.0 * m * k * n
        cells = [f"{times[a.desc.name] * 1e6:.0f} us ({flops / times[a.desc.name] / 1e12:.2f} "
                 f"TFLOP/s)" if a.desc.name in times else "-" for a in algorithms]
        print(f"| {label} | {m}x{k}x{n} | " + " | ".join(cells)
              + f" | {ort_s * 1e6:.0f} ({flops / ort_s / 1e12:.2f} TFLOP/s) | "
              f"**{min(times.values()) / ort_s:.2f}** |", flush=True)


if __name__ == "__main__":
    main()
