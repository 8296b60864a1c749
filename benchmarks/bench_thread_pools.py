"""How OpenBLAS's spin timeout affects BLAS speed and numba kernels that follow BLAS calls.

Each setting runs in its own process (OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when it loads).
Peer: OpenBLAS's own default (2^28 cycles), measured in the same run.  Figures: sgemm time at
128^3 and 512^3 relative to the default, and how often a numba kernel started right after a
burst of BLAS calls stalls (> 1 ms instead of ~0.2 ms).

    python -m benchmarks.bench_thread_pools [--trials 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks._common import header

SETTINGS = ["28", "4", "16", "20", "24"]  # 28 is OpenBLAS's default

CHILD = r"""
import json, sys, time
import fastrun  # sets OMP_WAIT_POLICY; OPENBLAS_THREAD_TIMEOUT comes from the environment
import numpy as np
from fastrun.registry import default_registry

trials = int(sys.argv[1])
registry = default_registry()
operator = registry.operator("matmul")
algorithms = {a.desc.text: a for a in registry.algorithms("matmul")}
blas, blocked = algorithms["blas"], algorithms["blocked(kb=64,mb=64,nb=256)"]

def case(n):
    a = np.random.rand(n, n).astype(np.float32)
    b = np.random.rand(n, n).astype(np.float32)
    return (a, b), operator.problem_for((a, b))

def per_call(algorithm, inputs, problem, number):
    start = time.perf_counter()
    for _ in range(number):
        algorithm.run(problem, inputs, None)
    return (time.perf_counter() - start) / number

x128, p128 = case(128)
x512, p512 = case(512)
blocked.run(p128, x128, None)
sgemm128 = min(per_call(blas, x128, p128, 300) for _ in range(5))
sgemm512 = min(per_call(blas, x512, p512, 30) for _ in range(3))
after = []
for _ in range(trials):
    for _ in range(20):
        blas.run(p128, x128, None)
    start = time.perf_counter()
    blocked.run(p128, x128, None)
    after.append(time.perf_counter() - start)
    time.sleep(0.002)
print(json.dumps({"sgemm128": sgemm128, "sgemm512": sgemm512, "after_max": max(after),
                  "stalls": sum(t > 1e-3 for t in after)}))
"""


def measure(timeout: str, trials: int) -> dict:
    env = dict(os.environ, OPENBLAS_THREAD_TIMEOUT=timeout)
    output = subprocess.run([sys.executable, "-c", CHILD, str(trials)], env=env,
                            capture_output=True, text=True, check=True).stdout
    return json.loads(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=60)
    args = parser.parse_args()
    print(header("thread pools: OPENBLAS_THREAD_TIMEOUT vs OpenBLAS's default (28)"))
    results = {timeout: measure(timeout, args.trials) for timeout in SETTINGS}
    base = results["28"]
    print(f"{'timeout':>8} {'sgemm128 us':>12} {'vs default':>10} {'sgemm512 us':>12} "
          f"{'vs default':>10} {'numba after BLAS max us':>24} {'stalls >1ms':>12}")
    for timeout, r in results.items():
        print(f"{timeout:>8} {r['sgemm128'] * 1e6:>12.1f} "
              f"{r['sgemm128'] / base['sgemm128']:>10.2f} "
              f"{r['sgemm512'] * 1e6:>12.0f} {r['sgemm512'] / base['sgemm512']:>10.2f} "
              f"{r['after_max'] * 1e6:>24.0f} {r['stalls']:>7}/{args.trials}")


if __name__ == "__main__":
    main()
