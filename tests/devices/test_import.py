"""The framework must not depend on the compute library, nor pull heavy imports at import."""

import json
import os
import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    script = f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    output = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                            text=True).stdout
    return set(output.split())


def test_import_fastrun_does_not_import_the_compute_library_or_heavy_packages():
    modules = _modules_after("import fastrun")
    assert not any(m.startswith("fastrun_algorithms") for m in modules)
    for heavy in ("numba", "pyopencl", "onnx", "msgpack", "filelock"):
        assert heavy not in modules, f"import fastrun imported {heavy}"


def test_opencl_support_imports_pyopencl_only_when_a_device_is_opened():
    modules = _modules_after("import fastrun, fastrun.devices.opencl, fastrun.core.chooser\n"
                             "import fastrun.api\nfastrun.get_device('cpu').category")
    assert "pyopencl" not in modules


def test_framework_modules_never_import_the_compute_library():
    code = ("import fastrun.core.chooser, fastrun.api, fastrun.cli.main, fastrun.cache, "
            "fastrun.core.profiler")
    modules = _modules_after(code)
    assert not any(m.startswith("fastrun_algorithms") for m in modules)


def test_the_library_arrives_through_the_entry_point():
    from fastrun.registry import Registry

    registry = Registry()
    assert "matmul" in registry.operators()
    assert not registry.plugin_errors


def _json_after_import(body: str, cleared: tuple[str, ...], numpy_first: bool = False,
                       **given: str):
    """What ``body`` prints as JSON in a fresh interpreter, with the variables ``cleared``
    removed from the environment and ``given`` set (numpy imported before fastrun or not)."""
    code = ("import numpy; " if numpy_first else "") + "import json, os, fastrun; " + body
    env = {k: v for k, v in os.environ.items() if k not in cleared}
    env.update(given)
    # A crash names its place: one run of the threading-layer test died of SIGSEGV once in
    # about 500 (not reproduced since); faulthandler prints the Python stack if it recurs.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"exit status {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def _environment_after_import(numpy_first: bool = False, **given: str
                              ) -> dict[str, str | None]:
    names = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
             "GOTO_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT")
    values, category = _json_after_import(
        "from fastrun.devices.cpu import CPUDevice; category = CPUDevice(1).category; "
        f"print(json.dumps([{{n: os.environ.get(n) for n in {names!r}}}, category]))",
        names, numpy_first, **given)
    return {**values, "category": category}


def test_import_alone_changes_no_thread_setting():
    """An embedding program that only imports fastrun keeps its environment and its BLAS."""
    names = ("GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT",
             "NUMPY_MADVISE_HUGEPAGE")
    values = _json_after_import(f"print(json.dumps({{n: os.environ.get(n) for n in {names!r}}}))",
                                names)
    assert values == dict.fromkeys(names)


def test_a_cpu_device_makes_numba_the_one_spinning_pool_but_keeps_the_users_choices():
    """configure_threads, which creating a CPU device (every session, every command) calls."""
    got = _environment_after_import()
    assert (got["GOMP_SPINCOUNT"], got["OPENBLAS_NUM_THREADS"],
            got["OPENBLAS_THREAD_TIMEOUT"]) == ("300000", "1", "20")
    assert got["OMP_WAIT_POLICY"] is None and "blas_threads=1;" in got["category"]
    # a value the user set is kept
    got = _environment_after_import(OPENBLAS_THREAD_TIMEOUT="28", GOMP_SPINCOUNT="0")
    assert (got["OPENBLAS_THREAD_TIMEOUT"], got["GOMP_SPINCOUNT"]) == ("28", "0")
    # a user who chose a wait policy or thread counts decided: no default overrides that
    got = _environment_after_import(OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="2")
    assert got["GOMP_SPINCOUNT"] is None and got["OPENBLAS_NUM_THREADS"] is None
    assert "blas_threads=2;" in got["category"]
    got = _environment_after_import(OPENBLAS_NUM_THREADS="2")
    assert got["OPENBLAS_NUM_THREADS"] == "2" and "blas_threads=2;" in got["category"]


def test_numpy_imported_first_still_gets_one_blas_thread_unless_the_user_chose():
    """OpenBLAS read its variables before fastrun could set them: fastrun asks it directly,
    and the category reports what OpenBLAS really has."""
    assert "blas_threads=1;" in _environment_after_import(numpy_first=True)["category"]
    got = _environment_after_import(numpy_first=True, OPENBLAS_NUM_THREADS="2")
    assert "blas_threads=2;" in got["category"]


def _huge_page_advice(numpy_first: bool, **given: str) -> list:
    """[the variable, numpy's advice after import, after the first CPU device]."""
    return _json_after_import(
        "import numpy; from fastrun.devices.cpu import memory as _memory; "
        "before = _memory.huge_page_advice(); "
        "from fastrun.devices.cpu import CPUDevice; CPUDevice(1); "
        "print(json.dumps([os.environ.get('NUMPY_MADVISE_HUGEPAGE'), before, "
        "_memory.huge_page_advice()]))", ("NUMPY_MADVISE_HUGEPAGE",), numpy_first, **given)


def test_the_first_cpu_device_turns_numpys_huge_page_advice_off_unless_the_user_chose():
    """``import fastrun`` leaves numpy's advice (and the environment) alone; the first CPU
    device turns it off through numpy's switch, setting no variable, whether numpy was
    imported before fastrun or after.  A user's NUMPY_MADVISE_HUGEPAGE is obeyed."""
    assert _huge_page_advice(numpy_first=False) == [None, True, False]
    assert _huge_page_advice(numpy_first=True) == [None, True, False]
    assert _huge_page_advice(False, NUMPY_MADVISE_HUGEPAGE="1") == ["1", True, True]
    assert _huge_page_advice(True, NUMPY_MADVISE_HUGEPAGE="0") == ["0", False, False]


_FAULTS_OF_REUSE = """
import json, resource, numpy, fastrun
from fastrun.devices.cpu import memory as _memory
{setup}
def faults_of_one_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = numpy.empty(48 << 20, dtype=numpy.uint8)
    block[::4096] = 1  # touch every page
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_block()
print(json.dumps([faults_of_one_block(), faults_of_one_block()]))
"""


def _faults_of_reusing_a_48mb_block(setup: str, **given: str) -> list[int]:
    env = {k: v for k, v in os.environ.items() if k != "FASTRUN_KEEP_PAGES"}
    env["NUMPY_MADVISE_HUGEPAGE"] = "0"  # 4 KB pages throughout: every page is one fault
    env.update(given)
    out = subprocess.run([sys.executable, "-c", _FAULTS_OF_REUSE.format(setup=setup)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_a_cpu_model_keeps_freed_pages_for_the_next_inference_unless_told_not_to():
    """A 48 MB block (above glibc's largest mmap threshold) freed and allocated again: 12,288
    fresh pages each time by default, none once a CPU model asked glibc to keep them."""
    pages = (48 << 20) // 4096
    assert min(_faults_of_reusing_a_48mb_block("")) >= pages
    model = "import fastrun.runtime; fastrun.runtime.load('zoo:squeezenet', batch=1)"
    assert max(_faults_of_reusing_a_48mb_block(model)) < pages // 100
    assert min(_faults_of_reusing_a_48mb_block(model, FASTRUN_KEEP_PAGES="0")) >= pages
    assert max(_faults_of_reusing_a_48mb_block("assert _memory.keep_freed_pages()")) < pages // 100


def _layer_after_a_parallel_kernel(activate_first: bool = False, **given: str
                                   ) -> tuple[str, str]:
    """(the category's layer fact, numba's threading layer after a parallel kernel ran); with
    ``activate_first``, the device starts numba's pool before anything reads its category, as
    a session does."""
    start = "device.activate(); " if activate_first else ""
    return tuple(_json_after_import(
        "import numba, numpy as np; from fastrun.devices.cpu import CPUDevice; "
        f"device = CPUDevice(2); {start}"
        "kernel = numba.njit(parallel=True)(lambda x: sum([x[i] for i in numba.prange(4)])); "
        "kernel(np.ones(4)); category = device.category; "
        "print(json.dumps([category.rsplit(';', 1)[1], numba.threading_layer()]))",
        ("NUMBA_THREADING_LAYER",), **given))


def test_numba_runs_on_the_threading_layer_the_category_names():
    """OpenMP by default (its regions cost less, see fastrun/devices/cpu/threads.py); TBB,
    where the user asks for it, found where pip put it without any loader path set; a layer
    the user chose is kept and named.  A session starts numba's pool before it reads the
    category: the layer is decided first even then (it once ran OpenMP under a category that
    named TBB)."""
    assert _layer_after_a_parallel_kernel() == ("layer=omp", "omp")
    assert _layer_after_a_parallel_kernel(activate_first=True) == ("layer=omp", "omp")
    assert _layer_after_a_parallel_kernel(True, NUMBA_THREADING_LAYER="tbb") == ("layer=tbb",
                                                                                "tbb")
    assert _layer_after_a_parallel_kernel(NUMBA_THREADING_LAYER="omp") == ("layer=omp", "omp")
