"""Suites, full rankings, the rankings file, and the noise-aware regression check.

The rule itself is tested on hand-made rankings and on fake algorithms timed on a fake clock
(exact numbers); the command end to end on real algorithms, with one algorithm made several
times slower to show that ``fastrun regress`` catches it and passes unchanged code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import msgpack
import pytest

from fastrun.analysis import suites
from fastrun.analysis.rankings import (
    RankedFailure,
    RankedProblem,
    Rankings,
    RankingsError,
    compare,
    confirm,
    load_rankings,
    rank,
    spearman,
)
from fastrun.api import Session
from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, InMemoryCache
from fastrun.cli.main import main
from fastrun.registry import default_registry
from tests.fakes import FakeAlgo, FakeClock, FakeDevice, N, R, make_registry, problem

ROOT = Path(__file__).resolve().parents[2]
US = 1_000


# --------------------------------------------------------------------------------------------
# Suites


def test_builtin_suites_build_through_the_registry():
    for name in suites.suite_names():
        built = suites.get_suite(name).build()
        assert built and all(p.operator == item.operator for item, p in built)
    resnet = suites.get_suite("resnet18").build()
    assert sum(item.weight for item, _ in resnet) == 20  # ResNet-18 has 20 convolutions
    assert any("activation=relu" in p.key for _, p in resnet)


def test_model_suite_keeps_distinct_problems_with_a_choice():
    suite = suites.get_suite("zoo:resnet18")
    operators = {item.operator for item in suite.problems}
    assert {"conv", "matmul", "add"} <= operators
    assert "add_relu" not in operators  # each residual Add -> Relu went into a conv
    assert any(p.param("residual") for i, p in suite.build() if i.operator == "conv")
    from fastrun.registry import default_registry

    for operator in operators:  # each kept problem has a choice to rank
        cpu = [a for a in default_registry().algorithms(operator) if a.device_kind == "cpu"]
        assert len(cpu) >= 2, operator
    # the conv layer table is the runtime's lowering of the model, weights included; with the
    # blocked layout, the suite also holds each conv's nchw16c form, which a search decides
    table = {(p.operator, p.key): i.weight for i, p in suites.get_suite("resnet18").build()}
    lowered = {(p.operator, p.key): i.weight for i, p in suite.build()
               if i.operator == "conv" and p.param("layout") is None}
    assert table == lowered
    blocked = {p.key for i, p in suite.build() if p.param("layout") == "nchw16c"}
    assert len(blocked) == len(table)


def test_unknown_suite_names_the_known_ones():
    with pytest.raises(ValueError, match="ci, matmul"):
        suites.get_suite("nope")


def test_shipped_ci_baseline_matches_the_ci_suite():
    """Editing the ci suite without refreshing the baseline would leave problems unchecked."""
    baseline = load_rankings(ROOT / "caches" / "ci-baseline.msgpack")
    assert baseline.suite == "ci"
    suite = {(p.operator, p.key) for _, p in suites.get_suite("ci").build()}
    assert {p.ident for p in baseline.problems} == suite
    winners = {p.winner.algorithm for p in baseline.problems}
    assert len(winners) >= 3  # different algorithms win: the suite exercises several families


# --------------------------------------------------------------------------------------------
# Ranking with fakes: exact timings


@pytest.fixture
def clock():
    return FakeClock()


def fake_session(clock, *algorithms, early_stop=True):
    options = {} if early_stop else {"early_stop_ratio": float("inf")}
    return Session(device=FakeDevice(clock), cache=InMemoryCache(), strategy="full-run",
                   registry=make_registry(*algorithms), progress=False, budget_s=20e-6,
                   **options)


def test_rank_keeps_the_full_ranking_failures_and_early_stops(clock, tmp_path):
    child = problem("child", 4)
    algorithms = [
        FakeAlgo("fake", "fast", 1 * US, clock, heuristic_rank=0),
        # dominated (same attributes, slower, more workspace): a cache would prune it
        FakeAlgo("fake", "dominated", 2 * US, clock, workspace=64, heuristic_rank=1),
        FakeAlgo("fake", "hopeless", 50 * US, clock, attributes=R | N, heuristic_rank=2),
        FakeAlgo("fake", "parent", 3 * US, clock, subs=[child], heuristic_rank=3),
        FakeAlgo("fake", "crashes", 1 * US, clock, raises=True),
        FakeAlgo("fake", "wrong", 1 * US, clock, wrong=True),
        FakeAlgo("fake", "unusable", 1 * US, clock, unusable="never"),
        FakeAlgo("child", "only", 1 * US, clock),
    ]
    session = fake_session(clock, *algorithms)
    seen = []
    rankings = rank(session, [problem()], progress=lambda d, t, r: seen.append((d, t, r.label)))
    assert seen == [(1, 1, str(problem()))]
    ranked, = rankings.problems
    assert [e.algorithm for e in ranked.entries] == ["fast", "dominated", "parent", "hopeless"]
    fast = ranked.entries[0]
    assert fast.time_s == pytest.approx(1e-6) and fast.spread_s == 0 and fast.repeats >= 3
    assert fast.attributes.names() == ["REPRODUCIBLE"] and fast.error == 0.0
    assert ranked.entry("dominated").workspace_bytes == 64
    assert ranked.entry("hopeless").early_stopped and not fast.early_stopped
    assert ranked.entry("hopeless").attributes.names() == ["REPRODUCIBLE", "NAIVE"]
    reasons = {f.algorithm: f.reason for f in ranked.failures}
    assert set(reasons) == {"crashes", "wrong"}  # unusable ones are no candidates at all
    assert "RuntimeError" in reasons["crashes"] and "numerical error" in reasons["wrong"]
    assert rankings.device == "fake-device" and rankings.suite == "custom"
    assert ranked.category.startswith("fake-device|fake@")
    # the sub-problem was decided (and searched) first; the ranked problem was not cached
    chooser = session.chooser
    assert [d.problem for d in chooser.decisions()] == [child]
    assert session.cache.get(chooser.category(session.registry.operator("fake")),
                             problem().key) is None

    path = tmp_path / "sub" / "r.msgpack"
    rankings.save(path)
    assert load_rankings(path) == rankings
    raw = msgpack.unpackb(path.read_bytes())
    assert raw["format"] == "fastrun-rankings" and raw["version"] == 1
    assert set(raw) >= {"suite", "device", "fastrun_version", "created_at", "budget_s",
                        "problems"}
    assert set(raw["problems"][0]["entries"][0]) == {
        "algorithm", "time_s", "spread_s", "repeats", "workspace_bytes", "error", "attributes",
        "early_stopped", "measured_at", "version"}
    assert not list(path.parent.glob(".rankings-*"))  # the temporary file was renamed


def test_rounds_keep_each_algorithms_fastest_round(clock):
    a = FakeAlgo("fake", "a", 2 * US, clock)
    b = FakeAlgo("fake", "b", 3 * US, clock)
    session = fake_session(clock, a, b, early_stop=False)
    original = a.run
    rounds_done = []

    def disturbed(*args, **kwargs):  # a burst of load during the first round only
        if not rounds_done:
            clock.now += 10 * US
        return original(*args, **kwargs)

    a.run = disturbed
    rankings = rank(session, [problem()], rounds=3, suite="tiny",
                    progress=lambda done, total, ranked: rounds_done.append(ranked))
    assert rounds_done[0].winner.algorithm == "b"  # the disturbed round alone is misleading
    ranked, = rankings.problems
    assert rankings.rounds == 3 and rankings.suite == "tiny"
    assert ranked.winner.algorithm == "a" and ranked.winner.time_s == pytest.approx(2e-6)
    assert ranked.entry("b").repeats == sum(r.entry("b").repeats for r in rounds_done)


def test_confirm_clears_a_burst_of_load_and_keeps_a_real_slowdown(clock):
    a = FakeAlgo("fake", "a", 2 * US, clock)
    b = FakeAlgo("fake", "b", 3 * US, clock)
    session = fake_session(clock, a, b, early_stop=False)
    baseline = rank(session, [problem()], rounds=2)
    original = a.run
    timed = {"calls": 0, "burst_calls": 0}

    def burst(*args, **kwargs):  # slow for as long as the first measurement lasts
        timed["calls"] += 1
        if timed["calls"] <= timed["burst_calls"]:
            clock.now += 10 * US
        return original(*args, **kwargs)

    a.run = burst
    timed["burst_calls"] = 10**9  # measure the first rounds under the burst
    current = rank(session, [problem()], rounds=2)
    assert compare(baseline, current, margin=0.25).regressions  # flagged at first
    timed["burst_calls"] = timed["calls"]  # the burst is over
    seen = []
    result, folded = confirm(session, baseline, current, [problem()], margin=0.25, rounds=2,
                             progress=lambda done, total, ranked: seen.append((done, total)),
                             pause_s=0)
    assert seen == [(1, 2), (2, 2)]
    assert not result.regressions and result.remeasured == [str(problem())]
    assert result.confirm_rounds == 2 and result.to_dict()["remeasured"] == [str(problem())]
    item, = result.problems
    assert item.notes[-1].startswith("not confirmed: flagged after the first 2 round(s) "
                                     "(winner changed: a -> b")
    # the extra rounds are folded in: each algorithm's fastest round, the repeats of all
    assert folded.problems[0].winner.time_s == pytest.approx(2e-6)
    assert folded.problems[0].entry("b").repeats > current.problems[0].entry("b").repeats

    # a real slowdown is slow in every round: confirmed, and the note says so
    timed["burst_calls"] = 10**9
    slow = rank(session, [problem()], rounds=2)
    result, _ = confirm(session, baseline, slow, [problem()], margin=0.25, rounds=2, pause_s=0)
    item, = result.regressions
    assert item.notes[-1] == "confirmed: still a regression after 2 more round(s)"
    # nothing flagged: nothing re-measured; rounds=0 turns confirmation off
    calls = timed["calls"]
    result, same = confirm(session, baseline, baseline, [problem()], rounds=2)
    assert same is baseline and not result.remeasured and timed["calls"] == calls
    result, same = confirm(session, baseline, slow, [problem()], rounds=0)
    assert result.regressions and same is slow and timed["calls"] == calls


# --------------------------------------------------------------------------------------------
# The rule, on hand-made rankings


def entry(name, time_us, spread=0.01, early=False):
    return Entry(name, AlgoAttribute.REPRODUCIBLE, time_us * 1e-6, spread * time_us * 1e-6, 0,
                 0.0, 50, 0.0, "test", early)


def rankings(*entries, device="dev", label="p"):
    ordered = sorted(entries, key=lambda e: e.time_s)
    ranked = RankedProblem("fake", f"{device}|fake@1|format=1", "k", label, 1, ordered, [])
    return Rankings("tiny", device, "0.1.0", 0.0, 0.01, [ranked])


def test_unchanged_and_uniformly_slower_runs_pass():
    base = rankings(entry("a", 10), entry("b", 20), entry("c", 40))
    assert not compare(base, base).regressions
    # a busier machine (everything 1.8x) is no regression: only ratios are compared
    slower = rankings(entry("a", 18), entry("b", 36), entry("c", 72))
    result = compare(base, slower)
    assert not result.regressions and not result.cross_device
    assert result.problems[0].spearman == pytest.approx(1.0)


def test_a_slowed_algorithm_is_named_and_a_slowed_winner_is_caught_by_the_runner_up():
    base = rankings(entry("a", 10), entry("b", 20), entry("c", 40))
    slow_c = compare(base, rankings(entry("a", 10), entry("b", 20), entry("c", 80)))
    item, = slow_c.regressions
    assert [c.algorithm for c in item.changes if c.regressed] == ["c"]
    assert "c slowed relative to a" in item.reasons[0]
    # the winner 1.6x slower but still winning: its ratio to the runner-up moved
    slow_a = compare(base, rankings(entry("a", 16), entry("b", 20), entry("c", 40)))
    item, = slow_a.regressions
    assert item.winner_now == "a" and "a slowed relative to b" in item.reasons[0]


def test_changes_within_spreads_plus_margin_do_not_count():
    base = rankings(entry("a", 10), entry("b", 20, spread=0.1))
    # b 1.3x relative to a: within 1 + 0.25 + spreads (0.01 + 0.1 + 0.01 + 0.1)
    assert not compare(base, rankings(entry("a", 10), entry("b", 26, spread=0.1))).regressions
    assert compare(base, rankings(entry("a", 10), entry("b", 26, spread=0.1)),
                   margin=0.05).regressions
    # early-stopped times rest on two runs: 1.8x is within their noise
    early = rankings(entry("a", 10), entry("b", 30, early=True))
    assert not compare(early, rankings(entry("a", 10), entry("b", 54, early=True))).regressions


def test_winner_change_counts_only_beyond_spreads_and_margin():
    base = rankings(entry("a", 10), entry("b", 10.5))
    flipped = compare(base, rankings(entry("a", 10.5), entry("b", 10)))
    assert not flipped.regressions
    assert any("winner changed: a -> b" in note for note in flipped.problems[0].notes)
    clear = compare(base, rankings(entry("a", 20), entry("b", 10)))
    assert "winner changed: a -> b" in clear.regressions[0].reasons[0]


def test_failures_new_and_missing_problems():
    base = rankings(entry("a", 10), entry("b", 20))
    now = rankings(entry("a", 10))
    now.problems[0].failures.append(RankedFailure("b", "raised ValueError: x"))
    result = compare(base, now)
    assert "b was timed in the baseline and now fails: raised ValueError" in \
        result.regressions[0].reasons[0]
    other = rankings(entry("a", 10))
    other.problems[0] = dataclasses.replace(other.problems[0], key="other")
    result = compare(base, other)
    assert {p.key: p.verdict for p in result.problems} == {"other": "new", "k": "missing"}
    assert not result.regressions


def test_cross_device_is_reported():
    base = rankings(entry("a", 10), entry("b", 20), device="other cpu")
    result = compare(base, rankings(entry("a", 5), entry("b", 10)))
    assert result.cross_device and not result.regressions
    assert result.to_dict()["method"] == "within-run ratios between algorithms"


def test_spearman():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1], [1]) is None and spearman([1, 1], [1, 2]) is None


# --------------------------------------------------------------------------------------------
# Bad input


def test_bad_rankings_files_are_clear_errors(tmp_path):
    with pytest.raises(RankingsError, match=r"missing.msgpack.*does not exist"):
        load_rankings(tmp_path / "missing.msgpack")
    garbage = tmp_path / "garbage.msgpack"
    garbage.write_bytes(b"\xc1\xc1 not msgpack")
    with pytest.raises(RankingsError, match=r"garbage.msgpack.*not a fastrun rankings file"):
        load_rankings(garbage)
    cache = tmp_path / "cache.bin"
    cache.write_bytes(msgpack.packb({"format": "fastrun-cache", "version": 1,
                                     "categories": {}}))
    with pytest.raises(RankingsError, match=r"cache.bin.*'fastrun-cache'"):
        load_rankings(cache)
    future = tmp_path / "future.msgpack"
    future.write_bytes(msgpack.packb({"format": "fastrun-rankings", "version": 99}))
    with pytest.raises(RankingsError, match="version 99"):
        load_rankings(future)
    broken = tmp_path / "broken.msgpack"
    broken.write_bytes(msgpack.packb({"format": "fastrun-rankings", "version": 1,
                                      "suite": "ci", "problems": [{"operator": "x"}]}))
    with pytest.raises(RankingsError, match=r"broken.msgpack.*malformed"):
        load_rankings(broken)


@pytest.mark.parametrize("argv, message", [
    (["regress", "--baseline", "{tmp}/missing.msgpack"], "does not exist"),
    (["regress", "--baseline", "{tmp}/cache.bin"], "not a fastrun rankings file"),
    (["regress", "--baseline", "{shipped}", "--suite", "nope"], "unknown suite 'nope'"),
    (["regress", "--baseline", "{shipped}", "--margin", "-1"], "--margin must be >= 0"),
    (["rank", "nope", "-o", "{tmp}/r.msgpack"], "unknown suite 'nope'"),
    (["rank", "model:{tmp}/missing.onnx", "-o", "{tmp}/r.msgpack"], "missing.onnx"),
])
def test_cli_bad_input_exits_2(argv, message, tmp_path, capsys):
    (tmp_path / "cache.bin").write_bytes(msgpack.packb({"format": "fastrun-cache"}))
    shipped = str(ROOT / "caches" / "ci-baseline.msgpack")
    argv = [a.format(tmp=tmp_path, shipped=shipped) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastrun: error:") and message in err


def test_cli_rejects_a_zero_budget(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["rank", "ci", "-o", "x.msgpack", "--budget", "0"])
    assert exit_info.value.code == 2
    assert "must be positive" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# End to end on real algorithms


@pytest.fixture
def tiny_suite(monkeypatch):
    """Three cheap real problems with clear winners (conv1x1, numpy, blas on this kind of
    machine), as a suite the command can name."""
    problems = [item for item in suites.CI_PROBLEMS
                if item.label in ("conv 1x1 32->32 @14", "add 1x32x28x28", "matmul 96x64x80")]
    assert len(problems) == 3
    monkeypatch.setitem(suites._BUILT_IN, "tiny", ("test suite", lambda: list(problems)))
    return "tiny"


def slow_down(monkeypatch, operator: str, name: str, factor: int) -> None:
    """Make one registered algorithm ``factor`` times slower: it runs ``factor`` times."""
    algorithm = next(a for a in default_registry().algorithms(operator)
                     if a.desc.text == name)
    original = algorithm.run

    def slower(*args, **kwargs):
        for _ in range(factor - 1):
            original(*args, **kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(algorithm, "run", slower)


# Quick and robust settings for a test on a shared machine: single-threaded numba (so other
# processes' load does not hit parallel kernels harder than serial ones), three rounds.
FLAGS = ["--budget", "0.005", "--device", "cpu:1", "--rounds", "3"]
#: regress without fresh processes: a slowdown planted in this process (and the tiny suite
#: itself) does not exist in a child
IN_PROCESS = ["--processes", "0"]


def test_rank_then_regress_passes_unchanged_code_and_catches_a_slowdown(
        tiny_suite, tmp_path, capsys, monkeypatch):
    baseline = tmp_path / "baseline.msgpack"
    assert main(["rank", tiny_suite, "-o", str(baseline), *FLAGS]) == 0
    out = capsys.readouterr()
    assert "[3/9] add 1x32x28x28" in out.err  # progress, round after round
    assert "conv 1x1 32->32 @14 (x1)" in out.out and "spread" in out.out
    recorded = load_rankings(baseline)
    assert len(recorded.problems) == 3 and recorded.rounds == 3
    conv = next(p for p in recorded.problems if p.operator == "conv")
    assert len(conv.entries) >= 3 and not any(e.early_stopped for e in conv.entries)

    # unchanged code passes (a generous margin: this is about the plumbing, not the tuning;
    # on a 2-core machine running the suite's other tests beside it, two kernels' ratio once
    # moved 2.5x between the rank and the regress)
    assert main(["regress", "--baseline", str(baseline), "--margin", "3", *FLAGS,
                 *IN_PROCESS]) == 0
    out = capsys.readouterr().out
    assert "no regression in 3 problems" in out
    assert "comparing within-run ratios" in out

    # the baseline from another device: still passes, and says only ratios are compared
    foreign = tmp_path / "foreign.msgpack"
    dataclasses.replace(recorded, device="cpu;Some Other CPU;threads=64").save(foreign)
    assert main(["regress", "--baseline", str(foreign), "--margin", "3", "--json",
                 *FLAGS, *IN_PROCESS]) == 0
    report = capsys.readouterr().out
    assert '"cross_device": true' in report

    # conv1x1, the clear winner of the 1x1 conv, made 8x slower: caught and named
    winner = conv.winner.algorithm
    slow_down(monkeypatch, "conv", winner, 8)
    assert main(["regress", "--baseline", str(baseline), "--margin", "1", *FLAGS,
                 *IN_PROCESS]) == 1
    captured = capsys.readouterr()
    out = captured.out
    assert "confirming: re-measuring the problems that regressed (3 more" in captured.err
    summary = out[out.index("REGRESSION in"):]
    assert "REGRESSION in 1 of 3 problems" in summary
    assert f"conv 1x1 32->32 @14: {winner} slowed relative to" in summary
    assert "were measured 3 more round(s): 1 confirmed, 0 cleared as noise" in out
    assert "add 1x32x28x28" not in summary


def test_regress_text_says_when_the_baseline_is_from_another_device(tiny_suite, tmp_path,
                                                                    capsys):
    base = tmp_path / "b.msgpack"
    assert main(["rank", tiny_suite, "-o", str(base), "--json", *FLAGS]) == 0
    capsys.readouterr()
    recorded = load_rankings(base)
    dataclasses.replace(recorded, device="gpu-from-elsewhere").save(base)
    main(["regress", "--baseline", str(base), "--margin", "2", *FLAGS, *IN_PROCESS])
    out = capsys.readouterr().out
    assert "the baseline comes from another device (gpu-from-elsewhere" in out
    assert "only within-run ratios between algorithms are compared, never absolute times" in out


def test_older_rankings_files_read_with_named_device_facts(tmp_path: Path) -> None:
    """Rankings written before categories had named facts still compare as the same device."""
    baseline = load_rankings(Path(__file__).parents[2] / "caches" / "ci-baseline.msgpack")
    old = baseline.to_dict()
    old["device"] = "cpu;Some CPU;x86-64-v4;threads=1;numba=0.68.1"
    for item in old["problems"]:
        item["category"] = old["device"] + "|" + item["category"].split("|")[1] \
            + "|format=1"
    path = tmp_path / "old.msgpack"
    path.write_bytes(msgpack.packb(old, use_bin_type=True))
    loaded = load_rankings(path)
    assert loaded.device == "cpu;processor=Some CPU;isa=x86-64-v4;threads=1;numba=0.68.1"
    assert all(p.category.startswith(loaded.device + "|") and "format" not in p.category
               for p in loaded.problems)


def test_regress_measures_as_the_baseline_was_measured(tmp_path: Path, capsys) -> None:
    """Without flags, regress ranks with the baseline's thread count, budget and rounds; a
    thread count that differs on the same machine is refused as a different measurement."""
    baseline = tmp_path / "one-thread.msgpack"
    assert main(["rank", "ci", "-o", str(baseline), "--device", "cpu:1", "--budget", "0.002",
                 "--rounds", "1"]) == 0
    capsys.readouterr()
    assert main(["regress", "--baseline", str(baseline), "--margin", "1", "--json",
                 "--confirm", "0", *IN_PROCESS]) in (0, 1)
    report = capsys.readouterr().out
    assert '"cross_device": false' in report  # threads=1, as recorded
    if (os.cpu_count() or 1) >= 2:
        assert main(["regress", "--baseline", str(baseline), "--device", "cpu:2"]) == 2
        err = capsys.readouterr().err
        assert "recorded with threads=1 and this run uses threads=2" in err
        assert "--device cpu:1" in err


@pytest.mark.parametrize("child_sees_it", [True, False])
def test_a_regression_must_show_in_fresh_processes_too(tiny_suite, tmp_path, capsys, monkeypatch,
                                                      child_sees_it):
    """After the rounds in this process, the check runs again in fresh processes (each its
    own ``fastrun regress --processes 0 --json``): a regression every process shows is held,
    one a fresh process does not show is cleared with a note."""
    from fastrun.cli import rank_cmd

    baseline = tmp_path / "baseline.msgpack"
    assert main(["rank", tiny_suite, "-o", str(baseline), *FLAGS]) == 0
    conv = next(p for p in load_rankings(baseline).problems if p.operator == "conv")
    slow_down(monkeypatch, "conv", conv.winner.algorithm, 8)
    capsys.readouterr()
    commands = []

    def child(command, **kwargs):
        commands.append(command)
        verdict = "regression" if child_sees_it else "ok"
        report = {"problems": [{"label": "conv 1x1 32->32 @14", "verdict": verdict}]}
        return subprocess.CompletedProcess(command, 1, json.dumps(report), "")

    monkeypatch.setattr(rank_cmd.subprocess, "run", child)
    code = main(["regress", "--baseline", str(baseline), "--margin", "1", *FLAGS])
    out = capsys.readouterr().out
    assert commands and all(c[c.index("--processes") + 1] == "0" and "--json" in c
                            and str(baseline) in c for c in commands)
    if child_sees_it:
        assert code == 1 and len(commands) == 2
        assert "checked in 2 fresh process(es): 0 cleared, 1 held" in out
        assert "REGRESSION in 1 of 3 problems" in out
    else:
        assert code == 0 and len(commands) == 1
        assert "cleared in a fresh process" in out and "no regression in 3 problems" in out
