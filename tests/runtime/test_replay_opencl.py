"""Launch plans on the OpenCL device (PoCL in CI): a searched model records its launches once
and every run replays them, with the same outputs as issuing each step through its algorithm;
a recording that would replay wrongly is refused, and the model keeps running step by step."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import fastrun
from fastrun.devices import UnreplayableError
from fastrun.runtime import load
from fastrun.runtime.replay import ModelReplay
from tests.opencl_helpers import device_fixture  # noqa: F401
from tests.runtime import _models


@pytest.fixture(autouse=True)
def replay_measured_faster(monkeypatch):
    """The tests of what a plan does need one: a plan is kept only where a replay is measured
    faster than a step-by-step run, which on PoCL's small runs may go either way.  The choice
    itself is tested below, with the real timing and with each outcome."""
    monkeypatch.setattr(ModelReplay, "time_plan_and_steps", lambda self, plan, feeds: (1e-3, 2e-3))


def _model(device, replay=None, proto=None):
    session = fastrun.Session(device=device, cache=None, strategy="heuristic", progress=False)
    model = load(proto or _models.residual_block(channels=8, size=6), session, batch=2,
                 replay=replay)
    model.search()
    return model


def test_runs_replay_the_recorded_launches_with_the_same_outputs(device):
    model = _model(device)
    plain = _model(device, replay=False)
    plan = model.launch_plan()
    assert plan is not None and plain.launch_plan() is None
    assert plan.launch_count >= model.step_count - 1  # a view launches nothing
    assert "launches replayed" in model.replay_note and plain.replay_note == "off"
    replayed = []
    original = plan.replay
    plan.replay = lambda: (replayed.append(1), original())[1]
    for seed in range(3):  # new inputs each time: the plan's input buffer is rewritten
        feeds = model.random_inputs(seed=10 + seed)
        np.testing.assert_array_equal(model.run(feeds)["y"], plain.run(feeds)["y"])
    assert len(replayed) == 3


def test_work_done_once_on_a_first_call_is_not_replayed(device):
    """cl_winograd transforms the prepared filters on its first call: that launch belongs to
    the ordinary run before the recording, not to every replay (on an H200 it was 13 of
    resnet18's 61 launches at batch 32)."""
    deep = _models.residual_block(channels=16, size=32)
    model = _model(device, proto=deep)
    names = model.launch_plan().kernel_names
    assert names.count("wino_input") == 2 and names.count("wino_output") == 2
    assert "wino_filter" not in names
    feeds = model.random_inputs(seed=3)
    np.testing.assert_array_equal(model.run(feeds)["y"],
                                  _model(device, replay=False, proto=deep).run(feeds)["y"])


def test_replay_takes_device_array_inputs(device):
    model = _model(device)
    feeds = model.random_inputs(seed=4)
    expected = model.run(feeds)["y"]
    on_device = {name: device.to_device(array) for name, array in feeds.items()}
    np.testing.assert_array_equal(model.run(on_device)["y"], expected)
    outputs, seconds = model.run_host_seconds(on_device)
    np.testing.assert_array_equal(outputs["y"], expected)
    assert seconds > 0


def test_the_environment_turns_replay_off(device, monkeypatch):
    monkeypatch.setenv("FASTRUN_REPLAY", "0")
    model = _model(device)
    assert model.launch_plan() is None and model.replay_note == "off"
    monkeypatch.setenv("FASTRUN_REPLAY", "maybe")
    with pytest.raises(ValueError, match="FASTRUN_REPLAY"):
        _model(device)


def test_a_plan_that_replays_wrongly_is_not_used(device, monkeypatch):
    """The check against an ordinary run catches work a replay would miss (here: the last
    launch dropped, as if an algorithm had enqueued it behind the device's back)."""
    from fastrun.devices.opencl import replay

    real = replay.LaunchPlan.__init__

    def dropping_the_last(self, device, launches, inputs, outputs):
        real(self, device, launches[:-1], inputs, outputs)

    monkeypatch.setattr(replay.LaunchPlan, "__init__", dropping_the_last)
    model = _model(device)
    assert model.launch_plan() is None
    assert "other values than an ordinary run" in model.replay_note
    monkeypatch.undo()
    feeds = model.random_inputs(seed=6)
    np.testing.assert_array_equal(model.run(feeds)["y"],
                                  _model(device, replay=False).run(feeds)["y"])


def test_a_transfer_inside_the_recorded_run_makes_it_unreplayable(device):
    x = device.to_device(np.ones(4, np.float32))
    with device.recording() as recording:
        device.to_host(x)
    with pytest.raises(UnreplayableError, match="downloads a device array"):
        recording.plan([x], [x])
    with device.recording() as recording:
        pass
    with pytest.raises(UnreplayableError, match="launched no kernel"):
        recording.plan([x], [x])
    with device.recording(), pytest.raises(RuntimeError, match="already open"):
        device.recording().__enter__()


def test_both_enqueue_ways_are_timed_and_give_the_same_result(device):
    model = _model(device)
    plan = model.launch_plan()
    feeds = model.random_inputs(seed=8)
    expected = model.run(feeds)["y"]
    seconds = plan.choose_enqueue(rounds=2)
    assert "pyopencl" in seconds and all(s > 0 for s in seconds.values())
    assert plan.enqueue in seconds
    for way in seconds:  # each way on its own
        plan._replay = getattr(plan, f"_replay_{way}")
        np.testing.assert_array_equal(model.run(feeds)["y"], expected, err_msg=way)


def test_a_timed_replay_times_each_launch_and_replays_them_all(device):
    model = _model(device)
    plan = model.launch_plan()
    feeds = model.random_inputs(seed=9)
    expected = model.run(feeds)["y"]
    for way in plan.choose_enqueue(rounds=1):  # the ways this machine has
        plan.enqueue = way
        plan.write_inputs(model._plan_feeds(feeds))
        seconds = plan.timed_replay()
        assert len(seconds) == plan.launch_count == len(plan.kernel_names)
        assert all(s > 0 for s in seconds)
        np.testing.assert_array_equal(plan.read_outputs()[0], expected, err_msg=way)


def test_threads_sharing_a_model_take_turns(device):
    model = _model(device)
    inputs = [model.random_inputs(seed=20 + i) for i in range(4)]
    expected = [model.run(feeds)["y"] for feeds in inputs]
    errors = []

    def worker(index: int) -> None:
        for _ in range(5):
            got = model.run(inputs[index])["y"]
            if not np.array_equal(got, expected[index]):
                errors.append(index)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_the_cpu_records_nothing():
    model = load(_models.conv_bn_relu(), fastrun.Session(device="cpu", cache=None,
                                                         strategy="heuristic", progress=False))
    assert model.launch_plan() is None and model.replay is False


def test_a_model_with_a_boolean_output_is_checked_and_replayed(device):
    """The check compares non-float outputs for equality (a bool has no tolerance)."""
    from tests.runtime._models import GraphWriter

    w = GraphWriter()
    x = w.node("Relu", ["x"], "r")
    w.node("Cast", [x], "y", to=9)  # BOOL: a device cast kernel, x != 0
    proto = w.model((1, 3, 4, 4), "y")
    proto.graph.output[0].type.tensor_type.elem_type = 9
    model = _model(device, proto=proto)
    assert model.launch_plan() is not None, model.replay_note
    feeds = model.random_inputs(seed=3)
    got = model.run(feeds)["y"]
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, np.maximum(feeds["x"], 0) != 0)


def test_without_the_opencl_library_the_plan_enqueues_through_pyopencl(device, monkeypatch):
    """Where the library pyopencl loaded cannot be found (no /proc, a static build), only
    pyopencl's enqueue is timed and used."""
    from fastrun.devices.opencl import replay

    monkeypatch.setattr(replay, "_direct_calls", lambda *args: None)
    model = _model(device)
    plan = model.launch_plan()
    assert plan is not None and plan.enqueue == "pyopencl"
    assert "direct" not in model.replay_note
    feeds = model.random_inputs(seed=12)
    np.testing.assert_array_equal(model.run(feeds)["y"],
                                  _model(device, replay=False).run(feeds)["y"])


def test_a_replay_measured_slower_than_step_by_step_is_not_used(device, monkeypatch):
    """A replay keeps each value in its recorded buffer; a step-by-step run reuses buffers
    still in the device's cache, and on a large model it can be the faster (ViT-B/16 at
    batch 32 on an H200): the plan goes only where it is measured faster."""
    monkeypatch.setattr(ModelReplay, "time_plan_and_steps", lambda self, plan, feeds: (2e-3, 1e-3))
    model = _model(device)
    assert model.launch_plan() is None
    assert re.fullmatch(r"step by step: 1\.000 ms a run against 2\.000 ms for a replay of "
                        r"the \d+ recorded launches", model.replay_note), model.replay_note
    feeds = model.random_inputs(seed=5)
    np.testing.assert_array_equal(model.run(feeds)["y"],
                                  _model(device, replay=False).run(feeds)["y"])


def test_the_plan_and_the_steps_are_both_timed_on_whole_runs(device, monkeypatch):
    timed = []
    monkeypatch.undo()  # the real timing, as a model's first run runs it
    real = ModelReplay.__dict__["time_plan_and_steps"]
    monkeypatch.setattr(ModelReplay, "time_plan_and_steps",
                        lambda self, plan, feeds: timed.append(real(self, plan, feeds))
                        or timed[-1])
    model = _model(device)
    assert not timed and model.replay_note == ""  # the search records nothing
    model.launch_plan()
    (replay_s, steps_s), = timed
    assert 0 < replay_s < 1 and 0 < steps_s < 1
    if model.launch_plan() is not None:
        assert f"run {replay_s * 1e3:.3f} ms, step by step {steps_s * 1e3:.3f} ms" in \
            model.replay_note
    else:
        assert model.replay_note.startswith(f"step by step: {steps_s * 1e3:.3f} ms")
