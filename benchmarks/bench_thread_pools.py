"""Thread-pool settings: ResNet-18 end to end under each, and OpenBLAS's spin timeout.

Default mode: ResNet-18 at batch 1 under each thread-pool setting of :data:`CONFIGS` (the
one ``import fastrun`` picks and the ones it replaced), each run in its own process because
the runtimes read their variables when they load.  Each process searches (the first time, into
a cache file per setting), then times fastrun and onnxruntime (2 intra-op threads) one after
the other; settings alternate over ``--rounds`` rounds.  Figure: fastrun's time as a ratio to
onnxruntime's in the same process (the machine's drift hits both), median over rounds.

``--timeouts``: with OpenBLAS on all cores and numba's workers asleep (the settings before
fastrun kept OpenBLAS on one thread), sgemm time at 128^3 and 512^3 for each
OPENBLAS_THREAD_TIMEOUT against OpenBLAS's own default (2^28 cycles), and how often a numba
kernel started right after a burst of BLAS calls stalls (> 1 ms instead of ~0.2 ms).

    python -m benchmarks.bench_thread_pools [--rounds 5] [--timeouts [--trials 60]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks._common import header

SETTINGS = ["28", "4", "16", "20", "24"]  # 28 is OpenBLAS's default

#: The variables the settings are made of (removed from a child's environment first).
THREAD_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS",
                    "OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT")
CORES = str(os.cpu_count() or 1)
#: name -> environment; the empty one is fastrun's default (fastrun/devices/cpu/threads.py)
CONFIGS = {
    "numba spinning, BLAS 1 thread (fastrun's default)": {},
    "numba spinning, BLAS on all cores": {"OPENBLAS_NUM_THREADS": CORES},
    "numba asleep, BLAS on all cores (the default before)": {
        "OMP_WAIT_POLICY": "passive", "OPENBLAS_NUM_THREADS": CORES},
}

MODEL_CHILD = r"""
import json, sys
import fastrun
import numpy as np
import onnxruntime as ort
from benchmarks._common import call_times
from fastrun.api import Session
from fastrun.runtime import load, zoo

cache, iterations = sys.argv[1], int(sys.argv[2])
session = Session(device="cpu", cache=cache, strategy="fast-run", progress=False)
model = load("zoo:resnet18", session, weight_preprocess=True)
feeds = model.random_inputs(0)
model.search()
options = ort.SessionOptions()
options.intra_op_num_threads = 2
options.log_severity_level = 3
peer = ort.InferenceSession(zoo.build("resnet18").SerializeToString(), options,
                           providers=["CPUExecutionProvider"])

def median_ms(run):
    for _ in range(3):
        run()
    return float(np.median(call_times(run, iterations)) * 1e3)

fastrun_ms = median_ms(lambda: model.run(feeds))
ort_ms = median_ms(lambda: peer.run(None, feeds))
print(json.dumps({"fastrun_ms": fastrun_ms, "ort_ms": ort_ms,
                  "category": session.device.category}))
"""

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


def _child_environment(settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env.update(settings)
    return env


def measure(timeout: str, trials: int) -> dict:
    env = _child_environment({"OPENBLAS_THREAD_TIMEOUT": timeout, "OMP_WAIT_POLICY": "passive",
                              "OPENBLAS_NUM_THREADS": CORES})
    output = subprocess.run([sys.executable, "-c", CHILD, str(trials)], env=env,
                            capture_output=True, text=True, check=True).stdout
    return json.loads(output)


def compare_configs(rounds: int, iterations: int) -> None:
    print(header("thread pools: resnet18 batch 1 under each setting, fastrun / onnxruntime"))
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as folder:
        caches = {name: os.path.join(folder, f"cache{i}.bin") for i, name in enumerate(CONFIGS)}
        for index in range(rounds):
            names = list(CONFIGS)
            shift = index % len(names)  # each round starts with another setting
            for name in names[shift:] + names[:shift]:
                output = subprocess.run(
                    [sys.executable, "-c", MODEL_CHILD, caches[name], str(iterations)],
                    env=_child_environment(CONFIGS[name]), capture_output=True, text=True,
                    check=True).stdout
                result = json.loads(output.strip().splitlines()[-1])
                results[name].append(result)
                print(f"  round {index + 1} {name}: fastrun {result['fastrun_ms']:.2f} ms, "
                      f"onnxruntime {result['ort_ms']:.2f} ms", flush=True)
    print(f"\n{'setting':52s} {'fastrun ms':>11s} {'ort ms':>8s} {'fastrun/ort':>12s}")
    for name, runs in results.items():
        ratios = [r["fastrun_ms"] / r["ort_ms"] for r in runs]
        print(f"{name:52s} {statistics.median(r['fastrun_ms'] for r in runs):>11.2f} "
              f"{statistics.median(r['ort_ms'] for r in runs):>8.2f} "
              f"{statistics.median(ratios):>12.3f}  (per round: "
              + ", ".join(f"{x:.2f}" for x in ratios) + ")")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--timeouts", action="store_true",
                        help="measure OPENBLAS_THREAD_TIMEOUT settings instead")
    parser.add_argument("--trials", type=int, default=60)
    args = parser.parse_args()
    if not args.timeouts:
        compare_configs(args.rounds, args.iterations)
        return
    print(header("thread pools: OPENBLAS_THREAD_TIMEOUT vs OpenBLAS's default (28), "
                 "OpenBLAS on all cores, numba asleep"))
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
