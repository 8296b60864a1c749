"""Serving a missed problem from the nearest measured one (issue 17, item 2): used only without
a search, only for comparable problems within the limit, never with an algorithm that cannot
compute the new problem, reported as ``nearest`` with the neighbour's key and distance."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fastrun
from fastrun.cache import FileCache, InMemoryCache
from fastrun.core.chooser import AlgoChooser
from fastrun.core.strategy import SearchOptions, Strategy
from fastrun.operator import Problem, split_key
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, make_registry, problem

MS = 1_000_000


@pytest.fixture
def clock():
    return FakeClock()


def chooser(registry, clock, strategy, cache, **options):
    opts = SearchOptions(strategy=Strategy.parse(strategy), budget_s=0.01, **options)
    return AlgoChooser(registry, FakeDevice(clock), cache, opts, clock=clock)


class SmallOnly(FakeAlgo):
    """Computes problems of up to ``largest`` elements only."""

    def __init__(self, *args, largest: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.largest = largest

    def unusable_reason(self, problem):
        return None if problem.shapes[0][0] <= self.largest else "too large"


def two_algorithms(clock, **second):
    """'rule' is the heuristic's first pick and slow; 'fast' is what a search finds.  'rule'
    needs less workspace, so the cache keeps both entries (neither dominates)."""
    rule = FakeAlgo("fake", "rule", 5 * MS, clock, heuristic_rank=0)
    cls = SmallOnly if "largest" in second else FakeAlgo
    fast = cls("fake", "fast", 1 * MS, clock, heuristic_rank=1, workspace=1024, **second)
    return rule, fast


def searched(registry, clock, *sizes, cache=None):
    cache = cache if cache is not None else InMemoryCache()
    searching = chooser(registry, clock, "fast-run", cache)
    for n in sizes:
        searching.decide(problem(n=n))
    return cache


def test_split_key_reads_back_every_problem_key():
    for p in (Problem.create("conv", [(1, 64, 56, 56), (64, 64, 3, 3), (64,)], ["float32"] * 3,
                             {"strides": (1, 1), "pads": (1, 1, 1, 1), "activation": "relu"}),
              Problem.create("matmul", [(128,), (128, 64)], ["float64"] * 2),
              Problem.create("scale", [()], ["float32"])):
        dtypes, shapes, params = split_key(p.key)
        assert dtypes == p.dtypes and shapes == p.shapes
        assert params == p.params_text
    for foreign in ("", "garbage", "float32[2x2]float32[3]", "f[2,2]", "float32[2x2],"):
        assert split_key(foreign) is None


def test_a_miss_near_a_measured_problem_takes_its_choice_and_names_it(clock):
    rule, fast = two_algorithms(clock)
    registry = make_registry(rule, fast)
    cache = searched(registry, clock, 32)
    runs = (rule.runs, fast.runs)
    c = chooser(registry, clock, "heuristic", cache)
    decision = c.decide(problem(n=64))
    assert decision.algorithm is fast and decision.source == "nearest"
    policy = decision.policy
    assert policy.neighbour == problem(n=32).key and policy.distance == pytest.approx(1.0)
    assert policy.time_s is None  # the neighbour's time measured another problem
    # ... carried here as an estimate: twice the elements, twice the time
    assert policy.estimate_s == pytest.approx(2 * 1e-3)
    assert "~2.000 ms estimated" in policy.render()
    assert f"nearest to {problem(n=32).key} (distance 1.00)" in policy.render()
    assert policy.to_dict()["neighbour"] == problem(n=32).key
    assert (rule.runs, fast.runs) == runs  # nothing timed
    assert c.stats.nearest == 1 and c.stats.heuristic == 0 and c.stats.profiled == 0
    # a search never takes a neighbour's word: it measures
    assert chooser(registry, clock, "fast-run", cache).decide(problem(n=64)).source == "profiled"


def test_the_limit_and_turning_it_off(clock):
    rule, fast = two_algorithms(clock)
    registry = make_registry(rule, fast)
    cache = searched(registry, clock, 32)
    assert chooser(registry, clock, "heuristic", cache).decide(problem(n=96)).source \
        == "heuristic"  # log2(96 / 32) = 1.58 > 1.0
    wider = chooser(registry, clock, "heuristic", cache, nearest=2.0).decide(problem(n=96))
    assert wider.source == "nearest" and wider.policy.distance == pytest.approx(math.log2(3))
    off = chooser(registry, clock, "heuristic", cache, nearest=0.0).decide(problem(n=64))
    assert off.source == "heuristic" and off.algorithm is rule


def test_the_nearest_of_several_wins(clock):
    rule, fast = two_algorithms(clock)
    registry = make_registry(rule, fast)
    cache = searched(registry, clock, 32, 128)
    c = chooser(registry, clock, "heuristic", cache, nearest=2.0)
    assert c.decide(problem(n=48)).policy.neighbour == problem(n=32).key      # 0.58 against 1.42
    assert c.decide(problem(n=96)).policy.neighbour == problem(n=128).key     # 0.42 against 1.58
    # at equal distances the larger problem's ranking is taken
    assert c.decide(problem(n=64)).policy.neighbour == problem(n=128).key
    # below 16 elements (a part-empty vector) against 32: never compared, whatever the limit
    assert c.decide(problem(n=12)).source == "heuristic"


def test_an_algorithm_unusable_for_the_new_problem_is_never_taken(clock):
    rule, fast = two_algorithms(clock, largest=32)
    slowest = FakeAlgo("fake", "slowest", 9 * MS, clock, heuristic_rank=2)  # two candidates left
    registry = make_registry(rule, fast, slowest)
    cache = searched(registry, clock, 32)
    assert [e.algorithm for e in cache.get(*next(iter(cache))[:2])] == ["fast", "rule"]
    decision = chooser(registry, clock, "heuristic", cache).decide(problem(n=64))
    # the neighbour's fastest cannot compute 64 elements: its next entry is taken
    assert decision.algorithm is rule and decision.source == "nearest"
    assert "too large" in decision.excluded["fast"]


def test_a_refused_neighbours_pick_is_warned_about_once(clock, caplog):
    from fastrun.core import chooser as chooser_module

    chooser_module._REFUSED.clear()  # other tests here refuse 'fast' too
    rule, fast = two_algorithms(clock, largest=32)
    slowest = FakeAlgo("fake", "slowest", 9 * MS, clock, heuristic_rank=2)  # two candidates left
    registry = make_registry(rule, fast, slowest)
    cache = searched(registry, clock, 32)
    with caplog.at_level("WARNING", logger="fastrun.core.chooser"):
        for n in (50, 50, 60):  # the same problem again, then another layer
            assert chooser(registry, clock, "heuristic", cache).decide(
                problem(n=n)).algorithm is rule
    refused = [r.getMessage() for r in caplog.records
               if "refused" in r.getMessage() and r.levelname == "WARNING"]
    assert len(refused) == 1 and "fast" in refused[0] and "too large" in refused[0]


class Sized(FakeAlgo):
    """Takes ``costs[n]`` nanoseconds on a problem of n elements: rankings that bend."""

    def __init__(self, *args, costs: dict[int, int], **kwargs):
        super().__init__(*args, **kwargs)
        self.costs = costs

    def run(self, problem, inputs, ctx, prepared=None):
        self.cost_ns = self.costs[problem.shapes[0][0]]
        return super().run(problem, inputs, ctx, prepared)


def test_two_neighbours_on_either_side_are_blended(clock):
    """'a' wins at 32 elements and loses at 128.  Carried to 64 (work in proportion to the
    elements): a 2 ms from 32 and 5 ms from 128; b 4 ms and 3 ms.  The nearer of two
    neighbours at equal distance is the larger one, which alone would pick b; blended (equal
    weights, geometric means) a takes sqrt(10) = 3.16 ms and b sqrt(12) = 3.46 ms."""
    from fastrun.attribute import AlgoAttribute

    a = Sized("fake", "a", 0, clock, costs={32: 1 * MS, 128: 10 * MS})
    b = Sized("fake", "b", 0, clock, costs={32: 2 * MS, 128: 6 * MS},
              attributes=AlgoAttribute.NONE)  # another attribute set: both entries are kept
    registry = make_registry(a, b)
    cache = searched(registry, clock, 32, 128)
    decision = chooser(registry, clock, "heuristic", cache).decide(problem(n=64))
    policy = decision.policy
    assert decision.algorithm is a and decision.source == "nearest"
    assert (policy.neighbour, policy.bracket) == (problem(n=128).key, problem(n=32).key)
    assert policy.distance == policy.bracket_distance == pytest.approx(1.0)
    assert policy.estimate_s == pytest.approx(math.sqrt(10) * 1e-3)
    assert "blended" in policy.render() and policy.to_dict()["bracket"] == problem(n=32).key
    # one side only (nothing measured above 128): the nearest neighbour's ranking alone
    alone = chooser(registry, clock, "heuristic", cache).decide(problem(n=200))
    assert alone.algorithm is b and alone.policy.bracket is None


def test_the_workspace_limit_holds_for_a_neighbours_choice(clock):
    rule, fast = two_algorithms(clock)
    registry = make_registry(rule, fast)
    cache = searched(registry, clock, 32)
    decision = chooser(registry, clock, "heuristic", cache,
                       workspace_limit=512).decide(problem(n=64))
    assert decision.algorithm is rule and decision.source == "nearest"


def test_other_dtypes_ranks_parameters_and_operators_are_never_neighbours(clock):
    rule, fast = two_algorithms(clock)
    other_rule = FakeAlgo("child", "rule", 5 * MS, clock, heuristic_rank=0)
    other_fast = FakeAlgo("child", "fast", 1 * MS, clock, heuristic_rank=1, workspace=1024)
    registry = make_registry(rule, fast, other_rule, other_fast)
    cache = searched(registry, clock, 32)
    c = chooser(registry, clock, "heuristic", cache)
    for stranger in (Problem.create("fake", [(16,)], ["float32"]),       # dtype
                     Problem.create("fake", [(8, 2)], ["float64"]),      # rank
                     Problem.create("fake", [(16,)], ["float64"], {"scale": 2}),  # parameters
                     Problem.create("child", [(16,)], ["float64"])):     # operator
        assert c.decide(stranger).source == "heuristic", stranger


def test_measurements_added_later_are_found(clock, tmp_path):
    rule, fast = two_algorithms(clock)
    registry = make_registry(rule, fast)
    path = tmp_path / "shared.bin"
    serving = chooser(registry, clock, "heuristic", FileCache(path))
    assert serving.decide(problem(n=64)).source == "heuristic"
    searched(registry, clock, 32, cache=FileCache(path))  # another process measures 32
    assert serving.decide(problem(n=48)).source == "nearest"


def test_a_real_conv_is_served_by_a_usable_algorithm_with_the_right_result(tmp_path):
    """The algorithms library's conv: searched at 12x12, run at 14x14 from the cache alone."""
    cache = InMemoryCache()
    weight = np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32)
    x12 = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    with fastrun.session(cache=cache, strategy="fast-run", budget_s=0.002, progress=False):
        fastrun.call("conv", x12, weight, pads=(1, 1, 1, 1))
    session = fastrun.Session(cache=cache, strategy="heuristic", progress=False)
    x14 = np.random.default_rng(2).standard_normal((1, 8, 14, 14)).astype(np.float32)
    decision = session.decide(session.problem("conv", [x14.shape, weight.shape],
                                              ["float32"] * 2, pads=(1, 1, 1, 1)))
    assert decision.source == "nearest"
    assert decision.policy.distance == pytest.approx(2 * math.log2(14 / 12))
    assert decision.algorithm.unusable_reason(decision.problem) is None
    with session:
        got = fastrun.call("conv", x14, weight, pads=(1, 1, 1, 1))
    operator = session.registry.operator("conv")
    expected = operator.reference(decision.problem, [x14, weight])
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_load_and_run_reports_the_neighbours(tmp_path, capsys):
    from fastrun.cli import load_and_run

    cache = tmp_path / "s32.bin"
    assert load_and_run.main(["zoo:squeezenet@32", "--fast-run", "--algo-policy", str(cache),
                              "--budget", "0.002", "--iter", "1", "--no-progress"]) == 0
    capsys.readouterr()
    out_json = tmp_path / "run.json"
    assert load_and_run.main(["zoo:squeezenet@40", "--algo-policy", str(cache), "--iter", "1",
                              "--verbose", "--no-progress", "--summary-json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "from the nearest measured problem" in out
    assert "nearest to float32[1x" in out
    summary = json.loads(out_json.read_text())
    assert summary["nearest"] > 0


class Tiled(FakeAlgo):
    """Works in whole tiles of ``tile`` elements: 17 elements cost as much as 32."""

    def __init__(self, *args, tile: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.tile = tile

    def work(self, problem):
        return float(-(-problem.shapes[0][0] // self.tile) * self.tile)


def test_times_are_carried_by_each_algorithms_work_so_a_bad_tile_fit_loses(clock):
    """Measured at 32 elements, 'tiled' (tiles of 32) is faster; at 20 it still does a whole
    tile while 'plain' does 20/32 of its work there: carried, 'plain' wins."""
    tiled = Tiled("fake", "tiled", 1 * MS, clock, heuristic_rank=0, tile=32, workspace=1024)
    plain = FakeAlgo("fake", "plain", int(1.2 * MS), clock, heuristic_rank=1)  # kept: less
    # workspace
    registry = make_registry(tiled, plain)
    cache = searched(registry, clock, 32)
    c = chooser(registry, clock, "heuristic", cache)
    small = c.decide(problem(n=20))
    assert small.source == "nearest" and small.algorithm is plain
    assert small.policy.estimate_s == pytest.approx(1.2e-3 * 20 / 32)
    # at 64 both double: the measured order stands
    large = c.decide(problem(n=64))
    assert large.source == "nearest" and large.algorithm is tiled
    assert large.policy.estimate_s == pytest.approx(2e-3)


def test_carried_entries_scale_by_work_and_keep_unknown_algorithms_as_measured(clock):
    from fastrun.cache.store import Entry
    from fastrun.core.nearest import Neighbour, carried_entries
    from fastrun.operator import Operator

    tiled = Tiled("fake", "tiled", 1 * MS, clock, tile=32)
    plain = FakeAlgo("fake", "plain", 1 * MS, clock)
    here = problem(n=20)
    there = Neighbour(problem(n=40).key, 1.0).problem(here)
    assert there == problem(n=40)

    def entry(name):
        return Entry(name, plain.attributes, 1.0, 0.1, 0, None, 5, 0.0, "test")

    carried = carried_entries([entry("tiled"), entry("plain"), entry("gone")], here, there,
                              Operator().work, {"tiled": tiled, "plain": plain})
    times = {e.algorithm: e.time_s for e in carried}
    assert times == pytest.approx({"tiled": 32 / 64, "plain": 20 / 40, "gone": 1.0})
    assert carried[1].spread_s == pytest.approx(0.05)


def test_winograd_and_blocked_direct_count_whole_tiles():
    """The case measured on the Xeon: ResNet-18's last stage at 5x5 pixels (160-pixel
    images) against 7x7 (224): F(4,3) does 4 tiles at both, the direct kernel half the work."""
    session = fastrun.Session(progress=False)
    by_name = {a.name: a for a in session.registry.algorithms("conv")}

    def conv(pixels):
        return session.problem("conv", [(1, 512, pixels, pixels), (512, 512, 3, 3)],
                               ["float32"] * 2, pads=(1, 1, 1, 1))

    f4, f2, direct = by_name["winograd_f4x3"], by_name["winograd_f2x3"], \
        by_name["blocked_direct"]
    assert f4.work(conv(5)) == f4.work(conv(7))
    assert f2.work(conv(5)) / f2.work(conv(7)) == pytest.approx(9 / 16)
    assert direct.work(conv(5)) / direct.work(conv(7)) == pytest.approx(5 / 9)  # 6-pixel tiles


def test_a_convs_pixels_are_no_vector_cliff_but_its_channels_are():
    """MobileNetV2 at 288 pixels has 18x18 layers where 224 had 14x14: comparable (the conv
    kernels tile pixels their own way).  12 channels against 24 are not."""
    from fastrun.core.nearest import _CategoryIndex

    session = fastrun.Session(progress=False)

    def conv(channels, pixels):
        return session.problem("conv", [(1, channels, pixels, pixels), (channels, channels, 3, 3)],
                               ["float32"] * 2, pads=(1, 1, 1, 1))

    index = _CategoryIndex([conv(24, 14).key], session.registry.operator("conv"))
    assert [n.key for n in index.neighbours(conv(24, 18), 2.0)] == [conv(24, 14).key]
    assert index.neighbours(conv(12, 14), 2.0) == []  # distance 2.0, across the cliff
    assert [n.key for n in index.neighbours(conv(17, 14), 2.0)] == [conv(24, 14).key]
