"""The ``linear`` operator: ``act(X @ W + B)``, a fully connected layer with its bias and its
activation in one step.

Why an operator of its own rather than a matmul with an epilogue: matmul is numpy's (any
rank, broadcast batches, 1-D operands) and has a dozen algorithms that would all have to learn
a bias; a transformer's projections and MLPs are all 2-D products by a constant weight followed
by a bias add and often a GELU, which the runtime fuses into this (``fastrun/runtime/fusion.py``)
where the device has an algorithm for it.  Each of those steps was a pass over the product's
output; here the bias and the activation are applied to each block of the output while it is
still in cache.

Inputs X (M, K), W (K, N), an optional bias B (N,) and, with ``residual``, a last input Z of
M x N values (any shape: read in row-major order, so a transformer's (1, M, N) residual is
taken as it lies), one float dtype; ``act(X @ W + B + Z)``, as conv's residual.  A
transformer's residual Add after its output projection and its MLP is fused into them
(``fastrun/runtime/patterns.py``).  ``activation``: ``none``, ``relu`` or ``gelu`` (the exact,
erf form).  ``weight_preprocess``: W is a constant
that algorithms may transform once, outside the timed calls (``packed`` packs it into column
panels).  Output (M, N).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastrun.operator import Problem, Shape
from fastrun_algorithms._common import CanonicalOperator, check_known_params
from fastrun_algorithms.activation.operator import gelu_error

SUPPORTED_DTYPES = ("float32", "float64")
ACTIVATIONS = ("none", "relu", "gelu")
#: The activation codes the CPU and OpenCL kernels take: none 0, relu 1, gelu 2.
CODES = {name: code for code, name in enumerate(ACTIVATIONS)}


def operands(problem: Problem, inputs: Sequence[Any]) -> tuple[Any, Any, Any, Any]:
    """(X, W, B or None, Z or None) of a linear problem's inputs: Z is the last input when
    ``residual`` is set, B the third when there is one besides."""
    z = inputs[-1] if problem.param("residual", False) else None
    rest = inputs[:-1] if z is not None else inputs
    return rest[0], rest[1], rest[2] if len(rest) > 2 else None, z


class LinearOperator(CanonicalOperator):
    """``act(X @ W + B)`` (see the module docstring)."""

    name = "linear"
    version = 1
    preprocesses_weights = True

    def canonical_params(self, shapes: Sequence[Shape], dtypes: Sequence[str],
                         params: Mapping[str, Any]) -> dict[str, Any]:
        check_known_params(self.name, params, ("activation", "weight_preprocess", "residual"))
        residual = bool(params.get("residual"))
        if len(shapes) - residual not in (2, 3):
            raise ValueError(f"linear takes 2 or 3 inputs (X, W[, B]){' and Z' * residual}, "
                             f"got {len(shapes)}")
        if any(str(d) not in SUPPORTED_DTYPES for d in dtypes) or len(set(map(str, dtypes))) > 1:
            raise ValueError(f"linear needs X, W and B of one dtype among "
                             f"{', '.join(SUPPORTED_DTYPES)}, got {', '.join(map(str, dtypes))}")
        x, w = tuple(shapes[0]), tuple(shapes[1])
        if len(x) != 2 or len(w) != 2 or x[1] != w[0]:
            raise ValueError(f"linear needs X (M, K) and W (K, N), got X {x} and W {w}")
        if len(shapes) - residual == 3 and tuple(shapes[2]) != (w[1],):
            raise ValueError(f"linear bias must be ({w[1]},), got {tuple(shapes[2])}")
        if residual and math.prod(shapes[-1]) != x[0] * w[1]:
            raise ValueError(f"linear residual Z must have M x N = {x[0] * w[1]} values, got "
                             f"shape {tuple(shapes[-1])}")
        activation = params.get("activation", "none") or "none"
        if activation not in ACTIVATIONS:
            raise ValueError(f"linear activation must be one of {', '.join(ACTIVATIONS)}, got "
                             f"{activation!r}")
        return {"activation": activation,
                **({"weight_preprocess": True} if params.get("weight_preprocess") else {}),
                **({"residual": True} if residual else {})}

    def output_shape(self, problem: Problem) -> Shape:
        return (problem.shapes[0][0], problem.shapes[1][1])

    def output_dtype(self, problem: Problem) -> np.dtype:
        return np.dtype(problem.dtypes[0])

    def work(self, problem: Problem) -> float:
        (m, k), n = problem.shapes[0], problem.shapes[1][1]
        return float(m * k * n)

    def error(self, problem: Problem, output: Any, reference: np.ndarray) -> float:
        """The base measure, but after a GELU gelu's (:func:`~fastrun_algorithms.activation.
        operator.gelu_error`): tiny outputs of large negative sums say nothing by their
        relative error."""
        if problem.param("activation") == "gelu":
            return gelu_error(problem, output, reference)
        return super().error(problem, output, reference)

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        x, w, bias, z = operands(problem, inputs)
        out = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
        if bias is not None:
            out += np.asarray(bias, np.float64)
        if z is not None:
            out += np.asarray(z, np.float64).reshape(out.shape)
        activation = problem.param("activation")
        if activation == "relu":
            out = np.where(out < 0, 0.0, out)
        elif activation == "gelu":
            out = 0.5 * out * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(
                out / math.sqrt(2))) if out.size else out
        return out.astype(problem.dtypes[0])
