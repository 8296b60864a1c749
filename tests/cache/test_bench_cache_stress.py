"""The cache stress benchmark tests what it claims (issue 32, D11): at a small size, every
phase runs, its kill phase meets compactions (its threshold once went to a module nothing
reads), and nothing is lost.  The figures come from the full run (docs/performance.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_stress_benchmark_runs_every_phase_and_loses_nothing():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_cache_stress", "--writers", "4", "--puts",
         "10", "--readers", "2", "--compactors", "2", "--kills", "8", "--flips", "1", "--fs",
         "here", "--sizes", "100", "--cost-puts", "3"],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    writers = next(line for line in out.splitlines() if "] writers:" in line)
    assert "0 problems lost, 0 of the shared key" in writers and "0 writers failed" in writers
    assert int(re.search(r"\((\d+) compactions\)", writers)[1]) > 0
    assert writers.count("100.0%") == 2  # each long-lived reader found every key
    throughput = next(line for line in out.splitlines() if "] throughput:" in line)
    assert ", 0 lost," in throughput
    kills = next(line for line in out.splitlines() if "] kills:" in line)
    assert int(re.search(r"\((\d+) file generations", kills)[1]) > 1
    assert "0 unreadable files, 0 of" in kills
    # a compactor killed after the last compaction leaves its temporary file until the next
    # one sweeps it (the benchmark's target is the count after): 0 after, whatever before
    assert re.search(r"stale tmp files \d+ before the next compaction and 0 after", kills)
    flips = re.search(r"flips: (\d+) single flipped bytes.*: (\d+) cost only their own record, "
                      r"(\d+) were reported", out)
    assert flips[1] == flips[2] == flips[3]
    damaged = re.search(r"damaged files: (\d+) of (\d+) kinds handled", out)
    assert damaged[1] == damaged[2]
