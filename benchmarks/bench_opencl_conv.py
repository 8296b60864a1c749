"""ResNet-18 conv layers on OpenCL: fast-run's pick against cuDNN FP32, same run.

For every layer of the ``resnet18`` suite (bias and the fused relu as the runtime runs them),
at the given batch: a fast-run search on the OpenCL device (its im2col/1x1 matmul sub-problems
are searched among the OpenCL GEMM configurations), then the pick is timed with queue markers
and torch's ``conv2d`` + bias + relu (cuDNN, TF32 off) with CUDA events.  Printed per layer and
summed (weighted by how often the layer occurs): fastrun's time, cuDNN's, and the share of
cuDNN's speed fastrun reaches (target: >= 50%), and the same for the 3x3 layers alone
(target at batch 32: >= 90%).  Without a CUDA GPU (PoCL here) the peer is
fastrun's own CPU pick, and the output says so.

``--also NAME`` times that registered algorithm (one without sub-problems, e.g.
``cl_winograd_fused``) directly on every layer it can compute, beside the pick.

    python -m benchmarks.bench_opencl_conv --batch 1 [--batch 32] [--quick] [--kernel 3]
        [--tuning-budget 0] [--also cl_winograd_fused]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import fastrun
from benchmarks._common import header
from fastrun.analysis.suites import RESNET18_LAYERS
from fastrun.cache import InMemoryCache
from fastrun.devices import get_device

TARGET = 0.5
#: issue 18: the 3x3 layers at batch 32, summed, against cuDNN
SQUARE_TARGET = 0.9


def device_seconds(device, function, runs: int = 20) -> float:
    function()
    device.synchronize()
    return statistics.median(device.measure(function)[0] * 1e-9 for _ in range(runs))


class CuDNN:
    label = "cuDNN FP32 via torch (TF32 off)"

    def __init__(self, torch):
        self.torch = torch
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True  # cuDNN's own algorithm search, like fast-run

    def seconds(self, x, w, b, params, relu: bool, runs: int = 20) -> float:
        torch = self.torch
        f = torch.nn.functional
        tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, b))
        pads = params["pads"]

        def call():
            y = f.conv2d(tx, tw, tb, stride=params["strides"], padding=(pads[0], pads[1]),
                         groups=params["group"])
            return torch.relu_(y) if relu else y

        for _ in range(5):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(runs):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)


class CPUPick:
    label = "fastrun's fast-run pick on the host CPU (no CUDA GPU here)"

    def __init__(self):
        self.session = fastrun.session(strategy="fast-run", cache=InMemoryCache(),
                                       budget_s=0.02, progress=False)

    def seconds(self, x, w, b, params, relu: bool, runs: int = 10) -> float:
        extra = {"activation": "relu"} if relu else {}
        call = self.session.prepare("conv", x, w, b, **params, **extra)
        call(x, w, b)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            call(x, w, b)
            times.append(time.perf_counter() - started)
        return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--device", default="opencl")
    parser.add_argument("--budget-s", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true", help="first 4 layers only")
    parser.add_argument("--kernel", type=int, help="only the layers of this kernel size")
    parser.add_argument("--tuning-budget", type=int, default=None,
                        help="candidates timed fully per problem (default: "
                             "FASTRUN_TUNING_CANDIDATES or 24; 0: every candidate, the oracle "
                             "a budgeted search's picks are compared with)")
    parser.add_argument("--also", action="append", default=[],
                        help="also time this registered algorithm (given as `fastrun "
                             "algorithms` prints it; no sub-problems) beside the pick")
    args = parser.parse_args()
    try:
        import torch
        peer = CuDNN(torch) if torch.cuda.is_available() else CPUPick()
    except ImportError:
        peer = CPUPick()
    device = get_device(args.device)
    layers = RESNET18_LAYERS[:4] if args.quick else RESNET18_LAYERS
    if args.kernel:
        layers = [layer for layer in layers if layer.kernel == args.kernel]
    print(header("ResNet-18 conv layers on OpenCL: fast-run pick vs peer"))
    print(f"# OpenCL device: {device} [{device.category}]")
    print(f"# peer: {peer.label}")
    # one pool of build helpers for every layer's search, as a model's search has: each
    # search opening its own made a layer's search time include starting the helpers
    with device.parallel_builds():
        _batches(args, device, peer, layers)


def _batches(args, device, peer, layers) -> None:
    for batch in args.batch:
        session = fastrun.session(device=device, cache=InMemoryCache(), strategy="fast-run",
                                  budget_s=args.budget_s, progress=False,
                                  tuning_budget=args.tuning_budget)
        budget = {None: "default", 0: "0 (every candidate)"}.get(args.tuning_budget,
                                                                  args.tuning_budget)
        print(f"\n## batch {batch}, tuning budget {budget}")
        also = _also(session, args.also)
        print(f"{'layer':<34} {'x':>2} {'search s':>9} {'fastrun ms':>11} {'peer ms':>9} "
              f"{'share':>7}  pick" + "".join(f"  |  {name} ms, share" for name in also))
        total_ours = total_peer = 0.0
        square_ours = square_peer = 0.0  # the 3x3 layers alone (issue 18's batch-32 target)
        rng = np.random.default_rng(0)
        for layer in layers:
            shapes = layer.shapes(batch, epilogue=False)
            x, w, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in shapes)
            params = layer.params(epilogue=False)
            relu = layer.activation == "relu"
            extra = {"activation": "relu"} if relu else {}
            started = time.perf_counter()
            call = session.prepare("conv", x, w, b, **params, **extra)
            search_s = time.perf_counter() - started
            inputs = [device.to_device(a) for a in (x, w, b)]
            ours = device_seconds(device, lambda call=call, inputs=inputs: call(*inputs))
            theirs = peer.seconds(x, w, b, params, relu)
            total_ours += ours * layer.count
            total_peer += theirs * layer.count
            if layer.kernel == 3:
                square_ours += ours * layer.count
                square_peer += theirs * layer.count
            print(f"{layer.name:<34} {layer.count:>2} {search_s:>9.1f} {ours * 1e3:>11.3f} "
                  f"{theirs * 1e3:>9.3f} {theirs / ours:>6.0%}  {call.decision.policy.algorithm}"
                  + "".join(f" [{c.algorithm}]" for c in call.decision.policy.children)
                  + "".join(_time_also(device, algorithm, call.problem, inputs, theirs)
                            for algorithm in also.values()),
                  flush=True)
        share = total_peer / total_ours
        verdict = "met" if share >= TARGET else "MISSED"
        print(f"summed: fastrun {total_ours * 1e3:.2f} ms, peer {total_peer * 1e3:.2f} ms, "
              f"share {share:.0%} (target >= {TARGET:.0%}: {verdict})")
        if square_ours:
            share = square_peer / square_ours
            verdict = "met" if share >= SQUARE_TARGET else "MISSED"
            print(f"3x3 layers summed: fastrun {square_ours * 1e3:.2f} ms, peer "
                  f"{square_peer * 1e3:.2f} ms, share {share:.0%} (target at batch 32 >= "
                  f"{SQUARE_TARGET:.0%}: {verdict})")


class _Context:
    """What an algorithm without sub-problems needs of a run context: the device."""

    def __init__(self, device):
        self.device = device


def _also(session, names: list[str]) -> dict:
    """The registered conv algorithms named by ``--also``, by name."""
    found = {a.desc.text: a for a in session.registry.algorithms("conv")}
    missing = [name for name in names if name not in found]
    if missing:
        raise SystemExit(f"--also: no registered conv algorithm {', '.join(missing)}")
    chosen = {name: found[name] for name in names}
    with_subs = [name for name, a in chosen.items() if a.sub_operators]
    if with_subs:
        raise SystemExit(f"--also: {', '.join(with_subs)} call sub-problems; time them "
                         "through a search instead")
    return chosen


def _time_also(device, algorithm, problem, inputs, peer_s: float) -> str:
    """`  |  ms, share` of ``algorithm`` run directly on the layer, or why it cannot."""
    reason = (algorithm.unusable_reason(problem)
              or algorithm.device_unusable_reason(device, problem))
    if reason:
        return "  |  -"
    context = _Context(device)
    # weights preprocessed once where the runtime would (the pick's problem says), as the
    # pick's call has them
    prepared = algorithm.preprocess(problem, inputs) if problem.weight_preprocess else None
    seconds = device_seconds(device, lambda: algorithm.run(problem, inputs, context, prepared))
    return f"  |  {seconds * 1e3:.3f} {peer_s / seconds:.0%}"


if __name__ == "__main__":
    main()
