"""A loaded model: lowered, fused, searched once, then run as a flat list of prepared calls.

Loading does everything that can fail or take time *before* the first inference: read and check
the ONNX graph, fix the input shapes, lower every node onto registry operators (folding
constants), fuse epilogues, then decide every problem through the session (cache, profile or
heuristic, as its strategy says).  What is left for :meth:`Model.run` is a loop over prepared
calls reading and writing slots of a list; intermediate results are released as soon as their
last reader has run, so peak memory stays near the largest live set, not the sum of all
activations.

On a device without host memory (OpenCL) the program keeps every tensor on the device: the
constants that steps read are uploaded once, when the model is searched; a run uploads each
input once and downloads each output once; in between, steps pass device arrays to each
other (view steps reshape and cast them on the device: its backend's ``view_function``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrun import config
from fastrun.api import Session
from fastrun.core import limits
from fastrun.core.chooser import Decision, NoUsableAlgorithmError, PreparedCall
from fastrun.devices import get_device
from fastrun.devices.opencl.settings import REPLAY
from fastrun.operator import Problem, random_values
from fastrun.runtime import fusion, layout, layout_check
from fastrun.runtime.errors import DeviceUnsupportedError, ModelError
from fastrun.runtime.graph import Graph, from_onnx
from fastrun.runtime.lowering import Step, Value, lower
from fastrun.runtime.replay import ModelReplay

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RunTrace:
    """One traced inference (:meth:`Model.run_traced`), in perf_counter nanoseconds: when it
    began, each step's (start, end), when the last step ended and when the outputs were
    ready.  What is not in a step is the runtime's own cost: converting the inputs, the step
    loop between steps (fetching arguments, releasing values), the outputs."""

    began: int
    steps: list[tuple[int, int]]
    issued: int
    ended: int

    @property
    def total_ns(self) -> int:
        return self.ended - self.began

    @property
    def step_ns(self) -> list[int]:
        return [end - start for start, end in self.steps]

    @property
    def gap_ns(self) -> list[int]:
        """Before the first step, between each two steps, and after the last."""
        marks = [self.began, *(t for step in self.steps for t in step), self.issued]
        return [marks[i + 1] - marks[i] for i in range(0, len(marks), 2)]


@dataclass
class StepReport:
    """How one step was decided: what a ``--verbose`` table row shows."""

    step: Step
    decision: Decision | None  # None for view steps

    @property
    def algorithm(self) -> str:
        if self.decision is None:
            return "view"
        policy = self.decision.policy
        children = sorted({c.algorithm for c in policy.children})
        return policy.algorithm + (f" [{', '.join(children)}]" if children else "")

    @property
    def source(self) -> str:
        return "-" if self.decision is None else self.decision.source


class Model:
    """An ONNX model prepared for fixed input shapes on one session."""

    def __init__(self, graph: Graph, session: Session,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 batch: int | None = None, weight_preprocess: bool = True,
                 fuse: bool = True, blocked_layout: bool | None = None,
                 replay: bool | None = None):
        self.graph = graph
        self.session = session
        self.weight_preprocess = weight_preprocess
        self.device = session.device
        #: True on a device with its own memory: tensors live there from input to output
        self.on_device = not session.device.host_memory
        self.device.model_loaded()
        #: device copies of the constants steps read, by id of their Value (uploaded once)
        self._uploaded: dict[int, Any] = {}
        self.inputs = _input_values(graph, dict(input_shapes or {}), batch)
        evaluator = _ConstantEvaluator(session)
        steps, values = lower(graph, self.inputs, session.registry, evaluator)
        self.outputs = [values[name] for name in graph.outputs]
        if fuse:
            steps = fusion.fuse(steps, self.outputs, session.registry, session.device.kind)
        if weight_preprocess:
            _enable_weight_preprocess(steps, session)
        self.steps = steps
        #: whether the search may run convolutions in the channel-blocked layout where that
        #: is measured to pay (``fastrun/runtime/layout.py``); on a CPU device only
        self.blocked_layout = (config.BLOCKED_LAYOUT.get(blocked_layout)
                               and layout.supported(session))
        #: what the layout choice decided (None before the search, or when not considered)
        self.layout_plan: layout.LayoutPlan | None = None
        self.reports: list[StepReport] | None = None
        self._program: list[tuple[Any, tuple[int, ...], int, tuple[int, ...]]] = []
        self._template: list[Any] = []
        self._input_slots: dict[str, int] = {}
        self._output_slots: list[int] = []
        #: whether runs replay a recorded launch plan (``fastrun/devices/opencl/replay.py``)
        #: where the device can record one
        self.replay = self.on_device and REPLAY.get(replay)
        #: the launch plan runs replay, recorded on the first run (``runtime/replay.py``)
        self._launches = ModelReplay(self, self.replay)

    # -- searching -----------------------------------------------------------------------------
    def search(self) -> list[StepReport]:
        """Decide every step's problem (cache, profile or heuristic, per the session's
        strategy) and bind the prepared calls.  Runs once; :meth:`run` calls it if needed.

        When the strategy profiles, the model is executed step by step on random inputs while
        it is searched, and each step's candidates are timed right after the model's previous
        step (in context): a kernel timed back to back against itself finds its thread pool
        awake and its data in cache, which a model that just ran another kernel does not
        offer (on the 2-core development VM a numba pooling kernel took 0.68 ms back to back
        and 1.3 ms after the vCPUs had idled, while numpy's took 0.9 ms either way).
        """
        if self.reports is not None:
            return self.reports
        if self.on_device:
            self._check_device_kind()
        # the model all in NCHW, kept while a blocked plan is checked end to end
        nchw: tuple[list[Step], list[Value]] | None = None
        if self.blocked_layout and self.layout_plan is None:
            # copies: the layout choice rewrites the steps it blocks in place
            nchw = ([dataclasses.replace(step, inputs=list(step.inputs), params=dict(step.params),
                                         notes=list(step.notes)) for step in self.steps],
                    list(self.outputs))
            self._choose_layouts()
            if not self.layout_plan.blocked_steps:
                nchw = None
        in_context = self.session.chooser.options.strategy.profiles
        reports, calls = self._decide_steps(in_context)
        self._compile(calls)
        self.reports = reports
        if nchw is not None:
            self._check_layout_plan(*nchw)
        return self.reports

    def _decide_steps(self, in_context: bool) -> tuple[list[StepReport], dict[int, PreparedCall]]:
        """Each step's decision and prepared call; ``in_context``: the model is executed step
        by step while it is searched (see :meth:`search`)."""
        chooser = self.session.chooser
        progress = self.session.progress
        total = sum(1 for step in self.steps if step.problem is not None)
        runner = _StepRunner(self) if in_context else None
        reports, calls = [], {}
        done = 0
        if progress is not None:
            progress.job(total, "searching" if in_context else "deciding")
        # a search builds kernels for every step: one pool of build helpers serves them all
        builds = self.device.parallel_builds() if in_context else contextlib.nullcontext()
        with builds:
            try:
                for index, step in enumerate(self.steps):
                    if step.problem is None:
                        reports.append(StepReport(step, None))
                        if runner is not None:
                            runner.run(index, self._view(step))
                        continue
                    done += 1
                    if progress is not None:
                        progress.job_item(done, total, step.node)
                    prelude = runner.previous if runner is not None else None
                    try:
                        call = chooser.prepare(
                            step.problem, [self._const(v) if v.is_const else None
                                           for v in step.inputs], prelude)
                    except NoUsableAlgorithmError as error:
                        raise StepAlgorithmError(step, error) from None
                    calls[id(step)] = call
                    reports.append(StepReport(step, call.decision))
                    if runner is not None:
                        runner.run(index, call, remember=True)
            finally:
                if progress is not None:
                    progress.job_end()
        return reports, calls

    def _check_layout_plan(self, nchw_steps: list[Step], nchw_outputs: list[Value]) -> None:
        """Keep the blocked plan only if whole inferences run faster with it than all in NCHW
        (``fastrun/runtime/layout_check.py``): the decision cached is repeated; without one,
        a search times both programs and caches the result, a run that may not time keeps
        the estimated plan."""
        plan = self.layout_plan
        key = layout_check.plan_key(nchw_steps)
        cached = layout_check.cached_choice(self.session, key)
        if cached is None and not self.session.chooser.options.strategy.profiles:
            plan.end_to_end = "not checked (no decision in the cache, nothing may be timed)"
            return
        if cached is not None:
            plan.end_to_end = f"{cached[0]} kept, from the cache ({cached[1] * 1e3:.3f} ms)"
            if cached[0] == layout_check.BLOCKED:
                return  # the NCHW program is not needed
        blocked = (self.steps, self.outputs, self.reports, self._program_state())
        self.steps, self.outputs = nchw_steps, nchw_outputs
        nchw_reports, nchw_calls = self._decide_steps(in_context=False)
        self._compile(nchw_calls)
        self.reports = nchw_reports
        nchw = (self.steps, self.outputs, self.reports, self._program_state())
        programs = {layout_check.BLOCKED: blocked, layout_check.NCHW: nchw}
        if cached is not None:
            choice = cached[0]
        else:
            feeds = self.random_inputs(seed=0)

            def runner(state: tuple) -> Callable[[], object]:
                def run() -> object:
                    self._set_program_state(state[3])
                    return self.run(feeds)
                return run
            medians = layout_check.time_plans({name: runner(state)
                                               for name, state in programs.items()})
            layout_check.store(self.session, key, medians)
            choice = layout_check.decide(medians)
            plan.end_to_end = (f"{choice} kept: blocked plan "
                               f"{_ms(medians[layout_check.BLOCKED])}, NCHW "
                               f"{_ms(medians[layout_check.NCHW])} (median of "
                               f"{layout_check.ROUNDS} alternating rounds)")
        log.info("layouts: %s", plan.end_to_end)
        plan.kept = choice == layout_check.BLOCKED
        self.steps, self.outputs, self.reports, state = programs[choice]
        self._set_program_state(state)

    def _program_state(self) -> tuple:
        return self._program, self._template, self._input_slots, self._output_slots

    def _set_program_state(self, state: tuple) -> None:
        self._program, self._template, self._input_slots, self._output_slots = state

    def _choose_layouts(self) -> None:
        """Decide which steps compute in the blocked layout (each conv decided in both
        layouts, each possible conversion too) and rewrite the steps accordingly."""
        chooser = self.session.chooser
        progress = self.session.progress

        def time_of(problem: Problem) -> float | None:
            """Measured, or carried from the nearest measured problem: a model served from
            neighbours plans its layouts as the searched one did."""
            try:
                policy = chooser.decide(problem).policy
            except NoUsableAlgorithmError:
                return None
            return policy.time_s if policy.time_s is not None else policy.estimate_s

        if progress is not None:
            progress.context = "[layouts]"
        try:
            self.layout_plan = layout.choose_layouts(self.steps, self.outputs, self.session,
                                                     time_of)
        finally:
            if progress is not None:
                progress.context = ""
        self.steps = self.layout_plan.steps

    def _check_device_kind(self) -> None:
        """Every operator step needs an algorithm of the device's kind: report all the nodes
        that have none before searching any."""
        kind = self.device.kind
        registry = self.session.registry
        missing = []
        for step in self.steps:
            if step.problem is None:
                continue
            kinds = {a.device_kind for a in registry.algorithms(step.operator)}
            if kind not in kinds:
                missing.append((step.node, step.op_type, step.operator,
                                ", ".join(sorted(kinds))))
        if missing:
            raise DeviceUnsupportedError(str(self.device), kind, missing)

    def _const(self, value: Value) -> Any:
        """A constant as the steps read it: its numpy array, or on a device without host
        memory the device copy, uploaded on first use and kept for every later run."""
        if not self.on_device:
            return value.const
        array = self._uploaded.get(id(value))
        if array is None:
            array = self._uploaded[id(value)] = self.device.to_device(value.const)
        return array

    def _view(self, step: Step) -> Any:
        """The callable of a view step: lowering's numpy closure, or the device's form of it
        (:meth:`fastrun.devices.Device.view_function`)."""
        if not self.on_device:
            return step.view
        return self.device.view_function(step)

    def _compile(self, calls: dict[int, PreparedCall]) -> None:
        """The flat program: (callable, argument slots, output slot, slots to release)."""
        slots: dict[int, int] = {}
        template: list[Any] = []

        def slot(value: Value) -> int:
            index = slots.get(id(value))
            if index is None:
                index = slots[id(value)] = len(template)
                template.append(self._const(value) if value.is_const else None)
            return index

        self._input_slots = {name: slot(value) for name, value in self.inputs.items()}
        program = []
        for step in self.steps:
            function = calls[id(step)] if step.problem is not None else self._view(step)
            program.append((function, tuple(slot(v) for v in step.inputs), slot(step.output)))
        self._output_slots = [slot(v) for v in self.outputs]
        # Release each computed value after its last reader (never constants or outputs).
        keep = set(self._output_slots) | {slots[id(v)] for v in self._constants()}
        last_use: dict[int, int] = {}
        for index, (_, args, _) in enumerate(program):
            for arg in args:
                last_use[arg] = index
        releases: dict[int, list[int]] = {}
        for value_slot, index in last_use.items():
            if value_slot not in keep:
                releases.setdefault(index, []).append(value_slot)
        self._program = [(fn, args, out, tuple(releases.get(i, ())))
                         for i, (fn, args, out) in enumerate(program)]
        self._template = template

    def _constants(self) -> list[Value]:
        values = [v for step in self.steps for v in step.inputs if v.is_const]
        return values + [v for v in self.outputs if v.is_const]

    # -- running -------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Outputs by name for inputs by name (a single-input model also takes a bare array)."""
        plan = self.launch_plan()
        if plan is not None:
            outputs, _ = plan.run(self._plan_feeds(feeds))
            return self._named(outputs)
        return self._run_steps(feeds)

    def run_resident(self, feeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A run on a queued device whose outputs stay there (device arrays by name, not
        downloaded), waited for: what a caller that chains more device work sees, and what a
        peer's run with resident tensors is compared with (``bench_opencl_models``).  Feeds
        that are device arrays are used as they are (a replayed plan copies them into its own
        input buffers, on the device); a replayed plan's outputs are its own buffers, which
        its next run overwrites.  A float16 model's outputs stay in float32 there."""
        if not self.on_device:
            raise ValueError("run_resident needs a model on a queued device (OpenCL); "
                             "on the CPU, run() already returns the outputs in place")
        plan = self.launch_plan()
        if plan is not None:
            outputs = plan.run_resident(self._plan_feeds(feeds))
        else:
            env = self._start(feeds)
            self._issue(env)
            outputs = [env[index] for index in self._output_slots]
        self.device.synchronize()
        return dict(zip(self.graph.outputs, outputs, strict=True))

    def _run_steps(self, feeds: Mapping[str, Any] | np.ndarray | None) -> dict[str, np.ndarray]:
        """One run issued step by step through each step's algorithm, outputs by name."""
        env = self._start(feeds)
        self._issue(env)
        return self._finish(env)

    def launch_plan(self) -> Any | None:
        """The recorded launches every run replays, or None: recorded on the first run (the
        search first, if it has not run), see :mod:`fastrun.runtime.replay`."""
        if self.reports is None:
            self.search()
        return self._launches.get()

    @property
    def replay_note(self) -> str:
        """Why runs replay recorded launches or not ("" before the first run)."""
        return self._launches.note

    def _plan_feeds(self, feeds: Mapping[str, Any] | np.ndarray | None) -> list[Any]:
        """The inputs checked, in the plan's order, not uploaded (the plan copies them into
        its own input buffers)."""
        checked = self._feeds(feeds, upload=False)
        return [checked[name] for name in self._input_slots]

    def _issue(self, env: list[Any]) -> None:
        """Every step, in order, on the values in ``env`` (each released after its last
        reader): on a device, enqueued without waiting; on a shared CPU, on the cores other
        processes leave idle (``Device.sharing``)."""
        with self.device.sharing():
            for function, args, out, releases in self._program:
                env[out] = function(*[env[i] for i in args])
                for index in releases:
                    env[index] = None

    def run_timed(self, feeds: Mapping[str, Any] | None = None,
                  ) -> tuple[dict[str, np.ndarray], list[float]]:
        """Like :meth:`run`, also returning each step's wall time in seconds (for tables)."""
        outputs, trace = self.run_traced(feeds)
        return outputs, [(end - start) * 1e-9 for start, end in trace.steps]

    def run_traced(self, feeds: Mapping[str, Any] | None = None,
                   ) -> tuple[dict[str, np.ndarray], RunTrace]:
        """Like :meth:`run` step by step, also returning when each step began and ended: the
        whole wall time of an inference split into the steps and what lies between them
        (``benchmarks/probe_wall_time.py``).  On a device, each step is waited for, so its
        time is its own."""
        clock = time.perf_counter_ns
        began = clock()
        env = self._start(feeds)
        # A device runs queued work asynchronously: wait for each step, so its time is its own.
        sync = self.device.synchronize if self.on_device else _nothing
        steps = []
        with self.device.sharing():
            for function, args, out, releases in self._program:
                started = clock()
                env[out] = function(*[env[i] for i in args])
                sync()
                steps.append((started, clock()))
                for index in releases:
                    env[index] = None
        issued = clock()
        outputs = self._finish(env)
        return outputs, RunTrace(began, steps, issued, clock())

    def run_host_seconds(self, feeds: Mapping[str, Any] | None = None,
                         ) -> tuple[dict[str, np.ndarray], float]:
        """Like :meth:`run`, also returning the seconds the host spent issuing the steps (the
        inputs already converted, the outputs not yet downloaded).  On a device that runs
        queued work asynchronously that is the model's host cost, which a small model on a
        large GPU waits for when it exceeds the kernels' time; on the CPU it is the whole run."""
        plan = self.launch_plan()
        if plan is not None:
            outputs, issued = plan.run(self._plan_feeds(feeds))
            return self._named(outputs), issued
        env = self._start(feeds)
        started = time.perf_counter()
        self._issue(env)
        issued = time.perf_counter() - started
        return self._finish(env), issued

    @property
    def step_count(self) -> int:
        """Steps the model runs, views included (each costs a call); searches first."""
        if self.reports is None:
            self.search()
        return len(self._program)

    def _start(self, feeds: Mapping[str, Any] | np.ndarray | None) -> list[Any]:
        if self.reports is None:
            self.search()
        feeds = self._feeds(feeds)
        env = list(self._template)
        for name, index in self._input_slots.items():
            env[index] = feeds[name]
        return env

    def _finish(self, env: list[Any]) -> dict[str, np.ndarray]:
        if self.on_device:  # one download per output
            to_host = self.device.to_host
            return self._named([to_host(env[index]) for index in self._output_slots])
        return self._named([np.asarray(env[index]) for index in self._output_slots])

    def _named(self, outputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Host outputs by name, in the dtype the model declares (a float16 model is computed
        in float32: :func:`fastrun.runtime.graph.float16_as_float32`)."""
        half = self.graph.float16_outputs
        return {name: value.astype(np.float16) if name in half else value
                for name, value in zip(self.graph.outputs, outputs, strict=True)}

    def _feeds(self, feeds: Mapping[str, Any] | np.ndarray | None,
               upload: bool = True) -> dict[str, Any]:
        """The inputs checked against the model's shapes and dtypes (a castable dtype is
        converted); on a device without host memory, uploaded (one copy per input) unless
        already a device array or ``upload`` is off."""
        if feeds is None:
            feeds = {}
        if not isinstance(feeds, Mapping):
            if len(self.inputs) != 1:
                raise ValueError(f"the model has {len(self.inputs)} inputs "
                                 f"({', '.join(self.inputs)}); pass a dict of arrays by name")
            feeds = {next(iter(self.inputs)): feeds}
        unknown = sorted(set(feeds) - set(self.inputs))
        if unknown:
            raise ValueError(f"unknown input(s) {', '.join(unknown)}; the model's inputs are "
                             f"{', '.join(self.inputs)}")
        result = {}
        device_array = self.device.array_type() if self.on_device else None
        for name, value in self.inputs.items():
            if name not in feeds:
                raise ValueError(f"input {name!r} ({value.dtype}{list(value.shape)}) is missing")
            if device_array is not None and isinstance(feeds[name], device_array):
                result[name] = self._device_feed(name, value, feeds[name])
                continue
            array = np.asarray(feeds[name])
            if _check_feed(name, value, array):
                array = array.astype(value.dtype)
            array = np.asarray(array, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
            result[name] = self.device.to_device(array) if self.on_device and upload else array
        return result

    def _device_feed(self, name: str, value: Value, array: Any) -> Any:
        """An input that is already a device array: checked like a host one, used as it is
        (a castable dtype is converted on the device)."""
        if _check_feed(name, value, array):
            return self.device.cast(array, value.dtype)
        if not array.flags.c_contiguous:
            raise ValueError(f"input {name!r} is a non-contiguous device array")
        return array

    def random_inputs(self, seed: int = 0, on_device: bool = False) -> dict[str, Any]:
        """Inputs of the right shapes and dtypes: floats in [-1, 1), integers in [0, 10).
        Numpy arrays (what ``--check`` hands to onnxruntime too); with ``on_device`` on a
        device without host memory, uploaded there (the in-context search runs on them).
        Each is checked against the memory limit, then drawn in its own dtype: no temporary
        larger than the input (:func:`fastrun.operator.random_values`)."""
        rng = np.random.default_rng(seed)
        feeds = {}
        for name, value in self.inputs.items():
            limits.check_tensor(value.shape, value.dtype, f"model input {name!r}")
            feeds[name] = random_values(rng, value.shape, value.dtype)
        for name in self.graph.float16_inputs:  # what the model declares
            feeds[name] = feeds[name].astype(np.float16)
        if on_device and self.on_device:
            feeds = {name: self.device.to_device(array) for name, array in feeds.items()}
        return feeds

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}: {v.dtype}{list(v.shape)}" for n, v in self.inputs.items())
        return f"<fastrun Model {self.graph.name!r} ({shapes}), {len(self.steps)} steps>"


def _ms(seconds: Sequence[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:.3f} ms"


def _nothing() -> None:
    pass


class StepAlgorithmError(NoUsableAlgorithmError):
    """A step's problem has no usable algorithm: the chooser's error, prefixed with the node
    and operator, since the problem alone does not say where in the model it came from."""

    def __init__(self, step: Step, error: NoUsableAlgorithmError):
        self.node, self.op_type = step.node, step.op_type
        self.problem, self.options, self.excluded = error.problem, error.options, error.excluded
        RuntimeError.__init__(self, f"node {step.node!r} ({step.op_type}, operator "
                                    f"{step.operator}): {error}")


def _check_feed(name: str, value: Value, array: Any) -> bool:
    """Raise when an input (host or device array) does not fit the prepared model; True when
    its dtype must be converted (a same-kind cast, e.g. float64 to float32)."""
    if tuple(array.shape) != value.shape:
        raise ValueError(f"input {name!r} has shape {list(array.shape)}; the model was "
                         f"prepared for {list(value.shape)}")
    if array.dtype == value.dtype:
        return False
    if not np.can_cast(array.dtype, value.dtype, "same_kind"):
        raise ValueError(f"input {name!r} is {array.dtype}; the model takes {value.dtype}")
    return True


class _StepRunner:
    """Executes a model step by step while it is searched, so that each step can be timed
    right after the step before it, on that step's real inputs."""

    def __init__(self, model: Model):
        self.values: dict[int, Any] = {}
        for name, array in model.random_inputs(seed=0, on_device=True).items():
            self.values[id(model.inputs[name])] = array
        self.const = model._const
        self.steps = model.steps
        self.last_use: dict[int, int] = {}
        for index, step in enumerate(model.steps):
            for value in step.inputs:
                self.last_use[id(value)] = index
        self.previous: Any = None

    def run(self, index: int, function: Any, remember: bool = False) -> None:
        step = self.steps[index]
        args = [self.const(v) if v.is_const else self.values[id(v)] for v in step.inputs]
        self.values[id(step.output)] = function(*args)
        if remember:
            self.previous = functools.partial(function, *args)
        for value in step.inputs:
            if self.last_use.get(id(value)) == index:
                self.values.pop(id(value), None)


class _ConstantEvaluator:
    """Folds constant subgraphs with the operators' heuristic choices (the session's
    :meth:`~fastrun.api.Session.rules`): no search, no cache entries, so folding a
    Shape->Gather chain never shows up as profiling work.

    Always on the CPU: folded values are numpy constants (lowering and fusion compute with
    them), so on a device without host memory folding there would only add round trips; the
    constants that steps read are uploaded once afterwards.
    """

    def __init__(self, session: Session):
        device = session.device if session.device.host_memory else get_device("cpu")
        self.chooser = session.rules(device)

    def __call__(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        return self.chooser.call(problem, *inputs)


def _input_values(graph: Graph, shapes: dict[str, Sequence[int]],
                  batch: int | None) -> dict[str, Value]:
    """Concrete shapes for the graph inputs: given ones first, then the model's own with the
    batch (dimension 0) set where it is symbolic or where ``batch`` overrides it."""
    unknown = sorted(set(shapes) - {i.name for i in graph.inputs})
    if unknown:
        raise ModelError(f"input shape(s) given for {', '.join(unknown)}, which the model does "
                         f"not take (inputs: {', '.join(i.name for i in graph.inputs)})")
    values = {}
    for spec in graph.inputs:
        if spec.name in shapes:
            shape = tuple(int(d) for d in shapes[spec.name])
            fixed = list(spec.shape or ())
            wrong = [i for i, (want, got) in enumerate(zip(fixed, shape, strict=False))
                     if i > 0 and isinstance(want, int) and want > 0 and want != got]
            if spec.shape is not None and (len(fixed) != len(shape) or wrong):
                raise ModelError(f"input {spec.name!r} is given shape {list(shape)}, but the "
                                 f"model fixes {[d if isinstance(d, int) else '?' for d in fixed]}"
                                 " (only the batch and symbolic dimensions can be chosen)")
        elif spec.shape is None:
            raise ModelError(f"input {spec.name!r} has no shape in the model; give its shape")
        else:
            dims = list(spec.shape)
            if dims and (not isinstance(dims[0], int) or dims[0] <= 0 or batch is not None):
                dims[0] = batch if batch is not None else 1
            symbolic = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int) or d <= 0]
            if symbolic:
                raise ModelError(f"input {spec.name!r} has symbolic dimension(s) "
                                 f"{', '.join(f'{d!r} at axis {i}' for i, d in symbolic)}; give "
                                 "its shape (e.g. an --input file)")
            shape = tuple(dims)
        if batch is not None and spec.name in shapes and shape and shape[0] != batch:
            raise ModelError(f"input {spec.name!r} has batch {shape[0]}, not {batch}")
        try:
            limits.check_tensor(shape, spec.dtype, f"input {spec.name!r}")
        except limits.TensorTooLargeError as error:
            raise ModelError(str(error)) from None
        values[spec.name] = Value(spec.name, shape, spec.dtype)
        log.debug("input %s: %s%s (%d elements)", spec.name, spec.dtype, list(shape),
                  math.prod(shape))
    return values


def _enable_weight_preprocess(steps: list[Step], session: Session) -> None:
    """Turn weight preprocessing on for the steps whose operator takes it
    (``preprocesses_weights``) and whose weight is constant: their algorithms' weight
    transforms then run once when the model is prepared, and profiling times them without."""
    registry = session.registry
    for step in steps:
        if step.problem is None or len(step.inputs) < 2 or not step.inputs[1].is_const:
            continue
        operator = registry.operator(step.operator)
        if operator.preprocesses_weights:
            step.params["weight_preprocess"] = True
            step.rebuild(operator)


def load(model: Any, session: Session | None = None, *,
         input_shapes: Mapping[str, Sequence[int]] | None = None, batch: int | None = None,
         weight_preprocess: bool = True, fuse: bool = True, check: bool = True,
         blocked_layout: bool | None = None, replay: bool | None = None) -> Model:
    """Load an ONNX model (path, bytes, ``zoo:NAME`` or ModelProto) for ``session`` (default:
    the current one).  Searching happens on :meth:`Model.search` or the first run.

    ``weight_preprocess``: transform constant weights once, when the model is prepared
    (Winograd's filters), instead of in every call (on by default; see docs/runtime.md).

    ``blocked_layout``: whether the search may run convolutions in the channel-blocked layout
    where measured to pay (default: ``FASTRUN_BLOCKED_LAYOUT``, on).

    ``replay``: on a queued device (OpenCL), whether runs replay a recorded launch plan
    (:meth:`Model.launch_plan`; default: ``FASTRUN_REPLAY``, on)."""
    from fastrun.api import current_session

    graph = from_onnx(model, check=check)
    return Model(graph, session or current_session(), input_shapes, batch, weight_preprocess,
                 fuse, blocked_layout, replay)
