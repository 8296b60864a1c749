"""The tune's scheduler alone: dependencies, longest-path-first order, failures handed to
another worker and given up after two, a lost worker's jobs requeued, and the simulation's
figures against hand-computed ones."""

from __future__ import annotations

import pytest

from fastrun.fleet.driver import eta_seconds
from fastrun.fleet.jobs import TuneJob
from fastrun.fleet.scheduler import Scheduler, expected_seconds, simulate, split


def job(key: str, seconds: float | None = None, children=(), work: float = 0.0,
        candidates=("x",)) -> TuneJob:
    return TuneJob("op", ((1,),), ("float32",), (), key, "cat", key,
                   tuple(("cat", c) for c in children), estimate_s=seconds, work=work,
                   candidates=tuple(candidates))


def uid(key: str, part: int = 0):
    return ("cat", key, part)


def test_children_first_then_the_longest_remaining_path():
    jobs = [job("parent", 1.0, children=["a", "b"]), job("a", 2.0), job("b", 5.0),
            job("lone", 6.5)]
    scheduler = Scheduler(jobs)
    # b's path (5 + 1 for its parent) beats lone's 6.5? no: 6.0 < 6.5, so lone first
    order = [scheduler.next_for("w").key for _ in range(3)]
    assert order == ["lone", "b", "a"]
    assert scheduler.next_for("w") is None  # the parent waits for a and b
    scheduler.finish(uid("a"))
    assert scheduler.next_for("w") is None
    assert scheduler.finish(uid("b")) == [uid("parent")]
    assert scheduler.next_for("w").key == "parent"


def test_done_jobs_are_skipped_and_unknown_times_scale_from_known_ones():
    jobs = [job("a", 4.0, work=2.0), job("b", None, work=3.0), job("c", None, work=1.0)]
    expected = expected_seconds(jobs)
    assert expected[uid("b")] == pytest.approx(8.0)  # 1 s per unit of 2**work
    assert expected[uid("c")] == pytest.approx(2.0)
    scheduler = Scheduler(jobs, done=[("cat", "a")])
    assert scheduler.pending == 2
    assert [scheduler.next_for("w").key for _ in range(2)] == ["b", "c"]


def test_a_failure_goes_to_another_worker_and_two_are_the_end():
    jobs = [job("bad", 1.0), job("parent", 1.0, children=["bad"]), job("ok", 0.5)]
    scheduler = Scheduler(jobs)
    assert scheduler.next_for("w1", workers=2).key == "bad"
    assert scheduler.fail(uid("bad"), "w1", "boom") is True
    # not handed back to w1 while w2 has not tried it
    assert scheduler.next_for("w1", workers=2).key == "ok"
    assert scheduler.next_for("w2", workers=2).key == "bad"
    assert scheduler.fail(uid("bad"), "w2", "boom again") is False
    assert scheduler.failed[("cat", "bad")] == ["w1: boom", "w2: boom again"]
    assert "needs bad, which failed" in scheduler.failed[("cat", "parent")][0]
    scheduler.finish(uid("ok"))
    assert scheduler.finished


def test_a_lost_worker_hands_its_job_back():
    scheduler = Scheduler([job("a", 1.0), job("b", 2.0)])
    first = scheduler.next_for("w1", workers=2)
    assert scheduler.lost("w1", "node died") == [(first.uid, True)]
    assert scheduler.next_for("w2", workers=2).key == first.key


def test_simulation_matches_hand_computed_schedules():
    jobs = [job(f"j{i}", float(s)) for i, s in enumerate([4, 3, 3, 2, 2, 2])]
    one = simulate(jobs, 1)
    assert one.makespan_s == pytest.approx(16) and one.speedup == pytest.approx(1)
    two = simulate(jobs, 2)  # 4+2+2 | 3+3+2 = 8 | 8
    assert two.makespan_s == pytest.approx(8) and two.efficiency == pytest.approx(1.0)
    many = simulate(jobs, 64)
    assert many.makespan_s == pytest.approx(4)  # the longest job
    assert many.efficiency == pytest.approx(16 / 4 / 64)


def test_simulation_respects_dependencies():
    jobs = [job("child", 3.0), job("parent", 1.0, children=["child"]), job("other", 1.0)]
    result = simulate(jobs, 8)
    assert result.makespan_s == pytest.approx(4.0)
    assert result.critical_path_s == pytest.approx(4.0)
    with pytest.raises(ValueError, match="at least one worker"):
        simulate(jobs, 0)


def test_a_long_problem_is_split_into_parts_its_parents_all_wait_for():
    costs = {"a": 8.0, "b": 4.0, "c": 3.0, "d": 1.0}
    big = job("big", None, candidates=list(costs))
    big.candidate_s, big.overhead_s = dict(costs), 0.5
    big.estimate_s = 0.5 + sum(costs.values())
    small = [job(f"s{i}", 0.5) for i in range(8)]
    parent = job("parent", 0.5, children=["big"])
    jobs = split([big, *small, parent], workers=4)
    parts = [j for j in jobs if j.key == "big"]
    assert len(parts) >= 2 and {j.parts for j in parts} == {len(parts)}
    names = [n for j in parts for n in j.algorithms]
    assert sorted(names) == sorted(costs)  # every candidate in exactly one part
    assert [j.key for j in jobs if j.key != "big"] == [f"s{i}" for i in range(8)] + ["parent"]
    assert split([big], workers=1) == [big]  # one worker: nothing to gain
    scheduler = Scheduler(jobs)
    assert scheduler.expected[parts[0].uid] == pytest.approx(
        0.5 + sum(costs[n] for n in parts[0].algorithms))
    for part in parts[:-1]:
        assert scheduler.finish(part.uid) == []
    assert scheduler.finish(parts[-1].uid) == [uid("parent")]
    assert scheduler.problem_done(("cat", "big"))


def test_splitting_lets_a_large_fleet_wait_less_on_one_long_problem():
    costs = {f"c{i}": 2.0 for i in range(8)}
    big = job("big", None, candidates=list(costs))
    big.candidate_s, big.overhead_s = dict(costs), 0.2
    big.estimate_s = 0.2 + 16.0
    jobs = [big, *(job(f"s{i}", 0.5) for i in range(60))]
    result = simulate(jobs, 16)
    # the big problem alone (16.2 s) would bound the wall time; in parts it does not
    assert result.makespan_s < 8 and result.serial_s == pytest.approx(16.2 + 30)


def test_a_part_waits_only_for_its_own_candidates_sub_problems():
    costs = {"direct": 4.0, "im2col": 4.0, "winograd": 4.0, "implicit": 4.0}
    conv = job("conv", None, candidates=list(costs))
    conv.candidate_s, conv.overhead_s = dict(costs), 0.1
    conv.estimate_s = 16.1
    conv.candidate_children = {"im2col": (("cat", "gemm"),), "winograd": (("cat", "gemm"),)}
    conv.children = (("cat", "gemm"),)
    gemm = job("gemm", 4.0)
    jobs = split([gemm, conv, *(job(f"s{i}", 1.0) for i in range(12))], workers=4)
    parts = {tuple(j.algorithms): j for j in jobs if j.key == "conv"}
    assert len(parts) >= 2
    for names, part in parts.items():
        needs_gemm = bool(set(names) & {"im2col", "winograd"})
        assert set(names) <= ({"im2col", "winograd"} if needs_gemm else {"direct", "implicit"})
        assert part.children == ((("cat", "gemm"),) if needs_gemm else ())
    scheduler = Scheduler(jobs)
    ready = []
    while (found := scheduler.next_for("w", workers=1)) is not None:
        ready.append(found)
    assert {j.key for j in ready} >= {"gemm", "conv"}  # the free parts start at once
    assert all(not j.children for j in ready)


def test_the_eta_counts_jobs_until_their_sizes_can_be_trusted():
    """Untimed jobs are sized from their arithmetic, which misses a search's fixed cost: a
    first small job that took 0.3 s against 1 us expected must not scale the rest into
    hours.  Until a fifth of the expected work is done the ETA counts jobs; after that, or
    when an earlier tune timed them, it scales the expected times."""
    # one small job done, 99 left: 99 x 0.3 s over 2 workers, not 1000 s x 300,000 / 2
    assert eta_seconds(1e-6, 0.3, 1, 1000.0, 99, 2, timed_before=False) == pytest.approx(14.85)
    # timed before: the expected times are seconds already, scaled by this run's pace
    assert eta_seconds(2.0, 3.0, 4, 10.0, 20, 2, timed_before=True) == pytest.approx(7.5)
    # a quarter of the expected work done: scaled
    assert eta_seconds(25.0, 50.0, 10, 75.0, 30, 5, timed_before=False) == pytest.approx(30.0)
    assert eta_seconds(0.0, 0.0, 0, 10.0, 3, 2, timed_before=False) is None


def test_each_fleet_size_has_its_own_bound_and_never_beats_it():
    """A long problem splits into more parts on more workers, so the longest chain (no
    schedule's wall time is shorter) is a property of each fleet size: every simulated row
    reaches at least its own, and a bigger fleet's is no longer."""
    costs = {"a": 8.0, "b": 4.0, "c": 3.0, "d": 1.0}
    big = job("big", None, candidates=list(costs))
    big.candidate_s, big.overhead_s = dict(costs), 0.5
    big.estimate_s = 0.5 + sum(costs.values())
    jobs = [big, *(job(f"s{i}", 0.5) for i in range(8)), job("parent", 0.5, children=["big"])]
    rows = [simulate(jobs, workers) for workers in (1, 2, 8, 64)]
    for row in rows:
        assert row.makespan_s >= row.critical_path_s - 1e-9
    bounds = [row.critical_path_s for row in rows]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] < bounds[0]
