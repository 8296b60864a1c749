"""The ``resize`` operator: ONNX's Resize (and Upsample) in nearest and linear modes.

Parameters in canonical form, all explicit so that the cache key does not depend on how a
model spelled them:

* ``mode``: ``nearest``, ``linear`` (N-linear over every resized axis) or ``cubic``
  (``cubic_coeff_a`` the kernel's parameter, -0.75 unless cubic);
* ``exclude_outside``: taps outside the input weigh nothing, the others renormalised;
* ``antialias``: linear and cubic widen their window by 1/scale when downsampling;
* ``sizes``: the output shape, every axis;
* ``scales``: the scale of every axis, as the coordinate transform uses it (a model that gives
  ``sizes`` has scales ``sizes / input``, one that gives ``scales`` keeps them even where the
  output size was rounded down: ONNX's rule);
* ``coordinate_transformation_mode``: how an output coordinate maps to the input
  (:data:`COORDINATE_MODES`);
* ``nearest_mode``: how nearest rounds (``round_prefer_floor`` in linear mode, where it is
  unused);
* ``roi`` and ``extrapolation_value``: ``tf_crop_and_resize``'s crop box (starts then ends,
  every axis, normalised) and the value of outputs outside the input; ``()`` and 0.0 in every
  other mode.

Each axis maps independently (:func:`axis_table`), so a resize is separable: nearest gathers
one index per axis, linear and cubic sum two or four weighted neighbours per axis (more when
antialiased), their indices clamped to the input as ONNX's reference does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastrun.operator import Problem, Shape
from fastrun_algorithms._common import CanonicalOperator, check_known_params, parallel_pays

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                    "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                    "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
LINEAR_DTYPES = ("float32", "float64")
NEAREST_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                  "uint64", "float16", "float32", "float64")
#: From this many bytes of output on, the parallel algorithm goes first in the rule of thumb: a
#: memory-bound pass like relu's (``activation.operator.PARALLEL_MIN_BYTES``).
PARALLEL_MIN_BYTES = 2 * 1024 * 1024
KNOWN = ("mode", "sizes", "scales", "coordinate_transformation_mode", "nearest_mode", "roi",
         "extrapolation_value", "cubic_coeff_a", "exclude_outside", "antialias")


class ResizeOperator(CanonicalOperator):
    """X resized to ``sizes`` (see the module docstring for the parameters)."""

    name = "resize"
    version = 1

    def canonical_params(self, shapes, dtypes, params):
        check_known_params("resize", params, KNOWN)
        if len(shapes) != 1:
            raise ValueError(f"resize takes one input, got {len(shapes)}")
        rank = len(shapes[0])
        mode = params.get("mode", "nearest")
        if mode not in MODES:
            raise ValueError(f"resize mode must be one of {', '.join(MODES)}, got {mode!r}")
        allowed = NEAREST_DTYPES if mode == "nearest" else LINEAR_DTYPES
        if dtypes[0] not in allowed:
            raise ValueError(f"resize {mode} supports dtypes {', '.join(allowed)}, got "
                             f"{dtypes[0]}")
        transform = params.get("coordinate_transformation_mode", "half_pixel")
        if transform not in COORDINATE_MODES:
            raise ValueError(f"resize coordinate_transformation_mode must be one of "
                             f"{', '.join(COORDINATE_MODES)}, got {transform!r}")
        nearest = params.get("nearest_mode", "round_prefer_floor") if mode == "nearest" \
            else "round_prefer_floor"
        if nearest not in NEAREST_MODES:
            raise ValueError(f"resize nearest_mode must be one of {', '.join(NEAREST_MODES)}, "
                             f"got {nearest!r}")
        sizes = tuple(int(s) for s in params.get("sizes", ()))
        if len(sizes) != rank or min(sizes, default=0) < 0:
            raise ValueError(f"resize sizes must give {rank} non-negative sizes (one per axis "
                             f"of X {list(shapes[0])}), got {list(sizes)}")
        scales = params.get("scales")
        scales = tuple(float(s) for s in (scales if scales is not None else
                                          [o / i if i else 1.0
                                           for o, i in zip(sizes, shapes[0], strict=True)]))
        if len(scales) != rank or not all(math.isfinite(s) and s > 0 for s in scales):
            raise ValueError(f"resize scales must give {rank} positive finite scales, got "
                             f"{list(scales)}")
        roi: tuple[float, ...] = ()
        extrapolation = 0.0
        if transform == "tf_crop_and_resize":
            roi = tuple(float(v) for v in params.get("roi", ()))
            if len(roi) != 2 * rank:
                raise ValueError(f"resize tf_crop_and_resize needs a roi of {2 * rank} values "
                                 f"(starts and ends of every axis), got {list(roi)}")
            extrapolation = float(params.get("extrapolation_value", 0.0))
        antialias = bool(params.get("antialias", False))
        if antialias and mode == "nearest":
            raise ValueError("resize antialias applies to linear and cubic modes, not nearest")
        return {"mode": mode, "sizes": sizes, "scales": scales,
                "coordinate_transformation_mode": transform, "nearest_mode": nearest,
                "roi": roi, "extrapolation_value": extrapolation,
                "cubic_coeff_a": float(params.get("cubic_coeff_a", -0.75))
                if mode == "cubic" else -0.75,
                "exclude_outside": bool(params.get("exclude_outside", False)),
                "antialias": antialias}

    def output_shape(self, problem: Problem) -> Shape:
        return tuple(problem.param("sizes"))

    def output_dtype(self, problem: Problem) -> np.dtype:
        return np.dtype(problem.dtypes[0])

    def output_bytes(self, problem: Problem) -> int:
        return math.prod(problem.param("sizes")) * self.output_dtype(problem).itemsize

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """:func:`resample`, blending in float64."""
        x = np.asarray(inputs[0])
        tables = [axis_table(problem, axis) for axis in range(x.ndim)]
        return resample(problem, x if one_tap(tables) else x.astype(np.float64), tables)

    def tolerance(self, problem: Problem) -> float:
        if problem.param("mode") == "nearest":
            return 0.0  # a gather, or one-hot weights: exact
        return float(64 * np.finfo(np.dtype(problem.dtypes[0])).eps)

    def parallel_pays(self, problem: Problem) -> bool:
        return parallel_pays(self.output_bytes(problem), PARALLEL_MIN_BYTES)


@dataclass(frozen=True)
class AxisTable:
    """How one axis maps: output position o is ``sum_k weight[o, k] * input[index[o, k]]``
    (one tap for nearest, two for linear, four for cubic, more with antialiasing), the indices
    clamped to the input; ``outside[o]`` marks outputs of a crop box that fall outside the
    input (None when none can)."""

    index: np.ndarray
    weight: np.ndarray
    outside: np.ndarray | None
    #: the input's size along the axis
    size_in: int

    @property
    def identity(self) -> bool:
        """Whether the axis is copied as it is: same size, and each output all of its own input
        (one tap, or a linear axis at scale 1, whose two taps weigh 0 and 1)."""
        if self.outside is not None or self.index.shape[0] != self.size_in:
            return False
        own = self.index == np.arange(self.size_in)[:, None]
        return bool(np.all(np.where(own, True, self.weight == 0))
                    and np.all(np.where(own, self.weight, 0).sum(axis=1) == 1))


def original_coordinates(problem: Problem, axis: int) -> np.ndarray:
    """Each output position's coordinate in the input along ``axis``, float64, per
    ``coordinate_transformation_mode`` (ONNX's formulas, where the output length is the
    unrounded ``scale * input``)."""
    size_in = problem.shapes[0][axis]
    size_out = problem.param("sizes")[axis]
    scale = problem.param("scales")[axis]
    length = scale * size_in
    o = np.arange(size_out, dtype=np.float64)
    transform = problem.param("coordinate_transformation_mode")
    if transform == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if transform == "half_pixel_symmetric":
        center = size_in / 2
        return center * (1 - size_out / length) + (o + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if length != 1 else np.full_like(o, -0.5)
    if transform == "align_corners":
        return o * (size_in - 1) / (length - 1) if length != 1 else np.zeros_like(o)
    if transform == "asymmetric":
        return o / scale
    if transform == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    rank = len(problem.shapes[0])
    start, end = problem.param("roi")[axis], problem.param("roi")[axis + rank]
    if length != 1:
        return start * (size_in - 1) + o * (end - start) * (size_in - 1) / (length - 1)
    return np.full_like(o, start * (size_in - 1) + (end - start) * (size_in - 1) / 2)


def _cubic(distance: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel of parameter ``a`` at ``distance``."""
    d = np.abs(distance)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _coefficients(problem: Problem, ratio: np.ndarray, scale: float) -> np.ndarray:
    """(outputs, taps) weights of the taps ``base + first .. base + first + taps - 1`` around
    each output, where ``ratio`` in (0, 1] is the output's distance from ``base``; taps and
    ``first`` follow from the mode (:func:`_taps`)."""
    mode = problem.param("mode")
    taps, first = _taps(problem, scale)
    offsets = np.arange(first, first + taps, dtype=np.float64)[None, :] - ratio[:, None]
    if mode == "nearest":
        rounding = problem.param("nearest_mode")
        if rounding == "round_prefer_floor":
            right = ratio > 0.5
        elif rounding == "round_prefer_ceil":
            right = ratio >= 0.5
        else:
            right = np.full(ratio.shape, rounding == "ceil")
        right |= ratio == 1  # an exact input position is that position
        return np.stack([~right, right], axis=1).astype(np.float64)
    shrink = min(scale, 1.0) if problem.param("antialias") else 1.0
    if mode == "linear":
        weights = np.clip(1 - np.abs(offsets * shrink), 0, 1)
    else:
        weights = _cubic(offsets * shrink, problem.param("cubic_coeff_a"))
    return weights / weights.sum(axis=1, keepdims=True)


def _taps(problem: Problem, scale: float) -> tuple[int, int]:
    """(taps, first offset) of each output's window: nearest and linear 2 (offsets 0, 1),
    cubic 4 (-1 .. 2); antialiased, the window widens by 1/scale when downsampling."""
    half = 1 if problem.param("mode") in ("nearest", "linear") else 2
    if problem.param("antialias") and scale < 1:
        first = int(np.floor(-half / scale) + 1)
    else:
        first = 1 - half
    return 2 - 2 * first, first


def axis_table(problem: Problem, axis: int) -> AxisTable:
    """The :class:`AxisTable` of ``axis``, as ONNX's reference computes it: an output at an
    exact input position counts as ratio 1 from the position to its left, tap indices are
    clamped to the input (its edge padding), and with ``exclude_outside`` the taps outside
    the input weigh nothing and the rest are renormalised.  Nearest keeps only its chosen tap
    (unless ``exclude_outside`` may have removed it)."""
    size_in = problem.shapes[0][axis]
    scale = problem.param("scales")[axis]
    x = original_coordinates(problem, axis)
    outside = None
    if problem.param("coordinate_transformation_mode") == "tf_crop_and_resize":
        outside = (x < 0) | (x > size_in - 1)
    floor = np.floor(x)
    exact = x == floor
    base = np.where(exact, floor - 1, floor).astype(np.int64)
    ratio = np.where(exact, 1.0, x - floor)
    weight = _coefficients(problem, ratio, scale)
    taps, first = _taps(problem, scale)
    index = base[:, None] + np.arange(first, first + taps)[None, :]
    if problem.param("exclude_outside"):
        weight = np.where((index < 0) | (index >= size_in), 0.0, weight)
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, max(size_in - 1, 0))
    if problem.param("mode") == "nearest" and not problem.param("exclude_outside"):
        chosen = np.argmax(weight, axis=1)[:, None]
        index = np.take_along_axis(index, chosen, axis=1)
        weight = np.ones_like(index, dtype=np.float64)
    return AxisTable(index, weight, outside, size_in)


def blend(values: np.ndarray, axis: int, table: AxisTable,
          weight: np.ndarray | None = None) -> np.ndarray:
    """``values`` interpolated along ``axis`` by ``table``'s taps, the taps summed in order.
    ``weight`` is :func:`tap_weights` of the table in ``values``' dtype (made here when not
    given): one contiguous row per tap, which numpy multiplies in without a buffer.  Two
    arrays of the result's size at a time: the running sum and one weighted tap."""
    weight = tap_weights(table, values.dtype) if weight is None else weight
    shape = [1] * values.ndim
    shape[axis] = table.index.shape[0]
    size = list(values.shape)
    size[axis] = table.index.shape[0]
    out = np.empty(size, values.dtype)
    # mode="clip" (the indices are inside already): with "raise", take buffers its output
    np.take(values, table.index[:, 0], axis=axis, out=out, mode="clip")
    out *= weight[0].reshape(shape)
    term = np.empty_like(out) if table.index.shape[1] > 1 else out
    for tap in range(1, table.index.shape[1]):
        np.take(values, table.index[:, tap], axis=axis, out=term, mode="clip")
        term *= weight[tap].reshape(shape)
        out += term
    return out


def tap_weights(table: AxisTable, dtype: np.dtype) -> np.ndarray:
    """The table's weights as (taps, outputs), C-contiguous, in ``dtype``."""
    return np.ascontiguousarray(table.weight.T, dtype=dtype)


def blend_sizes(problem: Problem, tables: Sequence[AxisTable]) -> list[tuple[int, int]]:
    """(elements after, taps) of each axis that :func:`blend` resizes, in order."""
    shape = list(problem.shapes[0])
    steps = []
    for axis, table in enumerate(tables):
        if not table.identity:
            shape[axis] = table.index.shape[0]
            steps.append((math.prod(shape), table.index.shape[1]))
    return steps


def one_tap(tables: Sequence[AxisTable]) -> bool:
    """Whether every axis takes one tap: the resize is one gather (nearest)."""
    return all(t.index.shape[1] == 1 for t in tables)


def resample(problem: Problem, x: np.ndarray, tables: Sequence[AxisTable],
             weights: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """The resize by ``tables``: one gather when every axis takes one tap, else a
    :func:`blend` per axis that is not copied as it is, in ``x``'s dtype (``weights``: each
    axis's :func:`tap_weights` in that dtype, or made per call); then the output in X's dtype,
    with the extrapolation value where any axis fell outside the crop box."""
    if not x.size or not out_size(problem):
        return np.zeros(problem.param("sizes"), np.dtype(problem.dtypes[0]))
    if one_tap(tables):
        out = x[np.ix_(*[t.index[:, 0] for t in tables])]
    else:
        out = x
        for axis, table in enumerate(tables):
            if not table.identity:
                out = blend(out, axis, table, None if weights is None else weights[axis])
    out = np.ascontiguousarray(out, dtype=np.dtype(problem.dtypes[0]))
    for axis, table in enumerate(tables):
        if table.outside is not None and table.outside.any():
            index = [slice(None)] * out.ndim
            index[axis] = table.outside
            out[tuple(index)] = problem.param("extrapolation_value")
    return out


def out_size(problem: Problem) -> int:
    return math.prod(problem.param("sizes"))
