"""Time every usable ``cl_igemm`` configuration (no search) on chosen ResNet-18 layers.

A development probe for the implicit-GEMM conv kernel's parameter space: for each layer and
batch it times all usable configurations on the OpenCL device, checks each against the conv
reference, and prints the best configuration per value of every parameter, so which
parameters matter is measured once and the registered space can be cut by evidence.  With
CUDA available, cuDNN's time for the layer (torch, TF32 off) is printed for scale.

    python -m benchmarks.probe_cl_igemm --layers 1 7 10 --batch 1 32
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import numpy as np

from fastrun.analysis.suites import RESNET18_LAYERS
from fastrun.devices import get_device
from fastrun.registry import default_registry
from fastrun_algorithms.conv.opencl import ImplicitGemmCLConv
from fastrun_algorithms.conv.opencl.space import igemm_configurations


class _Ctx:
    def __init__(self, device):
        self.device = device


def _median(device, function, runs: int = 15) -> float:
    function()
    device.synchronize()
    return statistics.median(device.measure(function)[0] * 1e-9 for _ in range(runs))


def _cudnn_seconds(x, w, b, params, relu: bool) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from benchmarks.bench_opencl_conv import CuDNN

    return CuDNN(torch).seconds(x, w, b, params, relu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 7, 10],
                        help="indices into the resnet18 suite's layer table")
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    device = get_device("opencl")
    operator = default_registry().operator("conv")
    configs = [ImplicitGemmCLConv(c) for c in igemm_configurations()]
    print(f"# OpenCL device: {device}; {len(configs)} registered configurations")
    for batch in args.batch:
        for index in args.layers:
            layer = RESNET18_LAYERS[index]
            rng = np.random.default_rng(0)
            x, w, b = (rng.uniform(-1, 1, s).astype(np.float32)
                       for s in layer.shapes(batch, epilogue=False))
            params = layer.params(epilogue=False)
            relu = layer.activation == "relu"
            extra = {"activation": "relu"} if relu else {}
            problem = operator.problem([x.shape, w.shape, b.shape], ["float32"] * 3,
                                       **params, **extra)
            reference = operator.reference(problem, [x, w, b])
            inputs = [device.to_device(a) for a in (x, w, b)]
            peer = _cudnn_seconds(x, w, b, params, relu)
            timed = []
            started = time.perf_counter()
            for algorithm in configs:
                if not algorithm.usable(problem) or algorithm.device_unusable_reason(
                        device, problem):
                    continue

                def call(a=algorithm, pr=problem, xs=inputs):
                    return a.run(pr, xs, _Ctx(device))

                error = operator.error(problem, device.to_host(call()), reference)
                if error > operator.tolerance(problem):
                    print(f"  WRONG {algorithm.desc.text}: error {error:.2e}")
                    continue
                timed.append((_median(device, call), algorithm))
            timed.sort(key=lambda t: t[0])
            peer_text = f", cuDNN {peer * 1e3:.3f} ms" if peer else ""
            print(f"\n## batch {batch} {layer.name}: {len(timed)} configurations in "
                  f"{time.perf_counter() - started:.0f} s{peer_text}")
            for seconds, algorithm in timed[:args.top]:
                print(f"  {seconds * 1e3:8.3f} ms  {algorithm.desc.text}")
            for key in ("vw", "kwg", "split", "mwg", "nwg", "mdimc", "ndimc"):
                best = collections.defaultdict(lambda: float("inf"))
                for seconds, algorithm in timed:
                    best[algorithm.param[key]] = min(best[algorithm.param[key]], seconds)
                print(f"  best by {key}: " + ", ".join(
                    f"{value}: {best[value] / timed[0][0]:.2f}" for value in sorted(best)))


if __name__ == "__main__":
    main()
