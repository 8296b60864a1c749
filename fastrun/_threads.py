"""One thread pool for the parallel work, TBB's where it loads; BLAS on the calling thread.

numba's threading layer: TBB (the ``tbb`` package, a dependency) rather than OpenMP.  An OpenMP
parallel region ends at a barrier every worker must reach, so a worker whose core is taken by
another process (or by the hypervisor) holds up every region for a scheduler slice; TBB's
scheduler lets the threads that run take all the tasks.  Measured on the 2-core development VM
with a busy loop pinned to one core, resnet18 at 2 threads: OpenMP 53-54 ms, TBB 16.0-16.5 ms,
onnxruntime 16.2-16.4; without the busy loop 8.4-8.7 (OpenMP) and 8.5-8.8 ms (TBB) against
8.0-8.1.  On the 16-core host the same collapse was seen (fastrun 106-115 ms at 16 threads
while onnxruntime slowed from 4.3 to 8.1 ms).  :func:`threading_layer` picks the layer (a
``NUMBA_THREADING_LAYER`` the user set wins) and it is part of the CPU device's category.
Where TBB does not load, OpenMP is kept, with the settings below.

Fast Run rests on one premise: an algorithm's time does not depend on what ran before it.  Two
thread pools could share the cores here, numba's (OpenMP layer) and OpenBLAS's, and on a
2-core machine they fight: a pool that busy-waits after its work takes the core the other one
needs next.  Measured on the 2-core development VM (``docs/performance.md``, "Thread pools"):

* numba's OpenMP workers spinning after a parallel region made the next multi-threaded sgemm
  (100x300x70) run 4x slower (30 us -> 118 us, up to 567 us), and OpenBLAS's workers spinning
  after a call (2^28 cycles, ~0.1 s, by default) made a numba kernel started in that window
  wait a scheduler slice (2-8 ms instead of ~150 us).
* Letting numba's workers *sleep* after every region (``OMP_WAIT_POLICY=passive``, the
  earlier default) avoids the fight but makes every parallel region wake a halted vCPU: about
  25-35 us per region on the VM (a tiny ``implicit_gemm`` call, two regions: 83 us asleep, 11
  us spinning), and a model runs ~50 regions per inference.  Under load from other tenants the
  wake-ups got worse, and fastrun kept only 1.2x of its second core where onnxruntime kept
  1.95x.

So the defaults make numba's pool the only parallel one and keep it awake briefly:

* ``GOMP_SPINCOUNT=20000``: numba's workers spin ~1 ms after a region before sleeping, long
  enough to bridge the Python between one step's kernels and the next step's;
* ``OPENBLAS_NUM_THREADS=1``: OpenBLAS runs on the calling thread, so it never waits for or
  competes with numba's workers; products that pay for two threads have algorithms on numba's
  pool (``blas_split``: one OpenBLAS call per worker; ``register_tiled``, ``blocked``), and Fast
  Run measures which wins.  ResNet-18 end to end
  went from 25.3-26.4 to 18.7-22.1 ms (5 of 5 alternated runs), onnxruntime at 17.9-19.2;
* ``OPENBLAS_THREAD_TIMEOUT=20`` (~0.4 ms of spinning instead of ~0.1 s) for a user who gives
  OpenBLAS more threads.

These defaults are applied by :func:`configure_threads`, which creating a CPU device calls
(every session, ``load_and_run`` and the ``fastrun`` command create one), and which a program
may call itself; ``import fastrun`` changes nothing.  A value the user set is kept, and so is
the intent: ``OMP_WAIT_POLICY`` set by the user leaves ``GOMP_SPINCOUNT`` alone, and
``OMP_NUM_THREADS`` or ``GOTO_NUM_THREADS`` (which OpenBLAS also reads) leave
``OPENBLAS_NUM_THREADS`` alone.  By then numpy has loaded OpenBLAS, which read its variables
when it loaded: its thread count is set through OpenBLAS's own call, under the same rule (its
idle threads stay asleep), and the variables are set too, for child processes and for numba's
OpenMP layer, which starts at its first parallel kernel.  ``OPENBLAS_THREAD_TIMEOUT`` cannot
be changed once OpenBLAS is loaded (see docs/performance.md); it only matters to a user who
gives OpenBLAS more than one thread, and such a user can set it before starting Python.
"""

import contextlib
import functools
import importlib
import os
import sys

from fastrun import openblas

#: variable -> (default, other variables whose presence means the user already decided)
DEFAULTS = {
    "GOMP_SPINCOUNT": ("20000", ("OMP_WAIT_POLICY",)),
    "OPENBLAS_NUM_THREADS": ("1", ("OMP_NUM_THREADS", "GOTO_NUM_THREADS")),
    "OPENBLAS_THREAD_TIMEOUT": ("20", ()),
}


@functools.cache
def configure_threads() -> None:
    """Make numba's pool the only spinning one (OpenBLAS on the calling thread), keeping every
    choice the user made (see the module docstring).  Idempotent; called by ``CPUDevice``."""
    user_set_blas = any(name in os.environ for name in
                        ("OPENBLAS_NUM_THREADS", *DEFAULTS["OPENBLAS_NUM_THREADS"][1]))
    for name, (value, user_decided) in DEFAULTS.items():
        if not any(other in os.environ for other in user_decided):
            os.environ.setdefault(name, value)
    if "numpy" in sys.modules and not user_set_blas:
        openblas.set_num_threads(int(DEFAULTS["OPENBLAS_NUM_THREADS"][0]))


def blas_threads() -> int:
    """The threads OpenBLAS uses: part of the CPU device's category, because a cache searched
    with a multi-threaded BLAS does not hold for a single-threaded one.  Asked of numpy's
    OpenBLAS itself where it is found; otherwise what its environment variables say (it reads
    them once, when numpy loads it)."""
    threads = openblas.get_num_threads()
    if threads is not None:
        return threads
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


@functools.cache
def threading_layer() -> str:
    """The threading layer numba's parallel kernels use in this process: ``tbb`` where TBB
    loads, else ``omp``, else ``workqueue`` (numba's own order), or what the user set in
    ``NUMBA_THREADING_LAYER`` (a layer, or a property such as ``forksafe`` for numba to
    resolve).  Set in numba's configuration here, before its first parallel
    kernel runs, so that the layer the CPU category names is the one that runs."""
    import numba

    chosen = os.environ.get("NUMBA_THREADING_LAYER", "default").strip().lower() or "default"
    if chosen in ("default", "tbb", "safe", "threadsafe"):
        _preload_tbb()
    if chosen == "default":
        chosen = next((layer for layer, module in (("tbb", "tbbpool"), ("omp", "omppool"))
                       if _loads(f"numba.np.ufunc.{module}")), "workqueue")
        numba.config.THREADING_LAYER = chosen
    return chosen


def _preload_tbb() -> None:
    """Load the ``tbb`` wheel's ``libtbb.so.12`` by its full path, so that numba's TBB layer
    finds it.  pip puts the library in ``<prefix>/lib``, which the dynamic loader does not
    search unless ``ldconfig`` or ``LD_LIBRARY_PATH`` says so: without this, a plain ``pip
    install`` silently ran OpenMP (numba's import of ``tbbpool`` fails on the soname).  Once a
    library of that soname is loaded, the loader reuses it for numba's module."""
    import ctypes
    from importlib import metadata

    try:
        tbb = metadata.distribution("tbb")
    except metadata.PackageNotFoundError:
        return
    for name in tbb.files or []:
        if os.path.basename(str(name)) == "libtbb.so.12":
            with contextlib.suppress(OSError):  # numba's import then decides: OpenMP is kept
                ctypes.CDLL(str(tbb.locate_file(name)), mode=ctypes.RTLD_GLOBAL)
            return


def _loads(module: str) -> bool:
    """Whether a numba threading-layer module imports (its native library is found)."""
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or OSError from the loader
        return False
    return True
