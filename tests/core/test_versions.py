"""The algorithm-set version in the cache category is derived, never bumped by hand: from the
operator's algorithms (names and versions) for one device kind, and from the algorithm sets
of the operators they call.  So a change to matmul invalidates conv's entries by itself, an
OpenCL configuration leaves CPU entries alone, and an unchanged operator keeps its entries."""

from __future__ import annotations

import numpy as np

from fastrun.algorithm import Algorithm
from fastrun.cache import InMemoryCache
from fastrun.core.chooser import AlgoChooser
from fastrun.core.strategy import SearchOptions, Strategy
from fastrun.registry import default_registry
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, make_registry, problem


def _registry(clock: FakeClock, *extra: Algorithm):
    """fake (two algorithms, one calling child), child (one algorithm), other (two)."""
    return make_registry(
        FakeAlgo("fake", "calls_child", 10, clock, subs=[problem("child")]),
        FakeAlgo("fake", "direct", 20, clock),
        FakeAlgo("child", "plain", 10, clock),
        FakeAlgo("other", "plain", 10, clock),
        FakeAlgo("other", "second", 20, clock),
        *extra, operators=("fake", "child", "other"))


def _versions(registry, kind: str = "cpu") -> dict[str, str]:
    return {name: registry.algorithm_set_version(name, kind) for name in ("fake", "child", "other")}


def test_a_change_to_a_called_operator_changes_its_callers_version_and_nothing_else():
    clock = FakeClock()
    registry = _registry(clock)
    before = _versions(registry)
    registry.register_algorithm(FakeAlgo("child", "faster", 5, clock))
    after = _versions(registry)
    assert after["child"] != before["child"]
    assert after["fake"] != before["fake"]  # its algorithm calls child
    assert after["other"] == before["other"]


def test_an_algorithms_own_version_and_another_device_kinds_algorithms():
    clock = FakeClock()
    bumped = FakeAlgo("child", "plain", 10, clock)
    bumped.version = 2
    assert _versions(_registry(clock))["child"] != _versions(make_registry(
        FakeAlgo("fake", "calls_child", 10, clock, subs=[problem("child")]),
        FakeAlgo("fake", "direct", 20, clock), bumped, FakeAlgo("other", "plain", 10, clock),
        FakeAlgo("other", "second", 20, clock), operators=("fake", "child", "other")))["child"]
    registry = _registry(clock)
    cpu = _versions(registry)
    gpu = FakeAlgo("child", "gpu_kernel", 1, clock)
    gpu.device_kind = "opencl"
    registry.register_algorithm(gpu)
    assert _versions(registry) == cpu  # an OpenCL kernel added: CPU entries stay valid
    assert _versions(registry, "opencl")["child"] != _versions(_registry(clock), "opencl")["child"]


def test_operators_calling_themselves_or_each_other_have_a_version():
    clock = FakeClock()
    registry = make_registry(FakeAlgo("fake", "loop", 1, clock, subs=[problem("child")]),
                             FakeAlgo("child", "back", 1, clock, subs=[problem("fake")]),
                             FakeAlgo("child", "self", 1, clock, subs=[problem("child")]))
    assert len(registry.algorithm_set_version("fake", "cpu")) == 10
    assert registry.algorithm_set_version("child", "cpu") != \
        registry.algorithm_set_version("fake", "cpu")


def test_the_category_carries_the_derived_version_so_old_entries_are_searched_again():
    """A cache entry of 'fake' measured before child gained an algorithm is not served
    afterwards: fake is profiled again (child's new algorithm changes what it measured)."""
    clock = FakeClock()
    cache = InMemoryCache()
    options = SearchOptions(strategy=Strategy.PROFILE, budget_s=1e-6)
    registry = _registry(clock)
    first = AlgoChooser(registry, FakeDevice(clock), cache, options)
    assert first.decide(problem("fake")).source == "profiled"
    assert AlgoChooser(registry, FakeDevice(clock), cache, options).decide(
        problem("fake")).source == "cache"
    registry.register_algorithm(FakeAlgo("child", "faster", 5, clock))
    again = AlgoChooser(registry, FakeDevice(clock), cache, options)
    assert again.decide(problem("fake")).source == "profiled"
    assert again.decide(problem("other")).source == "profiled"  # never measured
    assert again.category(registry.operator("other")) == first.category(
        registry.operator("other"))


def test_a_candidate_calling_an_undeclared_operator_is_excluded_with_the_reason():
    clock = FakeClock()
    liar = FakeAlgo("fake", "liar", 1, clock, subs=[problem("child")])
    liar.sub_operators = ()  # calls child without saying so
    honest = FakeAlgo("fake", "honest", 10, clock)
    registry = make_registry(liar, honest, FakeAlgo("child", "plain", 1, clock))
    chooser = AlgoChooser(registry, FakeDevice(clock), InMemoryCache(),
                          SearchOptions(strategy=Strategy.PROFILE, budget_s=1e-6))
    decision = chooser.decide(problem("fake"))
    assert decision.policy.algorithm == "honest"
    assert "child" in decision.excluded["liar"] and "sub_operators" in decision.excluded["liar"]
    out = chooser.call(problem("fake"), np.ones(8))
    assert np.array_equal(out, np.full(8, 2.0))


def test_every_registered_algorithm_declares_the_operators_it_calls():
    """The shipped library: every sub-operator an algorithm declares is registered, and conv's
    version follows matmul's (its GEMM-based algorithms call matmul)."""
    registry = default_registry()
    operators = set(registry.operators())
    for name in operators:
        for algorithm in registry.algorithms(name):
            assert set(algorithm.sub_operators) <= operators, algorithm.desc
    callers = {a.desc.text for a in registry.algorithms("conv") if "matmul" in a.sub_operators}
    assert {"im2col", "winograd_f2x3", "winograd_f4x3", "conv1x1"} <= callers
