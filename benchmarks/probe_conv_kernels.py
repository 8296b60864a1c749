"""Conv algorithms against onnxruntime's Conv, layer by layer, each engine in its own process.

For a set of layers (``--layers``: ResNet-18's 3x3 and first layers, ResNet-50's 1x1 layers,
the strided downsampling ones among them, the grouped 3x3 layers of RegNet-Y-400MF and
ResNeXt-50 32x4d, MobileNet's depthwise and 1x1 layers, or the mobile models' 3-channel stems
and strided depthwise layers (``strided-dw``); batch 1, bias + Relu, constant weights: onnxruntime
prepacks them, fastrun runs with weight preprocessing), a steady loop of ``--calls`` calls per
layer, first in a fastrun process (every algorithm of ``--algorithm``, comma-separated), then
in an onnxruntime process, alternating ``--pairs`` times.  Printed: GFLOP/s of each and the
ratio of times (fastrun / onnxruntime; below 1 fastrun is faster).  Separate processes because
onnxruntime's workers spin after each run and would slow fastrun's kernels in the same process
on many cores.  The kernel alone, not a model: no neighbouring layers, warm caches, and
onnxruntime converts each layer to and from its blocked layout (in a model it stays blocked,
which is why its in-model layers run faster than here).

    python -m benchmarks.probe_conv_kernels [--algorithm blocked_direct,im2col] [--threads 16]
                                            [--layers resnet50-1x1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from benchmarks._common import call_times, header

#: (input channels, image size, output channels, kernel, stride, pad[, groups]) per layer set
LAYER_SETS = {
    "resnet18": ((64, 56, 64, 3, 1, 1), (128, 28, 128, 3, 1, 1), (256, 14, 256, 3, 1, 1),
                 (512, 7, 512, 3, 1, 1), (64, 56, 128, 3, 2, 1), (256, 14, 512, 3, 2, 1),
                 (3, 224, 64, 7, 2, 3)),
    "resnet50-1x1": ((64, 56, 64, 1, 1, 0), (64, 56, 256, 1, 1, 0), (256, 56, 64, 1, 1, 0),
                     (256, 56, 128, 1, 1, 0), (256, 56, 512, 1, 2, 0), (128, 28, 512, 1, 1, 0),
                     (512, 28, 128, 1, 1, 0), (512, 28, 1024, 1, 2, 0),
                     (256, 14, 1024, 1, 1, 0), (1024, 14, 256, 1, 1, 0),
                     (1024, 14, 2048, 1, 2, 0), (512, 7, 2048, 1, 1, 0),
                     (2048, 7, 512, 1, 1, 0)),
    "grouped": ((48, 56, 48, 3, 2, 1, 6), (104, 28, 104, 3, 2, 1, 13),
                (104, 28, 104, 3, 1, 1, 13), (208, 14, 208, 3, 1, 1, 26),
                (208, 28, 208, 3, 2, 1, 26), (440, 7, 440, 3, 1, 1, 55),
                (440, 14, 440, 3, 2, 1, 55), (256, 56, 256, 3, 1, 1, 32),
                (512, 28, 512, 3, 1, 1, 32), (1024, 14, 1024, 3, 1, 1, 32),
                (2048, 7, 2048, 3, 1, 1, 32)),
    # MobileNetV3-Large's depthwise layers (groups = channels) and 1x1 layers
    "mobilenet-dw": ((16, 112, 16, 3, 1, 1, 16), (64, 112, 64, 3, 2, 1, 64),
                     (72, 56, 72, 3, 1, 1, 72), (72, 56, 72, 5, 2, 2, 72),
                     (120, 28, 120, 5, 1, 2, 120), (240, 28, 240, 3, 2, 1, 240),
                     (200, 14, 200, 3, 1, 1, 200), (672, 14, 672, 3, 1, 1, 672),
                     (960, 7, 960, 5, 1, 2, 960)),
    "strided-dw": ((3, 224, 16, 3, 2, 1), (16, 112, 16, 3, 2, 1, 16), (64, 112, 64, 3, 2, 1, 64),
                   (72, 56, 72, 3, 2, 1, 72), (96, 28, 96, 5, 2, 2, 96),
                   (144, 56, 144, 3, 2, 1, 144), (240, 28, 240, 3, 2, 1, 240)),
    "mobilenet-1x1": ((16, 112, 16, 1, 1, 0), (16, 112, 64, 1, 1, 0), (24, 56, 72, 1, 1, 0),
                      (72, 56, 24, 1, 1, 0), (40, 28, 240, 1, 1, 0), (184, 14, 80, 1, 1, 0),
                      (80, 14, 480, 1, 1, 0), (672, 14, 112, 1, 1, 0),
                      (112, 14, 672, 1, 1, 0), (960, 7, 160, 1, 1, 0),
                      (160, 7, 960, 1, 1, 0)),
}


def _groups(layer) -> int:
    return layer[6] if len(layer) > 6 else 1


def _inputs(layer):
    c, size, k, kernel = layer[:4]
    rng = np.random.default_rng(0)
    return (rng.standard_normal((1, c, size, size), np.float32),
            rng.standard_normal((k, c // _groups(layer), kernel, kernel), np.float32) * 0.1,
            rng.standard_normal(k).astype(np.float32))


def _median_call(function, calls: int) -> float:
    for _ in range(max(5, calls // 10)):
        function()
    return float(np.median(call_times(function, calls)))


def _fastrun_times(algorithm_names: str, layers, threads: int, calls: int,
                   layout: str) -> dict[str, list[float | None]]:
    import fastrun

    session = fastrun.session(strategy="heuristic", progress=False)  # sets the vector width
    import numba

    numba.set_num_threads(threads)
    from fastrun.devices.cpu.memory import keep_freed_pages

    keep_freed_pages()  # as a loaded model has it
    return {name: _algorithm_times(session, name, layers, calls, layout)
            for name in algorithm_names.split(",")}


def _algorithm_times(session, algorithm_name: str, layers, calls: int,
                     layout: str) -> list[float | None]:
    known = {a.desc.text: a for a in session.registry.algorithms("conv")}
    if algorithm_name not in known:
        raise SystemExit(f"no conv algorithm {algorithm_name!r}; known: {', '.join(known)}")
    algorithm = known[algorithm_name]
    times: list[float | None] = []
    for layer in layers:
        x, w, b = _inputs(layer)
        stride, pad = layer[4:6]
        params = {"group": _groups(layer)}
        if layout != "nchw":
            from fastrun_algorithms.layout.blocking import to_blocked

            x, params = to_blocked(x), {**params, "layout": layout}
        problem = session.problem("conv", [x.shape, w.shape, b.shape], ["float32"] * 3,
                                  pads=[pad] * 4, strides=[stride] * 2, activation="relu",
                                  weight_preprocess=True, **params)
        if not algorithm.usable(problem):
            times.append(None)
            continue
        for sub in algorithm.sub_problems(problem):
            session.decide(sub)
        prepared = algorithm.preprocess(problem, [x, w, b])
        inputs = [x, w, b]
        times.append(_median_call(
            lambda p=problem, i=inputs, r=prepared: algorithm.run(p, i, session.chooser, r),
            calls))
    return times


def _onnxruntime_times(layers, threads: int, calls: int) -> list[float]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    times = []
    for layer in layers:
        x, w, b = _inputs(layer)
        stride, pad = layer[4:6]
        graph = helper.make_graph(
            [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4,
                              strides=[stride] * 2, group=_groups(layer)),
             helper.make_node("Relu", ["c"], ["y"])], "conv",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        times.append(_median_call(lambda s=session, x=x: s.run(None, {"x": x}), calls))
    return times


def _spawn(engine: str, args) -> dict[str, list[float | None]] | list[float]:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.probe_conv_kernels", "--child", engine,
         "--algorithm", args.algorithm, "--threads", str(args.threads),
         "--calls", str(args.calls), "--layers", args.layers, "--layout", args.layout],
        capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"the {engine} process failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithm", default="blocked_direct",
                        help="the conv algorithm, as a cache names it (e.g. 'direct(kb=32)')")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--layers", choices=sorted(LAYER_SETS), default="resnet18")
    parser.add_argument("--layout", choices=["nchw", "nchw16c"], default="nchw",
                        help="the layout fastrun's input and output are in (onnxruntime's "
                             "stay NCHW)")
    parser.add_argument("--child", choices=["fastrun", "onnxruntime"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    layers = LAYER_SETS[args.layers]
    if args.child == "fastrun":
        print(json.dumps(_fastrun_times(args.algorithm, layers, args.threads, args.calls,
                                        args.layout)))
        return
    if args.child == "onnxruntime":
        print(json.dumps(_onnxruntime_times(layers, args.threads, args.calls)))
        return
    print(header(f"conv kernels ({args.layers}, fastrun in {args.layout}): {args.algorithm} "
                 f"against onnxruntime's Conv, {args.threads} threads, {args.pairs} process "
                 f"pairs"))
    ours: list[dict[str, list[float | None]]] = []
    theirs: list[list[float]] = []
    for _ in range(args.pairs):
        ours.append(_spawn("fastrun", args))
        theirs.append(_spawn("onnxruntime", args))
    names = args.algorithm.split(",")
    print(f"{'layer':<24} {'onnxruntime GFLOP/s':>20} "
          + " ".join(f"{name + ' GFLOP/s, ratio':>30}" for name in names))
    for index, layer in enumerate(layers):
        c, size, k, kernel, stride, pad = layer[:6]
        groups = _groups(layer)
        out = (size + 2 * pad - kernel) // stride + 1
        flops = 2 * k * out * out * c // groups * kernel * kernel
        peer = float(np.median([run[index] for run in theirs]))
        cells = []
        for name in names:
            times = [run[name][index] for run in ours if run[name][index] is not None]
            mine = float(np.median(times)) if times else None
            cells.append(f"{'unusable':>30}" if mine is None else
                         f"{flops / mine / 1e9:>23.0f}, {mine / peer:>5.2f}")
        name = f"{c}->{k} {kernel}x{kernel}/{stride} @{size}" + (f" g{groups}" if groups > 1
                                                                  else "")
        print(name.ljust(24)
              + f" {flops / peer / 1e9:>20.0f} " + " ".join(cells))


if __name__ == "__main__":
    main()
