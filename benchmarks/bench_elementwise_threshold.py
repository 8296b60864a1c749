"""Where does ``parallel`` start to pay for an elementwise operator?  Measured, not assumed.

Libraries usually hard-code a parallel threshold (TensorFlow-style kernels: a few thousand
elements).  The right value depends on the machine, the dtype (bytes per element, not
elements, is what a memory-bound loop pays for) and the threading runtime's wake-up cost; Fast
Run measures it per problem instead.  For each dtype this script sweeps same-shape operands over
output sizes from 1 KiB to 64 MiB (powers of 2 of output bytes) and

* measures ``numpy``, ``serial`` and ``parallel`` in interleaved rounds (medians), reporting
  serial/numpy and parallel/numpy per size (numpy measured in the same run: the peer);
* reports the crossover: the smallest size from which on ``parallel`` beats ``serial``, and
  beats both ``serial`` and ``numpy``, at every larger size measured;
* asks a fast-run session to decide every problem (it profiles each one) and prints its pick
  beside the measured best, so one can see that the pick follows the crossover; and prints
  what the heuristic (no profiling) would pick.

The threading runtime matters: ``import fastrun`` sets ``OMP_WAIT_POLICY=passive`` (see
``fastrun/devices/cpu/threads.py``) unless the environment already sets it, and passive workers
sleep between parallel regions, so every call pays to wake them.  Run it a second time with
``OMP_WAIT_POLICY=active`` to see the spinning runtime's crossover.

    python -m benchmarks.bench_elementwise_threshold [--quick] [--ops add,mul]
"""

from __future__ import annotations

import argparse
import os
import time

import numba
import numpy as np

import fastrun
from benchmarks._common import header, interleaved_medians
from fastrun.registry import Registry
from fastrun_algorithms import elementwise
from fastrun_algorithms.elementwise import PARALLEL_MIN_BYTES

DTYPES = ["float32", "float64", "int32", "int64"]
ALGORITHMS = ["numpy", "serial", "parallel"]


def size_text(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def measure(session: fastrun.Session, op: str, problem: fastrun.Problem, sample_s: float,
            rounds: int) -> dict[str, float]:
    """Median seconds per call of each algorithm on this problem, interleaved rounds."""
    registry, chooser = session.registry, session.chooser
    inputs = registry.operator(op).random_inputs(problem, np.random.default_rng(1))
    by_name = {a.desc.name: a for a in registry.algorithms(op)}
    functions = {}
    slowest = 0.0
    for name in ALGORITHMS:
        def run(algorithm=by_name[name]):
            return algorithm.run(problem, inputs, chooser)
        run()  # warm-up: compiles or loads the kernel
        start = time.perf_counter()
        run()
        slowest = max(slowest, time.perf_counter() - start)
        functions[name] = run
    number = max(1, int(sample_s / max(slowest, 1e-7)))
    return interleaved_medians(functions, rounds, number, settle_s=0.01)


def crossover(rows: list[dict], rivals: tuple[str, ...]) -> int | None:
    """The smallest size from which on ``parallel`` beats every rival at every larger size."""
    found = None
    for row in reversed(rows):
        if all(row["times"]["parallel"] < row["times"][rival] for rival in rivals):
            found = row["bytes"]
        else:
            break
    return found


def first_pick(rows: list[dict], key: str) -> int | None:
    """The smallest size from which on ``key`` is ``parallel`` at every larger size."""
    found = None
    for row in reversed(rows):
        if row[key] != "parallel":
            break
        found = row["bytes"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="every other size (4x steps), fewer rounds")
    parser.add_argument("--ops", default="add", help="comma-separated operations (default add)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per size")
    parser.add_argument("--sample", type=float, default=0.01, help="seconds per timed sample")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    step = 2 if args.quick else 1
    sizes = [1 << p for p in range(10, 27, step)]  # output bytes, 1 KiB .. 64 MiB

    print(header("elementwise: where parallel starts to pay (output bytes; ratios vs numpy, "
                 "same run)"))
    registry = Registry(load_plugins=False)
    elementwise.register(registry)
    session = fastrun.session(strategy="fast-run", cache=fastrun.InMemoryCache(),
                              progress=False, registry=registry)
    warm_up = session.problem("add", [(8,), (8,)], ["float64", "float64"])
    registry.algorithms("add")[2].run(warm_up, [np.ones(8), np.ones(8)], session.chooser)
    print(f"# numba {numba.__version__}, threading layer {numba.threading_layer()}, "
          f"{numba.get_num_threads()} threads, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}; same-shape contiguous operands; "
          f"{rounds} rounds of >= {args.sample * 1e3:.0f} ms samples, medians")
    # Parallel timings need idle cores: a busy machine shows up here, not as a mystery later.
    print(f"# load average at start: {os.getloadavg()[0]:.2f}")

    summary = []
    started = time.perf_counter()
    for op in args.ops.split(","):
        operator = registry.operator(op)
        for dtype in DTYPES:
            out_itemsize = operator.op.result_dtype(dtype, dtype).itemsize
            print(f"\n## {op} {dtype}")
            print(f"{'output':>8} {'elements':>9} {'numpy us':>10} {'serial/np':>10} "
                  f"{'parallel/np':>12}  {'best':<9}{'fast-run':<10}{'heuristic':<10}")
            rows = []
            for nbytes in sizes:
                n = nbytes // out_itemsize
                problem = session.problem(op, [(n,), (n,)], [dtype, dtype])
                pick = session.decide(problem).algorithm.desc.name
                heuristic = operator.heuristic_order(problem, registry.algorithms(op))[0]
                times = measure(session, op, problem, args.sample, rounds)
                best = min(times, key=times.get)
                rows.append({"bytes": nbytes, "times": times, "pick": pick, "best": best,
                             "heuristic": heuristic.desc.name})
                print(f"{size_text(nbytes):>8} {n:>9} {times['numpy'] * 1e6:>10.2f} "
                      f"{times['serial'] / times['numpy']:>10.2f} "
                      f"{times['parallel'] / times['numpy']:>12.2f}  {best:<9}{pick:<10}"
                      f"{heuristic.desc.name:<10}")
            agree = sum(r["pick"] == r["best"] for r in rows)
            # where the pick is not the measured best, how much slower it measured here
            worst = max(r["times"][r["pick"]] / r["times"][r["best"]] for r in rows)
            vs_serial = crossover(rows, ("serial",))
            vs_both = crossover(rows, ("serial", "numpy"))
            picked = first_pick(rows, "pick")
            print(f"crossover: parallel beats serial from "
                  f"{size_text(vs_serial) if vs_serial else 'nowhere up to 64 MiB'}; "
                  f"beats serial and numpy from "
                  f"{size_text(vs_both) if vs_both else 'nowhere up to 64 MiB'}; "
                  f"fast-run picks parallel from "
                  f"{size_text(picked) if picked else 'nowhere'}; pick = measured best at "
                  f"{agree}/{len(rows)} sizes, worst pick/best {worst:.2f}")
            summary.append((op, dtype, vs_serial, vs_both, picked, agree, len(rows), worst))

    print("\n## summary: crossover in output bytes (parallel faster at this size and every "
          "larger one measured)")
    print(f"{'op':<6}{'dtype':<9}{'par<serial':>12}{'par<serial,np':>15}{'fast-run par':>14}"
          f"{'pick=best':>11}{'worst pick/best':>17}")
    for op, dtype, vs_serial, vs_both, picked, agree, total, worst in summary:
        print(f"{op:<6}{dtype:<9}{size_text(vs_serial) if vs_serial else 'none':>12}"
              f"{size_text(vs_both) if vs_both else 'none':>15}"
              f"{size_text(picked) if picked else 'none':>14}{f'{agree}/{total}':>11}"
              f"{worst:>17.2f}")
    print(f"heuristic rule of thumb (no profiling): parallel first from "
          f"{size_text(PARALLEL_MIN_BYTES)} of output")
    print(f"total {time.perf_counter() - started:.0f} s, {session.stats.profiled} problems "
          f"profiled in {session.stats.search_seconds:.1f} s; load average at the end: "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
