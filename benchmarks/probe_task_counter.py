"""Static slices against tasks taken from a shared counter (``_common.next_task``): the same
work in one parallel region, split into 1, 4 and 16 tasks per thread.

Each variant runs in alternating blocks of 50 calls (20 blocks); the median, mean, 95th
percentile and worst call are printed, with the share of CPU time the hypervisor stole
(/proc/stat) meanwhile.  The counter evens out a worker that falls behind, but every task
costs an atomic add on a shared cache line, so it only pays for tasks that are not tiny
(docs/history/many-cores-issue-13-2026-11-25-to-27.md, second session).

    python -m benchmarks.probe_task_counter [--threads 16] [--region-us 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np
from numba import prange

from benchmarks._common import header
from fastrun_algorithms._common import next_task


@numba.njit(inline="always")
def _task(x, out, t, work):
    """A latency-bound chain of ``work`` steps (the same cost wherever it runs)."""
    s = 0.0
    for i in range(work):
        s = s * 0.999 + x[(t * 131 + i) & 4095]
    out[t] = s


@numba.njit(parallel=True)
def static_split(x, out, tasks, work):
    for t in prange(tasks):
        _task(x, out, t, work)


@numba.njit(parallel=True)
def from_counter(x, out, tasks, work, counter, workers):
    counter[0] = 0
    for _ in prange(workers):
        while True:
            t = next_task(counter)
            if t >= tasks:
                break
            _task(x, out, t, work)


def _cpu_times() -> list[int]:
    with open("/proc/stat") as stream:
        return [int(v) for v in stream.readline().split()[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    parser.add_argument("--region-us", type=float, default=200.0,
                        help="serial work per thread and region, about")
    args = parser.parse_args()
    threads = args.threads
    numba.set_num_threads(threads)
    x = np.random.default_rng(0).random(4096)
    counter = np.zeros(1, np.int64)
    print(header(f"task counter: one region of ~{args.region_us:.0f} us per thread, "
                 f"{threads} threads"))
    print("| tasks | variant | median us | mean us | p95 us | worst us | steal % |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for per_thread in (1, 4, 16):
        tasks = threads * per_thread
        work = max(1, int(args.region_us * 1e3 / 1.5 / per_thread))  # ~1.5 ns per step
        out = np.zeros(tasks)
        static_split(x, out, tasks, work)
        from_counter(x, out, tasks, work, counter, threads)
        samples: dict[str, list[float]] = {"static slices": [], "counter": []}
        before = _cpu_times()
        for _ in range(20):
            for name, times in samples.items():
                for _ in range(50):
                    started = time.perf_counter_ns()
                    if name == "static slices":
                        static_split(x, out, tasks, work)
                    else:
                        from_counter(x, out, tasks, work, counter, threads)
                    times.append((time.perf_counter_ns() - started) / 1e3)
        spent = [b - a for a, b in zip(before, _cpu_times(), strict=True)]
        steal = 100 * spent[7] / max(1, sum(spent)) if len(spent) > 7 else float("nan")
        for name, times in samples.items():
            print(f"| {tasks} | {name} | {statistics.median(times):.0f} | "
                  f"{statistics.fmean(times):.0f} | {np.percentile(times, 95):.0f} | "
                  f"{max(times):.0f} | {steal:.1f} |", flush=True)


if __name__ == "__main__":
    main()
