"""Operators.

An :class:`Operator` defines *what* is computed (shape rules, the reference result, how to check
a candidate's output); a :class:`~fastrun.base.problem.Problem` is one concrete instance of it
(``fastrun/base/problem.py``, re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

# Problem is what an operator poses; it lives in fastrun.base.problem (which imports neither this
# module nor fastrun.algorithm) and is re-exported here, where users have always found it.
from fastrun.base.problem import Problem, Shape, split_key

if TYPE_CHECKING:
    from fastrun.algorithm import Algorithm

__all__ = ["DRAW_CHUNK", "Epilogue", "Operator", "Problem", "Shape", "random_values",
           "split_key", "uniform"]


#: Elements drawn at a time where a dtype cannot be drawn in its own precision: the float64
#: temporary stays at 8 MiB whatever the tensor's size.
DRAW_CHUNK = 1 << 20


def uniform(rng: np.random.Generator, shape: Sequence[int], dtype: Any) -> np.ndarray:
    """Values in [-1, 1) of ``dtype``: float32 and float64 drawn in their own precision, in
    place (float64 draws then a cast took 1.03-1.24 s for VGG-16's 100M-element classifier
    weight, this 0.47-0.68 s, timed side by side on the 2-core VM); other dtypes through
    float64 a chunk at a time, so no temporary is larger than :data:`DRAW_CHUNK` elements (a
    16 GiB input once needed a 32 GiB one)."""
    kind = np.dtype(dtype)
    if kind in (np.float32, np.float64):
        out = rng.random(size=tuple(shape), dtype=kind)
        out *= 2
        out -= 1
        return out
    return _chunked(tuple(shape), kind, lambda n: rng.uniform(-1.0, 1.0, size=n))


def _chunked(shape: tuple[int, ...], dtype: np.dtype, draw: Any) -> np.ndarray:
    """An array of ``dtype`` filled ``DRAW_CHUNK`` elements at a time by ``draw(count)``."""
    out = np.empty(shape, dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, DRAW_CHUNK):
        count = min(DRAW_CHUNK, flat.size - start)
        flat[start:start + count] = draw(count)
    return out


def random_values(rng: np.random.Generator, shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A model input's values: floats in [-1, 1), booleans, integers in [0, 10); each drawn
    in its own dtype or a chunk at a time, so memory never holds more than the array and a
    chunk."""
    kind = np.dtype(dtype)
    if kind.kind == "f":
        return uniform(rng, shape, kind)
    if kind.kind == "b":
        return rng.integers(0, 2, size=tuple(shape), dtype=np.bool_)
    if kind.kind in "iu":
        return rng.integers(0, 10, size=tuple(shape), dtype=kind)
    return _chunked(tuple(shape), kind, lambda n: rng.integers(0, 10, size=n))


@dataclass(frozen=True)
class Epilogue:
    """What a step of an operator can take into its own output loop, so that the runtime
    fuses by capability rather than by the operator's name (:mod:`fastrun.runtime.fusion`).

    An operator with an epilogue takes a weight at input 1 whose axis 0 is the output
    channel (axis 1 of the output) and an optional bias at input 2, one value per output
    channel, so that a following batch norm or bias add folds into them; the parameters
    ``activation`` (``relu``, or ``clip`` with ``clip_min`` and ``clip_max``) for a following
    Relu or Clip; and, when :attr:`residual` is set, ``residual=True`` with a tensor of the
    output's shape as its last input, added before the activation (a residual Add).

    An operator without weights to fold into (:attr:`weights` False: batch_norm, whose inputs
    1 and 2 are its scale and bias) takes only the activation.
    """

    residual: bool = False
    weights: bool = True


class Operator:
    """Base class of operators. Subclasses define the shape rules and the reference."""

    #: Registry name, e.g. "matmul".
    name: str = ""
    #: The operator's own version: bump it when what its problems mean changes (canonical
    #: parameters, the reference).  The cache category carries the *algorithm set's* version,
    #: derived from this, the registered algorithms' names and versions and those of the
    #: operators they call (:meth:`fastrun.registry.Registry.algorithm_set_version`): adding,
    #: removing or changing an algorithm needs no edit here.
    version: int = 1
    #: The parameter names the operator takes; None: it checks them itself in
    #: :meth:`validate`.  A parameter it does not know is refused rather than silently put
    #: into the cache key.
    parameters: frozenset[str] | None = None
    #: What its steps can absorb after their computation (None: nothing fuses into them).
    epilogue: Epilogue | None = None
    #: Whether it takes ``weight_preprocess=True`` for a constant weight at input 1 (the
    #: runtime turns it on for such steps: the algorithms' weight transforms then run once).
    preprocesses_weights: bool = False

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        """Build and validate a problem from shapes (used by CLIs and suites)."""
        if self.parameters is not None:
            unknown = sorted(set(params) - self.parameters)
            if unknown:
                known = ", ".join(sorted(self.parameters)) or "none"
                raise ValueError(f"{self.name} has no parameter(s) {', '.join(unknown)} "
                                 f"(it takes: {known})")
        try:
            problem = Problem.create(self.name, shapes, dtypes, params)
            self.validate(problem)
        except (OverflowError, TypeError) as error:  # an infinite stride, a list for a number
            raise ValueError(f"{self.name}: bad parameter or shape: {error}") from None
        return problem

    def problem_for(self, inputs: Sequence[Any], **params: Any) -> Problem:
        """Build and validate the problem that computing ``inputs`` poses."""
        return self.problem([x.shape for x in inputs], [x.dtype for x in inputs], **params)

    def validate(self, problem: Problem) -> None:
        """Raise ValueError with a clear message when the problem is not well formed."""

    def size_axes(self, shapes: Sequence[Shape]) -> tuple[int, ...]:
        """The sizes that set a problem's work, each counted once: what the distance to the
        nearest measured problem compares (:mod:`fastrun.core.nearest`).

        By default every axis of every input, an input whose shape repeats an earlier one's
        counted once (``add(a, b)``).  An operator whose inputs repeat one size in another
        tensor (a conv's residual has the output's height and width) names its own, so that
        one change of size is not counted twice.
        """
        seen: set[Shape] = set()
        axes: list[int] = []
        for shape in shapes:
            if tuple(shape) not in seen:
                seen.add(tuple(shape))
                axes.extend(shape)
        return tuple(axes)

    def lane_axes(self, shapes: Sequence[Shape]) -> tuple[int, ...] | None:
        """Positions in :meth:`size_axes` of the sizes that kernels spread over vector lanes,
        where a size below 16 and one at or above it are different regimes, so that two
        problems on either side are not compared (:mod:`fastrun.core.nearest`); None: every
        size.  An operator whose kernels pad or tile some sizes to their own blocks (a conv's
        pixels) leaves those out."""
        return None

    def work(self, problem: Problem) -> float:
        """How much computing ``problem`` takes, up to a constant: the product of its
        :meth:`size_axes`.  Only ratios between problems are used, to carry a measured time
        to a nearby shape (:mod:`fastrun.core.nearest`); an algorithm that rounds the shape
        to its tiles says so itself (:meth:`fastrun.algorithm.Algorithm.work`)."""
        return float(math.prod(self.size_axes(problem.shapes)))

    def output_shape(self, problem: Problem) -> Shape:
        raise NotImplementedError

    def output_dtype(self, problem: Problem) -> np.dtype:
        """The result's dtype; the first input's unless the operator says otherwise."""
        return np.dtype(problem.dtypes[0])

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """The trusted result every candidate is checked against."""
        raise NotImplementedError

    def batch_inputs(self, problem: Problem) -> tuple[int, ...]:
        """Indices of the inputs whose axis 0 is a batch, each item of which makes one item of
        the output's axis 0 alone (a conv's images).  The search may then check a large
        problem's numerics on a few items (:data:`fastrun.core.profiler.CHECK_ITEMS`): its
        float64 reference and the downloads of every candidate's output cost seconds at batch
        32 on a GPU.  Empty (the default): the whole output is always checked."""
        return ()

    def random_inputs(self, problem: Problem, rng: np.random.Generator) -> list[np.ndarray]:
        """Inputs for profiling: values in [-1, 1] of the problem's dtypes."""
        return [uniform(rng, shape, dtype)
                for shape, dtype in zip(problem.shapes, problem.dtypes, strict=True)]

    def error(self, problem: Problem, output: Any, reference: np.ndarray) -> float:
        """Maximum absolute difference relative to the largest reference magnitude.

        The magnitude is floored at the smallest normal number of the output's float type: a
        float32 result cannot hold a reference of 4e-44 (sigmoid(-100)) except as a subnormal
        or zero, and that rounding is not an error of the algorithm."""
        output = np.asarray(output)
        if output.shape != reference.shape:
            return float("inf")
        if not reference.size:
            return 0.0
        from fastrun.base.max_error import worst_and_scale  # numba: compiled on a first check

        worst, scale = worst_and_scale(output, np.asarray(reference))
        if not np.isfinite(worst):
            return float("inf")
        kind = output.dtype if output.dtype.kind == "f" else np.dtype(np.float64)
        return worst / max(scale, float(np.finfo(kind).tiny))

    def tolerance(self, problem: Problem) -> float:
        """Largest acceptable :meth:`error` for this problem."""
        return 1e-3 if "float32" in problem.dtypes else 1e-9

    def heuristic_order(self, problem: Problem,
                        candidates: Sequence[Algorithm]) -> list[Algorithm]:
        """Candidates best-first by rule of thumb: what HEURISTIC picks, and the order the
        profiler times them in (a good first candidate makes early stopping effective).  By
        default each algorithm's own :meth:`Algorithm.heuristic_rank`; algorithms without a
        rule follow in registration order.  An operator overrides this only for a rule about
        the whole set that no single algorithm can state."""
        ranked = [(algorithm.heuristic_rank(problem), index, algorithm)
                  for index, algorithm in enumerate(candidates)]
        return [algorithm for _, _, algorithm in sorted(
            ranked, key=lambda item: (item[0] is None, item[0] or (), item[1]))]
