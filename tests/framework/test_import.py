"""The framework must not depend on the compute library, nor pull heavy imports at import."""

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
