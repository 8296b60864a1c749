"""Searching real matmul problems through the framework: results, strategies, the recursive
Strassen search, and a search interrupted by a killed process that resumes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastrun
from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, FileCache, InMemoryCache

FAST = {"budget_s": 0.002, "progress": False}


@pytest.mark.parametrize("strategy", ["heuristic", "fast-run", "full-run",
                                      "fast-run+reproducible"])
def test_results_match_numpy_under_every_strategy(strategy):
    rng = np.random.default_rng(0)
    shapes = [((17, 9), (9, 5)), ((3, 8, 6), (6, 4)), ((7,), (7, 3)), ((64, 64), (64, 64))]
    with fastrun.session(strategy=strategy, cache=InMemoryCache(), **FAST) as session:
        for a_shape, b_shape in shapes:
            a = rng.standard_normal(a_shape).astype(np.float32)
            b = rng.standard_normal(b_shape).astype(np.float32)
            np.testing.assert_allclose(fastrun.call("matmul", a, b), a @ b, rtol=1e-4, atol=1e-4)
        if "reproducible" in strategy:
            for decision in session.chooser.decisions():
                assert decision.algorithm.attributes & AlgoAttribute.REPRODUCIBLE


def test_strassen_sub_problems_are_searched_first_and_shown_in_the_policy():
    session = fastrun.session(strategy="fast-run", cache=InMemoryCache(), **FAST)
    problem = session.problem("matmul", [(64, 64), (64, 64)], ["float64", "float64"])
    session.decide(problem)
    order = [d.problem.key for d in session.chooser.decisions()]
    half = "float64[32x32],float64[32x32]"
    assert half in order and order.index(half) < order.index(problem.key)
    assert session.decide(session.problem("matmul", [(32, 32)] * 2, ["float64"] * 2)).source \
        == "profiled"

    # A cache that says strassen wins at 64: the policy shows its products' own choice.
    cache = InMemoryCache()
    chooser = session.chooser
    category = chooser.category(session.registry.operator("matmul"))
    cache.put(category, problem.key,
              [Entry("strassen", AlgoAttribute.REPRODUCIBLE, 1e-9, 0.0, 0, 0.0, 9, 0.0, "t")])
    policy = fastrun.session(cache=cache, **FAST).decide(problem).policy
    assert policy.algorithm == "strassen" and policy.source == "cache"
    (child,) = policy.children
    assert child.key == half and child.source == "heuristic" and child.algorithm == "blas"
    assert policy.total_workspace == policy.workspace_bytes > 0
    assert "strassen" in policy.render() and half in policy.render()


SEARCH_SCRIPT = textwrap.dedent("""
    import sys, fastrun
    session = fastrun.session(strategy="fast-run", cache=sys.argv[1], budget_s=0.02,
                              progress=False)
    for n in range(20, 20 + int(sys.argv[2])):
        problem = session.problem("matmul", [(n, 3 * n + 1), (3 * n + 1, n + 1)],
                                  ["float32", "float32"])
        session.decide(problem)
        print("done", problem.key, flush=True)
""")


def test_killed_search_resumes_with_only_the_missing_problems(tmp_path):
    path = tmp_path / "cache.bin"
    total = 12
    process = subprocess.Popen([sys.executable, "-c", SEARCH_SCRIPT, str(path), str(total)],
                               stdout=subprocess.PIPE, text=True)
    finished = [process.stdout.readline().split()[1] for _ in range(3)]
    process.kill()
    process.wait()
    process.stdout.close()
    stored = {key for _, key, _ in FileCache(path)}
    assert set(finished) <= stored and len(stored) < total

    resumed = subprocess.run([sys.executable, "-c", SEARCH_SCRIPT, str(path), str(total)],
                             capture_output=True, text=True, check=True)
    assert resumed.stdout.count("done") == total
    session = fastrun.session(strategy="fast-run", cache=FileCache(path), **FAST)
    for n in range(20, 20 + total):
        problem = session.problem("matmul", [(n, 3 * n + 1), (3 * n + 1, n + 1)],
                                  ["float32", "float32"])
        assert session.decide(problem).source == "cache"
    assert session.stats.profiled == 0


def test_resume_profiles_exactly_what_is_missing(tmp_path):
    path = tmp_path / "cache.bin"
    session = fastrun.session(strategy="fast-run", cache=path, **FAST)
    problems = [session.problem("matmul", [(n, 25), (25, n)], ["float32"] * 2)
                for n in (7, 9, 11, 13)]  # odd: no strassen sub-problems to count
    for problem in problems[:2]:
        session.decide(problem)
    stored = {key: entries for _, key, entries in FileCache(path)}

    resumed = fastrun.session(strategy="fast-run", cache=path, **FAST)
    assert [resumed.decide(p).source for p in problems] == ["cache", "cache", "profiled",
                                                            "profiled"]
    assert resumed.stats.profiled == 2 and resumed.stats.cache_hits == 2
    after = {key: entries for _, key, entries in FileCache(path)}
    assert set(after) == {p.key for p in problems}
    for key, entries in stored.items():  # what was measured before was not measured again
        assert after[key] == entries


def test_two_processes_search_into_one_file(tmp_path):
    path = tmp_path / "shared.bin"
    processes = [subprocess.Popen([sys.executable, "-c", SEARCH_SCRIPT, str(path), "4"],
                                  stdout=subprocess.DEVNULL) for _ in range(2)]
    assert [p.wait() for p in processes] == [0, 0]
    keys = {key for _, key, _ in FileCache(path)}
    assert len(keys) == 4
