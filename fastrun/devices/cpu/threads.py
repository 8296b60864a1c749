"""One thread pool for the parallel work, OpenMP's where it loads; BLAS on the calling thread.

numba's threading layer: OpenMP (libgomp) first, TBB (the ``tbb`` package, a dependency) where
OpenMP does not load.  What a layer costs is paid at every parallel region, and a model runs
one or more per step.  ``benchmarks/bench_scaling.py`` with one variant per layer (same cache,
same alternation) measures it: on the 16-core Xeon host at 16 threads, batch 1, TBB ran
resnet18 and mobilenet_v2 1.2-1.8x slower than OpenMP, and an empty region cost 14 us on TBB
against 7-9 us on OpenMP (``benchmarks/probe_wall_time.py``); TBB also took 15-19 page faults
per inference where OpenMP took none.  On the 2-core development VM an empty region costs 4.3
us on TBB and 2.4 us on OpenMP.

OpenMP's weakness is its barrier: a region ends when every worker has reached it, so a worker
whose core another process holds delays every region by a scheduler slice (resnet18 at 2
threads beside a busy loop pinned to one core: 53 ms, where TBB, whose idle workers take the
remaining tasks, ran 16 ms).  A model run avoids that by using only the cores other processes
leave idle (``fastrun.devices.cpu.share``), so the barrier waits for no descheduled worker.
:func:`threading_layer` picks the layer (a ``NUMBA_THREADING_LAYER`` the user set wins), before
numba starts its pool, and the layer is part of the CPU device's category.

Fast Run rests on one premise: an algorithm's time does not depend on what ran before it.  Two
thread pools could share the cores here, numba's and OpenBLAS's, and on a small machine they
fight: a pool that busy-waits after its work takes the core the other one needs next (on the
2-core VM, numba's workers spinning made the next multi-threaded sgemm 4x slower, and
OpenBLAS's made a numba kernel wait a scheduler slice;
``docs/history/two-cores-2026-11-21.md``, "Thread pools on two cores").  So the defaults
make numba's pool the only parallel one, and keep it awake between kernels:

* ``GOMP_SPINCOUNT=300000`` (libgomp's own default when no wait policy is set, stated so that
  it holds whatever else the user sets): numba's workers spin after a region before sleeping
  (9-14 ms of CPU time per worker on the 2-core VM), so the regions of an inference, and of
  inferences that follow each other within that time, find them awake.  In a tight loop on
  the 16-core host, 20,000, 300,000 and 2,000,000 spins were within the processes' spread of
  each other (mobilenet_v2 medians: 20,000 at 3.26 and 2.90 ms in two calls, 300,000 at 2.73,
  2,000,000 at 2.87 and 2.91; ``bench_scaling`` with one variant per setting).
* ``OPENBLAS_NUM_THREADS=1``: OpenBLAS runs on the calling thread, so it never waits for or
  competes with numba's workers; products that pay for more threads have algorithms on numba's
  pool (``blas_split``: one OpenBLAS call per worker; ``register_tiled``, ``blocked``), and Fast
  Run measures which wins.
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
be changed once OpenBLAS is loaded (see docs/history/two-cores-2026-11-21.md); it only
matters to a user who gives OpenBLAS more than one thread, and such a user can set it before
starting Python.
"""

import contextlib
import functools
import importlib
import os
import sys

from fastrun.devices.cpu import openblas

#: variable -> (default, other variables whose presence means the user already decided)
DEFAULTS = {
    "GOMP_SPINCOUNT": ("300000", ("OMP_WAIT_POLICY",)),
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
    """The threading layer numba's parallel kernels use in this process: ``omp`` where
    OpenMP loads, else ``tbb``, else ``workqueue`` (see the module docstring for why OpenMP
    first), or what the user set in ``NUMBA_THREADING_LAYER`` (a layer, or a property such as
    ``forksafe`` for numba to resolve).  Set in numba's configuration here, before its first
    parallel kernel runs (``CPUDevice`` calls this before it starts numba's pool), so that the
    layer the CPU category names is the one that runs."""
    import numba

    chosen = os.environ.get("NUMBA_THREADING_LAYER", "default").strip().lower() or "default"
    if chosen in ("tbb", "safe", "threadsafe", "forksafe"):
        _preload_tbb()
    if chosen == "default":
        if _loads("numba.np.ufunc.omppool"):
            chosen = "omp"
        else:
            _preload_tbb()
            chosen = "tbb" if _loads("numba.np.ufunc.tbbpool") else "workqueue"
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
