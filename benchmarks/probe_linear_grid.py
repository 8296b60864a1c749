"""Transformer projections on many threads: how ``blas_split`` cuts the output, against
onnxruntime's MatMul + Add and OpenBLAS's own threads.

The ``linear`` steps of BERT-base and ViT-B/16 are three quarters of an inference at 16
threads (docs/performance.md), and ``blas_split`` runs them as one single-threaded gemm per
block of the output.  Which blocks is a choice: by rows, by columns, or a grid of both, and
more blocks than threads.  This probe times the projections of those models (M = 128 tokens
for BERT, 197 for ViT; bias added, as the model's ``linear`` steps do) for:

* ``plan``: the cut :func:`split_plan` makes today;
* ``RxC``: every grid of R row blocks by C column blocks with R x C equal to the thread count
  or twice it;
* ``ort``: onnxruntime running a MatMul + Add graph of the same shapes at the thread count.

onnxruntime is timed in a block of its own after them (its workers spin between calls and
would sit on the cores numba's workers need); the fastrun cuts run in interleaved rounds
(median of rounds; each round ``--number`` calls).  Prints microseconds and TFLOP/s per
variant, and each one's ratio to onnxruntime.

    python -m benchmarks.probe_linear_grid [--threads 16] [--rounds 9] [--number 20]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._common import header, interleaved_medians, time_calls

#: (model, M, K, N): the projections of BERT-base (128 tokens) and ViT-B/16 (197 tokens).
SHAPES = (
    ("bert qkv", 128, 768, 768),
    ("bert mlp up", 128, 768, 3072),
    ("bert mlp down", 128, 3072, 768),
    ("vit qkv", 197, 768, 2304),
    ("vit out", 197, 768, 768),
    ("vit mlp up", 197, 768, 3072),
    ("vit mlp down", 197, 3072, 768),
)


def _grids(threads: int) -> list[tuple[int, int]]:
    grids = []
    for blocks in (threads, 2 * threads):
        grids += [(r, blocks // r) for r in range(1, blocks + 1) if blocks % r == 0]
    return grids


def ort_projection_time(x: np.ndarray, w: np.ndarray, bias: np.ndarray, threads: int,
                        number: int, rounds: int) -> float:
    """onnxruntime's seconds per call of a MatMul + Add graph (median of ``rounds``)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    (m, k), n = x.shape, w.shape[1]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feed = {"x": x}
    seconds = float(np.median([time_calls(lambda: session.run(None, feed), number)
                               for _ in range(rounds)]))
    return seconds  # the session, and its pool's workers, go with this frame


def _fastrun_times(x: np.ndarray, w: np.ndarray, bias: np.ndarray, threads: int, number: int,
                   rounds: int) -> dict[str, float]:
    """Seconds per call of each cut of ``blas_split``."""
    from fastrun_algorithms.linear.algorithms import _finish_block
    from fastrun_algorithms.matmul.blas_split import split_kernel, split_plan

    kernel = split_kernel("float32", _finish_block)
    (m, k), n = x.shape, w.shape[1]
    x3, w3 = x.reshape(1, m, k), w.reshape(1, k, n)
    out = np.empty((1, m, n), np.float32)
    epilogue = (bias, True, 0)
    reference = x @ w + bias

    def cut(grid):
        return lambda: kernel(x3, w3, out, *grid, epilogue)

    variants = {"plan": cut(split_plan(1, m, n, threads))}
    variants.update({f"{r}x{c}": cut((r, c)) for r, c in _grids(threads)})
    for name, function in variants.items():
        function()
        np.testing.assert_allclose(out[0], reference, rtol=1e-3, atol=1e-3, err_msg=name)
    return interleaved_medians(variants, rounds, number)


def projection_arguments(description: str) -> argparse.Namespace:
    """The options of the projection benchmarks: threads, rounds, calls per round and which
    of :data:`SHAPES` (``args.wanted``: their labels, empty for all)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--only", default="", help="comma-separated shape labels")
    args = parser.parse_args()
    args.wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    return args


def main() -> None:
    args = projection_arguments(__doc__.split("\n\n")[0])

    import numba

    from fastrun.devices.cpu.threads import configure_threads
    from fastrun_algorithms.matmul.blas_split import split_plan

    configure_threads()  # OpenBLAS on the calling thread, as in a fastrun model
    numba.set_num_threads(args.threads)
    print(header(f"blas_split's cuts of transformer projections, {args.threads} threads"))
    rng = np.random.default_rng(0)
    for label, m, k, n in SHAPES:
        if args.wanted and label not in args.wanted:
            continue
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        bias = rng.standard_normal(n, dtype=np.float32)
        times = _fastrun_times(x, w, bias, args.threads, args.number, args.rounds)
        times["ort"] = ort_s = ort_projection_time(x, w, bias, args.threads, args.number,
                                                   args.rounds)
        time.sleep(0.2)  # let onnxruntime's workers stop spinning
        flops = 2.0 * m * n * k
        print(f"\n## {label}: {m}x{k} @ {k}x{n}, plan {split_plan(1, m, n, args.threads)}",
              flush=True)
        for name, seconds in sorted(times.items(), key=lambda item: item[1]):
            print(f"{name:>9} {seconds * 1e6:9.1f} us {flops / seconds / 1e12:6.2f} TFLOP/s "
                  f"x ort {seconds / ort_s:5.2f}")


if __name__ == "__main__":
    main()
