"""Fake operators, algorithms, a fake clock and a fake device for framework tests.

A fake algorithm 'costs' a fixed number of nanoseconds on the fake clock, so every timing the
profiler sees is exact and the tests can assert on rankings without wall-clock noise.
"""

from __future__ import annotations

import numpy as np

from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.devices import Device
from fastrun.operator import Operator, Problem
from fastrun.registry import Registry

R = AlgoAttribute.REPRODUCIBLE
N = AlgoAttribute.NAIVE


class FakeClock:
    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        return self.now


class FakeDevice(Device):
    """A CPU as far as dispatch goes (its candidates are the CPU algorithms), whose clock is
    the fake one: the inherited :meth:`Device.measure` reads ``clock_ns``."""

    kind = "cpu"

    def __init__(self, clock: FakeClock):
        self.clock = clock

    @property
    def category(self) -> str:
        return "fake-device"

    def clock_ns(self) -> int:
        return self.clock()


class DoubleOp(Operator):
    """y = 2 x; the heuristic order is the framework's default (each algorithm's rank)."""

    def __init__(self, name: str):
        self.name = name

    def validate(self, problem: Problem) -> None:
        if len(problem.shapes) != 1:
            raise ValueError(f"{self.name} takes one input, got {len(problem.shapes)}")

    def reference(self, problem, inputs):
        return inputs[0].astype(np.float64) * 2

class FakeAlgo(Algorithm):
    def __init__(self, operator: str, name: str, cost_ns: int, clock: FakeClock,
                 attributes: AlgoAttribute = R, workspace: int = 0, wrong: bool = False,
                 raises: bool = False, subs: list[Problem] | None = None,
                 unusable: str | None = None, heuristic_rank: int = 0,
                 warmup_extra_ns: int = 0):
        self.operator = operator
        self.name = name
        self.attributes = attributes
        super().__init__()
        self.cost_ns = cost_ns
        self.clock = clock
        self.workspace = workspace
        self.wrong = wrong
        self.raises = raises
        self.subs = subs or []
        self.sub_operators = tuple(sorted({sub.operator for sub in self.subs}))
        self.unusable = unusable
        self.rank = heuristic_rank
        self.warmup_extra_ns = warmup_extra_ns
        self.runs = 0
        self.log: list[str] | None = None

    def unusable_reason(self, problem):
        return self.unusable

    def heuristic_rank(self, problem):
        return (self.rank,)

    def workspace_bytes(self, problem):
        return self.workspace

    def sub_problems(self, problem):
        return list(self.subs)

    def run(self, problem, inputs, ctx, prepared=None):
        if self.log is not None:
            self.log.append(f"run {self.operator}:{self.name}")
        self.runs += 1
        if self.raises:
            raise RuntimeError(f"{self.name} crashed")
        self.clock.now += self.cost_ns + (self.warmup_extra_ns if self.runs == 1 else 0)
        for sub in self.subs:
            ctx.call(sub, inputs[0])
        return inputs[0] * (3 if self.wrong else 2)


def make_registry(*algorithms: FakeAlgo, operators=("fake", "child")) -> Registry:
    registry = Registry(load_plugins=False)
    for name in operators:
        registry.register_operator(DoubleOp(name))
    for algorithm in algorithms:
        registry.register_algorithm(algorithm)
    return registry


def problem(operator: str = "fake", n: int = 8) -> Problem:
    return Problem.create(operator, [(n,)], ["float64"])


class PreprocessingAlgo(FakeAlgo):
    """Costs ``transform_ns`` for its weight transform: outside the timing when preprocessing
    is on, inside every run when it is off."""

    def __init__(self, *args, transform_ns: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.transform_ns = transform_ns
        self.transforms = 0

    def preprocess(self, problem, inputs):
        self.transforms += 1
        self.clock.now += self.transform_ns
        return "transformed"

    def run(self, problem, inputs, ctx, prepared=None):
        if prepared is None:
            self.preprocess(problem, inputs)
        else:
            assert prepared == "transformed"
        return super().run(problem, inputs, ctx, prepared)
