"""Plugin loading under concurrency, with the real plugins, each case in a fresh interpreter
(the process-wide registry loads its plugins once per process)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RACE = """
import json, threading, numpy as np, fastrun
barrier = threading.Barrier(8)
errors = []
def first_call():
    barrier.wait()  # all eight make their first lookup together
    try:
        fastrun.call("matmul", np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))
    except Exception as error:
        errors.append(repr(error))
threads = [threading.Thread(target=first_call) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(errors))
"""

EARLY_REGISTRATION = """
import json, numpy as np, fastrun
from fastrun.algorithm import Algorithm
from fastrun.registry import default_registry

class Transposed(Algorithm):
    operator = "matmul"
    name = "user_transposed"
    def run(self, problem, inputs, ctx, prepared=None):
        return np.ascontiguousarray((inputs[1].T @ inputs[0].T).T)

default_registry().register_algorithm(Transposed())  # before any lookup
names = [a.desc.name for a in default_registry().algorithms("matmul")]
out = fastrun.call("matmul", np.eye(3, dtype=np.float32), np.ones((3, 2), np.float32))
print(json.dumps([names, out.tolist()]))
"""


def _run(code: str):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_eight_threads_whose_first_call_is_the_first_lookup_all_find_the_plugins():
    for _ in range(3):  # the race lost 7 of 8 threads in 10 of 10 runs before the fix
        assert _run(RACE) == []


def test_an_algorithm_registered_before_any_lookup_joins_the_plugins():
    names, out = _run(EARLY_REGISTRATION)
    assert "user_transposed" in names and "blas" in names
    assert out == [[1.0, 1.0]] * 3


# -- a third party's plugin loads whatever the order of entry points (issue 32, D6) ----------

DOC_PLUGIN = '''
import numpy as np
from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute


class TransposedBlas(Algorithm):
    operator = "matmul"
    name = "blas_bt"
    attributes = AlgoAttribute.REPRODUCIBLE

    def unusable_reason(self, problem):
        return None if len(problem.shapes[1]) == 2 else "B must be 2-D"

    def workspace_bytes(self, problem):
        k, n = problem.shapes[1]
        return k * n * np.dtype(problem.dtypes[1]).itemsize

    def run(self, problem, inputs, ctx, prepared=None):
        a, b = inputs
        return a @ np.ascontiguousarray(b.T).T


def register(registry):
    registry.register_algorithm(TransposedBlas())
'''

LIST_MATMUL = """
import json
from fastrun.registry import default_registry
registry = default_registry()
names = [a.desc.name for a in registry.algorithms("matmul")]
print(json.dumps([registry.plugin_errors, "blas_bt" in names, "blas" in names]))
"""


def _install_plugin(site: Path, distribution: str, module: str) -> None:
    """The documented example (docs/adding-an-algorithm.md), installed as a distribution of
    its own: a module and a dist-info naming its entry point."""
    (site / f"{module}.py").write_text(DOC_PLUGIN)
    info = site / f"{distribution}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fastrun.plugins]\n{module} = {module}:register\n")


@pytest.mark.parametrize("distribution", ["evilalgs", "aaa-first", "blas-bt-plugin", "zzz-last"])
def test_a_plugin_loads_whatever_its_name_and_place_among_the_entry_points(tmp_path,
                                                                          distribution):
    site = tmp_path / "site"
    site.mkdir()
    module = distribution.replace("-", "_")
    _install_plugin(site, distribution, module)
    # first on the path: its entry point comes before the compute library's
    done = subprocess.run([sys.executable, "-c", LIST_MATMUL], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(site)})
    errors, has_plugin, has_library = json.loads(done.stdout.strip().splitlines()[-1])
    assert errors == {} and has_plugin and has_library


def test_a_plugin_whose_operator_nobody_registers_fails_naming_it(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _install_plugin(site, "orphan", "orphan")
    source = (site / "orphan.py").read_text().replace('operator = "matmul"',
                                                     'operator = "no_such_op"')
    (site / "orphan.py").write_text(source)
    done = subprocess.run([sys.executable, "-c", LIST_MATMUL], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(site)})
    errors, _, has_library = json.loads(done.stdout.strip().splitlines()[-1])
    assert "no_such_op" in errors["orphan"] and has_library


# -- without a writable numba cache the library loads, uncached (issue 32, D7) ---------------

def test_without_a_writable_numba_cache_the_library_loads_uncached_with_one_warning(tmp_path):
    """A read-only install, no home and no NUMBA_CACHE_DIR: numba refuses cache=True at
    decoration, and every command used to say "unknown operator 'matmul' (registered: none)"."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("no setpriv: root's permission bypass cannot be dropped here")
    install = tmp_path / "install"
    install.mkdir()
    for package in (REPO / "fastrun", REPO / "algorithms" / "fastrun_algorithms"):
        shutil.copytree(package, install / package.name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for path in [install, *install.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)  # read-only, for its owner too
    code = ("import numpy as np, fastrun\n"
            f"assert fastrun.__file__.startswith({str(install)!r})\n"
            "out = fastrun.call('matmul', np.ones((4, 4), np.float32), "
            "np.ones((4, 4), np.float32))\n"
            "print(out[0, 0])\n")
    prefix = (["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
              if os.geteuid() == 0 else [])
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300,
                              env={**env, "HOME": "/proc/nonexistent",
                                   "PYTHONPATH": str(install)})
    finally:
        for path in [install, *install.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4.0"
    assert done.stderr.count("numba cannot cache compiled kernels here") == 1, done.stderr
