"""Whether numba may keep compiled kernels on disk here: decided once per process.

Kernels are compiled with numba's ``cache=True`` so that a second process does not spend a
minute compiling them again.  numba refuses ``cache=True`` outright, at decoration time, where
it finds no folder to write to (a read-only install used by an unprivileged user whose home
does not exist): every module of kernels then failed to import, and fastrun knew no operator.
Here the kernels are compiled uncached instead, and the user is told once, with what restores
the cache.  Both the framework and the compute library decorate with ``cache=enabled()``.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)


def _probe(value: int) -> int:
    return value


@functools.cache
def enabled() -> bool:
    """True where numba can cache compiled kernels; else one warning (a log line), and
    False."""
    import numba

    try:
        numba.njit(cache=True)(_probe)
    except RuntimeError as error:  # numba: "cannot cache function ...: no locator available"
        log.warning("numba cannot cache compiled kernels here (%s); they are compiled again in "
                    "every process. Set NUMBA_CACHE_DIR to a writable folder to keep them.",
                    error)
        return False
    return True
