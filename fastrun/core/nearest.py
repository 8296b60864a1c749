"""The nearest measured problem: what serves a problem the cache lacks when nothing is searched.

Why: a deployment whose inputs vary (another image size, another batch) meets problems that
were never searched.  Searching each one costs seconds per problem in the middle of serving
(pytorch#2759), and reusing the first shape's choice for every later one is wrong as soon as
the shapes drift far (pytorch#197842).  Between the two: when a cache-only or heuristic run
misses, the measured ranking of a problem of nearly the same shape is a better guess than the
rule of thumb, and it costs a lookup.

Which problems are comparable
    Only problems of the same cache category (the device's facts, the operator and its
    algorithm set), with the same parameters (strides, padding, activation, ...), the same
    dtypes and the same number of tensors of the same ranks.  Anything else answers a
    different question and is never used.

The distance
    The sum of ``|log2(a / b)|`` over the sizes that set the problem's work, ``a`` and ``b``
    being the two problems' values of one size.  The sizes are the operator's
    :meth:`~fastrun.operator.Operator.size_axes`: by default every axis of every input; a conv
    counts X's axes, the output channels and the kernel (not the bias or the residual, which
    repeat them), a matmul A's axes and N.  So 1.0 is one size doubled or halved (batch 1
    against batch 2), or an image scaled by 1.41 on both sides (224 against 160 pixels is 0.97;
    224 against 288 is 0.73).  A size 0 is comparable only with another 0.  A log ratio rather
    than a difference, because what changes an algorithm's ranking is the relative size: 1
    against 2 images moves a GEMM's shape as much as 8 against 16.

    One cliff is not smooth: a size below :data:`VECTOR_LANES` (16 float32 lanes, one 512-bit
    vector) against one at or above it.  Kernels tiled by the vector run part-empty vectors or
    a remainder path below it: measured on the 2-core Zen 5 VM, ``register_tiled`` took 815 us
    for Winograd's batched product with N = 16 and 3722 us with N = 9 (``blas`` 1768 and 693),
    so a choice made at 16 was 5x off at 9.  Two problems with sizes on either side of it are
    not compared at all, on the sizes the operator puts into lanes
    (:meth:`~fastrun.operator.Operator.lane_axes`: every size by default, a conv's channels).

The limit
    A neighbour is used only when its distance is at most the limit: ``FASTRUN_NEAREST``
    (default 1.0; 0 turns nearest serving off) or ``fastrun.session(nearest=...)``.  Among the
    neighbours within it, the nearest comes first (ties: the larger problem, whose ranking
    reflects the larger working set, then the key, so the choice is the same in every process).

Carrying the ranking
    A neighbour's ranking is not taken as it is: each entry's time is scaled by its
    algorithm's work here over its work there (:func:`carried_entries`,
    :meth:`~fastrun.algorithm.Algorithm.work`), so an algorithm whose tiles fit the new shape
    worse drops.  The chooser then takes the fastest carried entry whose algorithm is usable
    for the new problem, fits its strategy and workspace limit, and has no sub-problem that
    fell to the rule of thumb (:meth:`AlgoChooser._from_nearest`): a neighbour never brings an
    algorithm that cannot compute the problem.  The carried time is the decision's estimate,
    which the runtime's layout planner uses as it would a measurement.

Both sides
    Where two neighbours within the limit lie on either side of the problem (:func:`bracket`),
    their carried rankings are blended first (:func:`blended_entries`): a ranking that bends
    between two measured shapes is followed rather than extrapolated from one of them.

What it is worth (``benchmarks/bench_nearest.py``, docs/performance.md, the 16-core Xeon at 16
threads): from a cache searched at 224 pixels, batch 1 and 8, other batches and image sizes
ran 0.64-0.98 of the rule of thumb's time and 0.83-1.05 of a fresh search's, the two worst
rows (ResNet-18 at 160 pixels, MobileNetV2 at 288) measured again over 6 rounds.  Copying the
ranking instead had run ResNet-18 at 160 pixels 1.21x a fresh search and 1.09x the rule of
thumb.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fastrun.algorithm import Algorithm
from fastrun.cache.store import Entry
from fastrun.operator import Operator, Problem, split_key

#: Neighbours returned per question: enough to get past a few whose picks do not apply.
MAX_NEIGHBOURS = 8
#: Sizes below this and sizes at or above it are different regimes (see the module docstring).
VECTOR_LANES = 16

#: log2 of an axis of size 0: far from every positive size, at distance 0 from another 0
_ZERO_AXIS = -1e6


@dataclass(frozen=True)
class Neighbour:
    """A measured problem near the one asked about."""

    key: str
    distance: float

    def problem(self, near: Problem) -> Problem:
        """The neighbour as a problem: ``near``'s operator, dtypes and parameters (a neighbour
        shares them) with the neighbour's shapes."""
        parts = split_key(self.key)
        assert parts is not None  # the index holds only keys it could split
        return Problem(near.operator, parts[1], near.dtypes, near.params)


def carried_entries(entries: Sequence[Entry], here: Problem, there: Problem,
                    operator_work: Callable[[Problem], float],
                    algorithms: Mapping[str, Algorithm]) -> list[Entry]:
    """The entries measured on ``there``, each time carried to ``here``: scaled by its
    algorithm's work here over its work there (:meth:`Algorithm.work`, else
    ``operator_work``).  The ranking that results is what the shapes' difference predicts,
    not the one measured: Winograd F(4,3) does as many tiles on 5x5 pixels as on 7x7, while
    a direct conv does about half the work, so a ranking measured on ResNet-18's last stage
    at 224-pixel images (7x7) should not hand its 160-pixel version (5x5) to Winograd as it
    is.  An entry of an algorithm not among ``algorithms`` is kept as measured (it will not
    be picked)."""
    def ratio(work_here: float, work_there: float) -> float:
        return work_here / work_there if work_here > 0 and work_there > 0 else 1.0

    alike = ratio(operator_work(here), operator_work(there))
    carried = []
    for entry in entries:
        algorithm = algorithms.get(entry.algorithm)
        scale = 1.0
        if algorithm is not None:
            work_here, work_there = algorithm.work(here), algorithm.work(there)
            scale = (alike if work_here is None or work_there is None
                     else ratio(work_here, work_there))
        carried.append(replace(entry, time_s=entry.time_s * scale,
                               spread_s=entry.spread_s * scale))
    return carried


def bracket(neighbours: Sequence[Neighbour], problem: Problem,
            operator: Operator) -> tuple[Neighbour, Neighbour] | None:
    """Of the pairs of ``neighbours`` between which ``problem`` lies (on every size axis its
    size within the range of theirs: 160-pixel images between 128 and 224, batch 4 between 2
    and 8), the one with the smallest summed distance; None when no pair brackets it.  The
    first of the pair is the one ``neighbours`` lists first (the nearer)."""
    here = np.asarray(_log_sizes(operator.size_axes(problem.shapes)))
    sized = [(n, np.asarray(_log_sizes(operator.size_axes(n.problem(problem).shapes))))
             for n in neighbours]
    best: tuple[float, Neighbour, Neighbour] | None = None
    for i, (first, first_sizes) in enumerate(sized):
        for second, second_sizes in sized[i + 1:]:
            low = np.minimum(first_sizes, second_sizes) - 1e-9
            high = np.maximum(first_sizes, second_sizes) + 1e-9
            total = first.distance + second.distance
            if (low <= here).all() and (here <= high).all() and (best is None
                                                                 or total < best[0]):
                best = (total, first, second)
    return None if best is None else best[1:]


def blended_entries(first: Sequence[Entry], first_distance: float, second: Sequence[Entry],
                    second_distance: float) -> list[Entry]:
    """Entries of the algorithms both bracketing neighbours measured (each already carried to
    the problem, :func:`carried_entries`), each time interpolated between the two in log
    space, the nearer neighbour weighing more.  One neighbour's ranking is a straight line
    from one side; two from both sides follow a ranking that bends between them (a tile that
    fits at 128 pixels and not at 224).  An algorithm only one of them kept is left out: a
    cache keeps a problem's Pareto front, so its absence on one side says it lost there."""
    total = first_distance + second_distance
    weight = second_distance / total if total > 0 else 0.5  # of the first neighbour
    others = {entry.algorithm: entry for entry in second}
    blended = []
    for entry in first:
        other = others.get(entry.algorithm)
        if other is None or entry.time_s <= 0 or other.time_s <= 0:
            continue
        time_s = math.exp(weight * math.log(entry.time_s)
                          + (1 - weight) * math.log(other.time_s))
        blended.append(replace(entry, time_s=time_s,
                               spread_s=weight * entry.spread_s + (1 - weight) * other.spread_s))
    return blended


def _group(dtypes: tuple[str, ...], shapes: tuple[tuple[int, ...], ...], params: str,
           sizes: int) -> tuple:
    """What two problems must share to be compared at all."""
    return (params, dtypes, tuple(len(shape) for shape in shapes), sizes)


def _log_sizes(sizes: Iterable[int]) -> list[float]:
    return [math.log2(d) if d > 0 else _ZERO_AXIS for d in sizes]


class _CategoryIndex:
    """The measured problems of one category, grouped by what must match, as log2 sizes."""

    def __init__(self, keys: Iterable[str], operator: Operator):
        self.operator = operator
        size_axes = operator.size_axes
        groups: dict[tuple, tuple[list[str], list[list[float]]]] = {}
        for key in keys:
            parts = split_key(key)
            if parts is None:
                continue  # a key this fastrun did not write: nothing to compare it with
            dtypes, shapes, params = parts
            try:
                sizes = _log_sizes(size_axes(shapes))
            except (IndexError, TypeError, ValueError):
                continue  # a key of a shape the operator no longer poses
            names, rows = groups.setdefault(_group(dtypes, shapes, params, len(sizes)),
                                            ([], []))
            names.append(key)
            rows.append(sizes)
        self.groups = {group: (names, np.asarray(rows, dtype=np.float64))
                       for group, (names, rows) in groups.items()}

    def neighbours(self, problem: Problem, limit: float) -> list[Neighbour]:
        sizes = _log_sizes(self.operator.size_axes(problem.shapes))
        group = _group(problem.dtypes, problem.shapes, problem.params_text, len(sizes))
        found = self.groups.get(group)
        if found is None:
            return []
        names, rows = found
        mine = np.asarray(sizes)
        distances = np.abs(rows - mine).sum(axis=1)
        # across the vector cliff on a size kernels put into lanes: not comparable
        lanes = math.log2(VECTOR_LANES)
        axes = self.operator.lane_axes(problem.shapes)
        columns = slice(None) if axes is None else list(axes)
        cliff = (rows[:, columns] < lanes) != (mine[columns] < lanes)
        distances[cliff.any(axis=1)] = np.inf
        volumes = rows.clip(min=0).sum(axis=1)  # log2 of the product of the sizes: larger first
        order = sorted((d, -v, name) for d, v, name in zip(distances, volumes, names, strict=True)
                       if d <= limit + 1e-9 and name != problem.key)
        return [Neighbour(name, float(d)) for d, _, name in order[:MAX_NEIGHBOURS]]


class NearestIndex:
    """Finds the measured problems nearest to a missed one, per cache category.

    The index of a category is built from the cache's keys on the first question about it, and
    again when the cache has grown since (a shared file another process writes into): a
    question costs a vectorised distance over the problems of one group, not a scan of the
    cache.
    """

    def __init__(self, cache):
        self.cache = cache
        self._lock = threading.Lock()
        self._indexes: dict[str, tuple[int, _CategoryIndex]] = {}

    def neighbours(self, category: str, problem: Problem, limit: float,
                   operator: Operator) -> list[Neighbour]:
        """Measured problems within ``limit`` of ``problem``, nearest first (at most
        :data:`MAX_NEIGHBOURS`); none when ``limit`` is 0.  ``operator``: the problem's (one
        operator per category), which names the sizes compared."""
        if limit <= 0:
            return []
        size = len(self.cache)
        with self._lock:
            built = self._indexes.get(category)
            if built is None or built[0] != size:
                built = (size, _CategoryIndex(self.cache.keys(category), operator))
                self._indexes[category] = built
        return built[1].neighbours(problem, limit)
