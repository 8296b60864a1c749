"""Searches on recorded times (``fastrun.devices.simulated``): replayed on the shipped CI
baseline, the search pipeline (order, early stopping, confirmation, pick) must pick what the
recording says is fastest, and record exactly the recorded times, every time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastrun
from fastrun.analysis.rankings import load_rankings, recorded_times
from fastrun.analysis.suites import get_suite
from fastrun.cache import InMemoryCache
from fastrun.core.chooser import NoUsableAlgorithmError
from fastrun.devices import get_device
from fastrun.devices.simulated import NotRecordedError, SimulatedDevice

BASELINE = Path(__file__).resolve().parents[2] / "caches" / "ci-baseline.msgpack"


@pytest.fixture(scope="module")
def rankings():
    return load_rankings(BASELINE)


def _search(times, unrecorded: str = "measure"):
    """Every problem of the CI suite searched on ``times``: (device, session, decisions)."""
    device = SimulatedDevice(get_device("cpu:1"), times, unrecorded=unrecorded)
    session = fastrun.session(device, cache=InMemoryCache(), strategy="fast-run",
                              budget_s=0.002)
    decisions = {}
    for _, problem in get_suite("ci", session.registry, "cpu").build(session.registry):
        decisions[(problem.operator, problem.key)] = session.chooser.decide(problem)
    return device, session, decisions


def test_a_search_on_recorded_times_picks_the_recorded_winner(rankings):
    times = recorded_times(rankings)
    device, session, decisions = _search(times)
    assert set(decisions) == set(times)  # the baseline covers the suite
    for ident, decision in decisions.items():
        recorded = times[ident]
        candidates = {c.desc.text for c in session.chooser.candidates(decision.problem)}
        assert candidates & set(recorded), ident
        expected = min((seconds, name) for name, seconds in recorded.items()
                       if name in candidates)[1]
        assert decision.algorithm.desc.text == expected, ident
        for entry in decision.entries:  # the recorded times (to the ns), not the clock's
            assert entry.time_s == pytest.approx(recorded[entry.algorithm], abs=1e-9)
    assert device.replayed > 0


def test_replayed_searches_agree_with_each_other(rankings):
    times = recorded_times(rankings)
    first = _search(times)[2]
    second = _search(times)[2]
    for ident, decision in first.items():
        assert [(e.algorithm, e.time_s) for e in decision.entries] == \
            [(e.algorithm, e.time_s) for e in second[ident].entries]


def test_a_candidate_without_a_recorded_time_fails_by_name(rankings):
    times = recorded_times(rankings)
    ident = next(k for k in times if k[0] == "add")
    runner_up = sorted(times[ident], key=times[ident].get)[1]
    del times[ident][runner_up]
    _, _, decisions = _search(times)
    decision = decisions[ident]
    failed = {f.algorithm: f.reason for f in decision.failures}
    assert "has no recorded time" in failed[runner_up]
    assert decision.algorithm.desc.text == min(times[ident], key=times[ident].get)


def test_outside_a_search_and_for_unrecorded_problems_the_clock_counts():
    device = SimulatedDevice(get_device("cpu:1"), {("add", "nothing"): {"numpy": 1.0}})
    elapsed, value = device.measure(lambda: np.ones(3))
    assert elapsed < 1e9 and value.sum() == 3 and device.measured == 1
    strict = SimulatedDevice(get_device("cpu:1"), {}, unrecorded="error")
    session = fastrun.session(strict, cache=InMemoryCache(), strategy="fast-run",
                              budget_s=0.001)
    x = np.ones((4, 4), np.float32)
    with pytest.raises(NoUsableAlgorithmError) as info:
        session.chooser.decide(session.registry.operator("add").problem(
            [x.shape, x.shape], [x.dtype, x.dtype]))
    assert "the recording holds no times for add" in str(info.value)
    with pytest.raises(ValueError, match="unrecorded"):
        SimulatedDevice(get_device("cpu:1"), {}, unrecorded="guess")
    assert issubclass(NotRecordedError, LookupError)
    assert "simulated" in str(strict) and strict.kind == "cpu"
