"""The base class of conv algorithms: each says which tensor layouts it reads and writes.

Why: a conv problem in the channel-blocked layout (``layout=nchw16c``, see
:mod:`fastrun_algorithms.layout.blocking`) has 5-D tensors that an NCHW kernel would misread
without failing.  Refusing other layouts here, by default, means an algorithm added later is
safe without knowing layouts exist; one written for the blocked layout lists it in
:attr:`ConvAlgorithm.layouts`.
"""

from __future__ import annotations

from fastrun.algorithm import Algorithm
from fastrun.operator import Problem
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.layout.blocking import NCHW


def layout_of(problem: Problem) -> str:
    """The problem's tensor layout (``nchw`` unless the problem names another)."""
    return problem.param("layout", NCHW)


class ConvAlgorithm(Algorithm):
    """A conv algorithm: usable for the layouts in :attr:`layouts` and where
    :meth:`conv_unusable_reason` finds nothing against the problem."""

    operator = "conv"
    #: the tensor layouts of X, Z and Y this algorithm reads and writes
    layouts: tuple[str, ...] = (NCHW,)

    def unusable_reason(self, problem: Problem) -> str | None:
        layout = layout_of(problem)
        if layout not in self.layouts:
            return f"computes {' and '.join(self.layouts)} tensors, not {layout}"
        return self.conv_unusable_reason(problem)

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        """Why the algorithm cannot compute ``problem`` in a layout it supports, or None."""
        return None

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return self.conv_rank(geometry(problem))

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        """The rule-of-thumb rank for ``geo`` (smaller first; see
        :mod:`fastrun_algorithms.conv.heuristic` for the classes of layers and the
        measurements behind each algorithm's rule).  The default places an algorithm without
        a rule after the specialised kernels and the GEMM families, before the reorders and
        the naive loops."""
        return (6, 0)
