"""A model's launch plan: the launches of one run, recorded on its first run and replayed by
every run after it, on a device that queues work (OpenCL).

Why: on a queued device the host's per-step cost (the algorithm's Python, an output array,
arguments set one by one) exceeds a small kernel's time, and every run repeats it
identically.  So the first run records one run on random inputs; the plan is checked against
an ordinary run on other random inputs, made before the recording (work an algorithm enqueued
behind the device's back would show there, and work done once on a first call stays out of the
plan), and used only if both agree and a replayed run is measured faster than a step-by-step
one.  Any failure leaves the model running step by step, with the reason in
:attr:`ModelReplay.note`.  The device's backend records and replays the launches
(``fastrun/devices/opencl/replay.py``); this module decides whether a model uses them.

Recording on the first run rather than at the end of the search keeps the search about
deciding problems: a model that is searched and never run (``fastrun tune``, a cache being
filled) records nothing.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fastrun.devices import UnreplayableError

log = logging.getLogger(__name__)

#: Whole runs of each kind :meth:`ModelReplay.time_plan_and_steps` times before a plan is
#: kept: enough for a median over a device's stray slow run, few enough that a large model's
#: first run stays short (ViT-B/16 at batch 32: about 0.5 s on the H200).
PLAN_TIMING_ROUNDS = 5


class ModelReplay:
    """Whether ``model`` (a :class:`fastrun.runtime.model.Model`, which owns this; not
    imported, so that the two modules import in one direction) replays recorded launches, and
    the plan it replays."""

    def __init__(self, model: Any, enabled: bool):
        self.model = model
        self.enabled = enabled
        #: the plan runs replay: None until the first run, False where none is used
        self._plan: Any = None
        #: why runs replay or not ("" until the first run; "off" when replay is off)
        self.note = "" if enabled else "off"

    def get(self) -> Any | None:
        """The plan every run replays, or None; recorded on the first call."""
        if self._plan is None:
            self._plan = self._record() if self.enabled else False
        return self._plan or None

    def _record(self) -> Any:
        """The checked plan, or False (the reason logged and kept in :attr:`note`)."""
        model = self.model
        recording = model.device.recording()
        if recording is None:
            self.note = f"{model.device.kind} devices record no launches"
            return False
        # The ordinary run the plan is checked against comes first, so that work an
        # algorithm does once, on its first call (cl_winograd transforms the prepared
        # filters), is done before the recording: the plan holds only what every run repeats.
        check = model.random_inputs(seed=2)
        expected = list(model._run_steps(check).values())
        env = model._start(model.random_inputs(seed=1, on_device=True))
        inputs = [env[index] for index in model._input_slots.values()]
        with recording:
            model._issue(env)
        outputs = [env[index] for index in model._output_slots]
        name = model.graph.name
        try:
            plan = recording.plan(inputs, outputs)
        except UnreplayableError as error:
            self.note = str(error)
            log.info("running %s step by step: %s", name, error)
            return False
        got, _ = plan.run(model._plan_feeds(check))
        wrong = [output for output, want, have
                 in zip(model.graph.outputs, expected, got, strict=True)
                 if not agree(have, want)]
        if wrong:
            self.note = (f"a replay of the recorded launches gave other values than an "
                         f"ordinary run for output(s) {', '.join(wrong)}")
            log.warning("running %s step by step: %s (an algorithm may enqueue work without "
                        "the device's launch())", name, self.note)
            return False
        timings = plan.choose_enqueue()
        replay_s, steps_s = self.time_plan_and_steps(plan, check)
        if steps_s < replay_s:
            self.note = (f"step by step: {steps_s * 1e3:.3f} ms a run against "
                         f"{replay_s * 1e3:.3f} ms for a replay of the {plan.launch_count} "
                         f"recorded launches")
            log.info("running %s %s", name, self.note)
            return False
        self.note = (f"{plan.launch_count} launches replayed ({plan.enqueue} enqueue; "
                     + ", ".join(f"{label} {seconds * 1e6:.0f} us"
                                 for label, seconds in timings.items())
                     + f"; run {replay_s * 1e3:.3f} ms, step by step {steps_s * 1e3:.3f} ms)")
        log.info("%s: %s", name, self.note)
        return plan

    def time_plan_and_steps(self, plan: Any, feeds: Mapping[str, Any],
                            rounds: int = PLAN_TIMING_ROUNDS) -> tuple[float, float]:
        """(seconds of a replayed run, seconds of a step-by-step run), each the median of
        ``rounds`` whole runs, inputs uploaded and outputs downloaded, alternating.  A replay
        saves the host's per-step work, but it also keeps every value in the buffer it was
        recorded in, where a step-by-step run reuses buffers it freed a moment before; which
        wins is not known in advance (ViT-B/16 at batch 32 ran faster step by step on one H200
        host and replayed on another: docs/history/transformers-2026-11-30-before-third.md).
        So the plan is kept only where it is measured faster."""
        model = self.model
        plan_feeds = model._plan_feeds(feeds)
        times: dict[str, list[float]] = {"replay": [], "steps": []}
        for _ in range(rounds):
            started = time.perf_counter()
            plan.run(plan_feeds)
            times["replay"].append(time.perf_counter() - started)
            started = time.perf_counter()
            model._run_steps(feeds)
            times["steps"].append(time.perf_counter() - started)
        return statistics.median(times["replay"]), statistics.median(times["steps"])


def agree(got: np.ndarray, expected: np.ndarray) -> bool:
    """Whether a replay's output matches an ordinary run's: floats within 1e-4 relative
    (NaN where NaN), anything else equal."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if got.dtype.kind in "fc":
        return bool(np.allclose(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True))
    return bool(np.array_equal(got, expected))
