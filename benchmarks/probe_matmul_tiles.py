"""The matmul sub-problems of ResNet-18's convolutions: ``register_tiled`` and ``blas_split``
against BLAS.

The GEMM-based conv algorithms hand their products to the matmul operator, and those products
are not square: Winograd's are batches of (K x C) @ (C x tiles) with 16 to 196 tiles, im2col's
have 49 to 784 columns.  For each such product at batch 1 this prints the algorithms' times
(interleaved medians, the same inputs) and the ratios register_tiled / blas and blas_split /
blas; below 1.0 means faster than numpy's OpenBLAS (on one thread, fastrun's default:
fastrun/devices/cpu/threads.py).

    python -m benchmarks.probe_matmul_tiles [--rounds 7]
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks._common import header, interleaved_medians
from fastrun_algorithms.matmul import (
    BlasMatmul,
    MatmulOperator,
    RegisterTiledMatmul,
    SplitBlasMatmul,
)

#: (what, A shape, B shape): the products of ResNet-18's 3x3 layers at batch 1.
PRODUCTS = (
    ("winograd F(4,3) 64@56", (36, 64, 64), (36, 64, 196)),
    ("winograd F(4,3) 128@28", (36, 128, 128), (36, 128, 49)),
    ("winograd F(4,3) 256@14", (36, 256, 256), (36, 256, 16)),
    ("winograd F(2,3) 256@14", (16, 256, 256), (16, 256, 49)),
    ("winograd F(2,3) 512@7", (16, 512, 512), (16, 512, 16)),
    ("im2col 3x3/2 64->128 @56", (128, 576), (576, 784)),
    ("im2col 3x3/2 128->256 @28", (256, 1152), (1152, 196)),
    ("im2col 3x3/2 256->512 @14", (512, 2304), (2304, 49)),
    ("im2col 3x3 512->512 @7", (512, 4608), (4608, 49)),
    ("conv1x1 1x1/2 64->128 @56", (128, 64), (64, 784)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    operator, blas, tiled = MatmulOperator(), BlasMatmul(), RegisterTiledMatmul()
    split = SplitBlasMatmul()
    rng = np.random.default_rng(0)
    print(header("matmul sub-problems of ResNet-18 convs: register_tiled and blas_split vs "
                 "blas (OpenBLAS)"))
    print(f"{'product':28s} {'A':>16s} {'B':>16s} {'blas ms':>8s} {'tiled ms':>8s} "
          f"{'GFLOP/s':>8s} {'ratio':>6s} {'split ms':>8s} {'ratio':>6s}")
    for what, a_shape, b_shape in PRODUCTS:
        problem = operator.problem([a_shape, b_shape], ["float32", "float32"])
        a = rng.uniform(-1, 1, a_shape).astype(np.float32)
        b = rng.uniform(-1, 1, b_shape).astype(np.float32)
        calls = {name: (lambda alg=alg, problem=problem, a=a, b=b: alg.run(problem, [a, b], None))
                 for name, alg in (("blas", blas), ("tiled", tiled), ("split", split))}
        calls["tiled"]()  # compile
        calls["split"]()
        seconds = interleaved_medians(calls, rounds=args.rounds, number=50, settle_s=0.3)
        flops = 2 * np.prod(a_shape) * b_shape[-1]
        print(f"{what:28s} {a_shape!s:>16s} {b_shape!s:>16s} "
              f"{seconds['blas'] * 1e3:8.3f} {seconds['tiled'] * 1e3:8.3f} "
              f"{flops / seconds['tiled'] / 1e9:8.0f} {seconds['tiled'] / seconds['blas']:6.2f} "
              f"{seconds['split'] * 1e3:8.3f} {seconds['split'] / seconds['blas']:6.2f}")


if __name__ == "__main__":
    main()
