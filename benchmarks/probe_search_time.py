"""Where a model's fast-run search spends its time: a breakdown by part, printed after each
problem that took longer than half a second, and for the whole search at the end.

The parts are the profiler's and the device's own functions, each wrapped to add up its
wall time and calls: the kernel builds (``build`` counts every call, cached or not, on every
thread; ``build_ahead`` is the wall time of the parallel builds; ``helper compiles`` the
requests to build helper processes, fastrun/devices/opencl/builders.py), the timed calls, the output
and input checks, downloads and uploads, the float64 references and the random inputs.  What
issue 18's batch-32 search figures in docs/performance.md came from.

    python -m benchmarks.probe_search_time resnet18 32 [--cache FILE] [--device opencl]
"""

from __future__ import annotations

import argparse
import collections
import functools
import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import header, model_spec

#: seconds and calls per part
_SECONDS: collections.Counter[str] = collections.Counter()
_CALLS: collections.Counter[str] = collections.Counter()


def _wrap(owner: Any, name: str, label: str) -> None:
    function = getattr(owner, name)

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _SECONDS[label] += time.perf_counter() - started
            _CALLS[label] += 1

    setattr(owner, name, timed)


def _instrument(device: Any) -> None:
    from fastrun.core import profiler
    from fastrun.operator import Operator

    for owner, name, label in (
            (profiler.Profiler, "profile", "profile (halving rounds included)"),
            (profiler.Profiler, "_time", "timed calls (warm-up included)"),
            (profiler.Profiler, "_build_ahead", "build_ahead"),
            (profiler._OutputCheck, "outputs", "output checks"),
            (profiler._OutputCheck, "inputs_unchanged", "input checks"),
            (Operator, "random_inputs", "random inputs")):
        _wrap(owner, name, label)
    if device.kind == "opencl":  # a helper's compile, as the thread waiting for it saw it
        from fastrun.devices.opencl import builders

        _wrap(builders.BuildHelpers, "binary", "helper compiles")
    device_class = type(device)
    for name in ("build", "to_host", "to_device", "same_bits", "copy"):
        if hasattr(device_class, name):
            _wrap(device_class, name, name)


def _wrap_references(registry: Any) -> None:
    """Each operator's reference, once per operator class."""
    seen = set()
    for name in registry.operators():
        cls = type(registry.operator(name))
        if cls not in seen and "reference" in vars(cls):
            seen.add(cls)
            _wrap(cls, "reference", "references")


def _breakdown() -> str:
    return ", ".join(f"{label} {seconds:.1f} s/{_CALLS[label]}"
                     for label, seconds in _SECONDS.most_common())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a zoo name (resnet18) or an ONNX file")
    parser.add_argument("batch", type=int)
    parser.add_argument("--device", default="opencl")
    parser.add_argument("--cache", default=None, help="cache file (default: in memory)")
    args = parser.parse_args()

    import fastrun
    from fastrun.runtime import load

    session = fastrun.session(device=args.device, cache=args.cache, strategy="fast-run",
                              progress=False)
    _instrument(session.device)
    _wrap_references(session.registry)
    spec = model_spec(args.model)
    model = load(spec, session, batch=args.batch)
    print(header(f"fast-run search of {spec} at batch {args.batch} on {session.device}"))
    started = time.perf_counter()
    last = [started]
    prepare: Callable[..., Any] = session.chooser.prepare

    def reporting(problem: Any, *rest: Any, **kwargs: Any) -> Any:
        call = prepare(problem, *rest, **kwargs)
        now = time.perf_counter()
        if now - last[0] > 0.5:
            print(f"{now - started:7.1f} s  +{now - last[0]:6.1f} s  {str(problem)[:80]} -> "
                  f"{call.decision.policy.algorithm} [{call.decision.source}]", flush=True)
        last[0] = now
        return call

    session.chooser.prepare = reporting  # type: ignore[method-assign]
    model.search()
    print(f"search {time.perf_counter() - started:.1f} s, {session.stats.profiled} problems "
          f"profiled")
    print(_breakdown())


if __name__ == "__main__":
    main()
