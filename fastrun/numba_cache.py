"""Whether numba may keep compiled kernels on disk here: decided once per process.

Kernels are compiled with numba's ``cache=True`` so that a second process does not spend a
minute compiling them again.  numba refuses ``cache=True`` outright, at decoration time, where
it finds no folder to write to (a read-only install used by an unprivileged user whose home
does not exist): every module of kernels then failed to import, and fastrun knew no operator.
Here the kernels are compiled uncached instead, and the user is told once, with what restores
the cache.  Both the framework and the compute library decorate with ``cache=enabled()``, and
the compute library sweeps its cached kernels when its sources change
(:func:`sweep_stale_kernels`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

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


#: The file, in a package's top ``__pycache__``, that records which sources its kernels were
#: cached from.
STAMP = "fastrun-kernels.stamp"


def _sources_stamp(root: Path) -> str:
    """A digest of every Python source under ``root``: its path, size and modification time."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        info = path.stat()
        digest.update(f"{path.relative_to(root)}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def sweep_stale_kernels(root: str | os.PathLike) -> int:
    """Delete the kernels numba cached under ``root`` (``__pycache__/*.nbi`` and ``*.nbc``)
    when any source file under it changed since they were cached; returns how many files went.

    Why: numba checks a cached kernel against the file that defines it and nothing else, so a
    kernel that inlines a helper from another file (a conv's epilogue, say) kept the old helper
    after that file changed, and computed the old thing without a word.  An editable install
    updated with ``git pull`` changes some files and not others; a wheel replaces them all.
    One stat per source file (about 3 ms for the compute library).  A tree numba cannot write
    to keeps its kernels elsewhere, or none, and is left alone.
    """
    root = Path(root)
    stamp_file = root / "__pycache__" / STAMP
    try:
        stamp = _sources_stamp(root)
        if stamp_file.exists() and stamp_file.read_text() == stamp:
            return 0
        removed = 0
        for pattern in ("*.nbi", "*.nbc"):
            for cached in root.rglob(f"__pycache__/{pattern}"):
                cached.unlink(missing_ok=True)
                removed += 1
        stamp_file.parent.mkdir(exist_ok=True)
        temporary = stamp_file.with_name(f"{STAMP}.{os.getpid()}")
        temporary.write_text(stamp)
        os.replace(temporary, stamp_file)  # atomic: a process beside this one reads all or none
    except OSError as error:  # a read-only tree: numba keeps nothing in it either
        log.debug("numba kernel cache under %s left as it is: %s", root, error)
        return 0
    if removed:
        log.info("deleted %d numba kernel cache files under %s: its sources changed", removed,
                 root)
    return removed
