"""Algorithms and their identity.

An :class:`Algorithm` is one way to compute an operator.  Its :class:`AlgorithmDesc` (operator,
name, parameters) is what caches store, so it must stay stable across processes and versions:
a tile configuration is part of the identity, the Python object is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fastrun.attribute import AlgoAttribute
from fastrun.base.problem import value_text

if TYPE_CHECKING:
    from fastrun.base.problem import Problem
    from fastrun.devices import Device


@dataclass(frozen=True, slots=True)
class AlgorithmDesc:
    """The identity of an algorithm: what a cache entry refers to."""

    operator: str
    name: str
    param: tuple[tuple[str, Any], ...] = ()

    @property
    def text(self) -> str:
        """Canonical text, e.g. ``blocked(kb=256,mb=64,nb=64)``; parameters sorted by name."""
        if not self.param:
            return self.name
        inner = ",".join(f"{key}={value_text(value)}" for key, value in sorted(self.param))
        return f"{self.name}({inner})"

    def __str__(self) -> str:
        return f"{self.operator}:{self.text}"


class RunContext(Protocol):
    """What an algorithm may ask of the framework while it runs."""

    #: The session's device: an OpenCL algorithm builds its programs with
    #: ``ctx.device.build(...)`` and enqueues on ``ctx.device.queue``.
    device: Device

    def call(self, problem: Problem, *inputs: Any) -> Any:
        """Compute a declared sub-problem with the algorithm chosen for it."""


class Algorithm:
    """Base class of every algorithm.

    Subclasses set ``operator``, ``name`` and ``attributes`` and implement :meth:`run`.  Everything
    else has a sensible default: a CPU algorithm, usable everywhere, no workspace, no
    sub-problems, no weight preprocessing.
    """

    operator: str = ""
    name: str = ""
    attributes: AlgoAttribute = AlgoAttribute.NONE
    #: The :attr:`Device.kind` this algorithm runs on; only algorithms of the session device's
    #: kind are candidates.  A CPU algorithm takes and returns numpy arrays; an "opencl" one
    #: takes and returns ``pyopencl.array.Array`` values on ``ctx.device``.
    device_kind: str = "cpu"
    #: The implementation's version.  Bump it when a change to this algorithm alone makes the
    #: measurements taken before it wrong (a faster kernel, other attributes): with the names
    #: of the registered algorithms it makes the operator's algorithm-set version
    #: (:meth:`fastrun.registry.Registry.algorithm_set_version`), part of the cache category,
    #: so the entries of this operator, and of operators whose algorithms call it, are
    #: measured again, and no other entry is.
    version: int = 1
    #: The operators of the problems :meth:`sub_problems` returns.  Their algorithm sets'
    #: versions are part of this operator's: a faster matmul changes what winograd's entries
    #: measured.  Checked when the sub-problems are decided: an undeclared one is an error.
    sub_operators: tuple[str, ...] = ()

    def __init__(self, param: dict[str, Any] | None = None):
        self.param = dict(param or {})
        self.desc = AlgorithmDesc(self.operator, self.name, tuple(sorted(self.param.items())))

    def unusable_reason(self, problem: Problem) -> str | None:
        """Why this algorithm cannot compute ``problem``, or None when it can.

        A reason rather than a boolean so that "no usable algorithm" errors can say why each
        candidate was excluded.
        """
        return None

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...] | None:
        """This algorithm's place in its operator's rule-of-thumb order for ``problem``
        (smaller first; compared with the other candidates' ranks), or None when it has no
        rule, which puts it after every ranked candidate, in registration order.  The order is
        what HEURISTIC picks and the order a search times candidates in (a good first one lets
        early stopping drop the rest quickly).  The rule lives with the algorithm, or with its
        family's base class, so adding an algorithm never edits its operator."""
        return None

    def work(self, problem: Problem) -> float | None:
        """How much this algorithm does for ``problem``, in a unit of its own choosing: only
        the ratio between two problems matters.  A problem the cache lacks, served from its
        nearest measured one (:mod:`fastrun.core.nearest`), takes each algorithm's time there
        scaled by its work here over its work there, so an algorithm whose tiles fit the new
        shape worse loses its place (a Winograd F(4,3) does as many tiles on 5x5 pixels as on
        7x7).  None: the operator's :meth:`~fastrun.operator.Operator.work`, which scales
        every algorithm alike and so keeps the measured order."""
        return None

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        """Why this algorithm cannot compute ``problem`` on ``device`` (a work-group or
        local-memory limit, a missing float64 extension), or None.  Asked only of algorithms of
        the device's kind, after :meth:`unusable_reason`; the reason shows in the "no usable
        algorithm" error like any other."""
        return None

    def usable(self, problem: Problem) -> bool:
        return self.unusable_reason(problem) is None

    def workspace_bytes(self, problem: Problem) -> int:
        """Bytes of temporary memory the algorithm allocates itself while it runs.

        Its own output is excluded, and so is the workspace its sub-problems' algorithms need
        (the framework adds that along the execution policy); sub-problem *results* the
        algorithm holds on to are its own temporaries and count.
        """
        return 0

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        """Problems this algorithm will hand to :meth:`RunContext.call`; they are searched first."""
        return ()

    def preprocess(self, problem: Problem, inputs: Sequence[Any]) -> Any:
        """Transform constant weights once (e.g. a winograd filter transform).

        Called outside the timed region when the problem has weight preprocessing on; the result
        is handed back to :meth:`run` as ``prepared``.  When preprocessing is off, :meth:`run`
        is called with ``prepared=None`` and must do the transform itself, inside the timing.
        """
        return None

    def build(self, problem: Problem, device: Any) -> None:
        """Compile what :meth:`run` will need for ``problem`` on ``device``, ahead of its first
        call (optional).  The search calls it for all of a problem's candidates at once, from
        several threads, so a driver's compiler works on many configurations together; it
        must therefore be safe to call from any thread.  By default nothing: the first call
        compiles, as always."""

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        raise NotImplementedError(f"{self.desc} does not implement run()")

    def bind(self, problem: Problem, ctx: RunContext,
             prepared: Any = None) -> Callable[..., Any]:
        """The call a runtime step makes, again and again: a function of the problem's inputs
        alone that returns what :meth:`run` returns.

        Why: a model calls each of its steps once per inference, and a step of a small layer
        takes 10-30 us, of which :meth:`run` spent 4-6 us working out, from the problem, what
        does not change between calls (its geometry, its plan, its kernel's arguments).  An
        algorithm overrides this to work those out once and implements :meth:`run` as
        ``self.bind(problem, ctx, prepared)(*inputs)``, so the two cannot differ.  What may
        change between calls is still read at call time: the thread count (a shared CPU lends
        a model fewer cores, ``Device.sharing``) and whatever the inputs' layout decides.  The
        default calls :meth:`run`."""
        def call(*inputs: Any) -> Any:
            return self.run(problem, inputs, ctx, prepared)
        return call

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.desc}>"
