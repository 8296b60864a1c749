"""The squeeze_excite operator: a squeeze-and-excitation block (Hu et al.) in one step.

``Y[n, c] = X[n, c] * gate(act(mean(X[n]) @ W1 + B1) @ W2 + B2)[c]``: each channel's plane
is averaged, the averages go through two small fully connected layers, and the second one's
gated output scales the channel.  MobileNetV3, EfficientNet and RegNet-Y end most
blocks with one, which ONNX writes as five or six nodes (GlobalAveragePool, a 1x1 Conv, its
activation, a 1x1 Conv, Sigmoid or HardSigmoid, Mul).  The runtime fuses them into this
operator where the device has an algorithm for it (``fastrun/runtime/fusion.py``): as separate
steps, the pool, the two matrix-vector products and the scale each paid a step's call and
parallel region for a few microseconds of work.

Inputs: X (N, C, *spatial), W1 (C, S), B1 (S,), W2 (S, C), B2 (C,), one float dtype: the
layers' weights as a matmul takes them (a 1x1 conv's (S, C, 1, 1) weight transposed), so
that a kernel runs over a layer's outputs in vectors.
Parameters: ``activation`` after the first layer (none, relu, silu or hard_swish; default
none), ``gate`` after the second (sigmoid or hard_sigmoid; default sigmoid), and
hard_sigmoid's ``alpha`` and ``beta`` (defaults 0.2 and 0.5, ONNX's), kept only with that gate.
``layout``: ``nchw`` (the default) or ``nchw16c``, X and Y in the channel-blocked layout
(:mod:`fastrun_algorithms.layout.blocking`), C then read from W1: a mobile network's blocks
run blocked from their expansion to their projection only if the block's squeeze-and-excitation
does too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastrun.operator import Operator, Problem, Shape
from fastrun_algorithms.layout.blocking import (
    BLOCKED,
    LAYOUTS,
    NCHW,
    check_blocked,
    to_blocked,
    to_nchw,
)

ACTIVATIONS = ("none", "relu", "silu", "hard_swish")
GATES = ("sigmoid", "hard_sigmoid")
DTYPES = ("float32", "float64")


class SqueezeExciteOperator(Operator):
    """X scaled per channel by the gated output of two layers on its channel means (see the
    module docstring)."""

    name = "squeeze_excite"
    parameters = frozenset({"activation", "gate", "alpha", "beta", "layout"})

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[object],
                **params: object) -> Problem:
        """Defaults dropped, hard_sigmoid's alpha and beta filled in: one key per block."""
        if params.get("activation") == "none":
            params = {k: v for k, v in params.items() if k != "activation"}
        if params.get("layout") == NCHW:
            params = {k: v for k, v in params.items() if k != "layout"}
        if params.get("gate", "sigmoid") == "hard_sigmoid":
            params = {**params, "alpha": float(params.get("alpha", 0.2)),
                      "beta": float(params.get("beta", 0.5))}
        elif params.get("gate") == "sigmoid":
            params = {k: v for k, v in params.items() if k != "gate"}
        return super().problem(shapes, dtypes, **params)

    def validate(self, problem: Problem) -> None:
        activation = problem.param("activation", "none")
        gate = problem.param("gate", "sigmoid")
        if activation not in ACTIVATIONS:
            raise ValueError(f"{self.name} activation must be one of {', '.join(ACTIVATIONS)}, "
                             f"got {activation!r}")
        if gate not in GATES:
            raise ValueError(f"{self.name} gate must be one of {', '.join(GATES)}, got {gate!r}")
        layout = problem.param("layout", NCHW)
        if layout not in LAYOUTS:
            raise ValueError(f"{self.name} layout must be one of {', '.join(LAYOUTS)}, got "
                             f"{layout!r}")
        if gate != "hard_sigmoid" and (problem.param("alpha") is not None
                                       or problem.param("beta") is not None):
            raise ValueError(f"{self.name} alpha/beta need gate='hard_sigmoid'")
        if len(problem.shapes) != 5:
            raise ValueError(f"{self.name} takes X, W1, B1, W2 and B2, got "
                             f"{len(problem.shapes)} inputs")
        if len(set(problem.dtypes)) != 1 or problem.dtypes[0] not in DTYPES:
            raise ValueError(f"{self.name} needs float32 or float64 inputs of one dtype, got "
                             f"{', '.join(problem.dtypes)}")
        x, w1, b1, w2, b2 = (tuple(shape) for shape in problem.shapes)
        if len(x) < 3 or min(x) < 1:
            raise ValueError(f"{self.name} needs X of shape (N, C, *spatial), got {x}")
        channels = x[1]
        if layout == BLOCKED:
            channels = w1[0] if w1 else 0
            check_blocked(x, channels, f"{self.name} X")
        squeezed = w1[1] if len(w1) == 2 else 0
        expected = ((channels, squeezed), (squeezed,), (squeezed, channels), (channels,))
        if squeezed < 1 or (w1, b1, w2, b2) != expected:
            raise ValueError(f"{self.name} needs W1 ({channels}, S), B1 (S,), W2 (S, "
                             f"{channels}) and B2 ({channels},) for X {x}, got {w1}, {b1}, "
                             f"{w2}, {b2}")

    def output_shape(self, problem: Problem) -> Shape:
        return tuple(problem.shapes[0])

    def batch_inputs(self, problem: Problem) -> tuple[int, ...]:
        return (0,)

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        x, w1, b1, w2, b2 = (np.asarray(v, np.float64) for v in inputs)
        blocked = problem.param("layout", NCHW) == BLOCKED
        if blocked:
            x = to_nchw(x, w1.shape[0])
        pooled = x.reshape(x.shape[0], x.shape[1], -1).mean(axis=2)
        hidden = _activate(pooled @ w1 + b1, problem.param("activation", "none"), problem)
        gate = _activate(hidden @ w2 + b2, problem.param("gate", "sigmoid"), problem)
        out = x * gate.reshape(*gate.shape, *([1] * (x.ndim - 2)))
        return to_blocked(out) if blocked else out


def _activate(values: np.ndarray, name: str, problem: Problem) -> np.ndarray:
    if name == "relu":
        return np.maximum(values, 0.0)
    if name == "silu":
        return values / (1.0 + np.exp(-values))
    if name == "hard_swish":
        return values * np.clip(values + 3.0, 0.0, 6.0) / 6.0
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-values))
    if name == "hard_sigmoid":
        return np.clip(values * problem.param("alpha") + problem.param("beta"), 0.0, 1.0)
    return values
