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
    not compared at all.

The limit
    A neighbour is used only when its distance is at most the limit: ``FASTRUN_NEAREST``
    (default 1.0; 0 turns nearest serving off) or ``fastrun.session(nearest=...)``.  Among the
    neighbours within it, the nearest comes first (ties: the larger problem, whose ranking
    reflects the larger working set, then the key, so the choice is the same in every process).

The chooser takes the first neighbour whose measured entries name an algorithm that is usable
for the new problem and fits its strategy and workspace limit (:meth:`AlgoChooser._pick`), so a
neighbour never brings an algorithm that cannot compute the problem.

What it is worth (``benchmarks/bench_nearest.py``, docs/performance.md): from a cache searched
at batch 1 and 8, batches 2 and 4 ran within 6% of a fresh search; other image sizes less well
(ResNet-18 at 160 pixels 1.21x a fresh search, 1.09x the rule of thumb), because a ranking
does not carry where another size's Winograd tiles fall.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fastrun.operator import Problem, split_key

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


def _group(dtypes: tuple[str, ...], shapes: tuple[tuple[int, ...], ...], params: str,
           sizes: int) -> tuple:
    """What two problems must share to be compared at all."""
    return (params, dtypes, tuple(len(shape) for shape in shapes), sizes)


#: shapes -> the sizes compared (an operator's size_axes)
SizeAxes = Callable[[Sequence[tuple[int, ...]]], Sequence[int]]


def _log_sizes(sizes: Iterable[int]) -> list[float]:
    return [math.log2(d) if d > 0 else _ZERO_AXIS for d in sizes]


class _CategoryIndex:
    """The measured problems of one category, grouped by what must match, as log2 sizes."""

    def __init__(self, keys: Iterable[str], size_axes: SizeAxes):
        self.size_axes = size_axes
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
        sizes = _log_sizes(self.size_axes(problem.shapes))
        group = _group(problem.dtypes, problem.shapes, problem.params_text, len(sizes))
        found = self.groups.get(group)
        if found is None:
            return []
        names, rows = found
        mine = np.asarray(sizes)
        distances = np.abs(rows - mine).sum(axis=1)
        # across the vector cliff on any size: not comparable
        lanes = math.log2(VECTOR_LANES)
        distances[((rows < lanes) != (mine < lanes)).any(axis=1)] = np.inf
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
                   size_axes: SizeAxes) -> list[Neighbour]:
        """Measured problems within ``limit`` of ``problem``, nearest first (at most
        :data:`MAX_NEIGHBOURS`); none when ``limit`` is 0.  ``size_axes``: the operator's
        (one operator per category)."""
        if limit <= 0:
            return []
        size = len(self.cache)
        with self._lock:
            built = self._indexes.get(category)
            if built is None or built[0] != size:
                built = (size, _CategoryIndex(self.cache.keys(category), size_axes))
                self._indexes[category] = built
        return built[1].neighbours(problem, limit)
