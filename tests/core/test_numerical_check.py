"""A search's numerical check cannot be fooled (issue 14, item 5): each candidate gets its own
inputs and must leave them as they were, its output is checked on the warm-up, the first and
the last timed call, dtype and shape included, and a candidate that raises SystemExit or
KeyboardInterrupt is excluded, while a real Ctrl-C stops the search with what was measured
saved."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from fastrun.algorithm import Algorithm
from fastrun.api import Session
from fastrun.cache import InMemoryCache
from fastrun.registry import Registry
from fastrun_algorithms.matmul.operator import MatmulOperator

OPERATOR = MatmulOperator()
PROBLEM = OPERATOR.problem([(16, 24), (24, 8)], ["float32", "float32"])


class Correct(Algorithm):
    operator = "matmul"

    def __init__(self, name: str):
        self.name = name
        super().__init__()

    def run(self, problem, inputs, ctx, prepared=None):
        return np.matmul(inputs[0], inputs[1])


class WritesItsInput(Correct):
    """Right result, then scribbles over A: the next candidate would read zeros."""

    def run(self, problem, inputs, ctx, prepared=None):
        out = np.matmul(inputs[0], inputs[1])
        inputs[0][...] = 0
        return out


class RightOnlySometimes(Correct):
    """Right on the calls ``right(call_number)`` says, off by one (or zero) on the others."""

    def __init__(self, name: str, right):
        super().__init__(name)
        self.right, self.calls = right, 0

    def run(self, problem, inputs, ctx, prepared=None):
        self.calls += 1
        out = np.matmul(inputs[0], inputs[1])
        return out if self.right(self.calls) else out * 0 + 1


class IgnoresItsInput(Correct):
    """Right on the first call, then that result again whatever the inputs: every timed call
    of a search gives it the same inputs."""

    def run(self, problem, inputs, ctx, prepared=None):
        if not hasattr(self, "first"):
            self.first = np.matmul(inputs[0], inputs[1])
        return self.first.copy()


class SharesItsOutput(Correct):
    """Right every time, into one buffer it returns from every call: at dispatch each call
    overwrites the result of the call before."""

    def run(self, problem, inputs, ctx, prepared=None):
        if not hasattr(self, "buffer"):
            self.buffer = np.empty((inputs[0].shape[0], inputs[1].shape[1]), np.float32)
        np.matmul(inputs[0], inputs[1], out=self.buffer)
        return self.buffer


class WrongDtype(Correct):
    def run(self, problem, inputs, ctx, prepared=None):
        return np.matmul(inputs[0].astype(np.float64), inputs[1])


class WrongShape(Correct):
    def run(self, problem, inputs, ctx, prepared=None):
        return np.matmul(inputs[0], inputs[1]).reshape(-1)


class Raises(Correct):
    def __init__(self, name: str, error: type[BaseException]):
        super().__init__(name)
        self.error = error

    def run(self, problem, inputs, ctx, prepared=None):
        raise self.error("from the candidate")


class PressesCtrlC(Correct):
    """Stands in for the user: SIGINT to this process while the candidate runs."""

    def run(self, problem, inputs, ctx, prepared=None):
        os.kill(os.getpid(), signal.SIGINT)
        return np.matmul(inputs[0], inputs[1])


def _session(*algorithms: Algorithm, cache=None) -> Session:
    registry = Registry(load_plugins=False)
    registry.register_operator(MatmulOperator())
    for algorithm in algorithms:
        registry.register_algorithm(algorithm)
    return Session(registry=registry, cache=InMemoryCache() if cache is None else cache,
                   strategy="fast-run", progress=False, budget_s=0.002)


def _decide(*algorithms: Algorithm):
    return _session(*algorithms).chooser.decide(PROBLEM)


def test_a_candidate_that_writes_into_its_inputs_is_caught_and_spoils_nothing():
    # first in registration order, and so timed before the correct ones
    decision = _decide(WritesItsInput("scribbler"), Correct("first"), Correct("second"))
    assert decision.excluded["scribbler"] == "wrote into its input 0"
    assert {e.algorithm for e in decision.entries} == {"first", "second"}


@pytest.mark.parametrize("rogue, call", [
    (RightOnlySometimes("once", lambda calls: calls == 1), "first timed"),
    (RightOnlySometimes("warm", lambda calls: calls > 1), "warm-up")])
def test_outputs_are_checked_beyond_the_warm_up(rogue, call):
    decision = _decide(rogue, Correct("right"))
    assert f"on its {call} call" in decision.excluded[rogue.name]
    assert decision.algorithm.desc.name == "right"


@pytest.mark.parametrize("rogue, text", [
    (IgnoresItsInput("memo"), "on its other inputs' call"),
    (SharesItsOutput("shared"), "one output buffer shared by every call")])
def test_a_candidate_that_ignores_its_inputs_or_shares_its_output_is_caught(rogue, text):
    decision = _decide(rogue, Correct("right"))
    assert text in decision.excluded[rogue.name]
    assert decision.algorithm.desc.name == "right"


@pytest.mark.parametrize("rogue, text", [(WrongDtype("f64"), "returned float64[16, 8]"),
                                         (WrongShape("flat"), "returned float32[128]")])
def test_dtype_and_shape_are_checked(rogue, text):
    decision = _decide(rogue, Correct("right"))
    assert text in decision.excluded[rogue.name]
    assert "output is float32[16, 8]" in decision.excluded[rogue.name]


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
def test_a_candidate_raising_systemexit_or_keyboardinterrupt_is_only_excluded(error):
    decision = _decide(Raises("quitter", error), Correct("right"))
    assert decision.excluded["quitter"].startswith(f"raised {error.__name__}")
    assert decision.algorithm.desc.name == "right"


def test_ctrl_c_stops_the_search_and_keeps_what_was_measured():
    # Python's own handler, as in an interactive program: a test run started in the background
    # of a non-interactive shell inherits SIGINT ignored, and then no Ctrl-C reaches anything.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_during_a_search()
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_during_a_search():
    cache = InMemoryCache()
    session = _session(Correct("measured"), PressesCtrlC("interrupted"), Correct("never"),
                       cache=cache)
    with pytest.raises(KeyboardInterrupt):
        session.chooser.decide(PROBLEM)
    saved = cache.get(session.chooser.category(OPERATOR), PROBLEM.key)
    assert [e.algorithm for e in saved] == ["measured"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_inputs_are_compared_bit_for_bit_in_chunks():
    import numpy as np

    from fastrun import devices
    from fastrun.devices import same_bits

    a = np.full(3 * (devices._CHUNK_BYTES // 4) + 5, np.nan, dtype=np.float32)
    assert same_bits(a, a.copy())  # a NaN equals itself
    b = a.copy()
    b[-1] = 1.0  # in the last, partial chunk
    assert not same_bits(a, b)
    zeros = np.zeros(4, dtype=np.float64)
    assert not same_bits(zeros, -zeros)  # -0 written over +0 is a write
    assert not same_bits(zeros, zeros.astype(np.float32))
    assert not same_bits(zeros, zeros.reshape(2, 2))
    assert same_bits(np.arange(6).reshape(2, 3).T, np.arange(6).reshape(2, 3).T.copy())


# -- a large problem's check covers a few batch items; candidates build ahead ----------------

class _Conv(Algorithm):
    """The conv's own reference, corrupted on one batch item (``wrong_item``, or none)."""

    operator = "conv"

    def __init__(self, name: str, wrong_item: int | None = None):
        self.name, self.wrong_item = name, wrong_item
        super().__init__()

    def run(self, problem, inputs, ctx, prepared=None):
        from fastrun_algorithms.conv.operator import ConvOperator

        out = ConvOperator().reference(problem, inputs).astype(np.float32)
        if self.wrong_item is not None:
            out[self.wrong_item] += 1.0
        return out


def _conv_session(*algorithms: Algorithm) -> tuple[Session, object]:
    from fastrun_algorithms.conv.operator import ConvOperator

    operator = ConvOperator()
    registry = Registry(load_plugins=False)
    registry.register_operator(operator)
    for algorithm in algorithms:
        registry.register_algorithm(algorithm)
    session = Session(registry=registry, cache=InMemoryCache(), strategy="fast-run",
                      progress=False, budget_s=0.002)
    problem = operator.problem([(8, 2, 6, 6), (4, 2, 1, 1)], ["float32", "float32"])
    return session, problem


def test_a_large_problem_is_checked_on_its_first_middle_and_last_items(monkeypatch):
    from fastrun.core import profiler
    from fastrun_algorithms.conv.operator import ConvOperator

    monkeypatch.setattr(profiler, "CHECK_ITEMS_FROM", 100)  # 8x4x6x6 = 1152 elements
    batches = []
    real = ConvOperator.reference
    monkeypatch.setattr(ConvOperator, "reference", lambda self, problem, inputs: (
        batches.append(problem.shapes[0][0]), real(self, problem, inputs))[1])
    session, problem = _conv_session(_Conv("last", 7), _Conv("middle", 4), _Conv("first", 0),
                                     _Conv("right"))
    decision = session.chooser.decide(problem)
    # one reference, of the three checked items (the candidates' own calls use the real one)
    assert batches[0] == 3
    for wrong in ("last", "middle", "first"):
        assert "numerical error" in decision.excluded[wrong], wrong
    assert decision.algorithm.desc.name == "right"


def test_a_small_problem_is_checked_whole():
    session, problem = _conv_session(_Conv("second", 1), _Conv("right"))
    decision = session.chooser.decide(problem)
    assert "numerical error" in decision.excluded["second"]


#: the threads the candidates' builds ran on
_BUILD_THREADS: set[str] = set()


class _Builds(Correct):
    """Records the thread its build ran on; ``fails`` makes the build raise."""

    def __init__(self, name: str, fails: bool = False):
        super().__init__(name)
        self.fails, self.built = fails, 0

    def build(self, problem, device):
        import threading
        import time

        _BUILD_THREADS.add(threading.current_thread().name)
        time.sleep(0.05)  # long enough for the pool to hand the next one to another thread
        self.built += 1
        if self.fails:
            raise RuntimeError("no compiler here")


def test_candidates_build_ahead_on_several_threads_and_a_failed_build_is_not_fatal(monkeypatch):
    from fastrun.core import profiler

    monkeypatch.setattr(profiler, "BUILD_THREADS", 4)
    _BUILD_THREADS.clear()
    candidates = [_Builds(f"b{i}") for i in range(4)] + [_Builds("broken", fails=True)]
    decision = _decide(*candidates)
    assert all(c.built == 1 for c in candidates)
    assert len(_BUILD_THREADS) >= 2
    assert "broken" in {e.algorithm for e in decision.entries}  # its run() still works
