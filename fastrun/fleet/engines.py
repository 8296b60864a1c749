"""Where workers run: local processes, or one Ray actor per node of a Ray cluster.

Both engines offer the driver the same few verbs (start, ask who a worker is, hand it a job,
wait for whatever comes back, stop or replace a worker), so one scheduler and one driver serve
both, and a tune without Ray (``--workers N``) exercises the same code a cluster does.

Local workers are processes started with ``spawn`` (nothing of the driver's state leaks in but
what :class:`~fastrun.fleet.worker.WorkerSettings` carries).  When they share a machine, each
is pinned to CPUs of its own (``cpu:THREADS`` times the workers must fit in the machine), so
that no two timings share a core.

Ray workers are actors, one per alive node (``--workers N`` takes N of them), each pinned to
its node and reserving all of the node's CPUs, so that Ray places nothing else there while it
times; on a GPU device, one per GPU of a node that has GPUs, each holding its GPU.  Locally,
a GPU device of a machine with several gives one worker process per GPU.  Ray is imported
only here and only when a Ray tune starts (``pip install 'fastrun[ray]'``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from fastrun.devices import split_spec
from fastrun.fleet.worker import Worker, WorkerSettings


@dataclass
class Event:
    """Something a worker sent back: ``result`` (a job's outcome) or ``died``."""

    worker: str
    kind: str
    result: dict[str, Any] | None = None
    error: str = ""


class EngineError(RuntimeError):
    """The engine cannot start (Ray missing, no cluster at the address, no CPUs to pin)."""


# -- local processes ---------------------------------------------------------------------------

def quiet_interrupts() -> None:
    """Keep a Ctrl-C from printing a traceback where Python cannot raise it.

    An interrupt that lands in a callback from native code (llvmlite's object cache while
    numba compiles, for one) cannot propagate. Python prints it as "Exception ignored in ...",
    with a traceback, and the process goes on until the next interrupt point. The tune
    reports the interrupt itself, so that echo is dropped. Any other unraisable exception
    still goes to Python's default hook."""
    default = sys.__unraisablehook__

    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            default(unraisable)

    sys.unraisablehook = hook


def _local_main(connection, settings: dict[str, Any]) -> None:
    """A local worker's process: answer the driver until it hangs up.  A Ctrl-C on the
    terminal reaches every process of its group: the driver reports it (and keeps what the
    workers sent), so a worker ends without a word of its own."""
    quiet_interrupts()
    try:
        _serve(connection, settings)
    except KeyboardInterrupt:
        return


def _serve(connection, settings: dict[str, Any]) -> None:
    worker = Worker(WorkerSettings.from_dict(settings))
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):  # the driver is gone (killed): so is this worker
            return
        if message is None:
            return
        kind, payload = message
        answer = worker.info() if kind == "info" else worker.tune(payload)
        try:
            connection.send((kind, answer))
        except (BrokenPipeError, OSError):
            return


def _available_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def pinning(workers: int, threads: int | None) -> list[tuple[int, ...] | None]:
    """CPUs for each of ``workers`` local workers of ``threads`` threads: disjoint sets when
    they fit in this process's CPUs, else None for all (and the timings share cores)."""
    available = _available_cpus()
    if threads is None or not available or workers * threads > len(available):
        return [None] * workers
    return [tuple(available[i * threads:(i + 1) * threads]) for i in range(workers)]


def worker_devices(devices: list[str], workers: int | None) -> list[str]:
    """Each local worker's device spec.  With several devices (a machine's GPUs), one worker
    per device: all of them by default, the first ``workers`` if given, and an error for more
    workers than devices (two workers on one GPU would disturb each other's timings).  With
    one device, ``workers`` (default 1) share it."""
    if len(devices) <= 1:
        return devices[:1] * (workers or 1)
    if workers is None:
        return list(devices)
    if workers > len(devices):
        raise EngineError(f"--workers {workers}: this machine has {len(devices)} devices of "
                          f"this kind ({', '.join(devices)}), and a tune runs one worker per "
                          f"device so that no two time on one; use --workers {len(devices)} "
                          "or fewer")
    return list(devices[:workers])


class LocalEngine:
    """Workers as processes on this machine: one per device given (a machine's GPUs), or
    ``workers`` sharing the one device, each pinned to CPUs of its own where they fit."""

    name = "local processes"

    def __init__(self, settings: WorkerSettings, workers: int | None, threads: int | None,
                 devices: list[str] | None = None):
        self.settings = settings
        self.devices = worker_devices(devices or [settings.device], workers)
        self.count = len(self.devices)
        if threads is None and len(set(self.devices)) > 1:
            # one worker per GPU: the host's cores shared out, so that one worker's float64
            # reference and kernel builds do not take the cores another's host work needs
            threads = max(1, len(_available_cpus()) // self.count)
        self.cpus = pinning(self.count, threads)
        self.shared_cores = self.count > 1 and self.cpus[0] is None
        self._context = multiprocessing.get_context("spawn")
        self._workers: dict[str, tuple[Any, Any]] = {}  # name -> (process, connection)
        self._settings: dict[str, WorkerSettings] = {}

    def start(self) -> list[str]:
        for index in range(self.count):
            name = f"local-{index + 1}"
            self._settings[name] = replace(self.settings, cpus=self.cpus[index],
                                           device=self.devices[index])
            self._spawn(name)
        return list(self._workers)

    def _spawn(self, name: str) -> None:
        mine, theirs = self._context.Pipe()
        process = self._context.Process(target=_local_main, name=f"fastrun-tune-{name}",
                                        args=(theirs, self._settings[name].to_dict()),
                                        daemon=True)
        process.start()
        theirs.close()
        self._workers[name] = (process, mine)

    def info(self, name: str) -> dict[str, Any]:
        process, connection = self._workers[name]
        try:
            connection.send(("info", None))
            _, answer = connection.recv()
        except (EOFError, OSError):
            process.join(timeout=5)
            raise EngineError(f"worker {name} exited as it started (exit code "
                              f"{process.exitcode}; its error went to standard error)") from None
        return answer

    def submit(self, name: str, payload: dict[str, Any]) -> None:
        self._workers[name][1].send(("tune", payload))

    def wait(self, timeout: float) -> list[Event]:
        by_handle = {}
        for name, (process, connection) in self._workers.items():
            by_handle[connection] = name
            by_handle[process.sentinel] = name
        events, seen = [], set()
        for handle in multiprocessing.connection.wait(list(by_handle), timeout):
            name = by_handle[handle]
            if name in seen or name not in self._workers:
                continue
            seen.add(name)
            process, connection = self._workers[name]
            try:
                if connection.poll():
                    _, answer = connection.recv()
                    events.append(Event(name, "result", answer))
                    continue
            except (EOFError, OSError):
                pass
            process.join(timeout=1)
            if not process.is_alive():
                code = process.exitcode
                events.append(Event(name, "died", error=f"worker process exited ({code})"))
                self._workers.pop(name)
        return events

    def stop(self, name: str) -> None:
        process, connection = self._workers.pop(name, (None, None))
        if process is not None:
            process.kill()
            process.join(timeout=5)
            connection.close()

    def restart(self, name: str) -> bool:
        self.stop(name)
        self._spawn(name)
        return True

    def close(self) -> None:
        for name in list(self._workers):
            process, connection = self._workers.pop(name)
            with contextlib.suppress(BrokenPipeError, OSError):
                connection.send(None)
            process.join(timeout=5)
            if process.is_alive():
                process.kill()


# -- Ray ---------------------------------------------------------------------------------------

class RayActor:
    """A Ray actor's body (made remote by :class:`RayEngine`): one Worker on one node."""

    def __init__(self, settings: dict[str, Any]):
        self.worker = Worker(WorkerSettings.from_dict(settings))

    def info(self) -> dict[str, Any]:
        return self.worker.info()

    def tune(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.worker.tune(payload)


def _per_gpu(device: str) -> bool:
    """Whether a tune on ``device`` runs one Ray actor per GPU: any device but the CPU."""
    return split_spec(device)[0] != "cpu"


class RayEngine:
    """One actor per alive node of a Ray cluster; for a GPU device, one per GPU of each node
    that declares GPUs (``num_gpus=1``: Ray sets the actor's ``CUDA_VISIBLE_DEVICES`` to its
    GPU, which NVIDIA's OpenCL driver honours, so 'opencl' opens that GPU)."""

    name = "Ray"

    def __init__(self, settings: WorkerSettings, address: str, workers: int | None):
        self.settings = settings
        self.address = address
        self.count = workers
        self._actors: dict[str, Any] = {}
        #: worker name -> (its node, the share of the node's GPUs it holds: 0 or 1)
        self._nodes: dict[str, tuple[dict[str, Any], int]] = {}
        self._running: dict[Any, str] = {}  # object ref -> worker name
        self._ray = None

    def _import(self):
        try:
            import ray
        except ImportError:
            raise EngineError("--ray needs Ray: pip install 'fastrun[ray]' (or tune without "
                              "--ray, with --workers N local processes)") from None
        return ray

    def start(self) -> list[str]:
        ray = self._ray = self._import()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, log_to_driver=False,
                         logging_level="ERROR", include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise EngineError(f"cannot reach a Ray cluster at {self.address!r}: "
                                  f"{error}") from None
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")),
                       key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]))
        if not nodes:
            raise EngineError(f"the Ray cluster at {self.address!r} has no alive node")
        per_gpu = _per_gpu(self.settings.device)
        for index, node in enumerate(nodes, 1):
            name = f"node-{index}:{node.get('NodeManagerAddress', '?')}"
            gpus = int(node.get("Resources", {}).get("GPU", 0)) if per_gpu else 0
            if gpus:
                for gpu in range(gpus):
                    self._nodes[f"{name}/gpu-{gpu}"] = (node, 1)
            else:
                self._nodes[name] = (node, 0)
        if self.count is not None:
            self._nodes = dict(list(self._nodes.items())[:self.count])
        for name in self._nodes:
            self._create(name)
        return list(self._actors)

    def _create(self, name: str) -> None:
        """The worker's actor, pinned to its node and holding all of it (a CPU worker), or
        one GPU and the node's CPUs shared out among its GPUs (a GPU worker)."""
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node, gpu = self._nodes[name]
        resources = node.get("Resources", {})
        cpus = resources.get("CPU", 1) or 1
        if gpu:
            cpus = cpus / max(1, int(resources.get("GPU", 1)))
        remote = ray.remote(RayActor).options(
            num_cpus=cpus, num_gpus=gpu, max_restarts=0, max_concurrency=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
        self._actors[name] = remote.remote(self.settings.to_dict())

    def info(self, name: str) -> dict[str, Any]:
        try:
            return self._ray.get(self._actors[name].info.remote(), timeout=600)
        except Exception as error:  # the actor could not start on its node
            raise EngineError(f"worker {name} did not start: {type(error).__name__}: "
                              f"{str(error).splitlines()[0][:200]}") from None

    def submit(self, name: str, payload: dict[str, Any]) -> None:
        self._running[self._actors[name].tune.remote(payload)] = name

    def wait(self, timeout: float) -> list[Event]:
        if not self._running:
            time.sleep(min(timeout, 0.2))
            return []
        ready, _ = self._ray.wait(list(self._running), num_returns=1, timeout=timeout)
        events = []
        for ref in ready:
            name = self._running.pop(ref)
            try:
                events.append(Event(name, "result", self._ray.get(ref)))
            except Exception as error:  # the actor or its node died
                events.append(Event(name, "died", error=f"{type(error).__name__}: "
                                                        f"{str(error).splitlines()[0][:200]}"))
                self._actors.pop(name, None)
        return events

    def stop(self, name: str) -> None:
        actor = self._actors.pop(name, None)
        for ref, owner in list(self._running.items()):
            if owner == name:
                self._running.pop(ref)
        if actor is not None:
            self._ray.kill(actor, no_restart=True)

    def restart(self, name: str) -> bool:
        """A new actor on the same node, if the node is still alive."""
        self.stop(name)
        node_id = self._nodes[name][0]["NodeID"]
        if not any(n["NodeID"] == node_id and n.get("Alive") for n in self._ray.nodes()):
            return False
        self._create(name)
        return True

    def close(self) -> None:
        for name in list(self._actors):
            self.stop(name)
