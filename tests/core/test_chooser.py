"""Chooser semantics with fake algorithms on a fake clock: every strategy, attribute filter,
workspace limit, failure mode, recursive search and error message."""

from __future__ import annotations

import pytest

from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, InMemoryCache, low_confidence
from fastrun.core.chooser import AlgoChooser, NoUsableAlgorithmError
from fastrun.core.strategy import SearchOptions, Strategy
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, N, R, make_registry, problem

MS = 1_000_000


@pytest.fixture
def clock():
    return FakeClock()


def chooser(registry, clock, strategy="fast-run", cache=None, **options):
    opts = SearchOptions(strategy=Strategy.parse(strategy), budget_s=0.01, **options)
    return AlgoChooser(registry, FakeDevice(clock), cache if cache is not None else InMemoryCache(),
                       opts, clock=clock)


def algos(clock, *specs, operator="fake"):
    return [FakeAlgo(operator, name, cost, clock, **kw) for name, cost, kw in specs]


def test_profile_picks_fastest_and_records_exact_timings(clock):
    slow, fast, mid = algos(clock, ("slow", 5 * MS, {}), ("fast", 1 * MS, {}), ("mid", 2 * MS, {}))
    cache = InMemoryCache()
    c = chooser(make_registry(slow, fast, mid), clock, cache=cache)
    decision = c.decide(problem())
    assert decision.algorithm is fast
    assert decision.source == "profiled"
    assert [e.algorithm for e in decision.entries][:2] == ["fast", "mid"]
    assert decision.entries[0].time_s == pytest.approx(1e-3)
    assert decision.entries[0].spread_s == 0.0
    assert decision.entries[0].error == 0.0
    # written to the cache at once, under the device/operator category
    (category, key, entries), = list(cache)
    version = c.registry.algorithm_set_version("fake", "cpu")  # derived (test_versions.py)
    assert category == f"fake-device|fake@{version}"
    assert key == problem().key
    assert entries[0].algorithm == "fast"


def test_repeats_fill_the_budget(clock):
    one, other = algos(clock, ("one", 1 * MS, {"heuristic_rank": 0}),
                       ("other", 1 * MS, {"heuristic_rank": 1}))
    c = chooser(make_registry(one, other), clock, confirm_rounds=0)
    entry = next(e for e in c.decide(problem()).entries if e.algorithm == "one")
    assert entry.repeats == 10  # 10 ms budget / 1 ms per run
    assert one.runs == 12  # plus the warm-up and the call on other inputs


def test_a_prelude_runs_before_each_timed_call_and_counts_against_the_budget(clock):
    """A runtime times candidates right after the model's previous step: that step runs
    before every timed call, is not part of the measurement, and its time uses up budget."""
    one, other = algos(clock, ("one", 1 * MS, {"heuristic_rank": 0}),
                       ("other", 1 * MS, {"heuristic_rank": 1}))
    order: list[str] = []
    one.log = other.log = order

    def prelude():
        order.append("prelude")
        clock.now += 1 * MS

    decision = chooser(make_registry(one, other), clock, confirm_rounds=0).decide(
        problem(), prelude=prelude)
    entry = next(e for e in decision.entries if e.algorithm == "one")
    assert entry.time_s == pytest.approx(1e-3)  # the prelude's millisecond is not in it
    assert entry.repeats == 5  # 10 ms budget / (1 ms prelude + 1 ms run)
    timed = order[1:1 + 2 * entry.repeats]  # after the warm-up
    assert timed == ["prelude", "run fake:one"] * entry.repeats


def test_an_algorithm_the_device_cannot_run_is_excluded_before_timing(clock):
    big, small = algos(clock, ("big", 1 * MS, {}), ("small", 2 * MS, {}))
    big.device_unusable_reason = lambda device, problem: "work-group too large for fake-device"
    decision = chooser(make_registry(big, small), clock).decide(problem())
    assert decision.algorithm is small and big.runs == 0
    assert decision.excluded["big"] == "not usable: work-group too large for fake-device"


def test_a_lone_candidate_is_taken_without_timing_or_caching(clock):
    """One eligible algorithm: profiling could not change the choice, so none is done."""
    (one,) = algos(clock, ("one", 1 * MS, {}))
    cache = InMemoryCache()
    c = chooser(make_registry(one), clock, cache=cache)
    decision = c.decide(problem())
    assert decision.algorithm is one and decision.source == "only"
    assert one.runs == 0 and len(cache) == 0
    assert (c.stats.single, c.stats.profiled) == (1, 0)


def test_clearly_slower_candidate_is_stopped_early(clock):
    fast, slow = algos(clock, ("fast", 1 * MS, {"heuristic_rank": 0}),
                       ("slow", 3 * MS, {"heuristic_rank": 1}))
    c = chooser(make_registry(fast, slow), clock)
    decision = c.decide(problem())
    by_name = {e.algorithm: e for e in decision.entries}
    assert by_name["slow"].repeats == 2 < by_name["fast"].repeats
    assert by_name["slow"].time_s == pytest.approx(3e-3)


def test_one_run_over_budget_stops_a_hopeless_candidate(clock):
    fast, glacial = algos(clock, ("fast", 1 * MS, {"heuristic_rank": 0}),
                          ("glacial", 500 * MS, {"heuristic_rank": 1}))
    c = chooser(make_registry(fast, glacial), clock)
    entry = {e.algorithm: e for e in c.decide(problem()).entries}["glacial"]
    assert glacial.runs == 3  # the warm-up, one timed run and the call on other inputs
    assert entry.repeats == 1 and entry.time_s == pytest.approx(0.5)


def test_warmup_cost_is_never_taken_for_the_time(clock):
    fast, compiled = algos(clock, ("fast", 1 * MS, {"heuristic_rank": 0}),
                           ("compiled", 1 * MS // 2, {"heuristic_rank": 1,
                                                     "warmup_extra_ns": 2000 * MS}))
    decision = chooser(make_registry(fast, compiled), clock).decide(problem())
    assert decision.algorithm is compiled
    assert decision.entries[0].time_s == pytest.approx(0.5e-3)


def test_optimized_never_runs_naive(clock):
    naive, other = algos(clock, ("naive", 1, {"attributes": N | R}), ("other", 5 * MS, {}))
    decision = chooser(make_registry(naive, other), clock, "fast-run").decide(problem())
    assert decision.algorithm is other
    assert naive.runs == 0
    assert "NAIVE excluded by strategy" in decision.excluded["naive"]


def test_full_run_considers_naive(clock):
    naive, other = algos(clock, ("naive", 1 * MS, {"attributes": N | R}), ("other", 5 * MS, {}))
    decision = chooser(make_registry(naive, other), clock, "full-run").decide(problem())
    assert decision.algorithm is naive


def test_reproducible_profiles_all_but_chooses_reproducible(clock):
    fast, repro = algos(clock, ("fast", 1 * MS, {"attributes": AlgoAttribute.NONE}),
                        ("repro", 3 * MS, {"attributes": R}))
    cache = InMemoryCache()
    decision = chooser(make_registry(fast, repro), clock, "fast-run+reproducible",
                       cache=cache).decide(problem())
    assert decision.algorithm is repro
    assert fast.runs > 0  # timed anyway, so the cache also serves non-reproducible runs
    assert "lacks REPRODUCIBLE" in decision.excluded["fast"]
    (_, _, entries), = list(cache)
    assert {e.algorithm for e in entries} == {"fast", "repro"}
    # and the same cache serves a plain run with the faster algorithm, with no new timing
    runs = fast.runs
    plain = chooser(make_registry(*algos(clock, ("fast", 1 * MS, {"attributes":
                    AlgoAttribute.NONE}), ("repro", 3 * MS, {}))), clock, "fast-run", cache=cache)
    assert plain.decide(problem()).algorithm.name == "fast"
    assert plain.decide(problem()).source == "cache"
    assert fast.runs == runs


def test_heuristic_times_nothing_and_follows_the_rule(clock):
    first, second = algos(clock, ("first", 9 * MS, {"heuristic_rank": 0}),
                          ("second", 1 * MS, {"heuristic_rank": 1}))
    c = chooser(make_registry(first, second), clock, "heuristic")
    decision = c.decide(problem())
    assert decision.algorithm is first and decision.source == "heuristic"
    assert first.runs == second.runs == 0
    assert decision.policy.time_s is None


def test_heuristic_respects_required_attributes_and_workspace(clock):
    big, nonrepro, ok = algos(
        clock, ("big", 1, {"heuristic_rank": 0, "workspace": 1 << 20}),
        ("nonrepro", 1, {"heuristic_rank": 1, "attributes": AlgoAttribute.NONE}),
        ("ok", 1, {"heuristic_rank": 2}))
    c = chooser(make_registry(big, nonrepro, ok), clock, "heuristic+reproducible",
                workspace_limit=1024)
    decision = c.decide(problem())
    assert decision.algorithm is ok
    assert "over the limit of 1.0 KiB" in decision.excluded["big"]
    assert "lacks REPRODUCIBLE" in decision.excluded["nonrepro"]


def test_cache_given_without_profile_is_used_before_heuristic(clock):
    first, second = algos(clock, ("first", 9 * MS, {"heuristic_rank": 0}),
                          ("second", 1 * MS, {"heuristic_rank": 1}))
    registry = make_registry(first, second)
    cache = InMemoryCache()
    chooser(registry, clock, "fast-run", cache=cache).decide(problem())  # search once
    runs = (first.runs, second.runs)
    c = chooser(registry, clock, "heuristic", cache=cache)
    decision = c.decide(problem())
    assert decision.algorithm is second and decision.source == "cache"
    assert (first.runs, second.runs) == runs
    # a miss far from every measured problem falls back to the heuristic, still without timing
    # (8 -> 64 is distance 3; the nearest-neighbour tests are in test_nearest.py)
    other = c.decide(problem(n=64))
    assert other.source == "heuristic" and (first.runs, second.runs) == runs
    assert c.stats.cache_hits == 1 and c.stats.heuristic == 1 and c.stats.profiled == 0


def test_second_search_with_same_cache_profiles_nothing(clock):
    a, b = algos(clock, ("a", 2 * MS, {}), ("b", 1 * MS, {}))
    registry = make_registry(a, b)
    cache = InMemoryCache()
    chooser(registry, clock, cache=cache).decide(problem())
    before = (a.runs, b.runs)
    again = chooser(registry, clock, cache=cache)
    assert again.decide(problem()).source == "cache"
    assert (a.runs, b.runs) == before
    assert again.stats.profiled == 0


def test_workspace_limit_excludes_from_profiling_and_from_cache_choice(clock):
    greedy, frugal = algos(clock, ("greedy", 1 * MS, {"workspace": 4096}),
                           ("frugal", 2 * MS, {"workspace": 16}))
    registry = make_registry(greedy, frugal)
    cache = InMemoryCache()
    unlimited = chooser(registry, clock, cache=cache).decide(problem())
    assert unlimited.algorithm is greedy
    limited = chooser(registry, clock, cache=cache, workspace_limit=1024)
    decision = limited.decide(problem())
    assert decision.algorithm is frugal and decision.source == "cache"
    greedy.runs = 0
    fresh = chooser(registry, clock, workspace_limit=1024).decide(problem())
    assert fresh.algorithm is frugal and greedy.runs == 0
    assert "needs 4.0 KiB of workspace" in fresh.excluded["greedy"]


def test_cache_without_eligible_entry_triggers_profiling(clock):
    fast, repro = algos(clock, ("fast", 1 * MS, {"attributes": AlgoAttribute.NONE}),
                        ("repro", 3 * MS, {}))
    registry = make_registry(fast, repro)
    cache = InMemoryCache()
    category = chooser(registry, clock).category(registry.operator("fake"))
    entry = Entry("fast", AlgoAttribute.NONE, 1e-3, 0.0, 0, 0.0, 5, 0.0, "test")
    cache.put(category, problem().key, [entry])
    decision = chooser(registry, clock, "fast-run+reproducible", cache=cache).decide(problem())
    assert decision.algorithm is repro and decision.source == "profiled"
    assert {e.algorithm for e in cache.get(category, problem().key)} == {"fast", "repro"}


def test_cache_entry_of_unknown_algorithm_is_ignored(clock):
    only, naive = algos(clock, ("only", 1 * MS, {}),
                        ("naive", 5 * MS, {"attributes": N | R, "heuristic_rank": 1}))
    registry = make_registry(only, naive)
    cache = InMemoryCache()
    category = chooser(registry, clock).category(registry.operator("fake"))
    gone = Entry("removed-algorithm", R, 1e-9, 0.0, 0, 0.0, 5, 0.0, "old")
    cache.put(category, problem().key, [gone])
    decision = chooser(registry, clock, "heuristic", cache=cache).decide(problem())
    assert decision.algorithm is only and decision.source == "heuristic"


def test_wrong_and_crashing_algorithms_are_excluded_and_recorded(clock):
    wrong, crash, good = algos(clock, ("wrong", 1, {"wrong": True}), ("crash", 1, {"raises": True}),
                               ("good", 5 * MS, {}))
    decision = chooser(make_registry(wrong, crash, good), clock).decide(problem())
    assert decision.algorithm is good
    failures = {f.algorithm: f for f in decision.failures}
    assert "numerical error" in failures["wrong"].reason and failures["wrong"].error > 0.1
    assert "raised RuntimeError: crash crashed" in failures["crash"].reason
    assert [e.algorithm for e in decision.entries] == ["good"]


def test_no_usable_algorithm_names_problem_strategy_and_every_reason(clock):
    naive, odd, big, crash = algos(
        clock, ("naive", 1, {"attributes": N | R}), ("odd", 1, {"unusable": "needs even n"}),
        ("big", 1, {"workspace": 10**9}), ("crash", 1, {"raises": True}))
    c = chooser(make_registry(naive, odd, big, crash), clock, "fast-run", workspace_limit=1000)
    with pytest.raises(NoUsableAlgorithmError) as info:
        c.decide(problem())
    message = str(info.value)
    assert "fake(float64[8])" in message
    assert "strategy=fast-run" in message and "workspace limit=1000 B" in message
    assert "naive: NAIVE excluded by strategy" in message
    assert "odd: not usable: needs even n" in message
    assert "big: needs 953.7 MiB of workspace, over the limit of 1000 B" in message
    assert "crash: raised RuntimeError" in message
    assert "hint: --full-run" in message


def test_dispatch_after_decision_is_a_lookup(clock, monkeypatch):
    (only,) = algos(clock, ("only", 1 * MS, {}))
    c = chooser(make_registry(only), clock)
    import numpy as np

    x = np.ones(8)
    np.testing.assert_array_equal(c.dispatch("fake", x), 2 * x)
    calls = []
    monkeypatch.setattr(c, "decide", lambda p: calls.append(p))
    monkeypatch.setattr(c.registry, "operator", lambda name: calls.append(name))
    np.testing.assert_array_equal(c.dispatch("fake", x), 2 * x)
    assert calls == []


def test_sub_problems_are_decided_first_and_parent_runs_the_childs_pick(clock):
    log: list[str] = []
    child_problem = problem("child", 4)
    c_slow, c_fast = algos(clock, ("c_slow", 4 * MS, {}), ("c_fast", 1 * MS, {}),
                           operator="child")
    parent, plain = algos(clock, ("parent", 1 * MS, {"subs": [child_problem, child_problem]}),
                          ("plain", 10 * MS, {}))
    for algorithm in (c_slow, c_fast, parent, plain):
        algorithm.log = log
    c = chooser(make_registry(c_slow, c_fast, parent, plain), clock)
    decision = c.decide(problem())
    # children were profiled before any parent candidate ran
    first_parent_run = min(i for i, line in enumerate(log) if line.startswith("run fake:"))
    assert all(line.startswith("run child:") for line in log[:first_parent_run])
    # while the parent is timed, its sub-problem dispatches to the child's winner only
    slow_runs = c_slow.runs
    assert decision.algorithm is parent
    assert decision.entries[0].time_s == pytest.approx(3e-3)  # 1 ms + 2 x 1 ms (c_fast)
    assert c_slow.runs == slow_runs
    policy = decision.policy
    assert [child.algorithm for child in policy.children] == ["c_fast"]  # de-duplicated
    assert policy.children[0].source == "profiled"
    # the parent's search time contains the child's; the session total counts it once
    child_decision = c.decide(child_problem)
    assert decision.search_seconds >= child_decision.search_seconds > 0
    assert c.stats.search_seconds == decision.search_seconds
    assert c.stats.profiled == 2


def test_workspace_of_a_parent_includes_its_sub_problems(clock):
    child_problem = problem("child", 4)
    (child,) = algos(clock, ("child_alg", 1, {"workspace": 600}), operator="child")
    parent, other = algos(clock, ("parent", 1, {"workspace": 500, "subs": [child_problem]}),
                          ("other", 5 * MS, {}))
    c = chooser(make_registry(child, parent, other), clock, workspace_limit=1000)
    decision = c.decide(problem())
    assert decision.algorithm is other
    assert "needs 1.1 KiB of workspace" in decision.excluded["parent"]


def test_cycle_is_detected_and_excludes_the_candidate(clock):
    selfish, honest = algos(clock, ("selfish", 1, {"subs": [problem()]}), ("honest", 2 * MS, {}))
    decision = chooser(make_registry(selfish, honest), clock).decide(problem())
    assert decision.algorithm is honest
    assert decision.excluded["selfish"] == (
        "sub-problem cycle: fake(float64[8]) -> fake(float64[8])")


def test_indirect_cycle_is_reported_with_its_chain(clock):
    there = FakeAlgo("fake", "there", 1, clock, subs=[problem("child", 8)])
    back = FakeAlgo("child", "back", 1, clock, subs=[problem("fake", 8)])
    with pytest.raises(NoUsableAlgorithmError) as info:
        chooser(make_registry(there, back), clock).decide(problem())
    assert "sub-problem child(float64[8]) has no usable algorithm" in str(info.value)


def test_strategy_parse():
    assert Strategy.parse("fast-run") == Strategy.PROFILE | Strategy.OPTIMIZED
    assert Strategy.parse("full-run") == Strategy.PROFILE
    assert Strategy.parse("reproducible") == Strategy.HEURISTIC | Strategy.REPRODUCIBLE
    assert Strategy.parse("fast-run+reproducible").required() == AlgoAttribute.REPRODUCIBLE
    assert Strategy.parse("fast-run").forbidden() == AlgoAttribute.NAIVE
    with pytest.raises(ValueError, match="unknown strategy 'fastest'"):
        Strategy.parse("fastest")


def test_entries_of_another_device_category_are_kept_but_not_used(clock):
    first, second = algos(clock, ("first", 9 * MS, {"heuristic_rank": 0}),
                          ("second", 1 * MS, {"heuristic_rank": 1}))
    registry = make_registry(first, second)
    cache = InMemoryCache()
    foreign = "other-device|fake@1|format=1"
    cache.put(foreign, problem().key, [Entry("second", R, 1e-9, 0.0, 0, 0.0, 9, 0.0, "t")])
    decision = chooser(registry, clock, "heuristic", cache=cache).decide(problem())
    assert decision.source == "heuristic" and decision.algorithm is first
    assert cache.get(foreign, problem().key)[0].algorithm == "second"


def test_weight_preprocessing_is_outside_the_timing_and_in_the_key(clock):
    from fastrun.operator import Problem
    from tests.fakes import PreprocessingAlgo

    wino = PreprocessingAlgo("fake", "wino", 1 * MS, clock, transform_ns=3 * MS)
    plain = FakeAlgo("fake", "plain", 2 * MS, clock)
    registry = make_registry(wino, plain)
    off = chooser(registry, clock).decide(problem())
    assert off.algorithm is plain  # 1 ms + 3 ms of transform per call
    assert {e.algorithm: e.time_s for e in off.entries}["wino"] == pytest.approx(4e-3)

    on_problem = Problem.create("fake", [(8,)], ["float64"], {"weight_preprocess": True})
    assert on_problem.key != problem().key and on_problem.key.endswith("weight_preprocess=true")
    c = chooser(registry, clock)
    on = c.decide(on_problem)
    assert on.algorithm is wino
    assert {e.algorithm: e.time_s for e in on.entries}["wino"] == pytest.approx(1e-3)

    import numpy as np

    bound = c.prepare(on_problem, [np.ones(8)])
    before = wino.transforms
    for _ in range(3):
        np.testing.assert_array_equal(bound(np.ones(8)), 2 * np.ones(8))
    assert wino.transforms == before  # transformed once, when prepared


class SlowPeriodAlgo(FakeAlgo):
    """Costs ``block_ns`` for its runs from ``slow_from`` to ``slow_runs`` (by default its
    block of repeats falls into a slow period of the machine), ``cost_ns`` otherwise."""

    def __init__(self, *args, block_ns: int, slow_runs: int, slow_from: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.block_ns, self.slow_runs, self.slow_from = block_ns, slow_runs, slow_from

    def run(self, problem, inputs, ctx, prepared=None):
        if self.slow_from <= self.runs < self.slow_runs:
            self.clock.now += self.block_ns - self.cost_ns
        return super().run(problem, inputs, ctx, prepared)


def test_close_candidates_are_confirmed_in_interleaved_rounds(clock):
    """'lucky' is 1 ms but its whole block (warm-up + 5 repeats in the 10 ms budget) ran at
    2.2 ms; 'steady' is 1.5 ms throughout, and 'far' (4 ms) is not close enough to take part.
    The interleaved rounds see 'lucky' at its real speed, so it wins and its entry carries the
    rounds' figures."""
    lucky = SlowPeriodAlgo("fake", "lucky", 1 * MS, clock, block_ns=2_200_000, slow_runs=6)
    steady, far = algos(clock, ("steady", 1_500_000, {"heuristic_rank": 1}),
                        ("far", 4 * MS, {"heuristic_rank": 2}))
    log = []
    for algorithm in (lucky, steady, far):
        algorithm.log = log
    decision = chooser(make_registry(lucky, steady, far), clock).decide(problem())
    entries = {e.algorithm: e for e in decision.entries}
    assert decision.algorithm.desc.name == "lucky"
    assert entries["lucky"].time_s == pytest.approx(1e-3)
    assert entries["steady"].time_s == pytest.approx(1.5e-3)
    # 3 rounds of 2.5 ms reach the 10 ms budget after the 4th: 4 rounds
    assert entries["lucky"].repeats == entries["steady"].repeats == 4
    assert entries["far"].time_s == pytest.approx(4e-3)  # its block median stands
    # one call of each per round, by block median first, the order rotating round by round
    rounds = [line.split(":")[1] for line in log[-8:]]
    assert rounds == ["steady", "lucky", "lucky", "steady", "steady", "lucky", "lucky",
                      "steady"]


def test_a_slow_period_during_the_rounds_lets_no_slower_candidate_ahead(clock):
    """Measured on the 16-core host: the rounds of two batched-matmul candidates fell into a
    slow period (10x), and a candidate stopped early at 3x the best then ranked first.  Each
    contender keeps the smaller of its block and rounds medians: the order stands."""
    # warm-up + 10 repeats fill the 10 ms budget of a 1 ms block; the rounds come after
    best = SlowPeriodAlgo("fake", "best", 1 * MS, clock, block_ns=10 * MS, slow_from=11,
                          slow_runs=100)
    close = SlowPeriodAlgo("fake", "close", 1_200_000, clock, block_ns=12 * MS, slow_from=10,
                           slow_runs=100, heuristic_rank=1)
    (slow,) = algos(clock, ("slow", 3 * MS, {"heuristic_rank": 2}))
    decision = chooser(make_registry(best, close, slow), clock).decide(problem())
    assert [e.algorithm for e in decision.entries] == ["best", "close", "slow"]
    assert [e.time_s for e in decision.entries] == pytest.approx([1e-3, 1.2e-3, 3e-3])
    assert close.runs > 10  # it did take part in the rounds


def test_the_heuristics_pick_is_confirmed_even_when_its_block_looked_slow(clock):
    """The heuristic's pick (tried first) had its whole block in a slow period (4 ms, beyond
    the confirmation ratio of the 1.5 ms runner-up); the rounds see its real 1 ms, so the
    search does not choose worse than the heuristic would have."""
    guess = SlowPeriodAlgo("fake", "guess", 1 * MS, clock, block_ns=4 * MS, slow_runs=4)
    (other,) = algos(clock, ("other", 1_500_000, {"heuristic_rank": 1}))
    decision = chooser(make_registry(guess, other), clock).decide(problem())
    assert decision.algorithm is guess
    assert decision.entries[0].time_s == pytest.approx(1e-3)


def test_without_confirmation_the_slow_block_decides(clock):
    lucky = SlowPeriodAlgo("fake", "lucky", 1 * MS, clock, block_ns=2_200_000, slow_runs=6)
    (steady,) = algos(clock, ("steady", 1_500_000, {"heuristic_rank": 1}))
    decision = chooser(make_registry(lucky, steady), clock, confirm_rounds=0).decide(problem())
    assert decision.algorithm.desc.name == "steady"


def test_a_candidate_that_raises_during_the_confirmation_leaves_the_first_ranking(clock, caplog):
    """A flaky algorithm that worked while its block was timed and raises in the rounds: the
    search keeps the block ranking (and says so) instead of failing."""

    class Flaky(FakeAlgo):
        def run(self, problem, inputs, ctx, prepared=None):
            # warm-up, 10 repeats (10 ms budget) and the call on other inputs went through
            if self.runs >= 12:
                raise RuntimeError("flaky")
            return super().run(problem, inputs, ctx, prepared)

    flaky = Flaky("fake", "flaky", 1 * MS, clock)
    (steady,) = algos(clock, ("steady", 1_200_000, {"heuristic_rank": 1}))
    decision = chooser(make_registry(flaky, steady), clock).decide(problem())
    assert decision.algorithm.desc.name == "flaky"  # the block ranking
    assert "confirmation of" in caplog.text and "flaky raised RuntimeError" in caplog.text


def test_equal_times_pick_what_the_cache_puts_first(clock):
    """A tie in time goes to the smaller workspace, then the name, in the search as in a later
    cache lookup (PoCL's timer made two OpenCL configurations tie exactly)."""
    zeta, alpha = algos(clock, ("zeta", 1 * MS, {"heuristic_rank": 0}),
                        ("alpha", 1 * MS, {"heuristic_rank": 1}))
    registry = make_registry(zeta, alpha)
    cache = InMemoryCache()
    decision = chooser(registry, clock, "fast-run", cache=cache, confirm_rounds=0
                       ).decide(problem())
    ((_, _, entries),) = list(cache)
    assert decision.algorithm is alpha and entries[0].algorithm == "alpha"
    again = chooser(registry, clock, "heuristic", cache=cache).decide(problem())
    assert again.source == "cache" and again.algorithm is alpha


# -- unstable timing -------------------------------------------------------------------------
class Jittery(FakeAlgo):
    """Costs 1 and 5 ms by turns (a machine too busy to time on) for its first ``jitter``
    runs, then a steady 2 ms."""

    def __init__(self, name, clock, jitter, **kw):
        super().__init__("fake", name, 2 * MS, clock, **kw)
        self.jitter = jitter

    def run(self, problem, inputs, ctx, prepared=None):
        if self.runs < self.jitter:
            self.clock.now += (1 if self.runs % 2 else 5) * MS - self.cost_ns
        return super().run(problem, inputs, ctx, prepared)


def test_an_unstable_timing_is_timed_again_and_a_steady_block_replaces_it(clock):
    shaky = Jittery("shaky", clock, jitter=6)
    slow = FakeAlgo("fake", "slow", 20 * MS, clock, heuristic_rank=1)
    cache = InMemoryCache()
    decision = chooser(make_registry(shaky, slow), clock, cache=cache).decide(problem())
    entry = next(e for e in decision.entries if e.algorithm == "shaky")
    assert not entry.unstable and entry.time_s == pytest.approx(2e-3)
    assert low_confidence(decision.entries) is None


def test_a_pick_that_stays_unstable_is_warned_about_once_and_measured_again_later(clock,
                                                                                  caplog):
    from fastrun.core import profiler

    profiler._unstable_warned.clear()
    shaky = Jittery("shaky", clock, jitter=10**9)
    slow = FakeAlgo("fake", "slow", 20 * MS, clock, heuristic_rank=1)
    cache = InMemoryCache()
    registry = make_registry(shaky, slow)
    with caplog.at_level("WARNING", logger="fastrun.core.profiler"):
        decision = chooser(registry, clock, cache=cache).decide(problem())
        chooser(registry, clock, cache=InMemoryCache()).decide(problem())  # no second warning
    assert decision.algorithm is shaky
    assert low_confidence(decision.entries).algorithm == "shaky"
    warnings = [r for r in caplog.records if "timing is unstable" in r.getMessage()]
    assert len(warnings) == 1 and "low-confidence" in warnings[0].getMessage()
    (_, _, stored), = list(cache)
    assert low_confidence(stored) is not None
    # a later search measures it again; a run that may not time takes the cached pick
    runs = shaky.runs
    later = chooser(registry, clock, cache=cache)
    assert later.decide(problem()).source == "profiled"
    assert shaky.runs > runs and later.stats.profiled == later.stats.remeasured == 1
    assert chooser(registry, clock, "heuristic", cache=cache).decide(
        problem()).source == "cache"


def test_a_steady_measurement_replaces_an_unstable_one_whatever_their_repeats():
    from fastrun.cache import entry_to_raw, merge_entries
    from fastrun.cache.store import merge_raw

    def entry(time_s, spread_s, repeats, at):
        return Entry("a", R, time_s, spread_s, 0, None, repeats, at, "1")

    shaky, steady = entry(1e-3, 2e-3, 50, 1.0), entry(2e-3, 1e-4, 5, 0.5)
    assert shaky.unstable and not steady.unstable
    for old, new in ((shaky, steady), (steady, shaky)):
        assert merge_entries([old], [new]) == [steady]
        merged = merge_raw("c", "k", [entry_to_raw(old)], [entry_to_raw(new)])
        assert merged == [entry_to_raw(steady)]
    # two steady ones: more repeats still wins
    more = entry(3e-3, 1e-4, 9, 0.1)
    assert merge_entries([more], [steady]) == [more]
