"""Choosing, per layer, whether a CPU model computes in NCHW or in the channel-blocked layout.

Why.  Kernels that put their vector over 16 channels (the compute library's ``nchw16c``
layout: (N, ceil(C/16), H, W, 16)) store a tile as whole vectors and read a depthwise tap as
one vector, where NCHW makes them scatter and gather.  Whether that pays depends on the layer
and the machine, and converting a tensor costs a pass over it.  So the decision is measured,
like every other one: each convolution is decided in both layouts, each conversion it would
need is decided too, and the layouts that make the model's summed time smallest are kept.

What may run blocked.  A 2-D float32 convolution and a squeeze-and-excitation block (the
``layout`` parameter of the conv and squeeze_excite operators: :data:`LAYOUT_OPERATORS`);
steps that do not care about the channel order: the elementwise activations and binary
operations whose non-constant inputs all have the output's shape, and a concat along the
channels where every input but the last fills whole blocks.  Everything else (pools, reshapes,
matmuls, the graph's inputs and outputs) stays NCHW, and ``reorder`` steps are inserted only
where a value's producer and a reader disagree, once per value and layout.

How the choice is made (:func:`choose_layouts`).  Conversions are only saved by keeping
neighbours together, so the choice works on groups: the capable steps connected through the
values they pass form regions; each region goes blocked as a whole, or from some step on
(a CNN's deep layers, with small planes and many channels, are where blocking pays), when
that lowers the summed time by more than :data:`MARGIN` of the changed convs' time.  Then
single steps are flipped where that lowers it further without adding a conversion.  A
conversion counts at least as much as the model's cheapest convolution: in a model it is one
more parallel step, and on the 16-core host single layers converted in and out ("islands")
measured slower in the model than their isolated times promised.  Layout-transparent steps
count as free in both layouts.

Times come from the session's decisions: under a profiling strategy problems are searched (and
cached), from a cache they are read back, so a run with the cache makes the search's layout
choice without timing anything.  A problem without a time (heuristic-only, or a cache that
lacks it) keeps its step in NCHW: nothing is converted on a guess.  The exception is a step
with one algorithm in each layout, which no search times (a squeeze-and-excitation block): it
counts as the same cost in both, as a transparent step does (for that block a channel-mean
pass and a scaling pass, the same work in either layout), and the end-to-end check
(``layout_check.py``) still guards the plan.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from fastrun.api import Session
from fastrun.operator import Problem
from fastrun.runtime.lowering import Step, Value

log = logging.getLogger(__name__)

NCHW = "nchw"
BLOCKED = "nchw16c"
LANES = 16

#: Operators computed value by value, whatever the order of the channels.
TRANSPARENT = frozenset({"relu", "clip", "sigmoid", "tanh", "leaky_relu", "hard_sigmoid",
                         "hard_swish", "sqrt", "exp", "log", "neg", "abs", "reciprocal", "erf",
                         "add", "add_relu", "sub", "mul"})


#: Operators with a ``layout`` parameter, decided in both layouts: X (their first input) and
#: conv's residual are read in the step's layout, their other inputs (weights) as they are.
#: A mobile network's block stays blocked from its expansion to its projection only if its
#: squeeze-and-excitation does too.
LAYOUT_OPERATORS = frozenset({"conv", "squeeze_excite"})

#: The share of the changed steps' NCHW time a layout change must gain to be kept.
MARGIN = 0.05


def _stake(nodes: Iterable[_Node]) -> float:
    """The NCHW time of ``nodes``' measured steps: what a layout change puts at stake."""
    return sum(n.nchw_s or 0.0 for n in nodes if n.step.operator in LAYOUT_OPERATORS)


def _us(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e6:.0f}"


def blocked_shape(shape: Sequence[int]) -> tuple[int, ...]:
    n, c, *spatial = shape
    return (n, -(-c // LANES), *spatial, LANES)


@dataclass(eq=False)
class _Node:
    """A step that may run blocked, with what the choice needs to know about it."""

    step: Step
    #: seconds in each layout (None: unknown, the step stays NCHW); transparent steps: 0, 0
    nchw_s: float | None
    blocked_s: float | None
    #: the step's problem as it runs blocked
    blocked_problem: Problem | None = None
    layout: str = NCHW

    @property
    def cost(self) -> float:
        time = self.blocked_s if self.layout == BLOCKED else self.nchw_s
        return math.inf if time is None else time


@dataclass
class LayoutPlan:
    """What :func:`choose_layouts` decided: the steps to run, and figures for reports."""

    steps: list[Step]
    blocked_steps: int = 0
    reorders: int = 0
    #: the summed estimated seconds of the capable steps and conversions, all NCHW and chosen
    nchw_s: float = 0.0
    chosen_s: float = 0.0
    #: whether the model runs this plan: False when whole inferences all in NCHW were faster
    #: (``fastrun/runtime/layout_check.py``)
    kept: bool = True
    #: what the end-to-end check found, for reports ("" when there was nothing to check)
    end_to_end: str = ""


def supported(session: Session) -> bool:
    """Whether the session can run blocked steps at all: a device with host memory, and a
    registry with the ``reorder`` operator (with an algorithm for the device's kind) and the
    conv operator."""
    if not session.device.host_memory:
        return False
    registry = session.registry
    if "reorder" not in registry.operators() or "conv" not in registry.operators():
        return False
    return any(a.device_kind == session.device.kind for a in registry.algorithms("reorder"))


class _Planner:
    def __init__(self, steps: list[Step], outputs: Iterable[Value], session: Session,
                 decide: Callable[[Problem], float | None]):
        self.steps = steps
        self.outputs = {id(v) for v in outputs}
        self.session = session
        self.decide = decide
        self.reorder = session.registry.operator("reorder")
        self.nodes: dict[int, _Node] = {}  # id(step) -> node
        self.producer: dict[int, Step] = {}
        self.readers: dict[int, list[Step]] = {}
        self.position = {id(step): index for index, step in enumerate(steps)}
        self._reorder_s: dict[tuple[int, str], float | None] = {}
        for step in steps:
            self.producer[id(step.output)] = step
            for value in step.inputs:
                self.readers.setdefault(id(value), []).append(step)
        self.collect()

    # -- which steps may run blocked, and their times --------------------------------------------
    def collect(self) -> None:
        """The capable steps with their times (each problem decided here), the step floor,
        and the values a conversion may sit on."""
        for step in self.steps:
            node = self._layout_node(step) if step.operator in LAYOUT_OPERATORS \
                else self._transparent(step)
            if node is not None:
                self.nodes[id(step)] = node
        #: what the cheapest convolution takes: the least a step of this model costs
        self.step_floor = min((n.nchw_s for n in self.nodes.values()
                               if n.step.operator == "conv" and n.nchw_s), default=0.0)
        #: values whose layout can differ from a reader's: those around capable steps (fixed
        #: once the nodes are known, read by every estimate the choice makes)
        values: dict[int, Value] = {}
        for node in self.nodes.values():
            values[id(node.step.output)] = node.step.output
            for value in node.step.inputs:
                if not value.is_const:
                    values[id(value)] = value
        self.values = list(values.values())

    def _layout_node(self, step: Step) -> _Node | None:
        x = step.inputs[0]
        if len(x.shape) != 4 or x.dtype.name != "float32" or len(step.output.shape) != 4 \
                or step.problem is None:
            return None
        params = {**step.params, "layout": BLOCKED}  # weight_preprocess included, if set
        shapes = [blocked_shape(x.shape), *[v.shape for v in step.inputs[1:]]]
        if step.problem.param("residual"):
            shapes[-1] = blocked_shape(step.inputs[-1].shape)
        operator = self.session.registry.operator(step.operator)
        try:
            blocked = operator.problem(shapes, [v.dtype for v in step.inputs], **params)
        except ValueError as error:  # a library whose operator takes no layout
            log.debug("%s stays NCHW: %s", step.node, error)
            return None
        nchw_s, blocked_s = self.decide(step.problem), self.decide(blocked)
        if nchw_s is None and blocked_s is None and self._lone_candidate(step.problem) \
                and self._lone_candidate(blocked):
            # One algorithm in each layout, so no search times either: counted as costing the
            # same in both, as a transparent step is; the convolutions around it decide.
            nchw_s = blocked_s = 0.0
        return _Node(step, nchw_s, blocked_s, blocked)

    def _lone_candidate(self, problem: Problem) -> bool:
        """Whether exactly one algorithm would compute ``problem`` (a search takes it without
        timing it)."""
        return len(self.session.chooser.candidates(problem)) == 1

    def _transparent(self, step: Step) -> _Node | None:
        if step.problem is None or len(step.output.shape) != 4 \
                or step.output.dtype.name != "float32":
            return None
        if step.operator == "concat":
            axis = step.problem.param("axis")
            heads = [v.shape[1] for v in step.inputs[:-1]]
            if axis != 1 or any(v.is_const or len(v.shape) != 4 for v in step.inputs) \
                    or any(c % LANES for c in heads):
                return None
        elif step.operator not in TRANSPARENT:
            return None
        for value in step.inputs:
            if value.is_const and math.prod(value.shape) == 1:
                continue  # a scalar broadcasts the same in any layout
            if value.is_const or (step.operator != "concat" and value.shape != step.output.shape):
                return None
        # the step posed on its blocked inputs (scalars as they are), as it runs blocked
        shapes = [v.shape if v.is_const else blocked_shape(v.shape) for v in step.inputs]
        try:
            blocked = self.session.registry.operator(step.operator).problem(
                shapes, [v.dtype for v in step.inputs], **step.params)
        except ValueError as error:
            log.debug("%s stays NCHW: %s", step.node, error)
            return None
        return _Node(step, 0.0, 0.0, blocked)

    def reorder_problem(self, value: Value, to: str) -> tuple[Problem, dict[str, object]]:
        """The conversion of (NCHW) ``value`` into layout ``to``, and its parameters."""
        if to == BLOCKED:
            params: dict[str, object] = {"to": BLOCKED}
            shape = value.shape
        else:
            params = {"to": NCHW, "channels": value.shape[1]}
            shape = blocked_shape(value.shape)
        return self.reorder.problem([shape], [value.dtype], **params), params

    def reorder_s(self, value: Value, to: str) -> float | None:
        key = (id(value), to)
        if key not in self._reorder_s:
            self._reorder_s[key] = self.decide(self.reorder_problem(value, to)[0])
        return self._reorder_s[key]

    # -- the summed time of an assignment ------------------------------------------------------
    def layout_of(self, value: Value) -> str:
        producer = self.producer.get(id(value))
        node = self.nodes.get(id(producer)) if producer is not None else None
        return node.layout if node is not None else NCHW

    def wanted(self, step: Step, value: Value) -> str:
        """The layout ``step`` reads ``value`` in."""
        node = self.nodes.get(id(step))
        if node is None or node.layout == NCHW:
            return NCHW
        if step.operator in LAYOUT_OPERATORS and value is not step.inputs[0] \
                and not (step.problem.param("residual") and value is step.inputs[-1]):
            return NCHW  # weights and bias keep their shapes
        if value.is_const:
            return NCHW  # a scalar
        return BLOCKED

    def conversions(self, value: Value) -> set[str]:
        """The layouts ``value`` must be converted to (its readers', the graph output's)."""
        have = self.layout_of(value)
        needed = {self.wanted(reader, value) for reader in self.readers.get(id(value), ())}
        if id(value) in self.outputs:
            needed.add(NCHW)
        needed.discard(have)
        return needed

    def total(self) -> float:
        """The estimated seconds of the capable steps and the conversions.  A conversion
        counts at least :attr:`step_floor`: in a model it is one more step, and on the 16-core
        host a reorder of a 300 KB tensor measured 14-23 us in the search and 23-59 us between
        two other steps, as long as the cheapest convolutions."""
        total = sum(node.cost for node in self.nodes.values())
        for value in self.values:
            for to in self.conversions(value):
                time = self.reorder_s(value, to)
                total += math.inf if time is None else max(time, self.step_floor)
        return total

    # -- choosing ------------------------------------------------------------------------------
    def regions(self) -> list[list[_Node]]:
        parent = {id(n): id(n) for n in self.nodes.values()}

        def find(key: int) -> int:
            while parent[key] != key:
                parent[key] = parent[parent[key]]
                key = parent[key]
            return key

        for node in self.nodes.values():
            for value in node.step.inputs:
                producer = self.producer.get(id(value))
                other = self.nodes.get(id(producer)) if producer is not None else None
                if other is not None:
                    parent[find(id(node))] = find(id(other))
        groups: dict[int, list[_Node]] = {}
        for node in self.nodes.values():
            groups.setdefault(find(id(node)), []).append(node)
        return list(groups.values())

    def choose(self) -> None:
        """Whole regions, then the deeper part of each region from every cut point on (a CNN's
        small deep planes are where blocking pays most), then single flips that add no
        conversion.  A change is kept only when it gains more than :data:`MARGIN` of the
        changed convs' time.  No single flip may create an island with a conversion on each
        side: on the 16-core host those islands measured slower in the model than their
        isolated times promised (below, and docs/performance.md)."""
        best = self.total()
        for region in self.regions():
            if not any(n.step.operator == "conv" for n in region):
                continue
            order = sorted(region, key=lambda n: self.position[id(n.step)])
            for start in range(len(order)):  # start 0: the whole region
                tail = order[start:]
                if not any(n.step.operator == "conv" for n in tail):
                    break
                previous = [n.layout for n in order]
                for node in order:
                    node.layout = BLOCKED if node in tail else NCHW
                trial = self.total()
                if trial < best - MARGIN * _stake(tail):
                    best = trial
                else:
                    for node, kept in zip(order, previous, strict=True):
                        node.layout = kept
        for _ in range(4):  # single flips until none helps (a few passes suffice)
            improved = False
            for node in self.nodes.values():
                before = self.conversion_count()
                node.layout = BLOCKED if node.layout == NCHW else NCHW
                trial = self.total()
                if trial < best - MARGIN * _stake([node]) - 1e-12 \
                        and self.conversion_count() <= before:
                    best, improved = trial, True
                else:
                    node.layout = BLOCKED if node.layout == NCHW else NCHW
            if not improved:
                break

    def conversion_count(self) -> int:
        return sum(len(self.conversions(value)) for value in self.values)

    # -- rewriting the steps -------------------------------------------------------------------
    def rewrite(self, outputs: list[Value]) -> tuple[list[Step], int]:
        """The steps with blocked ones rewritten and conversions inserted, and how many
        conversions; a graph output computed blocked is replaced in ``outputs`` by its
        conversion."""
        converted: dict[tuple[int, str], Value] = {}
        result: list[Step] = []
        reorders = 0
        blocked_values: dict[int, Value] = {}  # id(nchw value) -> its blocked Value

        def read(value: Value, layout: str) -> Value:
            nonlocal reorders
            have = BLOCKED if id(value) in blocked_values else NCHW
            current = blocked_values.get(id(value), value)
            if have == layout:
                return current
            key = (id(value), layout)
            if key not in converted:
                problem, params = self.reorder_problem(value, layout)
                if layout == BLOCKED:
                    out = Value(value.name + "@" + BLOCKED, blocked_shape(value.shape),
                                value.dtype)
                else:
                    out = Value(value.name, value.shape, value.dtype)
                result.append(Step(value.name, "Reorder", [current], out, problem=problem,
                                   params=params,
                                   notes=[f"layout conversion to {layout}"]))
                converted[key] = out
                reorders += 1
            return converted[key]

        for step in self.steps:
            node = self.nodes.get(id(step))
            step.inputs = [v if v.is_const else read(v, self.wanted(step, v))
                           for v in step.inputs]
            if node is not None and node.layout == BLOCKED:
                original = step.output
                blocked = Value(original.name + "@" + BLOCKED, blocked_shape(original.shape),
                                original.dtype)
                if step.operator in LAYOUT_OPERATORS:
                    step.params["layout"] = BLOCKED
                step.problem = node.blocked_problem
                step.output = blocked  # later readers find it through blocked_values
                blocked_values[id(original)] = blocked
            result.append(step)
        for index, value in enumerate(outputs):  # the graph's outputs are NCHW
            if id(value) in blocked_values:
                outputs[index] = read(value, NCHW)
        return result, reorders


def layout_problems(steps: list[Step], outputs: list[Value], session: Session) -> list[Problem]:
    """Every problem :func:`choose_layouts` would decide for these steps, besides the steps'
    own: each layout step's blocked form and each conversion a plan could need, both ways.
    What a tune must cover so that a search of the model then hits its cache."""
    planner = _Planner(steps, outputs, session, lambda problem: None)
    found = [node.blocked_problem for node in planner.nodes.values()]
    for value in planner.values:
        found += [planner.reorder_problem(value, to)[0] for to in (BLOCKED, NCHW)]
    return found


def choose_layouts(steps: list[Step], outputs: list[Value], session: Session,
                   decide: Callable[[Problem], float | None]) -> LayoutPlan:
    """The steps with the layouts that minimise the model's estimated time (see the module
    docstring); ``outputs`` (the graph's output values) is updated in place where an output
    is now produced by a conversion.  ``decide`` gives a problem's time in seconds, or None."""
    planner = _Planner(steps, outputs, session, decide)
    if not any(n.step.operator == "conv" and n.blocked_s is not None
               for n in planner.nodes.values()):
        return LayoutPlan(steps)
    all_nchw = planner.total()
    planner.choose()
    chosen = planner.total()
    for node in planner.nodes.values():
        if node.step.operator == "conv":
            log.info("layouts: %s runs in %s (%s us in NCHW, %s us in %s)", node.step.node,
                     node.layout, _us(node.nchw_s), _us(node.blocked_s), BLOCKED)
    blocked = sum(1 for n in planner.nodes.values() if n.layout == BLOCKED)
    if blocked == 0:
        return LayoutPlan(steps, nchw_s=all_nchw, chosen_s=chosen)
    new_steps, reorders = planner.rewrite(outputs)
    log.info("layouts: %d steps in %s, %d conversions; estimated %.3f ms against %.3f ms in "
             "NCHW", blocked, BLOCKED, reorders, chosen * 1e3, all_nchw * 1e3)
    return LayoutPlan(new_steps, blocked_steps=blocked, reorders=reorders, nchw_s=all_nchw,
                      chosen_s=chosen)
