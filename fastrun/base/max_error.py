"""The numerical check's arithmetic in one pass: :meth:`fastrun.operator.Operator.error`.

A batch-32 search on a GPU checks thousands of outputs of up to millions of elements.  numpy
needs a float64 temporary and five passes over it (the reference's extremes, the cast, the
difference, its magnitude, its maximum), and a new temporary of that size page-faults on every
call: on the 2-core VM 3.4-4.2 ms for 600K float32 elements against 0.48 ms here, and the
H200's batch-32 search spent 28.5 s of its 114 s in output checks.  The loop runs without
the GIL, so the search's build threads keep going meanwhile.
"""

from __future__ import annotations

import numba
import numpy as np

from fastrun import numba_cache

#: Element types the compiled loop takes as they are; others (float16, ...) are widened to
#: float64 first, which is exact for every real type.
_NATIVE = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int8, np.int16, np.int32,
                                          np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                                          np.bool_))


@numba.njit(cache=numba_cache.enabled(), nogil=True)
def _worst_and_scale(output: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    worst = 0.0
    scale = 0.0
    for i in range(output.size):
        r = np.float64(reference[i])
        d = abs(np.float64(output[i]) - r)
        if not d <= worst:  # larger, or NaN
            if not np.isfinite(d):
                return np.inf, scale
            worst = d
        if abs(r) > scale:
            scale = abs(r)
    return worst, scale


def worst_and_scale(output: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(the largest ``|output - reference|``, the largest ``|reference|``), both in float64,
    for arrays of one shape; the first is inf where any difference is not finite (a NaN or an
    infinity on either side)."""
    flat = [np.ravel(a if a.dtype in _NATIVE else a.astype(np.float64))
            for a in (output, reference)]
    worst, scale = _worst_and_scale(flat[0], flat[1])
    return float(worst), float(scale)
