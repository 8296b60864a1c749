"""Conv layers of ResNet-18 and MobileNetV2: fast-run's pick against onnxruntime's CPU Conv.

For every layer (with bias and the activation the runtime fuses, constant weights on both
sides: onnxruntime prepacks initializers, so fastrun runs with weight preprocessing on),
fast-run searches the layer, then its pick and a one- or two-node onnxruntime model are timed
in interleaved rounds with the same thread count.  Printed: the full ranking fast-run measured
per layer, the per-layer ratio fastrun/onnxruntime, and the summed ratio weighted by how often
each layer occurs in the network (target at batch 1: <= 1.0).  The layer tables are
``fastrun.analysis.suites.CONV_LAYERS``.
With --oracle, every candidate is also re-measured many times and the pick is compared with the
best (target: within 5% per layer).

    python -m benchmarks.bench_conv_layers --suite resnet18 --batch 1 [--oracle] [--quick]
    python -m benchmarks.bench_conv_layers --no-ort --oracle    # on many cores (see --no-ort)
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import fastrun
from benchmarks._common import header, interleaved_medians
from fastrun.analysis.suites import CONV_LAYERS as SUITES
from fastrun.attribute import AlgoAttribute


def ort_session(x: np.ndarray, w: np.ndarray, b: np.ndarray, z: np.ndarray | None, params: dict,
                threads: int):
    """onnxruntime's model of the layer: Conv, then the residual Add of ``z`` (an input) when
    there is one, then the activation (onnxruntime fuses Conv+Add+Relu and Conv+Clip as
    fastrun does)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    activation = params.get("activation")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], strides=list(params["strides"]),
                              pads=list(params["pads"]), group=params["group"])]
    last = "conv"
    if z is not None:
        nodes.append(helper.make_node("Add", ["conv", "z"], ["sum"]))
        last = "sum"
    if activation == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif activation == "relu6":
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    constants = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if activation == "relu6":
        constants += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
                      numpy_helper.from_array(np.array(6, np.float32), "hi")]
    graph = helper.make_graph(
        nodes, "conv",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(array.shape))
         for name, array in (("x", x), ("z", z)) if array is not None],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what every onnxruntime since 1.10 reads
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": x} if z is None else {"x": x, "z": z}
    return lambda: session.run(None, feeds)


def oracle(session, problem, inputs, sample_s: float, rounds: int) -> dict[str, float]:
    """Every fast-run candidate of the layer, re-measured in its own steady state."""
    chooser = session.chooser
    functions = {}
    for algorithm in session.registry.algorithms("conv"):
        if (algorithm.device_kind != session.device.kind or not algorithm.usable(problem)
                or algorithm.attributes & AlgoAttribute.NAIVE):
            continue
        try:
            for sub in algorithm.sub_problems(problem):
                session.decide(sub)  # its sub-problems dispatch as they do for fast-run
            prepared = algorithm.preprocess(problem, inputs)
        except Exception:  # a candidate that cannot run is not in the oracle
            continue
        functions[algorithm.desc.text] = (
            lambda a=algorithm, p=prepared: a.run(problem, inputs, chooser, p))
    return interleaved_medians(functions, rounds, 1, settle_s=sample_s)


def measure_layer(session, layer, args, threads: int, rng) -> list:
    """[layer, pick, fastrun s, onnxruntime s, ranking text, (oracle best, pick/best)?]"""
    shapes = layer.shapes(args.batch)
    inputs = tuple(rng.uniform(-1, 1, s).astype(np.float32) for s in shapes)
    x, w, b = inputs[:3]
    z = inputs[3] if layer.residual else None
    problem = session.problem("conv", shapes, ["float32"] * len(shapes), weight_preprocess=True,
                              **layer.params())
    decision = session.decide(problem)
    bound = session.chooser.prepare(problem, inputs)
    if args.no_ort:
        medians = interleaved_medians({"fastrun": lambda: bound(*inputs)}, args.rounds, 1,
                                      settle_s=0.05)
        medians["ort"] = float("nan")
    else:
        ort_run = ort_session(x, w, b, z, layer.params(), threads)
        np.testing.assert_allclose(bound(*inputs), ort_run()[0], rtol=2e-3, atol=2e-3)
        medians = interleaved_medians({"fastrun": lambda: bound(*inputs), "ort": ort_run},
                                      args.rounds, 1, settle_s=0.05)
    ranking = ", ".join(f"{e.algorithm} {e.time_s * 1e3:.3f}" for e in decision.entries)
    row = [layer, decision.algorithm.desc.text, medians["fastrun"], medians["ort"], ranking]
    if args.oracle:
        measured = oracle(session, problem, inputs, 0.05, 5)
        best = min(measured, key=measured.get)
        row.append((best, measured[decision.algorithm.desc.text] / measured[best]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suite", choices=sorted(SUITES), default="resnet18")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.2, help="fast-run budget per candidate")
    parser.add_argument("--oracle", action="store_true", help="also compare pick vs oracle")
    parser.add_argument("--quick", action="store_true", help="first 4 layers only")
    parser.add_argument("--no-ort", action="store_true",
                        help="leave onnxruntime out (with --oracle: the selection check alone). "
                             "Needed on many cores: onnxruntime's workers spin after each run "
                             "and, in the same process, slow fastrun's timings several-fold")
    parser.add_argument("--cache", help="cache file to search into (default: in memory)")
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    layers = SUITES[args.suite][:4] if args.quick else SUITES[args.suite]
    print(header(f"{args.suite} conv layers, batch {args.batch}: fast-run pick vs onnxruntime "
                 f"CPU Conv ({threads} threads, same run)"))
    session = fastrun.session(strategy="fast-run", budget_s=args.budget, progress=False,
                              cache=args.cache or fastrun.InMemoryCache())
    rng = np.random.default_rng(0)
    rows = []
    for layer in layers:
        rows.append(measure_layer(session, layer, args, threads, rng))
        print(f"  searched {layer.name}: {rows[-1][1]}", flush=True)

    print(f"\n{'layer':<30} {'x':>2} {'pick':<26} {'fastrun ms':>10} {'ort ms':>8} "
          f"{'ratio':>6}" + (f"  {'oracle best':<26} {'pick/best':>9}" if args.oracle else ""))
    for row in rows:
        layer, pick, ours, theirs = row[:4]
        line = (f"{layer.name:<30} {layer.count:>2} {pick:<26} {ours * 1e3:>10.3f} "
                f"{theirs * 1e3:>8.3f} {ours / theirs:>6.2f}")
        if args.oracle:
            line += f"  {row[5][0]:<26} {row[5][1]:>9.3f}"
        print(line)
    ours = sum(r[0].count * r[2] for r in rows)
    theirs = sum(r[0].count * r[3] for r in rows)
    print(f"\nsummed (weighted by occurrences): fastrun {ours * 1e3:.2f} ms, onnxruntime "
          f"{theirs * 1e3:.2f} ms, ratio {ours / theirs:.3f}")
    if args.oracle:
        print(f"worst pick/oracle: {max(r[5][1] for r in rows):.3f} (target <= 1.05)")
    print("\nfast-run rankings (ms, as measured during the search):")
    for row in rows:
        print(f"  {row[0].name}: {row[4]}")


if __name__ == "__main__":
    main()
