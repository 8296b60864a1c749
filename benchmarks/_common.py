"""Shared by the benchmark scripts: machine description and robust timing."""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable


def machine() -> str:
    from fastrun.devices.cpu.vectors import cpu_model_and_flags

    model, _ = cpu_model_and_flags()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, Python {platform.python_version()}"


def header(title: str) -> str:
    today = datetime.date.today().isoformat()
    return f"# {title}\n# {today} on {machine()}"


def time_calls(function: Callable[[], object], number: int) -> float:
    """Seconds per call over ``number`` back-to-back calls, garbage collector off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            function()
        return (time.perf_counter() - start) / number
    finally:
        if was_enabled:
            gc.enable()


def call_times(function: Callable[[], object], calls: int) -> list[float]:
    """Seconds of each of ``calls`` back-to-back calls: a steady loop as a user runs it,
    timed call by call so that medians and tails can be read from it (warm up first)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def run_worker(module: str, arguments: list[str], what: str,
               env: dict[str, str] | None = None) -> dict:
    """Run ``python -m module arguments`` from the repository root, a measurement in a process
    of its own, and return the JSON object its last output line holds; a failed worker ends
    the benchmark with ``what`` and the end of its stderr.

    The worker runs with ``-P`` and the repository root last on its ``PYTHONPATH``: ``-m``
    would otherwise put the root (the working directory) first on ``sys.path``, so a variant
    whose ``PYTHONPATH`` names another tree (``--variant "old:PYTHONPATH=OLD/algorithms:OLD"``)
    got that tree's compute library but this tree's ``fastrun``."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    merged = {**os.environ, **(env or {})}
    paths = [p for p in merged.get("PYTHONPATH", "").split(os.pathsep) if p]
    merged["PYTHONPATH"] = os.pathsep.join([*paths, root])
    done = subprocess.run([sys.executable, "-P", "-m", module, *arguments], env=merged,
                          capture_output=True, text=True, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def steady_loop(run: Callable[[], object], iters: int, warmup: int) -> dict:
    """A process's steady state, as a user's serving loop sees it: warm up, then time
    ``iters`` calls one by one.  Page faults per call tell fresh memory apart."""
    import resource

    for _ in range(warmup):
        run()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = call_times(run, iters)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    times_ms = sorted(t * 1e3 for t in times)
    return {"median_ms": statistics.median(times_ms),
            "p90_ms": times_ms[min(len(times_ms) - 1, int(0.9 * len(times_ms)))],
            "faults_per_iter": faults / iters, "times_ms": times_ms}


def model_spec(name: str) -> str:
    """What a benchmark's ``--models`` entry names: an ONNX file (a path ending in
    ``.onnx``, e.g. a torchvision export) or a full spec (``zoo:resnet18@160``) as it is, else
    a zoo model (``zoo:NAME``)."""
    return name if ":" in name or name.endswith(".onnx") else f"zoo:{name}"


def model_label(name: str) -> str:
    """A ``--models`` entry as tables and cache files name it: a file's name without
    ``.onnx``."""
    return os.path.basename(name)[:-len(".onnx")] if name.endswith(".onnx") else name


def model_proto(model_spec: str):
    """The ModelProto of a zoo spec (``zoo:NAME``, ``zoo:NAME@PIXELS``) or an ONNX file."""
    import onnx

    from fastrun.runtime import zoo

    return zoo.resolve(model_spec) if model_spec.startswith(zoo.PREFIX) else \
        onnx.load(model_spec)


def ort_session(model_spec: str, threads: int):
    """onnxruntime on a model spec (:func:`model_proto`): the CPU provider with ``threads``
    intra-op threads, sequential: the peer every model benchmark uses."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(model_proto(model_spec).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def ort_steady_loop(model_spec: str, batch: int, threads: int, iters: int, warmup: int) -> dict:
    """onnxruntime's steady state on random inputs of ``batch``, for a process of its own."""
    import numpy as np

    session = ort_session(model_spec, threads)
    spec = session.get_inputs()[0]
    shape = [batch, *spec.shape[1:]]
    feeds = {spec.name: np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)}
    return steady_loop(lambda: session.run(None, feeds), iters, warmup)


def openvino_available() -> bool:
    """Whether OpenVINO can be imported here (the ``bench`` extra installs it)."""
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def openvino_steady_loop(model_spec: str, batch: int, threads: int, iters: int,
                         warmup: int) -> dict:
    """OpenVINO's steady state on the same ONNX model: its CPU plugin with ``threads``
    inference threads, one stream and the latency hint (one request at a time, as the other
    engines run), in float32 (on a processor with AMX or AVX-512 BF16 the plugin would
    otherwise compute in bfloat16: 2.5x onnxruntime's speed on the lent Xeon, and not the
    same arithmetic), for a process of its own."""
    import tempfile

    import numpy as np
    import openvino as ov

    core = ov.Core()
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "model.onnx")
        with open(path, "wb") as stream:
            stream.write(model_proto(model_spec).SerializeToString())
        model = core.read_model(path)
    shape = [batch, *model.inputs[0].get_partial_shape()[1:].to_shape()]
    model.reshape({model.inputs[0].get_any_name(): shape})
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                 "NUM_STREAMS": 1,
                                                 "PERFORMANCE_HINT": "LATENCY",
                                                 "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    feeds = {0: np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)}
    return steady_loop(lambda: request.infer(feeds), iters, warmup)


class BackgroundLoad:
    """``count`` processes that each keep one core busy while the measurements run: a server
    shared with other work (the issue of a pool that spins and never yields)."""

    def __init__(self, count: int) -> None:
        import subprocess
        import sys

        self.processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                          for _ in range(count)]

    def __enter__(self) -> BackgroundLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait()


def _fastrun_model(model_spec: str, batch: int, threads: int, strategy: str,
                   cache: str | None, **options):
    import fastrun
    from fastrun.cache import InMemoryCache
    from fastrun.runtime import load

    session = fastrun.session(cache=cache if cache else InMemoryCache(), strategy=strategy,
                              device=f"cpu:{threads}", progress=False, **options)
    return session, load(model_spec, session, batch=batch, weight_preprocess=True)


def fastrun_search(model_spec: str, batch: int, threads: int, cache: str | None,
                   **options) -> dict:
    """A fast-run search of a model into ``cache``, for a process of its own."""
    started = time.perf_counter()
    session, model = _fastrun_model(model_spec, batch, threads, "fast-run", cache, **options)
    model.search()
    return {"search_s": time.perf_counter() - started, "profiled": session.stats.profiled}


def fastrun_steady_loop(model_spec: str, batch: int, threads: int, cache: str | None,
                        iters: int, warmup: int, **options) -> dict:
    """fastrun's steady state on a model read from ``cache`` (nothing searched: a miss takes
    its nearest measured problem, else the rule of thumb), for a process of its own."""
    session, model = _fastrun_model(model_spec, batch, threads, "heuristic", cache, **options)
    feeds = model.random_inputs(seed=1)
    model.search()
    result = steady_loop(lambda: model.run(feeds), iters, warmup)
    stats = session.stats
    result.update(profiled=stats.profiled, nearest=stats.nearest, heuristic=stats.heuristic,
                  cache_hits=stats.cache_hits, cache_misses=stats.heuristic + stats.nearest)
    return result


def interleaved_samples(functions: dict[str, Callable[[], object]], rounds: int,
                        number: int, settle_s: float = 0.0) -> dict[str, list[float]]:
    """Seconds per call of each function, one sample per round, measured in alternating
    rounds so that drift of a shared machine hits every function alike.

    ``settle_s``: before each sample, run the function untimed for this long, so that thread
    pools the previous function used (OpenBLAS workers spin for about 0.1 s after a call) have
    gone idle and each function is measured in its own steady state.
    """
    samples: dict[str, list[float]] = {name: [] for name in functions}
    names = list(functions)
    for index in range(rounds):
        # Each round starts with another function, so that none always follows the same one
        # (a peer whose threads keep spinning after a call would slow whatever comes next).
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            function = functions[name]
            deadline = time.perf_counter() + settle_s
            while time.perf_counter() < deadline:
                function()
            samples[name].append(time_calls(function, number))
    return samples


def interleaved_medians(functions: dict[str, Callable[[], object]], rounds: int,
                        number: int, settle_s: float = 0.0) -> dict[str, float]:
    """Median seconds per call of each function over :func:`interleaved_samples`' rounds."""
    return medians(interleaved_samples(functions, rounds, number, settle_s))


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    """Each function's median over its samples."""
    return {name: statistics.median(values) for name, values in samples.items()}


def paired_ratio(samples: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of the two functions' ratio within the round.

    Why not the ratio of the medians: a burst of load that lasts a few rounds moves both
    functions' samples of those rounds, so a ratio taken inside a round cancels it, while the
    two medians can each land on a different round's noise.
    """
    return statistics.median(a / b for a, b in zip(samples[numerator], samples[denominator],
                                                   strict=True))


def empty_region_us(threads: int, idle_us: float = 0.0, calls: int = 2000) -> float:
    """The median cost of an empty parallel region of numba's pool at ``threads``, each call
    after ``idle_us`` of busy-waiting on the calling thread (0: back to back; longer gaps let
    the pool's workers go to sleep): the floor of every parallel step."""
    import numba
    import numpy as np

    @numba.njit(parallel=True)
    def touch(out):
        for i in numba.prange(out.size):
            out[i] += 1.0

    out = np.zeros(threads * 16, np.float32)
    numba.set_num_threads(threads)
    for _ in range(100):
        touch(out)
    idle_ns = int(idle_us * 1e3)
    times = []
    for _ in range(calls):
        deadline = time.perf_counter_ns() + idle_ns
        while time.perf_counter_ns() < deadline:
            pass
        started = time.perf_counter_ns()
        touch(out)
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times) * 1e-3
