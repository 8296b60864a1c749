"""The pooling operators: maxpool, avgpool, global_maxpool, global_avgpool and lrn, with ONNX
semantics (MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool, LRN; opsets 1-22)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fastrun.operator import Operator, Problem, Shape
from fastrun_algorithms.pooling.geometry import (
    SUPPORTED_DTYPES,
    canonical_pool_params,
    check_dtypes,
    pool_geometry,
)

if TYPE_CHECKING:
    pass


def _check_canonical(operator: Operator, problem: Problem, canonical: Mapping[str, Any]) -> None:
    """Problems built any other way than with ``operator.problem()`` may spell parameters
    differently, and then equal problems would get different cache keys: refuse them."""
    if dict(problem.params) != dict(canonical):
        raise ValueError(f"{operator.name} problems must be built with {type(operator).__name__}"
                         f".problem() so that their parameters are canonical; got "
                         f"{dict(problem.params)}, canonical {dict(canonical)}")


class _WindowPoolOperator(Operator):
    """maxpool and avgpool: windows sliding over 1, 2 or 3 spatial axes (see
    :mod:`fastrun_algorithms.pooling.geometry` for the exact semantics)."""

    version = 1
    average = False

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        canonical = canonical_pool_params(self.name, shapes, params, self.average)
        problem = Problem.create(self.name, shapes, dtypes, canonical)
        self.validate(problem)
        return problem

    def validate(self, problem: Problem) -> None:
        check_dtypes(self.name, problem.dtypes)
        _check_canonical(self, problem, canonical_pool_params(
            self.name, problem.shapes, dict(problem.params), self.average))
        geo = pool_geometry(problem)
        for axis, counts in enumerate(geo.real_counts):
            if min(counts) < 1:
                o = counts.index(0)
                raise ValueError(
                    f"{self.name} output {o} along spatial axis {axis} has a window of padding "
                    f"only (input length {geo.sizes[axis]}, pads {geo.begins[axis]}+"
                    f"{geo.ends[axis]}, kernel {geo.kernel[axis]}, stride {geo.strides[axis]}, "
                    f"dilation {geo.dilations[axis]}): ONNX gives it no value; use smaller "
                    f"pads")

    def output_shape(self, problem: Problem) -> Shape:
        return pool_geometry(problem).out_shape

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """Float64, straight from the definition: pad (with -inf for a max, zeros for an
        average) to every position a window reads, then combine one strided view per kernel
        offset; an average divides by the number of its taps that a 0/1 mask of the counted
        positions marks."""
        geo = pool_geometry(problem)
        x = np.asarray(inputs[0], np.float64)
        reach = geo.reach
        inside = (slice(None), slice(None),
                  *(slice(b, b + s) for b, s in zip(geo.begins, geo.sizes, strict=True)))
        padded = np.full((geo.n, geo.c, *reach), 0.0 if geo.average else -np.inf)
        padded[inside] = x
        counted = np.zeros((1, 1, *reach))
        if geo.count_include_pad:  # the explicitly padded input, not ceil_mode's overhang
            counted[(slice(None), slice(None), *(slice(0, b + s + e) for b, s, e in zip(
                geo.begins, geo.sizes, geo.ends, strict=True)))] = 1.0
        else:
            counted[inside] = 1.0
        result = count = None
        for offset in itertools.product(*(range(k) for k in geo.kernel)):
            window = (slice(None), slice(None), *(
                slice(j * d, j * d + (o - 1) * st + 1, st)
                for j, d, o, st in zip(offset, geo.dilations, geo.out, geo.strides,
                                       strict=True)))
            if result is None:
                result, count = padded[window].copy(), counted[window].copy()
            elif geo.average:
                result += padded[window]
                count += counted[window]
            else:
                result = np.maximum(result, padded[window])
        return result / count if geo.average else result


class MaxPoolOperator(_WindowPoolOperator):
    """``Y = maxpool(X)`` as ONNX MaxPool defines it (without the Indices output).

    Input X (N, C, D1[, D2[, D3]]), float32 or float64.  Parameters: kernel_shape (required),
    strides, pads (begins then ends), dilations, auto_pad (NOTSET, SAME_UPPER, SAME_LOWER,
    VALID), ceil_mode, and storage_order (accepted, ignored: it only orders Indices).
    Padding never wins a max.  Problems are built canonical (see
    :func:`~fastrun_algorithms.pooling.geometry.canonical_pool_params`).
    """

    name = "maxpool"
    average = False

    def tolerance(self, problem: Problem) -> float:
        # a max picks one of the inputs: any algorithm must reproduce it exactly
        return 0.0


class AvgPoolOperator(_WindowPoolOperator):
    """``Y = avgpool(X)`` as ONNX AveragePool defines it (dilations as in opset 19+).

    The parameters of maxpool (storage_order aside, which it also accepts) plus
    count_include_pad: 0 divides by the real elements of each window, 1 also counts the
    explicit padding, but never the positions only ceil_mode's last window reaches.
    """

    name = "avgpool"
    average = True


class _GlobalPoolOperator(Operator):
    """global_maxpool and global_avgpool: one value per (image, channel) over all spatial
    axes; X (N, C, *spatial) -> (N, C, 1, ..., 1).  No parameters."""

    version = 1

    def validate(self, problem: Problem) -> None:
        if problem.params:
            raise ValueError(f"{self.name} takes no parameters, got "
                             f"{', '.join(name for name, _ in problem.params)}")
        check_dtypes(self.name, problem.dtypes)
        x_shape = problem.shapes[0]
        if len(x_shape) < 2:
            raise ValueError(f"{self.name} needs X of shape (N, C, *spatial), got {x_shape}")
        if min(x_shape) < 1:
            raise ValueError(f"{self.name} input must not be empty, got shape {x_shape}")

    def output_shape(self, problem: Problem) -> Shape:
        x_shape = problem.shapes[0]
        return (x_shape[0], x_shape[1], *(1 for _ in x_shape[2:]))


class GlobalMaxPoolOperator(_GlobalPoolOperator):
    """``Y = max of X over its spatial axes`` (ONNX GlobalMaxPool)."""

    name = "global_maxpool"

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs[0], np.float64)
        return np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)

    def tolerance(self, problem: Problem) -> float:
        return 0.0


class GlobalAvgPoolOperator(_GlobalPoolOperator):
    """``Y = mean of X over its spatial axes`` (ONNX GlobalAveragePool)."""

    name = "global_avgpool"

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs[0], np.float64)
        return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


class PoolLinearOperator(Operator):
    """A classifier head in one step: ``Y = mean of X over its spatial axes, flattened, @ W
    (+ B)``; X (N, C, *spatial), W (C, M), B (M,) -> (N, M).

    It is ONNX's GlobalAveragePool -> Flatten -> Gemm (or MatMul, and Add of a bias), which
    the runtime fuses into it only on a device with an algorithm for it
    (``fastrun/runtime/fusion.py``): on a GPU each of those steps is a launch, and a
    batch-1 model waits for its launches.  No parameters."""

    name = "pool_linear"
    version = 1

    def validate(self, problem: Problem) -> None:
        if problem.params:
            raise ValueError(f"{self.name} takes no parameters, got "
                             f"{', '.join(name for name, _ in problem.params)}")
        if len(problem.shapes) not in (2, 3):
            raise ValueError(f"{self.name} takes X, W and an optional B, got "
                             f"{len(problem.shapes)} inputs")
        if len(set(problem.dtypes)) != 1 or problem.dtypes[0] not in SUPPORTED_DTYPES:
            raise ValueError(f"{self.name} needs float32 or float64 inputs of one dtype, got "
                             f"{', '.join(problem.dtypes)}")
        x, w = problem.shapes[0], problem.shapes[1]
        if len(x) < 3 or min(x) < 1:
            raise ValueError(f"{self.name} needs X of shape (N, C, *spatial), got {x}")
        if len(w) != 2 or w[0] != x[1] or w[1] < 1:
            raise ValueError(f"{self.name} needs W of shape ({x[1]}, M) for X {x}, got {w}")
        if len(problem.shapes) == 3 and tuple(problem.shapes[2]) != (w[1],):
            raise ValueError(f"{self.name} needs B of shape ({w[1]},), got "
                             f"{problem.shapes[2]}")

    def output_shape(self, problem: Problem) -> Shape:
        return (problem.shapes[0][0], problem.shapes[1][1])

    def batch_inputs(self, problem: Problem) -> tuple[int, ...]:
        return (0,)

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs[0], np.float64)
        pooled = np.mean(x.reshape(x.shape[0], x.shape[1], -1), axis=2)
        out = pooled @ np.asarray(inputs[1], np.float64)
        if len(inputs) == 3:
            out += np.asarray(inputs[2], np.float64)
        return out


def lrn_window(size: int) -> tuple[int, int]:
    """ONNX LRN's channel window around channel c: ``c - before`` to ``c + after`` inclusive,
    ``before = floor((size - 1) / 2)``, ``after = ceil((size - 1) / 2)``."""
    return (size - 1) // 2, size // 2


def canonical_lrn_params(shapes: Sequence[Sequence[int]],
                         params: Mapping[str, Any]) -> dict[str, Any]:
    """size as an int, alpha, beta and bias as floats with ONNX's defaults filled in."""
    known = {"size", "alpha", "beta", "bias"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"lrn has no parameter(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    if len(shapes) != 1:
        raise ValueError(f"lrn takes one input X, got {len(shapes)}")
    size = params.get("size")
    if size is None:
        raise ValueError("lrn needs size (the number of channels to sum over)")
    if isinstance(size, (bool, float)) or int(size) < 1:
        raise ValueError(f"lrn size must be a positive integer, got {size!r}")
    result: dict[str, Any] = {"size": int(size)}
    for name, default in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)):
        value = params.get(name, default)
        value = default if value is None else value
        if isinstance(value, bool) or not np.isfinite(float(value)):
            raise ValueError(f"lrn {name} must be a finite number, got {value!r}")
        result[name] = float(value)
    return result


class LRNOperator(Operator):
    """Local response normalisation across channels, as ONNX LRN defines it::

        Y[n, c, ...] = X[n, c, ...] / (bias + alpha / size * sum of X[n, c', ...]^2)^beta

    summed over ``c'`` in ``[c - floor((size-1)/2), c + ceil((size-1)/2)]`` clipped to the
    channels.  X (N, C, ...), float32 or float64; parameters size (required), alpha=1e-4,
    beta=0.75, bias=1.0.
    """

    name = "lrn"
    version = 1

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        problem = Problem.create(self.name, shapes, dtypes, canonical_lrn_params(shapes, params))
        self.validate(problem)
        return problem

    def validate(self, problem: Problem) -> None:
        check_dtypes(self.name, problem.dtypes)
        _check_canonical(self, problem,
                         canonical_lrn_params(problem.shapes, dict(problem.params)))
        x_shape = problem.shapes[0]
        if len(x_shape) < 2:
            raise ValueError(f"lrn needs X of shape (N, C, ...), got {x_shape}")
        if min(x_shape) < 1:
            raise ValueError(f"lrn input must not be empty, got shape {x_shape}")

    def output_shape(self, problem: Problem) -> Shape:
        return tuple(problem.shapes[0])

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """Float64, one channel at a time."""
        x = np.asarray(inputs[0], np.float64)
        size = problem.param("size")
        before, after = lrn_window(size)
        channels = x.shape[1]
        out = np.empty_like(x)
        for c in range(channels):
            square_sum = np.sum(x[:, max(0, c - before):min(channels, c + after + 1)] ** 2,
                                axis=1)
            scale = problem.param("bias") + problem.param("alpha") / size * square_sum
            out[:, c] = x[:, c] / scale ** problem.param("beta")
        return out
