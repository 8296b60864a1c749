"""Recording the problems that miss the cache (``record=PATH``, ``FASTRUN_RECORD``,
``load_and_run --record``): each problem once, posable again through the registry, cache hits
not recorded, several processes appending at once without a loss or a duplicate, a torn line
survived, a foreign file refused with its kind named."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import fastrun
from fastrun.cache import InMemoryCache
from fastrun.cache.problems import ProblemRecorder, ProblemsFileError, read_problems


def _decide(session, *sizes):
    for size in sizes:
        problem = session.problem("matmul", [(size, size), (size, size)], ["float32"] * 2)
        session.decide(problem)


def test_a_session_records_each_missed_problem_once_and_it_can_be_posed_again(tmp_path):
    path = tmp_path / "problems.jsonl"
    session = fastrun.Session(cache=InMemoryCache(), strategy="heuristic", record=path,
                              progress=False)
    _decide(session, 8, 16, 32, 8)
    recorded = read_problems(path)
    assert [r.shapes[0] for r in recorded] == [(8, 8), (16, 16), (32, 32)]
    registry = session.registry
    for record in recorded:
        again = registry.operator(record.operator).problem(record.shapes, record.dtypes,
                                                           **record.params)
        assert again.key == record.key
        assert record.category == session.chooser.category(registry.operator("matmul"))
    # another session (another process, as far as the file knows) adds only what is new
    other = fastrun.Session(cache=InMemoryCache(), strategy="heuristic", record=path,
                            progress=False)
    _decide(other, 16, 64)
    assert [r.shapes[0] for r in read_problems(path)] == [(8, 8), (16, 16), (32, 32), (64, 64)]


def test_cache_hits_are_not_recorded_and_nothing_is_profiled(tmp_path):
    cache = InMemoryCache()
    searched = fastrun.Session(cache=cache, strategy="fast-run", budget_s=0.001, progress=False)
    _decide(searched, 8)
    path = tmp_path / "problems.jsonl"
    session = fastrun.Session(cache=cache, strategy="heuristic", record=path, progress=False)
    _decide(session, 8, 12)
    assert [r.shapes[0] for r in read_problems(path)] == [(12, 12)]
    assert session.chooser.stats.profiled == 0


def test_the_environment_variable_turns_recording_on(tmp_path, monkeypatch):
    path = tmp_path / "env.jsonl"
    monkeypatch.setenv("FASTRUN_RECORD", str(path))
    session = fastrun.Session(cache=InMemoryCache(), strategy="heuristic", progress=False)
    a = np.ones((4, 4), np.float32)
    session.call("matmul", a, a)
    session.call("matmul", a, a)
    assert len(read_problems(path)) == 1


WRITER = """
import sys
from fastrun.cache.problems import ProblemRecorder
path, first = sys.argv[1], int(sys.argv[2])
recorder = ProblemRecorder(path)
for i in range(first, first + 60):
    recorder.record("matmul", [[i, 2], [2, i]], ["float32", "float32"], {}, f"k{i}", "cat")
"""


def test_processes_recording_at_once_lose_nothing_and_duplicate_nothing(tmp_path):
    path = tmp_path / "shared.jsonl"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(first)])
               for first in (0, 20, 40, 60)]  # overlapping ranges
    assert all(w.wait(timeout=120) == 0 for w in writers)
    keys = [r.key for r in read_problems(path)]
    assert sorted(keys, key=lambda k: int(k[1:])) == [f"k{i}" for i in range(120)]
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    assert len(lines) == 1 + 120  # the header and each problem once


def test_a_torn_last_line_is_skipped_and_the_next_record_starts_afresh(tmp_path):
    path = tmp_path / "torn.jsonl"
    path.write_text("")  # an empty file is a new one
    ProblemRecorder(path).record("matmul", [[2, 2], [2, 2]], ["float32"] * 2, {}, "a", "cat")
    with open(path, "a", encoding="utf-8") as file:
        file.write('{"operator": "matmul", "shapes": [[3')  # a writer killed mid-line
    assert [r.key for r in read_problems(path)] == ["a"]
    ProblemRecorder(path).record("matmul", [[4, 4], [4, 4]], ["float32"] * 2, {}, "b", "cat")
    assert [r.key for r in read_problems(path)] == ["a", "b"]


def test_a_file_that_is_not_a_problems_file_is_refused_with_its_kind(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text('{"format": "fastrun-cache-json", "version": 1}\n')
    with pytest.raises(ProblemsFileError, match=r"not a fastrun problems file.*fastrun-cache-json"):
        ProblemRecorder(path)
    done = subprocess.run([sys.executable, "-m", "fastrun.cli.load_and_run", "zoo:resnet18",
                           "--record", str(path), "--iter", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FASTRUN_RECORD": ""})
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "not a fastrun problems file" in done.stderr
