"""Whole models on the OpenCL device against torch eager with cuDNN, same run, same card.

For every model and batch (default: resnet18, resnet50 and mobilenet_v2 at batch 1, 8 and
32):

1. a fast-run search on the OpenCL device into a cache of its own, in a process of its own
   (its wall time and the problems it profiled are printed: target for resnet18 at batch 32,
   under 2 minutes);
2. ``--pairs`` rounds of two processes, alternating: fastrun running the model from that cache
   (nothing searched), and torch running the same ONNX graph op by op with its eager calls
   on CUDA (``Conv`` as ``conv2d``, ``BatchNormalization`` as ``batch_norm``, ...: what a
   torchvision model in eval mode does), with ``cudnn.benchmark = True`` and TF32 off; a
   zoo model whose graph that interpreter does not run (``vit_b16``) runs as torchvision's
   model of the same layout (:data:`TORCHVISION`).  Each process warms up, then times
   ``--iters`` inferences one by one, inputs uploaded and the output downloaded in every one,
   as a serving loop does.  Both also time a resident loop (input already on the card, output
   left there, each run waited for): fastrun through ``Model.run_resident``, torch eager and
   as a CUDA graph replay, which a PyTorch user who cares about latency captures;
3. two ratios of the medians of the process medians: the serving loops (fastrun/torch;
   targets: resnet18 <= 1.0 at batch 1 and <= 1.1 at 8 and 32; resnet50 and mobilenet_v2
   <= 1.2), and fastrun resident against torch's CUDA graph (resident/CUDA graph, issue 35's
   target); and fastrun's host microseconds per step: the time the host spends issuing the
   model's steps, before waiting for the output, over the number of steps (target <= 10).

Without torch or CUDA (PoCL on a CPU) the peer columns say so and only fastrun's figures are
printed.

    python -m benchmarks.bench_opencl_models [--models resnet18] [--batches 1,8]
        [--pairs 3] [--iters 50] [--budget S] [--cache-dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from benchmarks._common import header, model_proto, model_spec, run_worker, steady_loop

#: ratio targets by model (batch 1, larger batches): issue 18's CNNs, issue 34's ViT-B/16
TARGETS = {"resnet18": (1.0, 1.1), "resnet50": (1.2, 1.2), "mobilenet_v2": (1.2, 1.2),
           "vit_b16": (1.0, 1.0)}
#: zoo models whose graphs the node-by-node peer does not run, by torchvision's name for the
#: same layout
TORCHVISION = {"vit_b16": "vit_b_16"}
HOST_TARGET_US = 10.0


# -- the torch peer: the ONNX graph run with torch's eager calls ---------------------------------

class TorchGraph:
    """The model's ONNX graph executed node by node with torch's functional calls on CUDA.

    The same arithmetic as the torchvision model a PyTorch user would run in eval mode (batch
    norm as its own call, not folded), so the comparison is with torch eager as users meet it.
    Shape arithmetic (``Shape``, ``Gather``, ``Concat`` of sizes before a ``Reshape``) is done
    on the host, as ``x.view(x.size(0), -1)`` would be."""

    def __init__(self, proto, torch):
        from onnx import helper, numpy_helper

        self.torch = torch
        self.f = torch.nn.functional
        weights = {t.name for t in proto.graph.initializer}
        self.input = next(i.name for i in proto.graph.input if i.name not in weights)
        self.output = proto.graph.output[0].name
        self.values = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).cuda()
                       for t in proto.graph.initializer}
        self.nodes = [(n.op_type, list(n.input), n.output[0],
                       {a.name: helper.get_attribute_value(a) for a in n.attribute})
                      for n in proto.graph.node]
        # Clip's bounds as numbers read here: reading a tensor on the card while a CUDA graph
        # is captured would end the capture
        host = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        for op, inputs, _, attrs in self.nodes:
            if op == "Clip":
                for index, key in ((1, "min"), (2, "max")):
                    if len(inputs) > index and inputs[index] in host:
                        attrs[key] = float(host[inputs[index]])
                        inputs[index] = ""
        for op, _, _, _ in self.nodes:
            if not hasattr(self, f"_op_{op}"):
                raise SystemExit(f"the torch peer does not run ONNX {op} nodes")

    def __call__(self, x):
        env = dict(self.values)
        env[self.input] = x
        for op, inputs, output, attrs in self.nodes:
            env[output] = getattr(self, f"_op_{op}")([env.get(i) for i in inputs], attrs)
        return env[self.output]

    # one method per ONNX operator the zoo models use
    def _op_Conv(self, a, attrs):
        pads = attrs.get("pads", [0, 0, 0, 0])
        if pads[:2] != pads[2:]:
            raise SystemExit("the torch peer runs symmetric conv padding only")
        return self.f.conv2d(a[0], a[1], a[2] if len(a) > 2 else None,
                             stride=tuple(attrs.get("strides", (1, 1))), padding=tuple(pads[:2]),
                             dilation=tuple(attrs.get("dilations", (1, 1))),
                             groups=attrs.get("group", 1))

    def _op_BatchNormalization(self, a, attrs):
        return self.f.batch_norm(a[0], a[3], a[4], a[1], a[2], training=False,
                                 eps=attrs.get("epsilon", 1e-5))

    def _op_Relu(self, a, attrs):
        return self.f.relu(a[0])

    def _op_Clip(self, a, attrs):
        low = float(a[1]) if len(a) > 1 and a[1] is not None else attrs.get("min", -3.4e38)
        high = float(a[2]) if len(a) > 2 and a[2] is not None else attrs.get("max", 3.4e38)
        # (a bound from another node's output is read from the card: not capturable)
        return self.f.hardtanh(a[0], low, high)

    def _op_MaxPool(self, a, attrs):
        pads = attrs.get("pads", [0, 0, 0, 0])
        return self.f.max_pool2d(a[0], tuple(attrs["kernel_shape"]),
                                 tuple(attrs.get("strides", attrs["kernel_shape"])),
                                 tuple(pads[:2]), ceil_mode=bool(attrs.get("ceil_mode", 0)))

    def _op_Add(self, a, attrs):
        return a[0] + a[1]

    def _op_GlobalAveragePool(self, a, attrs):
        return self.f.adaptive_avg_pool2d(a[0], 1)

    def _op_Flatten(self, a, attrs):
        return self.torch.flatten(a[0], attrs.get("axis", 1))

    def _op_Dropout(self, a, attrs):
        return a[0]

    def _op_Gemm(self, a, attrs):
        if attrs.get("transB", 0):
            return self.f.linear(a[0], a[1], a[2] if len(a) > 2 else None)
        return self.torch.addmm(a[2], a[0], a[1]) if len(a) > 2 else a[0] @ a[1]

    def _op_Shape(self, a, attrs):
        return list(a[0].shape)

    def _op_Constant(self, a, attrs):
        from onnx import numpy_helper

        return numpy_helper.to_array(attrs["value"]).tolist()

    def _op_Gather(self, a, attrs):
        return a[0][int(a[1])]

    def _op_Unsqueeze(self, a, attrs):
        return [a[0]]

    def _op_Concat(self, a, attrs):
        if all(isinstance(v, list) for v in a):
            return [int(x) for v in a for x in v]
        return self.torch.cat(a, attrs.get("axis", 0))

    def _op_Reshape(self, a, attrs):
        return a[0].reshape(tuple(int(v) for v in a[1]))


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# -- the worker processes ------------------------------------------------------------------------

def worker_search(args: argparse.Namespace) -> dict:
    import fastrun
    from fastrun.runtime import load

    started = time.perf_counter()
    session = fastrun.session(device=args.device, cache=args.cache, strategy="fast-run",
                              budget_s=args.budget, progress=False)
    model = load(model_spec(args.model), session, batch=args.batch, weight_preprocess=True)
    model.search()
    return {"search_s": time.perf_counter() - started, "profiled": session.stats.profiled}


def worker_fastrun(args: argparse.Namespace) -> dict:
    import fastrun
    from fastrun.runtime import load

    session = fastrun.session(device=args.device, cache=args.cache, strategy="heuristic",
                              progress=False)
    model = load(model_spec(args.model), session, batch=args.batch, weight_preprocess=True)
    model.launch_plan()  # what the first run records, out of every timed loop
    feeds = model.random_inputs(seed=1)
    result = steady_loop(lambda: model.run(feeds), args.iters, args.warmup)
    resident = model.random_inputs(seed=1, on_device=True)
    result["resident_ms"] = steady_loop(lambda: model.run_resident(resident), args.iters,
                                        args.warmup)["median_ms"]
    host = [model.run_host_seconds(feeds)[1] for _ in range(args.iters)]
    steps = model.step_count
    result.update(host_us_per_step=statistics.median(host) * 1e6 / steps, steps=steps,
                  missed=session.stats.heuristic + session.stats.nearest,
                  launches=model.replay_note)
    return result


def _torch_network(proto, model: str, torch):
    """(the network, whether it computes this ONNX graph's weights): the graph run node by node
    (:class:`TorchGraph`), or for a zoo model whose graph has nodes it does not run (a
    transformer's), torchvision's model of the same layout with random weights, as a PyTorch
    user would run it (the times do not depend on the weights)."""
    try:
        return TorchGraph(proto, torch), True
    except SystemExit:
        if model not in TORCHVISION:
            raise
    import torchvision

    return getattr(torchvision.models, TORCHVISION[model])().eval().cuda(), False


def worker_torch(args: argparse.Namespace) -> dict:
    """Serving loops of torch eager (input uploaded, output downloaded: ``median_ms``), and
    with the input resident on the card, eager and as a CUDA graph replay (captured once from
    the same eager calls, then replayed), the three a PyTorch user would compare."""
    import numpy as np

    torch = _torch_cuda()
    torch.backends.cudnn.benchmark = True  # cuDNN's own algorithm search
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    proto = model_proto(model_spec(args.model))
    graph, same_weights = _torch_network(proto, args.model, torch)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    shape = [args.batch, *(d.dim_value for d in dims[1:])]
    x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)

    def run():
        with torch.inference_mode():
            return graph(torch.from_numpy(x).cuda()).cpu().numpy()

    result = steady_loop(run, args.iters, args.warmup)
    result.update(_torch_resident(torch, graph, x, args.iters, args.warmup))
    if not same_weights:
        return result
    try:  # the peer computes the model: its output against onnxruntime's
        import onnxruntime as ort
    except ImportError:
        return result
    reference = ort.InferenceSession(proto.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, {
                                         graph.input: x})[0]
    result["error_vs_ort"] = float(np.abs(run() - reference).max()
                                   / max(np.abs(reference).max(), 1e-30))
    return result


def _torch_resident(torch, network, x, iters: int, warmup: int) -> dict:
    """Medians with the input already on the card and the output left there: eager, and a
    CUDA graph of the same calls replayed (``graph_ms``), each run waited for."""
    resident = torch.from_numpy(x).cuda()
    with torch.inference_mode():
        def eager():
            network(resident)
            torch.cuda.synchronize()

        eager_ms = steady_loop(eager, iters, warmup)["median_ms"]
        side = torch.cuda.Stream()  # capture needs warmed-up calls on a side stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                network(resident)
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            network(resident)

        def replay():
            captured.replay()
            torch.cuda.synchronize()

        graph_ms = steady_loop(replay, iters, warmup)["median_ms"]
    return {"resident_ms": eager_ms, "graph_ms": graph_ms}


WORKERS = {"search": worker_search, "fastrun": worker_fastrun, "torch": worker_torch}


# -- the driver ----------------------------------------------------------------------------------

def _spawn(kind: str, model: str, batch: int, args: argparse.Namespace, cache: str) -> dict:
    arguments = ["--worker", kind, "--model", model, "--batch", str(batch),
                 "--device", args.device, "--iters", str(args.iters),
                 "--warmup", str(args.warmup), "--cache", cache]
    if args.budget is not None:
        arguments += ["--budget", str(args.budget)]
    return run_worker("benchmarks.bench_opencl_models", arguments,
                      f"{kind} worker for {model} at batch {batch}",
                      env={"FASTRUN_REPLAY": "1" if args.replay else "0"})


def measure(model: str, batch: int, args: argparse.Namespace, directory: str,
            peer: bool) -> dict:
    cache = os.path.join(directory, f"{model}-b{batch}.bin")
    search = _spawn("search", model, batch, args, cache)
    runs: dict[str, list[dict]] = {"fastrun": [], "torch": []}
    for _ in range(args.pairs):
        runs["fastrun"].append(_spawn("fastrun", model, batch, args, cache))
        if peer:
            runs["torch"].append(_spawn("torch", model, batch, args, cache))
    medians = {name: statistics.median(r["median_ms"] for r in results)
               for name, results in runs.items() if results}
    row = {"model": model, "batch": batch, "search": search, "runs": runs, "medians_ms": medians,
           "resident_ms": statistics.median(r["resident_ms"] for r in runs["fastrun"]),
           "host_us_per_step": statistics.median(r["host_us_per_step"]
                                                 for r in runs["fastrun"]),
           "steps": runs["fastrun"][0]["steps"]}
    if peer:
        row["ratio"] = medians["fastrun"] / medians["torch"]
        row["torch_graph_ms"] = statistics.median(r["graph_ms"] for r in runs["torch"])
        row["torch_resident_ms"] = statistics.median(r["resident_ms"] for r in runs["torch"])
        row["graph_ratio"] = row["resident_ms"] / row["torch_graph_ms"]
        errors = [r["error_vs_ort"] for r in runs["torch"] if "error_vs_ort" in r]
        if errors:
            row["torch_error_vs_ort"] = max(errors)
    return row


def _device_line(device: str) -> str:
    import fastrun

    session = fastrun.Session(device=device, progress=False)
    cl_device = getattr(session.device, "cl_device", None)
    if cl_device is None:
        return str(session.device)
    return (f"{cl_device.name.strip()}, driver {cl_device.driver_version.strip()}, "
            f"{cl_device.platform.name.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50,mobilenet_v2")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--device", default="opencl")
    parser.add_argument("--pairs", type=int, default=3, help="alternating rounds of processes")
    parser.add_argument("--iters", type=int, default=50, help="timed inferences per process")
    parser.add_argument("--warmup", type=int, default=5, help="untimed inferences first")
    parser.add_argument("--budget", type=float, default=None,
                        help="the search's seconds of timed repeats per candidate (default: "
                             "fastrun's)")
    parser.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True,
                        help="fastrun replays its recorded launches (default; --no-replay: "
                             "every step through its algorithm)")
    parser.add_argument("--cache-dir", help="keep the searched caches here (default: temporary)")
    parser.add_argument("--json", help="write every measurement to this file")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return

    torch = _torch_cuda()
    peer = torch is not None
    print(header(f"whole models on {args.device}: {_device_line(args.device)}"))
    print(f"# peer: {'torch ' + torch.__version__ + ' eager, cuDNN ' + str(torch.backends.cudnn.version()) + ' (benchmark mode, TF32 off), ' + torch.cuda.get_device_name() if peer else 'none (no torch with CUDA here)'}")  # noqa: E501
    print(f"# {args.pairs} alternating rounds of processes, {args.iters} inferences each")
    print("| model | batch | fastrun ms | torch ms | fastrun/torch | target | fastrun resident "
          "ms | torch resident ms | torch CUDA graph ms | resident/CUDA graph | host us/step "
          "| steps | search s | problems searched |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.cache_dir or scratch
        os.makedirs(directory, exist_ok=True)
        for model in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                row = measure(model, batch, args, directory, peer)
                rows.append(row)
                target = TARGETS.get(model, (None, None))[0 if batch == 1 else 1]
                fast = ", ".join(f"{r['median_ms']:.2f}" for r in row["runs"]["fastrun"])
                peer_ms = ", ".join(f"{r['median_ms']:.2f}" for r in row["runs"]["torch"])
                ratio = f"**{row['ratio']:.2f}**" if "ratio" in row else "-"
                resident = (f"{row['resident_ms']:.2f} | "
                            + (f"{row['torch_resident_ms']:.2f} | {row['torch_graph_ms']:.2f} | "
                               f"**{row['graph_ratio']:.2f}**" if peer else "- | - | -"))
                print(f"| {model} | {batch} | {fast} | {peer_ms or '-'} | {ratio} | "
                      f"{'<= ' + str(target) if target else '-'} | {resident} | "
                      f"{row['host_us_per_step']:.1f} | {row['steps']} | "
                      f"{row['search']['search_s']:.1f} | {row['search']['profiled']} |",
                      flush=True)
                print(f"#   launches: {row['runs']['fastrun'][0]['launches'] or 'step by step'}",
                      flush=True)
                if args.json:
                    with open(args.json, "w", encoding="utf-8") as stream:
                        json.dump(rows, stream, indent=1)
    print(f"(host target: <= {HOST_TARGET_US:g} us per step)")
    errors = [f"{r['model']} b{r['batch']} {r['torch_error_vs_ort']:.1e}" for r in rows
              if "torch_error_vs_ort" in r]
    if errors:
        print(f"(the torch peer's output against onnxruntime's, relative: {', '.join(errors)})")


if __name__ == "__main__":
    main()
