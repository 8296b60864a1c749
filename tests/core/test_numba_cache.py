"""numba's cached kernels are swept when any source of their package changes: a kernel that
inlines a helper from another file would otherwise keep the old helper (numba checks only the
kernel's own file)."""

from __future__ import annotations

import os
import pathlib

from fastrun import numba_cache


def _tree(root):
    package = root / "kernels"
    (package / "__pycache__").mkdir(parents=True)
    (package / "conv").mkdir()
    (package / "conv" / "__pycache__").mkdir()
    (package / "helpers.py").write_text("def activate(x):\n    return x\n")
    (package / "conv" / "tiled.py").write_text("from kernels.helpers import activate\n")
    return package


def _cache_files(package):
    for name in ("conv/__pycache__/tiled.kernel-1.py311.nbi",
                 "conv/__pycache__/tiled.kernel-1.py311.1.nbc"):
        (package / name).write_bytes(b"cached")
    return sorted(p.name for p in package.rglob("__pycache__/*.nb?"))


def test_kernels_go_when_a_helper_in_another_file_changes(tmp_path):
    package = _tree(tmp_path)
    assert _cache_files(package)
    assert numba_cache.sweep_stale_kernels(package) == 2  # no stamp yet: nothing is trusted
    kept = _cache_files(package)
    assert numba_cache.sweep_stale_kernels(package) == 0  # nothing changed: kept
    assert sorted(p.name for p in package.rglob("__pycache__/*.nb?")) == kept
    helper = package / "helpers.py"
    helper.write_text("def activate(x):\n    return max(x, 0)\n")
    os.utime(helper, ns=(helper.stat().st_atime_ns, helper.stat().st_mtime_ns + 10**9))
    assert numba_cache.sweep_stale_kernels(package) == 2
    assert not list(package.rglob("__pycache__/*.nb?"))
    assert (package / "__pycache__" / numba_cache.STAMP).exists()


def test_a_tree_it_cannot_write_is_left_alone(tmp_path, monkeypatch):
    """A read-only install: the first deletion fails, and the import goes on."""
    package = _tree(tmp_path)
    cached = _cache_files(package)

    def refuse(*args, **kwargs):
        raise PermissionError("read-only")

    monkeypatch.setattr(pathlib.Path, "unlink", refuse)
    assert numba_cache.sweep_stale_kernels(package) == 0
    assert sorted(p.name for p in package.rglob("__pycache__/*.nb?")) == cached
    assert not (package / "__pycache__" / numba_cache.STAMP).exists()


def test_the_compute_library_is_stamped_when_imported():
    import fastrun_algorithms

    package = os.path.dirname(fastrun_algorithms.__file__)
    assert os.path.exists(os.path.join(package, "__pycache__", numba_cache.STAMP))
