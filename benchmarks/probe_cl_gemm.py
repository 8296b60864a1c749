"""Time chosen ``cl_gemm`` configurations directly (no search) against cuBLAS FP32 (TF32 off).

A development probe for the kernel and its parameter space: which parameters matter on a GPU
is measured here once, so the registered space and the heuristic order can be cut by
evidence rather than guessed.  Each configuration's output is compared with cuBLAS's.

    python -m benchmarks.probe_cl_gemm --sizes 4096 --configs "mwg=128,nwg=128,...;..."
    python -m benchmarks.probe_cl_gemm --shapes 128x4096x4096 --configs "...,split=4;..."

``--shapes`` takes M x N x K products besides the squares of ``--sizes``.  A configuration is
timed even where the search would skip it (a split-K count on a product whose tiles already
fill the device): the probe measures what such rules assume.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fastrun.devices import get_device
from fastrun.operator import Problem
from fastrun_algorithms.matmul.opencl import GemmCLMatmul


class _Ctx:
    def __init__(self, device):
        self.device = device


class _Variant(GemmCLMatmul):
    """A configuration built with extra options (-D switches of kernel variants)."""

    def __init__(self, param, extra):
        super().__init__(param)
        self.extra = extra

    def options(self, dtype, shape_defines=None):
        # (an older checkout's options() takes no shape defines: the probe times it too)
        args = (dtype,) if shape_defines is None else (dtype, shape_defines)
        return super().options(*args) + self.extra


def _median(device, function, runs: int = 20) -> float:
    function()
    device.synchronize()
    return statistics.median(device.measure(function)[0] * 1e-9 for _ in range(runs))


def _ptxas_report(device, algorithm, problem) -> str:
    """The lines of NVIDIA's build log that say what each kernel of the configuration uses
    (built again from source with -cl-nv-verbose, outside the device's program cache)."""
    import pyopencl as cl

    from fastrun_algorithms.matmul._batch import layout_of

    options = algorithm.options(np.dtype(problem.dtypes[0]),
                                algorithm.shape_defines(layout_of(problem)))
    program = cl.Program(device.context, algorithm.source)
    program.build(options=[*options, "-cl-nv-verbose"], devices=[device.cl_device])
    text = program.get_build_info(device.cl_device, cl.program_build_info.LOG)
    lines = [line.strip() for line in text.splitlines()
             if any(word in line for word in ("Compiling", "registers", "spill", "stack"))]
    return "\n".join("    " + line for line in lines) or "    (no compiler report in the log)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[4096])
    parser.add_argument("--shapes", nargs="*", default=[], help="products as MxNxK")
    parser.add_argument("--variants", nargs="*", default=["-"],
                        help="extra -D defines tried with every configuration, each "
                             "'NAME=V,NAME=V' ('-' for none; 'cl-...' passes -cl-... as it is)")
    parser.add_argument("--ptxas", action="store_true",
                        help="also build each configuration with -cl-nv-verbose and print "
                             "what NVIDIA's compiler reports (registers, spills, shared memory)")
    parser.add_argument("--configs", required=True,
                        help="';'-separated configurations, each 'key=value,...'")
    args = parser.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    device = get_device("opencl")
    configs = [dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in c.split(","))
               for c in args.configs.split(";") if c.strip()]
    shapes = [(s, s, s) for s in args.sizes]
    shapes += [tuple(int(v) for v in shape.split("x")) for shape in args.shapes]
    for m, n, k in shapes:
        size = f"{m}x{n}x{k}"
        rng = np.random.default_rng(0)
        a = rng.random((m, k), dtype=np.float32)
        b = rng.random((k, n), dtype=np.float32)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        reference = (ta @ tb).cpu().numpy()
        for _ in range(3):
            ta @ tb
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            ta @ tb
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        peer = statistics.median(times)
        flops = 2.0 * m * n * k
        print(f"# {size}: cuBLAS {peer * 1e3:.3f} ms {flops / peer / 1e12:.1f} TFLOP/s",
              flush=True)
        problem = Problem.create("matmul", [(m, k), (k, n)], ["float32"] * 2)
        inputs = [device.to_device(a), device.to_device(b)]
        for param, variant in ((p, v) for p in configs for v in args.variants):
            algorithm = _Variant(param, [f"-{d}" if d.startswith("cl-") else f"-D{d}"
                                         for d in variant.split(",") if d and d != "-"])
            try:
                started = time.perf_counter()
                out = device.to_host(algorithm.run(problem, inputs, _Ctx(device)))
                build = time.perf_counter() - started
                error = float(np.abs(out - reference).max() / np.abs(reference).max())
                seconds = _median(device, lambda alg=algorithm, pr=problem, xs=inputs:
                                  alg.run(pr, xs, _Ctx(device)))
            except Exception as exc:  # report and go on: this is a probe
                print(f"{size} {algorithm.desc.text}: FAILED {str(exc)[:300]}", flush=True)
                continue
            print(f"{size} {seconds * 1e3:8.3f} ms {flops / seconds / 1e12:5.1f} TF/s "
                  f"{peer / seconds:5.0%}  err {error:.1e} build {build:.1f}s  "
                  f"{algorithm.desc.text} {' '.join(algorithm.extra)}", flush=True)
            if args.ptxas:
                print(_ptxas_report(device, algorithm, problem), flush=True)


if __name__ == "__main__":
    main()
