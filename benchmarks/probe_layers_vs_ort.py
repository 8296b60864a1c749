"""Where a model's time goes, layer by layer, in fastrun and in onnxruntime at one thread count.

``bench_scaling`` says how far apart the two engines are on a whole model; this probe says on
which layers.  Each engine runs in its own process (two pools of many spinning threads in one
process hold each other up), in a steady loop, with its own per-node timer:

* fastrun: ``load_and_run``'s in-run step times (the median inside whole inferences), from a
  fast-run cache searched at that thread count first (``--cache``, searched if missing);
* onnxruntime: its profiler's ``*_kernel_time`` events (CPU provider, the same intra-op
  threads, sequential), median per node over the timed iterations.

Both engines fuse: fastrun a Conv with its BatchNormalization, Add and Relu; onnxruntime a Conv
with its Relu (and BatchNormalization at load), and it converts layouts in nodes of its own.
Each onnxruntime node is counted for the fastrun step that did its work (matched by the ONNX
node names both keep), so a row compares the same work; nodes of no step (layout conversions)
are listed apart.  The last lines sum by operator kind: the ratio a change must move.

    python -m benchmarks.probe_layers_vs_ort --model resnet18 --threads 16 [--batch 1]
    python -m benchmarks.probe_layers_vs_ort --model DIR/efficientnet_b0.onnx --threads 2
        [--iters 30] [--cache FILE] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks._common import header, model_proto, model_spec


def _fastrun_steps(args: argparse.Namespace, workdir: str) -> list[dict]:
    """Per step: the node, the operator, the algorithm and the in-run median in us."""
    cache = args.cache or os.path.join(workdir, "cache.bin")
    profile = os.path.join(workdir, "fastrun-profile.json")
    base = [sys.executable, "-m", "fastrun.cli.load_and_run", model_spec(args.model),
            "--batch", str(args.batch), "--device", f"cpu:{args.threads}",
            "--algo-policy", cache, "--no-progress", "--weight-preprocess"]
    if not os.path.exists(cache):
        subprocess.run([*base, "--fast-run", "--iter", "1"], check=True, capture_output=True)
    subprocess.run([*base, "--iter", str(args.iters), "--warmup-iter", "5",
                    "--profile-json", profile], check=True, capture_output=True)
    with open(profile) as stream:
        steps = json.load(stream)["steps"]
    return [{"node": s["node"], "what": f"{s['operator'] or s['op_type']}:{s['algorithm']}",
             "us": (s["in_run_ms"] or 0.0) * 1e3} for s in steps]


def _ort_worker(model: str, batch: int, threads: int, iters: int) -> None:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    session = ort.InferenceSession(model_proto(model_spec(model)).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    spec = session.get_inputs()[0]
    feeds = {spec.name: np.random.default_rng(1).uniform(
        -1, 1, [batch, *spec.shape[1:]]).astype(np.float32)}
    for _ in range(5 + iters):
        session.run(None, feeds)
    with open(session.end_profiling()) as stream:
        events = json.load(stream)
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    kinds = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            node = name[:-len("_kernel_time")]
            per_node[node].append(float(event["dur"]))
            kinds[node] = event.get("args", {}).get("op_name", "?")
    print(json.dumps([{"node": node, "what": kinds[node],
                       "us": statistics.median(times[-iters:])}
                      for node, times in per_node.items()]))


def _ort_steps(args: argparse.Namespace) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.probe_layers_vs_ort",
                           "--ort-worker", "--model", args.model, "--batch", str(args.batch),
                           "--threads", str(args.threads), "--iters", str(args.iters)],
                          check=True, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(done.stdout.strip().splitlines()[-1])


def _step_for(ort_node: str, steps: list[dict]) -> int | None:
    """The fastrun step that did an onnxruntime node's work.  A fastrun step is named by the
    ONNX nodes it fused, joined by ``+``; onnxruntime names a fused node after one of its
    nodes, sometimes with a suffix (``_nchwc``, ``_token_12``).  The longest name that matches
    wins, so ``features.1`` does not claim ``features.10``."""
    best, best_length = None, -1
    for index, step in enumerate(steps):
        for name in step["node"].split("+"):
            if (ort_node == name or ort_node.startswith(name + "_")) and len(name) > best_length:
                best, best_length = index, len(name)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--cache", help="a fast-run cache for this thread count "
                        "(searched first if the file does not exist)")
    parser.add_argument("--top", type=int, default=25, help="rows of the per-layer table")
    parser.add_argument("--ort-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ort_worker:
        _ort_worker(args.model, args.batch, args.threads, args.iters)
        return

    print(header(f"{args.model} batch {args.batch}, {args.threads} threads: per layer"))
    with tempfile.TemporaryDirectory() as workdir:
        mine = _fastrun_steps(args, workdir)
    theirs = {row["node"]: row for row in _ort_steps(args)}
    rows = [{**step, "ort_us": 0.0, "ort_what": []} for step in mine]
    unclaimed = []
    for node, row in theirs.items():
        index = _step_for(node, mine)
        if index is None:
            unclaimed.append(row)
        else:
            rows[index]["ort_us"] += row["us"]
            rows[index]["ort_what"].append(row["what"])
    for row in rows:
        row["ort_what"] = "+".join(row["ort_what"]) or "-"

    mine_total = sum(r["us"] for r in mine)
    ort_total = sum(r["us"] for r in theirs.values())
    print(f"sum of steps: fastrun {mine_total:.0f} us, onnxruntime {ort_total:.0f} us, "
          f"ratio {mine_total / ort_total:.2f}")
    print(f"\n{'node':34s} {'fastrun':>9s} {'ort':>9s} {'diff':>8s}  fastrun algorithm / ort op")
    by_loss = sorted(rows, key=lambda r: r["ort_us"] - r["us"])
    for row in by_loss[:args.top]:
        print(f"{row['node'][:34]:34s} {row['us']:9.1f} {row['ort_us']:9.1f} "
              f"{row['us'] - row['ort_us']:8.1f}  {row['what']} / {row['ort_what']}")
    if unclaimed:
        print(f"\nonnxruntime nodes of no fastrun step, layout conversions among them "
              f"({len(unclaimed)}, {sum(r['us'] for r in unclaimed):.0f} us): "
              + ", ".join(f"{r['node']} {r['what']} {r['us']:.1f}" for r in unclaimed[:12]))

    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        kind = row["what"].split(":")[0]
        kinds[kind][0] += row["us"]
        kinds[kind][1] += row["ort_us"]
        kinds[kind][2] += 1
    print(f"\n{'operator':20s} {'steps':>5s} {'fastrun us':>11s} {'ort us':>9s} {'ratio':>6s}")
    for kind, (us, ort_us, count) in sorted(kinds.items(), key=lambda item: -item[1][0]):
        ratio = f"{us / ort_us:.2f}" if ort_us else "-"
        print(f"{kind:20s} {count:5d} {us:11.1f} {ort_us:9.1f} {ratio:>6s}")


if __name__ == "__main__":
    main()
