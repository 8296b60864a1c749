"""The public API: sessions, fastrun.call, the default session, caches by path."""

import numpy as np
import pytest

import fastrun
from fastrun.api import reset_default_session
from fastrun.cache import FileCache, InMemoryCache
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, make_registry

CLOCK = FakeClock()
DEVICE = FakeDevice(CLOCK)


@pytest.fixture
def registry():
    return make_registry(FakeAlgo("fake", "slow", 3_000_000, CLOCK),
                         FakeAlgo("fake", "fast", 1_000_000, CLOCK))


def test_call_inside_a_session_searches_once_and_writes_the_file(tmp_path, registry):
    path = tmp_path / "cache.bin"
    x = np.arange(8.0)
    with fastrun.session(DEVICE, cache=path, strategy="fast-run", registry=registry,
                         budget_s=0.001) as s:
        np.testing.assert_array_equal(fastrun.call("fake", x), 2 * x)
        assert fastrun.current_session() is s
        assert s.policy("fake", x).algorithm == "fast"
        assert s.stats.profiled == 1
    assert fastrun.current_session() is not s
    keys = [(cat, key, [e.algorithm for e in entries]) for cat, key, entries in FileCache(path)]
    assert len(keys) == 1 and keys[0][1] == "float64[8]" and keys[0][2][0] == "fast"
    # a new session reading the same file searches nothing
    with fastrun.session(DEVICE, cache=str(path), strategy="fast-run",
                             registry=registry) as again:
        fastrun.call("fake", x)
        assert again.stats.profiled == 0 and again.stats.cache_hits == 1


def test_sessions_nest_and_restore(registry):
    outer = fastrun.session(cache=InMemoryCache(), registry=registry)
    inner = fastrun.session(cache=InMemoryCache(), registry=registry)
    with outer:
        with inner:
            assert fastrun.current_session() is inner
        assert fastrun.current_session() is outer


def test_default_session_follows_environment(monkeypatch, tmp_path):
    from fastrun.cache import set_default_cache

    monkeypatch.setenv("FASTRUN_STRATEGY", "fast-run+reproducible")
    monkeypatch.setenv("FASTRUN_WORKSPACE_LIMIT", "1MiB")
    reset_default_session()
    set_default_cache(None)
    try:
        session = fastrun.current_session()
        assert session.options.strategy == fastrun.Strategy.parse("fast-run+reproducible")
        assert session.options.workspace_limit == 1024 * 1024
        assert isinstance(session.cache, InMemoryCache)
    finally:
        reset_default_session()


def test_bad_settings_are_named(monkeypatch):
    monkeypatch.setenv("FASTRUN_WORKSPACE_LIMIT", "lots")
    with pytest.raises(ValueError, match="cannot read size 'lots'"):
        fastrun.session()
    with pytest.raises(ValueError, match="unknown strategy"):
        fastrun.session(strategy="warp-speed")


def test_unknown_operator_lists_known_ones(registry):
    with fastrun.session(registry=registry), pytest.raises(LookupError,
                                                           match="unknown operator 'conv'"):
        fastrun.call("conv", np.ones(3))


def test_parse_size():
    from fastrun.config import parse_size

    assert parse_size("64MiB") == 64 * 1024**2
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("4096") == 4096
    assert parse_size("none") is None


def test_one_session_used_from_many_threads(registry):
    import threading

    session = fastrun.session(DEVICE, cache=InMemoryCache(), strategy="fast-run",
                              registry=registry, budget_s=0.001)
    errors = []

    def work(offset):
        try:
            for n in range(1, 30):
                x = np.arange(float(n + offset % 3))
                np.testing.assert_array_equal(session.call("fake", x), 2 * x)
        except Exception as error:  # reported below: a thread's assertion would be lost
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    keys = [d.problem.key for d in session.chooser.decisions()]
    assert len(keys) == len(set(keys)) == 31  # each problem decided exactly once
    assert session.stats.profiled == 31


def test_the_sessions_rules_decide_by_the_heuristic_once_per_device(registry):
    """session.rules(): the rules of thumb the constant folder computes with and the gain over
    the heuristic compares against: no timing, nothing cached, one chooser per device."""
    x = np.arange(8.0)
    s = fastrun.session(DEVICE, cache=InMemoryCache(), strategy="fast-run", registry=registry,
                        budget_s=0.001)
    rules = s.rules()
    assert s.rules() is rules and s.rules(DEVICE) is rules
    problem = s.problem("fake", [x.shape], [x.dtype])
    decision = rules.decide(problem)
    assert decision.source.name == "HEURISTIC" and decision.entries == []
    assert s.stats.profiled == 0 and rules.stats.profiled == 0
    assert s.decide(problem).algorithm.desc.name == "fast"  # the session itself still searches


def test_listeners_hear_every_decision_once_with_its_source(tmp_path, registry, caplog):
    """A listener gets each new decision, with the pick, the measured candidates and where the
    pick came from; a second session over the same file hears a cache hit.  A listener that
    raises is logged and dropped, and the search goes on."""
    path = tmp_path / "cache.bin"
    x, y = np.arange(8.0), np.arange(4.0)
    heard = []
    with fastrun.session(DEVICE, cache=path, strategy="fast-run", registry=registry,
                         budget_s=0.001) as s:
        s.add_listener(heard.append)
        fastrun.call("fake", x)
        fastrun.call("fake", x)  # decided already: nothing new to hear
        assert s.progress is s.chooser.profiler.progress
    (decision,) = heard
    assert decision.algorithm.desc.text == "fast" and decision.source.value == "profiled"
    assert {e.algorithm for e in decision.entries} == {"fast", "slow"}
    assert decision.search_seconds > 0
    again = []
    with fastrun.session(DEVICE, cache=path, strategy="fast-run", registry=registry) as s:
        s.add_listener(lambda d: 1 / 0)
        s.add_listener(again.append)
        fastrun.call("fake", x)
        fastrun.call("fake", y)
        assert len(s.chooser.listeners) == 1  # the raising one is gone
    assert [d.source.value for d in again] == ["cache", "profiled"]
    assert "raised ZeroDivisionError" in caplog.text
