"""A benchmark variant runs the tree its ``PYTHONPATH`` names: framework and compute library
alike (``benchmarks._common.run_worker``).  ``python -m`` from the repository root once put
this tree's ``fastrun`` ahead of a variant's, so an "old code" variant ran the old compute
library under the new framework."""

from __future__ import annotations

from pathlib import Path

from benchmarks._common import run_worker

REPO = Path(__file__).resolve().parents[1]

PROBE = """import json
import fastrun
print(json.dumps({"fastrun": fastrun.__file__}))
"""


def test_a_worker_imports_the_variants_fastrun_and_otherwise_this_trees(tmp_path):
    (tmp_path / "variant_probe.py").write_text(PROBE)
    plain = run_worker("variant_probe", [], "probe", {"PYTHONPATH": str(tmp_path)})
    assert Path(plain["fastrun"]).resolve().is_relative_to(REPO)
    fake = tmp_path / "fastrun"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    variant = run_worker("variant_probe", [], "probe", {"PYTHONPATH": str(tmp_path)})
    assert Path(variant["fastrun"]).resolve() == (fake / "__init__.py").resolve()
