"""The budgeted search (fastrun.core.tuning) on fake algorithms and the fake clock: which candidates
are timed fully, what the rest are excluded with, determinism, and the budget settings."""

from __future__ import annotations

import pytest

from fastrun.cache import InMemoryCache
from fastrun.core import tuning
from fastrun.core.chooser import AlgoChooser
from fastrun.core.strategy import SearchOptions, Strategy
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, make_registry, problem

US = 1_000


@pytest.fixture
def clock():
    return FakeClock()


def chooser(algorithms, clock, **options):
    opts = SearchOptions(strategy=Strategy.parse("fast-run"), budget_s=0.01, **options)
    return AlgoChooser(make_registry(*algorithms), FakeDevice(clock), InMemoryCache(), opts,
                       clock=clock)


def space(clock, costs_us):
    """One fake configuration per cost, heuristic order = list order."""
    return [FakeAlgo("fake", f"cfg{index:03d}", cost * US, clock, heuristic_rank=index)
            for index, cost in enumerate(costs_us)]


def test_a_space_within_the_budget_is_timed_fully(clock):
    algorithms = space(clock, [50 - i for i in range(10)])
    decision = chooser(algorithms, clock, tuning_budget=10).decide(problem())
    assert len(decision.entries) == 10
    assert decision.algorithm.name == "cfg009"
    assert not any("halving" in reason for reason in decision.excluded.values())


def test_halving_times_only_the_budget_fully_and_finds_the_fastest(clock):
    # 30 candidates, budget 8: the sample (4 x 8 = 32) covers them all; the fastest is last
    # in the heuristic's order and must survive the halving 30 -> 15 -> 8.
    costs = [100 + 7 * i for i in range(29)] + [20]
    algorithms = space(clock, costs)
    decision = chooser(algorithms, clock, tuning_budget=8).decide(problem())
    assert decision.algorithm.name == "cfg029"
    assert len(decision.entries) == 8  # only the survivors are timed fully and cached
    dropped = {name: reason for name, reason in decision.excluded.items()
               if "successive halving" in reason}
    assert len(dropped) == 30 - 8
    # the slowest went in the first round, after its one repeat, with its ratio to the best
    assert decision.excluded["cfg028"] == (
        "dropped by successive halving after 1 repeats: "
        f"{(100 + 7 * 28) / 20:.1f} times the best")
    # round two ran 2 repeats: those dropped there ran warm-up + 1, then warm-up + 2 times
    second_round = [a for a in algorithms if "after 3 repeats" in decision.excluded.get(
        a.desc.text, "")]
    assert len(second_round) == 15 - 8
    assert all(a.runs == 5 for a in second_round)
    first_round = [a for a in algorithms if "after 1 repeats" in decision.excluded.get(
        a.desc.text, "")]
    assert len(first_round) == 15 and all(a.runs == 2 for a in first_round)


def test_a_large_space_is_sampled_with_the_heuristic_first_ones_kept(clock):
    algorithms = space(clock, [100 + i for i in range(200)])
    decision = chooser(algorithms, clock, tuning_budget=5, seed=3).decide(problem())
    not_sampled = [name for name, reason in decision.excluded.items()
                   if "not in the budgeted search's sample" in reason]
    assert len(not_sampled) == 200 - 4 * 5
    ran = [a.desc.text for a in algorithms if a.runs]
    assert len(ran) == 20
    assert {f"cfg{i:03d}" for i in range(5)} <= set(ran)  # the heuristic's first five
    assert len(decision.entries) == 5
    # the best of the heuristic's picks is cfg000 (cost 100), the fastest of all sampled
    assert decision.algorithm.name == "cfg000"


def test_the_sample_and_the_result_are_deterministic(clock):
    def run(seed):
        local = FakeClock()
        algorithms = space(local, [300 - (i * 37) % 250 for i in range(120)])
        decision = chooser(algorithms, local, tuning_budget=6, seed=seed).decide(problem())
        return decision.algorithm.name, sorted(a.desc.text for a in algorithms if a.runs)

    assert run(0) == run(0)
    assert run(0)[1] != run(1)[1]


def test_failures_in_a_brief_round_are_excluded_with_their_reason(clock):
    algorithms = space(clock, [100 + i for i in range(12)])
    algorithms[3].raises = True
    decision = chooser(algorithms, clock, tuning_budget=4).decide(problem())
    assert decision.excluded["cfg003"] == "raised RuntimeError: cfg003 crashed"
    assert decision.algorithm.name == "cfg000"


def test_budget_zero_times_everything_and_the_variable_sets_the_default(clock, monkeypatch):
    algorithms = space(clock, [100 + i for i in range(30)])
    assert len(chooser(algorithms, clock, tuning_budget=0).decide(problem()).entries) == 30
    monkeypatch.setenv("FASTRUN_TUNING_CANDIDATES", "7")
    assert tuning.resolve_budget(None) == 7
    assert tuning.resolve_budget(3) == 3
    local = FakeClock()
    decision = chooser(space(local, [100 + i for i in range(30)]), local).decide(problem())
    assert len(decision.entries) == 7
    monkeypatch.delenv("FASTRUN_TUNING_CANDIDATES")
    assert tuning.resolve_budget(None) == tuning.DEFAULT_BUDGET
    monkeypatch.setenv("FASTRUN_TUNING_BUDGET", "5")  # the old name still works, with a warning
    with pytest.warns(DeprecationWarning, match="use FASTRUN_TUNING_CANDIDATES"):
        assert tuning.resolve_budget(None) == 5



def test_profile_seconds_variable_and_its_old_name(monkeypatch):
    from fastrun import config

    monkeypatch.setenv("FASTRUN_PROFILE_SECONDS", "0.3")
    assert config.PROFILE_SECONDS.get() == 0.3
    monkeypatch.delenv("FASTRUN_PROFILE_SECONDS")
    monkeypatch.setenv("FASTRUN_PROFILE_BUDGET", "0.4")
    with pytest.warns(DeprecationWarning, match="use FASTRUN_PROFILE_SECONDS"):
        assert config.PROFILE_SECONDS.get() == 0.4


def test_the_sample_follows_the_configurations_not_their_positions(clock):
    """Problems whose usable configurations overlap sample the same ones (a device then
    compiles each once): the choice depends on the names and the seed only."""
    algorithms = space(clock, [10] * 60)
    picked = tuning._stable_sample(algorithms, 12, seed=0)
    assert {a.desc.text for a in picked} == {
        a.desc.text for a in tuning._stable_sample(algorithms[::-1], 12, seed=0)}
    # three of them unusable for another problem: the other nine are still in its sample
    fewer = [a for a in algorithms if a not in picked[:3]]
    assert set(picked[3:]) <= set(tuning._stable_sample(fewer, 12, seed=0))
    assert {a.desc.text for a in tuning._stable_sample(algorithms, 12, seed=1)} != {
        a.desc.text for a in picked}
