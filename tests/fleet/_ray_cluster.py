"""Run inside a network namespace of its own (``unshare -n``): start a Ray cluster of three
nodes on the loopback address, run the tunes test_tune_ray.py checks, print their outcome as
JSON on the last line, and stop the cluster.

Nodes: the head and a second node, each ``num_cpus=1``; a third whose processes see
``NUMBA_THREADING_LAYER=workqueue``, so that its CPU category differs (the ``layer`` fact)
from the driver's and it must be refused; last, for an OpenCL tune, a fourth that declares two
GPUs.  Outside such a namespace Ray binds to the machine's
interface address; inside it only ``lo`` exists, brought up here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

PORT = 6390
SECOND_NODE_PORT = 6391
ADDRESS = f"127.0.0.1:{PORT}"
DEVICE = "cpu:1"


def _run(command: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-2000:]}")
    return done.stdout


def start_cluster() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    _run(["ray", "start", "--head", f"--port={PORT}", "--include-dashboard=false", *common])
    _run(["ray", "start", f"--address={ADDRESS}", f"--node-manager-port={SECOND_NODE_PORT}",
          *common])
    _run(["ray", "start", f"--address={ADDRESS}", *common],
         env={"NUMBA_THREADING_LAYER": "workqueue"})


def kill_second_node() -> None:
    """SIGKILL the second node's raylet and every process it started (its worker)."""
    found = subprocess.run(["pgrep", "-f", f"raylet.*node_manager_port={SECOND_NODE_PORT}"],
                           capture_output=True, text=True).stdout.split()
    for pid in found:
        children = subprocess.run(["pgrep", "-P", pid], capture_output=True,
                                  text=True).stdout.split()
        for victim in [*children, pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(victim), signal.SIGKILL)
    if not found:
        raise SystemExit("the second node's raylet was not found")


def tune(models: list[str], cache: str, extra: list[str] = (), kill_after: int | None = None,
         interrupt_after: int | None = None) -> dict:
    """One tune on the cluster; ``kill_after``: SIGKILL the second node once that many jobs
    are logged; ``interrupt_after``: then send SIGINT to the driver's process group instead,
    as a terminal's Ctrl-C does."""
    summary = cache + ".summary.json"
    command = [sys.executable, "-m", "fastrun", "tune", *models, "--algo-policy", cache,
               "--device", DEVICE, "--ray", ADDRESS, "--no-progress", "--json", summary,
               *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    killed = False
    times = cache + ".times.jsonl"
    deadline = time.monotonic() + 400
    while process.poll() is None and time.monotonic() < deadline:
        after = kill_after if kill_after is not None else interrupt_after
        if after is not None and not killed and os.path.exists(times):
            with open(times, encoding="utf-8") as file:
                if len(file.read().splitlines()) > after:
                    if kill_after is not None:
                        kill_second_node()
                    else:
                        os.killpg(process.pid, signal.SIGINT)
                    killed = True
        time.sleep(0.05)
    if process.poll() is None:
        process.kill()
    out, err = process.communicate()
    result = {}
    if os.path.exists(summary):
        with open(summary, encoding="utf-8") as file:
            result = json.load(file)
    result.update(returncode=process.returncode, stdout=out[-4000:], stderr=err[-4000:],
                  killed=killed)
    return result


def record_opencl_problems(path: str) -> None:
    """A problems file of a few small OpenCL problems, as ``--record`` writes one."""
    import fastrun
    from fastrun.cache import InMemoryCache

    session = fastrun.Session(device="opencl", cache=InMemoryCache(), strategy="heuristic",
                              record=path, progress=False)
    for size in (64, 96, 128, 160):
        session.decide(session.problem("add", [(size,), (size,)], ["float32"] * 2))


def gpu_tune(scratch: str) -> dict:
    """A node that declares two GPUs joins, and an OpenCL tune (on PoCL's CPU device here)
    runs: one actor per GPU on that node, each holding one, and one per node elsewhere."""
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        return {"not_run": "pyopencl is not installed"}
    _run(["ray", "start", f"--address={ADDRESS}", "--num-cpus=2", "--num-gpus=2",
          "--node-ip-address=127.0.0.1", "--disable-usage-stats"])
    problems = os.path.join(scratch, "opencl.jsonl")
    record_opencl_problems(problems)
    return tune([], os.path.join(scratch, "gpus.bin"),
                ["--device", "opencl", "--problems", problems, "--budget", "0.003"])


def main() -> None:
    scratch = sys.argv[1]
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    start_cluster()
    try:
        outcome = {
            "union": tune(["zoo:squeezenet@32", "zoo:resnet18@32"],
                          os.path.join(scratch, "union.bin"), ["--budget", "0.003"]),
            "killed": tune(["zoo:resnet18@64"], os.path.join(scratch, "killed.bin"),
                           ["--budget", "0.02"], kill_after=3),
            "interrupted": tune(["zoo:resnet18@48"], os.path.join(scratch, "ctrl-c.bin"),
                                ["--budget", "0.02"], interrupt_after=2),
        }
        outcome["gpus"] = gpu_tune(scratch)
    finally:
        subprocess.run(["ray", "stop", "--force"], capture_output=True, timeout=120)
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
