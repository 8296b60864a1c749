"""numpy's huge-page advice off by default: a kernel's time must not depend on the process.

On Linux numpy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on
every array of 4 MB or more.  Where the kernel's THP mode is ``madvise`` (the development VM:
``enabled`` and ``defrag`` both ``madvise``), such an allocation may be backed by huge pages,
compacted for, or collapsed later, and which of these happens differs from process to process.
Fast Run's premise is that what it measured in the search process holds in the process that
runs the model; measured on the first 2-core VM (``docs/history/two-cores-2026-11-21.md``,
"MobileNetV2"):

* ``implicit_gemm`` on MobileNetV2's 16->96 1x1 conv at 112x112 (a 4.8 MB output per call):
  medians of 0.53-0.87 ms in five processes with numpy's advice, 0.49-0.54 ms in five
  without; a search had ranked it 18% ahead of ``conv1x1`` and the model then found it 10%
  behind;
* ``bench_models --models mobilenet_v2``: fast-run against heuristic-only 1.040-1.054 in four
  measurements with the advice, 0.950-1.009 in four without.

So the first CPU device of a process (every session, every command) turns the advice off
through numpy's own switch (:func:`turn_off_huge_page_advice`), as it sets the thread pools'
defaults; ``import fastrun`` alone changes nothing, and no environment variable is set.  A
value of ``NUMPY_MADVISE_HUGEPAGE`` the user set is obeyed (``1`` keeps numpy's default).
"""

import os
import sys

VARIABLE = "NUMPY_MADVISE_HUGEPAGE"


def _numpy_switch():
    """numpy's setter of the advice (it returns the previous setting), or None."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    for module in ("_core", "core"):  # numpy 2, numpy 1
        multiarray = getattr(getattr(numpy, module, None), "multiarray", None)
        switch = getattr(multiarray, "_set_madvise_hugepage", None)
        if switch is not None:
            return switch
    return None


def turn_off_huge_page_advice() -> None:
    """numpy's huge-page advice off, through numpy's switch (numpy is imported here), unless
    the user set NUMPY_MADVISE_HUGEPAGE, which numpy itself obeys.  Idempotent."""
    if VARIABLE in os.environ:
        return
    import numpy  # noqa: F401  (the switch lives in numpy's core)

    switch = _numpy_switch()
    if switch is not None:
        switch(False)


def huge_page_advice() -> bool | None:
    """Whether numpy currently advises huge pages (None before numpy is imported, or where
    numpy has no such switch): for tests and diagnostics."""
    switch = _numpy_switch()
    if switch is None:
        return None
    previous = switch(False)
    switch(previous)
    return bool(previous)


# -- keeping freed pages -------------------------------------------------------------------------
#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: Free bytes at the top of the heap glibc keeps instead of returning them (mallopt's int
#: maximum: never, in practice).
_KEEP_TOP = 2**31 - 1

_kept: bool | None = None


def keep_freed_pages() -> bool:
    """Ask glibc to keep the pages of freed tensors for the next allocation (True when it did,
    or had already been asked; False where there is no glibc).

    glibc serves every allocation above its mmap threshold (at most 32 MB) from a fresh
    ``mmap`` and returns it with ``munmap`` when freed, so each inference of a model whose
    tensors or workspaces are that large writes to fresh pages, and every 4 KB page costs a
    fault the first time it is touched, faults that many threads take at once and that
    serialise on the process's memory map.  MobileNetV2 at batch 8 took 9,409 of them per
    inference, and 23% of its time on 2 cores (second session of
    ``docs/history/many-cores-issue-13-2026-11-25-to-27.md``); ResNet-50 at batch 8 took
    25,024 on one 16-core host.  With mmap off and the heap never trimmed, a freed block
    stays mapped and the next inference's same-sized allocation
    reuses it.  The pages then stay with the process for its lifetime, as an inference
    engine's arena does; ``FASTRUN_KEEP_PAGES=0`` turns this off.
    """
    global _kept
    if _kept is None:
        _kept = _mallopt(_M_MMAP_MAX, 0) and _mallopt(_M_TRIM_THRESHOLD, _KEEP_TOP)
    return _kept


def _mallopt(parameter: int, value: int) -> bool:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(parameter, value) == 1
