"""SGEMM on OpenCL: fast-run-tuned ``cl_gemm`` (and friends) against the vendor BLAS.

For every shape: a fresh fast-run search on the OpenCL device (budgeted: see
docs/opencl-matmul.md) whose wall time is reported as the tuning time, then the chosen
configuration and the heuristic's first guess are timed with queue markers, and the peer in
the same run:

* on an NVIDIA GPU with torch: cuBLAS FP32 with TF32 off (``torch.backends.cuda.matmul.
  allow_tf32 = False``), timed with CUDA events;
* elsewhere (PoCL on the CPU here, no torch or no GPU): numpy's BLAS on the host, timed with
  ``perf_counter``, and the output says so.

Targets (GPU): the tuned kernel at >= 80% of cuBLAS at 4096, tuning SGEMM 4096 in < 60 s.

    python benchmarks/bench_opencl_matmul.py                 # 1024..8192 + 3 skinny shapes
    python benchmarks/bench_opencl_matmul.py --quick         # small shapes (PoCL smoke run)
    python benchmarks/bench_opencl_matmul.py --device opencl:0:1 --tuning-budget 32
    python benchmarks/bench_opencl_matmul.py --shapes 6304x2304x768 6304x768x3072
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import fastrun
from benchmarks._common import header
from fastrun.cache import InMemoryCache
from fastrun.devices import get_device

#: (label, M, N, K)
SQUARE = [(f"sgemm {s}", s, s, s) for s in (1024, 2048, 4096, 8192)]
#: transformer-like skinny products: a narrow K (one attention head's 128), a few rows
#: through a 4096 x 4096 projection (decode with 128 sequences), and a narrow output
SKINNY = [
    ("K-skinny 4096x4096x128", 4096, 4096, 128),
    ("M-skinny 128x4096x4096", 128, 4096, 4096),
    ("N-skinny 4096x128x4096", 4096, 128, 4096),
]
QUICK = [("sgemm 128", 128, 128, 128), ("sgemm 256", 256, 256, 256),
         ("K-skinny 256x256x32", 256, 256, 32), ("M-skinny 32x256x256", 32, 256, 256),
         ("N-skinny 256x32x256", 256, 32, 256)]
TARGET_RATIO = 0.8
TARGET_TUNING_S = 60.0


def _median_device_seconds(device, function, min_seconds: float, max_runs: int) -> float:
    """Median device time of ``function`` (queue markers), after one untimed warm-up."""
    function()
    device.synchronize()
    times = []
    started = time.perf_counter()
    while len(times) < max_runs and (len(times) < 5
                                     or time.perf_counter() - started < min_seconds):
        times.append(device.measure(function)[0] * 1e-9)
    return statistics.median(times)


class CuBLAS:
    """torch.matmul on the GPU, FP32 with TF32 off, timed with CUDA events."""

    label = "cuBLAS FP32 (TF32 off)"

    def __init__(self, torch):
        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def time(self, m: int, n: int, k: int, min_seconds: float, max_runs: int) -> float:
        torch = self.torch
        a = torch.rand((m, k), device="cuda", dtype=torch.float32)
        b = torch.rand((k, n), device="cuda", dtype=torch.float32)
        for _ in range(3):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        times = []
        started = time.perf_counter()
        while len(times) < max_runs and (len(times) < 5
                                         or time.perf_counter() - started < min_seconds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)


class NumpyBLAS:
    """numpy's BLAS (float32) on the host: the peer where there is no CUDA GPU."""

    def __init__(self):
        try:
            blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
        except Exception:
            blas = "BLAS"
        self.label = f"numpy {blas} FP32 on the host CPU (no CUDA GPU/torch here)"

    def time(self, m: int, n: int, k: int, min_seconds: float, max_runs: int) -> float:
        rng = np.random.default_rng(0)
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        a @ b
        times = []
        started = time.perf_counter()
        while len(times) < max_runs and (len(times) < 5
                                         or time.perf_counter() - started < min_seconds):
            t = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t)
        return statistics.median(times)


def peer():
    try:
        import torch
    except ImportError:
        return NumpyBLAS()
    return CuBLAS(torch) if torch.cuda.is_available() else NumpyBLAS()


def _parse_shape(text: str) -> tuple[str, int, int, int]:
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: {text!r} is not MxNxK (three integers joined by x)") from None
    return (f"{m}x{n}x{k}", m, n, k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (PoCL smoke run)")
    parser.add_argument("--device", default="opencl", help="OpenCL device spec (opencl:P:D)")
    parser.add_argument("--tuning-budget", type=int, default=None,
                        help="candidates timed fully per shape (default: FASTRUN_TUNING_CANDIDATES "
                             "or 24)")
    parser.add_argument("--budget-s", type=float, default=0.05,
                        help="seconds of timed repeats per fully timed candidate")
    parser.add_argument("--only", nargs="*", default=None, help="labels to run")
    parser.add_argument("--shapes", nargs="*", default=None, metavar="MxNxK",
                        help="these products instead of the default set (for example a "
                             "model's: 6304x2304x768 is ViT-B/16's QKV projection at batch 32)")
    args = parser.parse_args()

    shapes = QUICK if args.quick else SQUARE + SKINNY
    if args.shapes:
        shapes = [_parse_shape(text) for text in args.shapes]
    if args.only:
        shapes = [s for s in shapes if s[0] in args.only]
    the_peer = peer()
    device = get_device(args.device)
    print(header("OpenCL SGEMM: fast-run-tuned vs vendor BLAS"))
    print(f"# OpenCL device: {device} [{device.category}]")
    print(f"# peer: {the_peer.label}")
    budget = {None: "default", 0: "0 (exhaustive: every candidate timed fully)"}.get(
        args.tuning_budget, args.tuning_budget)
    print(f"# search: fast-run, tuning budget {budget}, {args.budget_s} s per fully timed "
          f"candidate; times are medians")
    print(f"{'shape':<26} {'tuning s':>9} {'tuned ms':>9} {'GFLOP/s':>9} "
          f"{'guess ms':>9} {'peer ms':>9} {'peer GF/s':>9} {'tuned/peer':>10}  pick")
    min_seconds, max_runs = (0.2, 50) if args.quick else (0.5, 200)
    results = []
    for label, m, n, k in shapes:
        session = fastrun.session(device=device, cache=InMemoryCache(), strategy="fast-run",
                                  budget_s=args.budget_s, progress=False,
                                  tuning_budget=args.tuning_budget)
        problem = session.problem("matmul", [(m, k), (k, n)], ["float32", "float32"])
        started = time.perf_counter()
        decision = session.decide(problem)
        tuning_s = time.perf_counter() - started
        operator = session.registry.operator("matmul")
        inputs = [device.to_device(x)
                  for x in operator.random_inputs(problem, np.random.default_rng(1))]
        ctx = session.chooser

        def timed(algorithm, inputs=inputs, problem=problem, ctx=ctx):
            return _median_device_seconds(
                device, lambda: algorithm.run(problem, inputs, ctx), min_seconds, max_runs)

        tuned_s = timed(decision.algorithm)
        candidates = [a for a in session.registry.algorithms("matmul")
                      if a.device_kind == "opencl" and a.usable(problem)
                      and a.desc.name != "cl_naive"]
        guess = operator.heuristic_order(problem, candidates)[0]
        guess_s = timed(guess)
        peer_s = the_peer.time(m, n, k, min_seconds, max_runs)
        flops = 2.0 * m * n * k
        ratio = peer_s / tuned_s
        results.append((label, ratio, tuning_s))
        print(f"{label:<26} {tuning_s:>9.1f} {tuned_s * 1e3:>9.3f} {flops / tuned_s / 1e9:>9.1f} "
              f"{guess_s * 1e3:>9.3f} {peer_s * 1e3:>9.3f} {flops / peer_s / 1e9:>9.1f} "
              f"{ratio:>9.0%}  {decision.algorithm.desc.text}", flush=True)
    for label, ratio, tuning_s in results:
        if label == "sgemm 4096":
            verdict = "met" if ratio >= TARGET_RATIO and tuning_s < TARGET_TUNING_S else "MISSED"
            print(f"# target at 4096 (>= {TARGET_RATIO:.0%} of the peer, tuning < "
                  f"{TARGET_TUNING_S:.0f} s): {verdict} ({ratio:.0%}, {tuning_s:.1f} s)")


if __name__ == "__main__":
    main()
