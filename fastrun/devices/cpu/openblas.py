"""numpy's bundled OpenBLAS: where its library is, and its thread count.

numpy's wheels ship OpenBLAS as ``scipy-openblas`` with prefixed, 64-bit-integer symbols
(``scipy_cblas_sgemm64_``, ``scipy_openblas_get_num_threads64_``).  fastrun needs it twice:
the CPU device's category records how many threads OpenBLAS really has
(``fastrun/devices/cpu/threads.py``
asks for one, but a program that imported numpy first started OpenBLAS before fastrun could
ask), and ``blas_split`` calls its gemm from numba's workers.  Nothing here imports numpy
before the caller has: the library is looked up next to an already imported numpy.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from typing import Any


def library_folders() -> list[str]:
    """Where numpy's wheels keep their bundled libraries (Linux, then macOS); empty while numpy
    is not imported."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not getattr(numpy, "__file__", None):
        return []
    here = os.path.dirname(numpy.__file__)
    return [os.path.join(here, os.pardir, "numpy.libs"), os.path.join(here, ".dylibs")]


def libraries() -> tuple[tuple[str, Any], ...]:
    """(path, ctypes library) of every OpenBLAS numpy ships that loads (none while numpy is not
    imported; that answer is not remembered)."""
    return _load(tuple(library_folders()))


@functools.cache
def _load(folders: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    found = []
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "*openblas*"))):
            try:
                found.append((path, ctypes.CDLL(path)))
            except OSError:
                continue
    return tuple(found)


def function(symbol: str) -> Any | None:
    """The ctypes function ``symbol`` of numpy's OpenBLAS, or None."""
    for _, library in libraries():
        found = getattr(library, symbol, None)
        if found is not None:
            return found
    return None


def _thread_function(name: str) -> Any | None:
    found = function(f"scipy_openblas_{name}64_")
    if found is not None:
        found.restype = ctypes.c_int if name == "get_num_threads" else None
        found.argtypes = [] if name == "get_num_threads" else [ctypes.c_int]
    return found


def get_num_threads() -> int | None:
    """The threads OpenBLAS uses now, or None when numpy's OpenBLAS is not found."""
    get = _thread_function("get_num_threads")
    return int(get()) if get is not None else None


def set_num_threads(threads: int) -> bool:
    """Give OpenBLAS ``threads`` threads from now on; False when it is not found."""
    set_ = _thread_function("set_num_threads")
    if set_ is None:
        return False
    set_(int(threads))
    return True
