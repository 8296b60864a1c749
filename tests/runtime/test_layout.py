"""The runtime's choice of the channel-blocked layout (``fastrun/runtime/layout.py``): the steps
it rewrites and the conversions it inserts, results equal to NCHW's and onnxruntime's, the
choice following the measured times (all blocked, none, one layer left out of a region), no
guessing without times, and a cached choice replayed without a search."""

from __future__ import annotations

import numpy as np
import pytest

import fastrun
from fastrun.cache import FileCache, InMemoryCache
from fastrun.runtime import layout, layout_check, load
from tests.runtime import _models
from tests.runtime.test_runtime import FAST, assert_matches_onnxruntime, heuristic_session


def _times(blocked: float = 1e-4, nchw: float = 1e-3, reorder: float = 1e-5, special=None):
    """A ``decide`` for :func:`layout.choose_layouts`: fixed seconds per kind of problem;
    ``special(problem)`` may override (returns None to fall through)."""
    def decide(problem):
        if special is not None and (time := special(problem)) is not None:
            return time
        if problem.operator == "reorder":
            return reorder
        return blocked if problem.param("layout") else nchw
    return decide


def _planned(decide, proto=None):
    proto = proto or _models.layout_mix()
    session = heuristic_session()
    model = load(proto, session, weight_preprocess=True, blocked_layout=False)
    plan = layout.choose_layouts(model.steps, model.outputs, session, decide)
    model.steps, model.layout_plan = plan.steps, plan
    return proto, model, plan


def _layouts(model) -> dict[str, str]:
    """Each conv's layout, by its first ONNX node's name (fused steps join names with '+')."""
    return {step.node.split("+")[0]: step.problem.param("layout", "nchw")
            for step in model.steps if step.operator == "conv"}


def _reorders(model) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return [(step.inputs[0].shape, step.output.shape) for step in model.steps
            if step.operator == "reorder"]


def _slow_c3_in_nchw(problem):
    """c3, alone between the MaxPool and the global pool, gains enough to pay for its two
    conversions (each counted at least as the cheapest conv)."""
    if problem.operator == "conv" and problem.shapes[1] == (24, 36, 3, 3):
        return 1e-4 if problem.param("layout") else 1e-2
    return None


def test_everything_blocked_when_it_pays_with_conversions_only_at_the_edges():
    proto, model, plan = _planned(_times(special=_slow_c3_in_nchw))
    assert set(_layouts(model).values()) == {"nchw16c"}
    # in: the image; out: before the MaxPool (NCHW only) and before the global pool
    assert _reorders(model) == [((1, 3, 9, 9), (1, 1, 9, 9, 16)),
                                ((1, 3, 9, 9, 16), (1, 36, 9, 9)),
                                ((1, 36, 4, 4), (1, 3, 4, 4, 16)),
                                ((1, 2, 4, 4, 16), (1, 24, 4, 4))]
    assert plan.reorders == 4 and plan.chosen_s < plan.nchw_s
    transparent = {step.operator for step in model.steps
                   if step.output.shape[-1:] == (16,) and step.operator != "conv"}
    assert transparent >= {"sigmoid", "concat", "mul", "reorder"}
    feeds = model.random_inputs()
    reference = load(proto, heuristic_session(), weight_preprocess=True, blocked_layout=False)
    np.testing.assert_allclose(model.run(feeds)["y"], reference.run(feeds)["y"], rtol=1e-5,
                               atol=1e-6)
    assert_matches_onnxruntime(proto, model, feeds)


def test_nothing_changes_when_nchw_is_faster():
    _proto, model, plan = _planned(_times(blocked=2e-3))
    assert plan.blocked_steps == 0 and plan.steps is model.steps
    assert set(_layouts(model).values()) == {"nchw"} and not _reorders(model)


def test_the_deeper_part_of_a_region_goes_blocked_alone():
    """c0 and the depthwise conv are faster in NCHW, what follows them in blocked: the region
    is cut where blocking starts to pay, with one conversion at the cut."""
    def shallow_in_nchw(problem):
        if problem.operator == "conv" and problem.shapes[1] in ((20, 3, 3, 3), (20, 1, 3, 3)):
            return 5e-3 if problem.param("layout") else 1e-4
        return _slow_c3_in_nchw(problem)

    _, model, _ = _planned(_times(special=shallow_in_nchw))
    layouts = _layouts(model)
    assert (layouts.pop("c0"), layouts.pop("dw")) == ("nchw", "nchw")
    assert set(layouts.values()) == {"nchw16c"}


def test_no_island_of_one_layer_between_two_conversions():
    """A conv that alone would gain a little more than its two conversions stays NCHW: a
    conversion counts at least as the cheapest conv, and single flips add no conversion."""
    def only_c1_gains(problem):
        if problem.operator == "conv" and problem.shapes[1][2:] == (1, 1):
            return 1e-4 if problem.param("layout") else 2.5e-3
        if problem.operator == "conv":
            return 5e-3 if problem.param("layout") else 1e-3
        return None

    _, _, plan = _planned(_times(special=only_c1_gains))
    assert plan.blocked_steps == 0


@pytest.mark.parametrize("se_timed", [True, False])
def test_a_squeeze_excitation_block_stays_blocked_with_its_convolutions(se_timed):
    """MobileNetV3's block (expansion, depthwise, squeeze-excitation, projection, residual):
    the fused squeeze_excite step runs blocked with the convolutions around it, no conversion
    between them.  Searched with its one algorithm, it has no time in either layout
    (``se_timed`` False) and counts the same in both."""
    timed = _times()

    def decide(problem):
        return None if problem.operator == "squeeze_excite" and not se_timed else timed(problem)

    proto, model, plan = _planned(decide, _models.mobilenet_v3_block(channels=16, size=10))
    excite = [step for step in model.steps if step.operator == "squeeze_excite"]
    assert len(excite) == 1 and excite[0].problem.param("layout") == "nchw16c"
    assert set(_layouts(model).values()) == {"nchw16c"}
    assert plan.reorders == 2  # the image in, the output out
    feeds = model.random_inputs()
    reference = load(proto, heuristic_session(), weight_preprocess=True, blocked_layout=False)
    np.testing.assert_allclose(model.run(feeds)["y"], reference.run(feeds)["y"], rtol=1e-5,
                               atol=1e-6)
    assert_matches_onnxruntime(proto, model, feeds)


def test_unknown_times_keep_nchw():
    _, model, plan = _planned(lambda problem: None)
    assert plan.blocked_steps == 0 and not _reorders(model)
    # a heuristic-only search has no times: the model is searched as before, all NCHW
    model = load(_models.layout_mix(), heuristic_session(), weight_preprocess=True,
                 blocked_layout=True)
    model.search()
    assert set(_layouts(model).values()) == {"nchw"}


def test_on_by_default_and_switched_off_by_the_environment(monkeypatch):
    assert load(_models.layout_mix(), heuristic_session()).blocked_layout
    monkeypatch.setenv("FASTRUN_BLOCKED_LAYOUT", "0")
    model = load(_models.layout_mix(), heuristic_session())
    assert not model.blocked_layout
    model.search()
    assert model.layout_plan is None
    assert load(_models.layout_mix(), heuristic_session(), blocked_layout=True).blocked_layout


def test_a_searched_choice_is_replayed_from_the_cache(tmp_path):
    """The search times both layouts and stores them; a later process with the cache alone
    (heuristic strategy, nothing timed) makes the same choice, whatever it is."""
    path = tmp_path / "cache.bin"
    proto = _models.layout_mix(size=12)
    searched = load(proto, fastrun.session(cache=FileCache(path), strategy="fast-run", **FAST),
                    weight_preprocess=True, blocked_layout=True)
    searched.search()
    assert searched.layout_plan is not None and searched.layout_plan.nchw_s > 0
    session = fastrun.session(cache=FileCache(path), strategy="heuristic", progress=False)
    replayed = load(proto, session, weight_preprocess=True, blocked_layout=True)
    replayed.search()
    assert session.chooser.stats.profiled == 0
    assert [(s.operator, s.problem.key if s.problem else None) for s in replayed.steps] == \
        [(s.operator, s.problem.key if s.problem else None) for s in searched.steps]
    assert_matches_onnxruntime(proto, replayed, replayed.random_inputs())


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "squeezenet"])
def test_zoo_models_all_blocked_match_nchw(name):
    """Every conv of the built-in CNNs computed blocked (forced by the times given) gives the
    NCHW model's result."""
    proto, model, plan = _planned(_times(), f"zoo:{name}")
    assert plan.blocked_steps > 0
    feeds = model.random_inputs()
    reference = load(proto, heuristic_session(), weight_preprocess=True, blocked_layout=False)
    expected = reference.run(feeds)
    for output, value in model.run(feeds).items():
        scale = float(np.max(np.abs(expected[output])))
        assert float(np.max(np.abs(value - expected[output]))) <= 1e-5 * scale


def test_a_search_with_blocked_layouts_gives_onnxruntimes_result():
    model = load(_models.layout_mix(), fastrun.session(cache=InMemoryCache(),
                                                       strategy="fast-run", **FAST),
                 blocked_layout=True)
    feeds = model.random_inputs()
    assert_matches_onnxruntime(_models.layout_mix(), model, feeds)


def test_a_model_served_from_neighbours_plans_its_layouts_with_carried_times(monkeypatch):
    """Without times every conv would stay NCHW ("no guessing"): a model at a size nobody
    searched plans its layouts with the times carried from its nearest measured problems."""
    cache = InMemoryCache()
    searching = fastrun.Session(cache=cache, strategy="fast-run", budget_s=0.002,
                                progress=False)
    load(_models.layout_mix(20), searching, blocked_layout=True).search()
    asked = []
    real = layout.choose_layouts

    def spy(steps, outputs, session, decide):
        def recorded(problem):
            asked.append((problem, decide(problem)))
            return asked[-1][1]
        return real(steps, outputs, session, recorded)

    monkeypatch.setattr(layout, "choose_layouts", spy)
    serving = fastrun.Session(cache=cache, strategy="heuristic", progress=False)
    load(_models.layout_mix(24), serving, blocked_layout=True).search()
    conv_times = [time for problem, time in asked if problem.operator == "conv"]
    assert conv_times and None not in conv_times
    assert serving.chooser.stats.nearest > 0 and serving.chooser.stats.profiled == 0


# -- the plan checked end to end (fastrun/runtime/layout_check.py) ----------------------------

def _all_blocked_choice(monkeypatch):
    """The layout choice blocks every capable conv, whatever the search measured, so that the
    end-to-end check has a plan to judge."""
    real = layout.choose_layouts
    monkeypatch.setattr(layout, "choose_layouts",
                        lambda steps, outputs, session, decide: real(steps, outputs, session,
                                                                     _times()))


def _timed_plans(monkeypatch, blocked_ms: float, nchw_ms: float) -> list[set[str]]:
    """Replaces the timing of whole inferences by fixed medians (each plan is still run
    once, so a program that fails would show); returns the plan names each call timed."""
    calls = []

    def time_plans(plans, rounds=layout_check.ROUNDS, runs=layout_check.RUNS):
        calls.append(set(plans))
        for run in plans.values():
            run()
        return {layout_check.BLOCKED: [blocked_ms * 1e-3] * rounds,
                layout_check.NCHW: [nchw_ms * 1e-3] * rounds}
    monkeypatch.setattr(layout_check, "time_plans", time_plans)
    return calls


def _search(path, strategy="fast-run"):
    options = FAST if strategy == "fast-run" else {"progress": False}
    session = fastrun.session(cache=FileCache(path), strategy=strategy, **options)
    model = load(_models.layout_mix(size=12), session, weight_preprocess=True,
                 blocked_layout=True)
    model.search()
    return session, model


def test_a_blocked_plan_slower_end_to_end_gives_way_to_nchw_and_the_cache_remembers(
        monkeypatch, tmp_path):
    _all_blocked_choice(monkeypatch)
    timed = _timed_plans(monkeypatch, blocked_ms=2.0, nchw_ms=1.0)
    path = tmp_path / "cache.bin"
    _, model = _search(path)
    assert timed == [{"nchw16c", "nchw"}]
    assert not model.layout_plan.kept and model.layout_plan.blocked_steps > 0
    assert "nchw kept" in model.layout_plan.end_to_end
    assert set(_layouts(model).values()) == {"nchw"} and not _reorders(model)
    assert_matches_onnxruntime(_models.layout_mix(size=12), model, model.random_inputs())
    # a later run from the cache alone repeats the decision, timing nothing
    session, replayed = _search(path, strategy="heuristic")
    assert timed == [{"nchw16c", "nchw"}] and session.chooser.stats.profiled == 0
    assert not replayed.layout_plan.kept and "from the cache" in replayed.layout_plan.end_to_end
    assert set(_layouts(replayed).values()) == {"nchw"}


def test_a_blocked_plan_faster_end_to_end_is_kept(monkeypatch, tmp_path):
    _all_blocked_choice(monkeypatch)
    _timed_plans(monkeypatch, blocked_ms=1.0, nchw_ms=2.0)
    _, model = _search(tmp_path / "cache.bin")
    assert model.layout_plan.kept and "nchw16c kept" in model.layout_plan.end_to_end
    assert "nchw16c" in _layouts(model).values() and _reorders(model)
    assert_matches_onnxruntime(_models.layout_mix(size=12), model, model.random_inputs())
    entries = FileCache(tmp_path / "cache.bin").get(layout_check.category(model.session),
                                                     layout_check.plan_key(
                                                         _nchw_steps_of(model)))
    assert entries and min(entries, key=lambda e: e.time_s).algorithm == "nchw16c"


def test_a_cached_blocked_decision_is_repeated_without_binding_nchw(monkeypatch, tmp_path):
    _all_blocked_choice(monkeypatch)
    timed = _timed_plans(monkeypatch, blocked_ms=1.0, nchw_ms=2.0)
    path = tmp_path / "cache.bin"
    _search(path)
    session, replayed = _search(path, strategy="heuristic")
    assert len(timed) == 1 and session.chooser.stats.profiled == 0
    assert replayed.layout_plan.kept and "from the cache" in replayed.layout_plan.end_to_end
    assert "nchw16c" in _layouts(replayed).values()
    assert_matches_onnxruntime(_models.layout_mix(size=12), replayed,
                               replayed.random_inputs())


def _nchw_steps_of(model):
    """The NCHW steps of ``model``'s graph, as a model without the blocked layout lowers them."""
    plain = load(_models.layout_mix(size=12), heuristic_session(), weight_preprocess=True,
                 blocked_layout=False)
    return plain.steps


def test_a_run_that_may_not_time_and_finds_no_decision_keeps_the_estimated_plan(monkeypatch):
    _all_blocked_choice(monkeypatch)
    timed = _timed_plans(monkeypatch, blocked_ms=2.0, nchw_ms=1.0)
    model = load(_models.layout_mix(size=12), heuristic_session(), weight_preprocess=True,
                 blocked_layout=True)
    model.search()
    assert timed == [] and model.layout_plan.kept
    assert "not checked" in model.layout_plan.end_to_end
    assert "nchw16c" in _layouts(model).values()


def test_whole_inferences_alternate_between_the_plans():
    order = []
    medians = layout_check.time_plans({"a": lambda: order.append("a"),
                                       "b": lambda: order.append("b")}, rounds=2, runs=1)
    assert order == ["a", "a", "b", "b", "b", "b", "a", "a"]
    assert set(medians) == {"a", "b"} and all(len(v) == 2 for v in medians.values())
