"""``fastrun tune`` on local worker processes (the path a tune without Ray takes, and the one
the Ray tests fall back to where namespaces are not allowed): the union of models' jobs,
results in the cache that a model run then hits, a worker killed mid-tune, a driver killed
with SIGKILL resuming, recorded problems as a source, failures recorded with their errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import fastrun
from fastrun.cache import FileCache, InMemoryCache, low_confidence
from fastrun.fleet.driver import check_worker, run_tune
from fastrun.fleet.engines import LocalEngine
from fastrun.fleet.jobs import read_times
from fastrun.fleet.tune import collect, tune
from fastrun.fleet.worker import WorkerSettings

DEVICE = "cpu:1"
SMALL = "zoo:squeezenet@32"
OTHER = "zoo:resnet18@32"
BUDGET = 0.003


def _idents(jobs):
    return {job.ident for job in jobs}


def test_two_models_tune_the_union_of_what_each_would_alone():
    both = collect([SMALL, OTHER], device=DEVICE)
    first, second = collect([SMALL], device=DEVICE), collect([OTHER], device=DEVICE)
    assert _idents(both) == _idents(first) | _idents(second)
    assert len(both) == len(_idents(both))  # each problem once
    # every job's children are jobs too, and come from the same walk
    idents = _idents(both)
    assert all(set(job.children) <= idents for job in both)
    assert any(job.children for job in both)  # Winograd and im2col wait for their GEMMs


def test_a_local_tune_fills_the_cache_that_a_model_run_then_hits(tmp_path):
    cache_path = str(tmp_path / "tuned.bin")
    jobs = collect([SMALL], device=DEVICE)
    summary = tune(jobs, cache_path, device=DEVICE, workers=2, budget_s=BUDGET, stream=None)
    assert summary.tuned == len(jobs) and not summary.failed
    # how sure the picks are: close calls (confirmed in rounds) and low-confidence ones
    assert 0 <= summary.close_calls + summary.low_confidence <= summary.tuned
    picks = next(line for line in summary.lines() if line.startswith("picks"))
    assert f"{summary.close_calls} close call(s)" in picks and "low-confidence" in picks
    assert sum(w.tuned for w in summary.workers) >= len(jobs)  # a long problem in parts
    assert all(w.tuned > 0 for w in summary.workers)  # both workers took work
    times = read_times(cache_path + ".times.jsonl")
    assert set(times) == _idents(jobs)
    # the runtime poses the same problems: a fast-run search of the model profiles nothing
    from fastrun.runtime import load

    session = fastrun.Session(device=DEVICE, cache=FileCache(cache_path), strategy="fast-run",
                              progress=False)
    load(SMALL, session).search()
    assert session.stats.profiled == session.stats.remeasured and session.stats.cache_hits > 0
    # a second tune finds everything done, but what a loaded machine timed unstably
    shaky = sum(1 for ident in _idents(jobs)
                if low_confidence(FileCache(cache_path).get(*ident) or ()) is not None)
    again = tune(collect([SMALL], device=DEVICE), cache_path, device=DEVICE, workers=1,
                 budget_s=BUDGET, stream=None)
    assert again.tuned == shaky and again.skipped == len(jobs) - shaky


class _KillingEngine(LocalEngine):
    """Kills the first worker's process right after handing it its second job."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handed = 0

    def submit(self, name, payload):
        super().submit(name, payload)
        if name == "local-1":
            self.handed += 1
            if self.handed == 2:
                os.kill(self._workers[name][0].pid, signal.SIGKILL)


def test_a_worker_killed_in_the_middle_loses_nothing(tmp_path):
    jobs = collect([SMALL], device=DEVICE)
    session = fastrun.Session(device=DEVICE, cache=InMemoryCache(), strategy="fast-run",
                              progress=False)
    categories = {op: session.chooser.category(session.registry.operator(op))
                  for op in {job.operator for job in jobs}}
    engine = _KillingEngine(WorkerSettings(device=DEVICE, budget_s=BUDGET), 2, 1)
    cache = FileCache(tmp_path / "killed.bin")
    summary = run_tune(jobs, cache, engine, session.device.category, categories, stream=None)
    assert summary.tuned == len(jobs) and not summary.failed
    lost = {w.name: w.lost for w in summary.workers}
    assert "exited" in lost["local-1"]
    assert all(cache.get(*job.ident) for job in jobs)


def test_a_worker_of_another_category_is_refused_with_the_fact_named():
    session = fastrun.Session(device=DEVICE, cache=InMemoryCache(), progress=False)
    category = session.chooser.category(session.registry.operator("conv"))
    other = category.replace(";threads=1;", ";threads=2;")
    assert other != category
    reason = check_worker({"categories": {"conv": other}}, {"conv": category})
    assert "threads 2 (worker) vs 1 (target)" in reason
    assert check_worker({"categories": {"conv": category}}, {"conv": category}) == ""


def test_recorded_problems_are_tuned_and_failures_are_recorded(tmp_path):
    record = tmp_path / "seen.jsonl"
    serving = fastrun.Session(device=DEVICE, cache=InMemoryCache(), strategy="heuristic",
                              record=record, progress=False)
    problem = serving.problem("matmul", [(24, 40), (40, 8)], ["float32"] * 2)
    serving.decide(problem)
    jobs = collect(problems_files=[str(record)], device=DEVICE)
    assert jobs[-1].key == problem.key  # after its sub-problems (Strassen's halves)
    assert jobs[-1].children and set(jobs[-1].children) <= {job.ident for job in jobs[:-1]}
    cache_path = str(tmp_path / "rec.bin")
    done = tune(jobs, cache_path, device=DEVICE, workers=1, budget_s=BUDGET, stream=None)
    assert done.tuned == len(jobs) and FileCache(cache_path).get(*jobs[-1].ident)
    # a workspace limit no algorithm of a big conv fits: the job fails on two attempts
    conv = collect([SMALL], device=DEVICE)
    failing = tune(conv, str(tmp_path / "tiny.bin"), device=DEVICE, workers=2,
                   budget_s=BUDGET, workspace_limit=1, stream=None)
    assert failing.failed
    for errors in failing.failed.values():
        assert errors[0].startswith("needs ") or len(errors) == 2
    assert any("NoUsableAlgorithmError" in " ".join(e) for e in failing.failed.values())


def test_problems_recorded_on_other_threads_are_tuned_with_a_warning(tmp_path):
    """The README's record -> tune -> run: problems recorded at 2 threads, tuned with --device
    cpu:1, would land in a category the recording machine never looks in.  tune says so,
    naming the fact and the --device that matches; with that device it says nothing."""
    record = tmp_path / "seen.jsonl"
    serving = fastrun.Session(device="cpu:2", cache=InMemoryCache(), strategy="heuristic",
                              record=record, progress=False)
    serving.decide(serving.problem("matmul", [(24, 40), (40, 8)], ["float32"] * 2))
    command = [sys.executable, "-m", "fastrun", "tune", "--problems", str(record),
               "--algo-policy", str(tmp_path / "t.bin"), "--list"]
    other = subprocess.run([*command, "--device", "cpu:1"], capture_output=True, text=True,
                           timeout=120)
    assert other.returncode == 0, other.stderr
    warning = next(line for line in other.stderr.splitlines() if "warning" in line)
    assert "1 problem(s) were recorded for another device" in warning
    assert "threads 2 (recorded) vs 1 (--device cpu:1)" in warning
    assert warning.endswith("tune with --device cpu:2 to match")
    same = subprocess.run([*command, "--device", "cpu:2"], capture_output=True, text=True,
                          timeout=120)
    assert same.returncode == 0 and "warning" not in same.stderr


def test_ctrl_c_stops_a_tune_with_its_summary_and_no_worker_tracebacks(tmp_path):
    """A terminal's Ctrl-C reaches the driver and its workers (one process group): the
    driver's summary says it was interrupted, exit status 130, and no worker prints a
    traceback."""
    cache_path = tmp_path / "ctrl-c.bin"
    times = tmp_path / "ctrl-c.bin.times.jsonl"
    driver = subprocess.Popen(
        [sys.executable, "-m", "fastrun", "tune", OTHER, "--algo-policy", str(cache_path),
         "--device", DEVICE, "--workers", "2", "--budget", str(BUDGET), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # SIGINT at its default disposition, as on a terminal, even when this test run
        # inherited it ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        if times.exists() and len(times.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    if driver.poll() is not None:
        pytest.fail(f"the tune ended before it could be interrupted: {driver.communicate()}")
    os.killpg(driver.pid, signal.SIGINT)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 130, (out, err)
    assert "interrupted: run the same command again to resume" in out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_a_driver_killed_with_sigkill_resumes_with_what_is_missing(tmp_path):
    cache_path = tmp_path / "resume.bin"
    times = tmp_path / "resume.bin.times.jsonl"
    command = [sys.executable, "-m", "fastrun", "tune", OTHER, "--algo-policy",
               str(cache_path), "--device", DEVICE, "--workers", "1", "--budget",
               str(BUDGET), "--no-progress"]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=False)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if times.exists() and len(times.read_text().splitlines()) >= 4:
            break
        if driver.poll() is not None:
            pytest.fail(f"the tune ended before it could be killed: {driver.communicate()}")
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    before = len(read_times(str(times)))
    total = len(collect([OTHER], device=DEVICE))
    assert 3 <= before < total
    done = subprocess.run([*command, "--json", str(tmp_path / "summary.json")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["skipped"] >= before - 1 and summary["skipped"] + summary["tuned"] == total
    cache = FileCache(cache_path)
    assert all(cache.get(*job.ident) for job in collect([OTHER], device=DEVICE))


def test_the_command_line_lists_simulates_and_refuses_bad_input_clearly(tmp_path, capsys):
    from fastrun.cli.main import main

    assert main(["tune", SMALL, "--list", "--device", DEVICE, "--algo-policy", "x.bin"]) == 0
    out = capsys.readouterr().out
    assert f"{len(collect([SMALL], device=DEVICE))} job(s)" in out and "needs " in out
    times = tmp_path / "t.jsonl"
    times.write_text('{"format": "fastrun-tune-times", "version": 1}\n'
                     '{"category": "c", "key": "a", "seconds": 3.0, "children": []}\n'
                     '{"category": "c", "key": "b", "seconds": 1.0, "children": [["c", "a"]]}\n')
    assert main(["tune", "--simulate", str(times), "--workers", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 4.0 | 4.0 | 1.00 | 100% |" in out and "| 4 | 4.0 | 4.0 | 1.00 | 25% |" in out
    not_problems = tmp_path / "cache.json"
    not_problems.write_text('{"format": "fastrun-cache-json", "version": 1}\n')
    for argv, message in [
        (["tune", SMALL], "needs --algo-policy"),
        (["tune", "--algo-policy", "c.bin"], "nothing to tune"),
        (["tune", SMALL, "--algo-policy", "c.bin", "--workers", "0"], "positive number"),
        (["tune", "--problems", str(not_problems), "--algo-policy", "c.bin"],
         "not a fastrun problems file"),
        (["tune", "--simulate", str(tmp_path / "none.jsonl")], "does not exist"),
        (["tune", "--simulate", str(not_problems)], "not a fastrun tune times log"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)


# -- one worker per device ----------------------------------------------------------------------
def test_several_devices_get_one_worker_each():
    from fastrun.fleet.engines import EngineError, worker_devices

    gpus = ["opencl:0:0", "opencl:0:1"]
    assert worker_devices(gpus, None) == gpus  # all of them by default
    assert worker_devices(gpus, 1) == ["opencl:0:0"]
    with pytest.raises(EngineError, match=r"2 devices of this kind .* --workers 2 or fewer"):
        worker_devices(gpus, 3)
    assert worker_devices(["cpu:1"], None) == ["cpu:1"]  # one device: the count shares it
    assert worker_devices(["cpu:1"], 3) == ["cpu:1"] * 3
    engine = LocalEngine(WorkerSettings(device="opencl:0:0"), None, None, gpus)
    assert engine.count == 2 and engine.devices == gpus
    if len(os.sched_getaffinity(0)) >= 2:  # the host's cores shared out between the GPUs
        first, second = engine.cpus
        assert first and second and not set(first) & set(second)


def test_each_local_worker_opens_the_device_it_was_given(tmp_path):
    """Two local workers given two device specs each report their own: the worker's device
    comes from the engine, not from the driver's settings."""
    engine = LocalEngine(WorkerSettings(device="cpu:1"), None, None, ["cpu:1", "cpu:2"])
    names = engine.start()
    try:
        devices = {engine.info(name)["device"] for name in names}
    finally:
        engine.close()
    assert len(devices) == 2 and any("threads=1" in d for d in devices)
    assert any("threads=2" in d for d in devices)


def test_a_low_confidence_pick_is_tuned_again(tmp_path):
    """A problem whose cached pick was timed unstably is not skipped as done: the tune
    measures it again (and the merge keeps the steadier measurement)."""
    import dataclasses

    from fastrun.cache import low_confidence

    record = tmp_path / "seen.jsonl"
    serving = fastrun.Session(device=DEVICE, cache=InMemoryCache(), strategy="heuristic",
                              record=record, progress=False)
    serving.decide(serving.problem("matmul", [(24, 40), (40, 8)], ["float32"] * 2))
    jobs = collect(problems_files=[str(record)], device=DEVICE)
    cache_path = str(tmp_path / "rec.bin")
    first = tune(jobs, cache_path, device=DEVICE, workers=1, budget_s=BUDGET, stream=None)
    assert first.tuned == len(jobs)
    category, key = jobs[-1].ident

    def shaken(data):  # as if the tune had run on a busy machine
        data[category][key] = [dataclasses.replace(e, spread_s=2 * e.time_s + 1e-3)
                               for e in data[category][key]]
        return data

    FileCache(cache_path).rewrite(shaken)
    assert low_confidence(FileCache(cache_path).get(category, key)) is not None
    again = tune(jobs, cache_path, device=DEVICE, workers=1, budget_s=BUDGET, stream=None)
    assert again.tuned == 1 and again.skipped == len(jobs) - 1


def test_an_interrupt_in_a_native_callback_prints_no_traceback(monkeypatch, capsys):
    """A Ctrl-C that lands in a callback from native code (llvmlite's object cache while
    numba compiles) cannot be raised; Python would print it with a traceback. The tune's
    processes drop that echo; any other unraisable exception is still printed."""
    import ctypes

    from fastrun.fleet.engines import quiet_interrupts

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    quiet_interrupts()

    def raising(error):
        @ctypes.CFUNCTYPE(None)
        def callback():
            raise error
        callback()

    raising(KeyboardInterrupt())
    assert "Traceback" not in capsys.readouterr().err
    raising(ValueError("a real fault"))
    assert "ValueError: a real fault" in capsys.readouterr().err
