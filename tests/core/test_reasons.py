"""Exclusions and decision sources are structured: code reads their kind, never their words."""

from __future__ import annotations

import json
import pickle

import pytest

from fastrun.cache import InMemoryCache
from fastrun.core.chooser import AlgoChooser, NoUsableAlgorithmError
from fastrun.core.reasons import Exclusion, Source, Why, why_of
from fastrun.core.strategy import SearchOptions, Strategy
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, N, make_registry, problem


def _chooser(*algorithms, **options):
    clock = FakeClock()
    registry = make_registry(*[make(clock) for make in algorithms])
    return AlgoChooser(registry, FakeDevice(clock), InMemoryCache(),
                       SearchOptions(strategy=Strategy.parse("fast-run"), budget_s=1e-6, **options),
                       clock=clock)


def test_every_exclusion_carries_its_kind_and_the_source_is_an_enum():
    def other_device(clock):
        algorithm = FakeAlgo("fake", "gpu", 1, clock)
        algorithm.device_kind = "opencl"
        return algorithm

    chooser = _chooser(
        lambda c: FakeAlgo("fake", "fast", 10, c),
        lambda c: FakeAlgo("fake", "slow", 20, c),
        lambda c: FakeAlgo("fake", "big", 1, c, workspace=4096),
        lambda c: FakeAlgo("fake", "odd", 1, c, unusable="only even sizes"),
        lambda c: FakeAlgo("fake", "naive", 1, c, attributes=N),
        lambda c: FakeAlgo("fake", "crash", 1, c, raises=True),
        other_device, workspace_limit=1024)
    decision = chooser.decide(problem())
    kinds = {name: why_of(reason) for name, reason in decision.excluded.items()}
    assert kinds == {"big": Why.WORKSPACE, "odd": Why.UNUSABLE, "naive": Why.STRATEGY,
                     "crash": Why.FAILED, "gpu": Why.OTHER_DEVICE}
    assert decision.excluded["gpu"].device_kind == "opencl"
    assert decision.source is Source.PROFILED and decision.source == "profiled"
    # still the text wherever text is wanted: printing, JSON, pickling (with the kind)
    assert json.loads(json.dumps(decision.excluded))["odd"] == "not usable: only even sizes"
    copy = pickle.loads(pickle.dumps(decision.excluded["big"]))
    assert copy.why is Why.WORKSPACE and copy == decision.excluded["big"]
    assert N in decision.excluded["naive"].attributes  # the attribute at issue, not its word


def test_hints_follow_the_kind_not_words_in_a_message():
    """An unusable algorithm whose reason happens to say 'workspace' or 'NAIVE' gets no
    workspace or full-run hint; a real workspace exclusion does."""
    chooser = _chooser(lambda c: FakeAlgo("fake", "odd", 1, c,
                                          unusable="the workspace NAIVE kernels need"))
    with pytest.raises(NoUsableAlgorithmError) as caught:
        chooser.decide(problem())
    assert "hint" not in str(caught.value)
    chooser = _chooser(lambda c: FakeAlgo("fake", "big", 1, c, workspace=4096),
                       workspace_limit=1024)
    with pytest.raises(NoUsableAlgorithmError) as caught:
        chooser.decide(problem())
    assert "hint: raise the workspace limit" in str(caught.value)
    chooser = _chooser(lambda c: FakeAlgo("fake", "naive", 1, c, attributes=N))
    with pytest.raises(NoUsableAlgorithmError) as caught:
        chooser.decide(problem())
    assert "--full-run" in str(caught.value)


def test_a_plain_text_reason_has_no_kind():
    assert why_of("read back from a rankings file") is None
    assert why_of(Exclusion.other_device("opencl")) is Why.OTHER_DEVICE
