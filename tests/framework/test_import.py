"""The framework must not depend on the compute library, nor pull heavy imports at import."""

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
    modules = _modules_after("import fastrun, fastrun.opencl, fastrun.chooser, fastrun.api\n"
                             "fastrun.get_device('cpu').category")
    assert "pyopencl" not in modules


def test_framework_modules_never_import_the_compute_library():
    code = ("import fastrun.chooser, fastrun.api, fastrun.cli.main, fastrun.cache, "
            "fastrun.profiler")
    modules = _modules_after(code)
    assert not any(m.startswith("fastrun_algorithms") for m in modules)


def test_the_library_arrives_through_the_entry_point():
    from fastrun.registry import Registry

    registry = Registry()
    assert "matmul" in registry.operators()
    assert not registry.plugin_errors


def test_import_sets_quiet_thread_pool_defaults_but_keeps_the_users():
    code = "import os, fastrun; print(os.environ['OMP_WAIT_POLICY'], " \
           "os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["passive", "20"]
    env["OPENBLAS_THREAD_TIMEOUT"] = "28"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["passive", "28"]
