"""``fastrun tune`` as a library call: problems from models, suites and problems files, tuned
into one cache by local processes or a Ray cluster, or replayed on paper.

    from fastrun.fleet.tune import collect, tune, simulate_times
    jobs = collect(models=["zoo:resnet18"], device="cpu:1")
    summary = tune(jobs, "cache.bin", device="cpu:1", workers=2)
    print("\\n".join(summary.lines()))
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO

from fastrun import category
from fastrun.cache import FileCache
from fastrun.devices import split_spec
from fastrun.fleet.driver import TuneSummary, run_tune
from fastrun.fleet.engines import LocalEngine, RayEngine
from fastrun.fleet.jobs import TuneJob, apply_times, collect_jobs, read_times
from fastrun.fleet.scheduler import Simulation, simulate
from fastrun.fleet.worker import WorkerSettings, forwarded_environment, tuning_session


def collect(models: Sequence[str] = (), suites: Sequence[str] = (),
            problems_files: Sequence[str] = (), device: str = "cpu", batch: int | None = None,
            workspace_limit: int | None = None, stream: TextIO | None = None
            ) -> list[TuneJob]:
    """The jobs of every source, each (category, key) once, sub-problems included.

    ``models``: ``zoo:NAME`` or ``.onnx`` paths (at ``batch``); ``suites``: built-in suite
    names; ``problems_files``: files a session recorded with ``record=PATH``.  A recorded
    problem that this fastrun cannot pose (an operator it lacks, a changed parameter) is
    reported on ``stream`` and left out.
    """
    from fastrun.analysis.suites import get_suite, model_suite
    from fastrun.cache.problems import read_problems

    session = tuning_session(device, workspace_limit=workspace_limit)
    registry = session.registry
    found = []
    for model in models:
        suite = model_suite(model, registry, name=model, batch=batch,
                            device_kind=session.device.kind)
        found += [(p, f"{model} {sp.label}") for sp, p in suite.build(registry)]
    for name in suites:
        suite = get_suite(name, registry, device_kind=session.device.kind)
        found += [(p, f"suite {name} {sp.label}") for sp, p in suite.build(registry)]
    for path in problems_files:
        elsewhere: dict[str, int] = {}  # a recorded category's device part -> problems
        for record in read_problems(path):
            try:
                operator = registry.operator(record.operator)
                problem = operator.problem(record.shapes, record.dtypes, **record.params)
            except (KeyError, ValueError, TypeError) as error:
                if stream is not None:
                    stream.write(f"tune: {path}: left out {record.operator}({record.key}): "
                                 f"{error}\n")
                continue
            recorded_device = category.split(record.category)[0]
            if recorded_device != category.split(session.chooser.category(operator))[0]:
                elsewhere[recorded_device] = elsewhere.get(recorded_device, 0) + 1
            found.append((problem, f"recorded in {os.path.basename(path)}"))
        if stream is not None:
            for recorded_device, count in elsewhere.items():
                stream.write(other_device_warning(path, count, recorded_device,
                                                  session.device.category, device) + "\n")
    return collect_jobs(found, session.chooser)


def other_device_warning(path: str, count: int, recorded: str, tuning: str,
                         device: str) -> str:
    """The warning for problems recorded on another device than the tune's: a run there looks
    in the recorded category and would miss what this tune writes.  Names the facts that
    differ and, for a CPU that differs only in its thread count, the --device that matches."""
    found = category.device_differences(recorded, tuning)
    why = "; ".join(d.describe(("recorded", f"--device {device}")) for d in found)
    hint = ""
    cpu = category.parse_device(recorded)[0] == (category.DEVICE, "cpu")
    if cpu and [d.fact for d in found] == ["threads"] and found[0].cache is not None:
        hint = f"; tune with --device cpu:{found[0].cache} to match"
    return (f"tune: warning: {path}: {count} problem(s) were recorded for another device than "
            f"this tune's ({category.printable(why or recorded)}), so a run there will not find "
            f"what this tune writes{hint}")


def default_times_path(cache_path: str) -> str:
    return os.fspath(cache_path) + ".times.jsonl"


def tune(jobs: list[TuneJob], cache_path: str, device: str = "cpu",
         workers: int | None = None, ray: str | None = None, timeout_s: float | None = None,
         budget_s: float | None = None, workspace_limit: int | None = None,
         times_path: str | None = None, stream: TextIO | None = sys.stderr,
         max_failures: int = 2) -> TuneSummary:
    """Tune ``jobs`` into the cache file at ``cache_path`` (created if needed).  ``ray``: a
    Ray address ('auto' for the local cluster) for one worker per node (per GPU on an OpenCL
    device); else ``workers`` local processes: by default one per device where ``device``
    names a kind with several on this machine (``opencl`` on a machine of several GPUs), else
    one.  Earlier search times in the times log order the work; this
    tune's are appended to it."""
    session = tuning_session(device, workspace_limit=workspace_limit)
    registry = session.registry
    operators = sorted({job.operator for job in jobs})
    categories = {name: session.chooser.category(registry.operator(name)) for name in operators}
    times_path = times_path or default_times_path(cache_path)
    if os.path.exists(times_path):
        apply_times(jobs, read_times(times_path))
    settings = WorkerSettings(device=session.device.spec, budget_s=budget_s,
                              workspace_limit=workspace_limit,
                              environment=forwarded_environment())
    if ray:
        engine = RayEngine(settings, ray, workers)
    else:
        # 'opencl:0:1' names one device; 'opencl' lets the tune take all
        named = bool(split_spec(device)[1])
        devices = [session.device.spec] if named else session.device.fleet_specs()
        engine = LocalEngine(settings, workers, getattr(session.device, "threads", None),
                             devices)
    cache = FileCache(cache_path)
    return run_tune(jobs, cache, engine, session.device.category, categories,
                    timeout_s=timeout_s, times_path=times_path, stream=stream,
                    max_failures=max_failures)


def simulate_times(times_path: str, workers: Sequence[int]) -> list[Simulation]:
    """Replay a times log on each fleet size: the jobs it recorded, their dependencies, their
    search times and the seconds per candidate (what splitting a long problem into parts is
    planned from), through the tune's scheduler."""
    records = read_times(times_path)
    if not records:
        raise ValueError(f"{times_path} records no job")
    jobs = [TuneJob(r.get("operator", ""), (), (), (), ident[1], ident[0], "",
                    tuple(tuple(c) for c in r["children"]),
                    candidates=tuple(r.get("candidates") or ()))
            for ident, r in records.items()]
    apply_times(jobs, records)
    return [simulate(jobs, count) for count in workers]
