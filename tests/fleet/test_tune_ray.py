"""``fastrun tune --ray`` on a real Ray cluster of three nodes on this machine, inside a
network namespace of the test's own (``unshare -n``, ``lo`` up), so that every connection stays
on 127.0.0.1: two models tuned into one cache give the union of their problems, a node whose
category differs is refused with the fact named, and a node killed in the middle of a tune
loses nothing.  Where Ray is not installed or namespaces are not allowed, these skip with the
reason; test_tune_local.py covers the same scheduler and driver on local processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from fastrun.cache import FileCache
from fastrun.fleet.tune import collect

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _why_not() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'fastrun[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is missing: no network namespace for the cluster"
    done = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"network namespaces are not allowed here: {done.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    scratch = str(tmp_path_factory.mktemp("ray"))
    done = subprocess.run(["unshare", "-n", sys.executable, "-m", "tests.fleet._ray_cluster",
                           scratch], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["scratch"] = scratch
    return result


def _all_in_cache(path: str, models: list[str]) -> None:
    cache = FileCache(path)
    missing = [job.key for job in collect(models, device="cpu:1") if not cache.get(*job.ident)]
    assert not missing, missing[:5]


def test_two_models_on_the_cluster_give_the_union_and_the_odd_node_is_refused(outcome):
    union = outcome["union"]
    assert union["returncode"] == 0, union["stderr"]
    models = ["zoo:squeezenet@32", "zoo:resnet18@32"]
    assert union["tuned"] == len(collect(models, device="cpu:1"))
    _all_in_cache(os.path.join(outcome["scratch"], "union.bin"), models)
    refused = [w for w in union["workers"] if w["refused"]]
    assert len(refused) == 1 and "layer" in refused[0]["refused"]
    assert "workqueue (worker)" in refused[0]["refused"]
    assert sum(w["tuned"] > 0 for w in union["workers"]) == 2  # both good nodes took work


def test_a_node_killed_in_the_middle_of_a_tune_loses_nothing(outcome):
    killed = outcome["killed"]
    assert killed["killed"] and killed["returncode"] == 0, killed["stderr"]
    _all_in_cache(os.path.join(outcome["scratch"], "killed.bin"), ["zoo:resnet18@64"])
    assert any(w["lost"] for w in killed["workers"]), killed["workers"]


def test_ctrl_c_stops_a_cluster_tune_with_its_summary_and_no_traceback(outcome):
    """A terminal's Ctrl-C (SIGINT to the driver's process group) ends a tune on the
    cluster: exit status 130, the summary says it was interrupted and keeps what was tuned,
    and no traceback is printed."""
    interrupted = outcome["interrupted"]
    assert interrupted["killed"] and interrupted["returncode"] == 130, interrupted["stderr"]
    assert "interrupted: run the same command again to resume" in interrupted["stdout"]
    assert "Traceback" not in interrupted["stderr"]
    assert interrupted["interrupted"] and interrupted["tuned"] >= 1


def test_an_opencl_tune_runs_one_actor_per_gpu(outcome):
    """A node declaring two GPUs gets two actors, each holding one GPU; the nodes without
    GPUs get one actor each, and every recorded problem is tuned."""
    gpus = outcome["gpus"]
    if "not_run" in gpus:
        pytest.skip(gpus["not_run"])
    assert gpus["returncode"] == 0, gpus["stderr"]
    names = [w["name"] for w in gpus["workers"]]
    assert sum(name.endswith(("/gpu-0", "/gpu-1")) for name in names) == 2, names
    assert not any(w["refused"] for w in gpus["workers"] if "/gpu-" in w["name"])
    assert gpus["tuned"] == gpus["jobs"] - gpus["skipped"]
