"""The ``conv_transpose`` operator: ONNX's ConvTranspose (a convolution's gradient with respect
to its input: each input pixel spreads its kernel-weighted values over the output), 1-D and 2-D.

Parameters in one canonical form, as conv's are, so that the cache key does not depend on how a
model spelled them: ``strides``, ``dilations``, ``pads`` (top, left, bottom, right: cropped
from the full result), ``output_padding`` (rows and columns added at the bottom and right) and
``group``.  ``auto_pad`` and ``output_shape`` are resolved into pads here, as ONNX's reference
implementation does: the total padding is ``stride * (in - 1) + output_padding + (kernel - 1)
* dilation + 1 - out``, split evenly, the odd one at the end for ``SAME_UPPER`` and at the
beginning otherwise.  An ``output_shape`` beyond the full result makes a pad negative, which
extends the output with zeros (plus the bias).  Algorithms see a 1-D problem as a 2-D one of
height 1 (:func:`geometry`).

Inputs: X (N, C, H, W), W (C, K/group, kh, kw), an optional bias B (K,).  Output (N, K,
out_h, out_w) with ``out = stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 -
pad_begin - pad_end``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrun.operator import Problem, Shape
from fastrun_algorithms._common import CanonicalOperator, check_known_params

SUPPORTED_DTYPES = ("float32", "float64")
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
KNOWN = ("strides", "dilations", "pads", "output_padding", "output_shape", "auto_pad", "group",
         "kernel_shape")


def _ints(name: str, value: Any, count: int, default: int, low: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * count
    try:
        values = tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"conv_transpose {name} must be integers, got {value!r}") from None
    if len(values) != count:
        raise ValueError(f"conv_transpose {name} needs {count} value(s), got {list(values)}")
    if any(v < low for v in values):
        raise ValueError(f"conv_transpose {name} must be at least {low}, got {list(values)}")
    return values


@dataclass(frozen=True)
class Geometry:
    """What every algorithm computes from, in 2-D."""

    batch: int
    channels: int
    height: int
    width: int
    out_channels: int
    kh: int
    kw: int
    group: int
    sh: int
    sw: int
    dh: int
    dw: int
    top: int
    left: int
    out_h: int
    out_w: int
    has_bias: bool

    @property
    def before_h(self) -> int:
        """Rows of zeros before the uncropped result: an ``output_shape`` larger than the
        result gives a negative pad, which extends the output instead of cropping it."""
        return max(0, -self.top)

    @property
    def before_w(self) -> int:
        return max(0, -self.left)

    @property
    def full_h(self) -> int:
        """Rows of the uncropped result, big enough for the crop and the output padding."""
        return self.before_h + max(self.sh * (self.height - 1) + (self.kh - 1) * self.dh + 1,
                                   self.top + self.out_h)

    @property
    def full_w(self) -> int:
        return self.before_w + max(self.sw * (self.width - 1) + (self.kw - 1) * self.dw + 1,
                                   self.left + self.out_w)


@functools.lru_cache(maxsize=4096)
def geometry(problem: Problem) -> Geometry:
    """The problem in 2-D: a 1-D one has a height of 1, and stride, dilation 1 and no padding
    on it."""
    x, w = problem.shapes[0], problem.shapes[1]
    strides, dilations = problem.param("strides"), problem.param("dilations")
    output_padding, pads = problem.param("output_padding"), problem.param("pads")
    if len(x) == 3:
        x, w = (x[0], x[1], 1, x[2]), (w[0], w[1], 1, w[2])
        strides, dilations = (1, *strides), (1, *dilations)
        output_padding, pads = (0, *output_padding), (0, pads[0], 0, pads[1])
    group = problem.param("group")
    (sh, sw), (dh, dw), (oph, opw) = strides, dilations, output_padding
    out = ConvTransposeOperator.out_size
    return Geometry(x[0], x[1], x[2], x[3], w[1] * group, w[2], w[3], group, sh, sw, dh, dw,
                    pads[0], pads[1], out(x[2], w[2], sh, dh, oph, pads[0] + pads[2]),
                    out(x[3], w[3], sw, dw, opw, pads[1] + pads[3]), len(problem.shapes) > 2)


def output_shape(problem: Problem) -> Shape:
    """(N, K, out_w) for a 1-D problem, (N, K, out_h, out_w) for a 2-D one."""
    geo = geometry(problem)
    if len(problem.shapes[0]) == 3:
        return (geo.batch, geo.out_channels, geo.out_w)
    return (geo.batch, geo.out_channels, geo.out_h, geo.out_w)


class ConvTransposeOperator(CanonicalOperator):
    """ONNX ConvTranspose (see the module docstring)."""

    name = "conv_transpose"
    version = 1

    @staticmethod
    def out_size(size: int, kernel: int, stride: int, dilation: int, output_padding: int,
                 pads: int) -> int:
        return stride * (size - 1) + output_padding + (kernel - 1) * dilation + 1 - pads

    def canonical_params(self, shapes: Sequence[Shape], dtypes: Sequence[str],
                         params: Mapping[str, Any]) -> dict[str, Any]:
        check_known_params(self.name, params, KNOWN)
        if len(shapes) not in (2, 3):
            raise ValueError(f"conv_transpose takes 2 or 3 inputs (X, W[, B]), got {len(shapes)}")
        unsupported = [d for d in dtypes if str(d) not in SUPPORTED_DTYPES]
        if unsupported or len(set(map(str, dtypes))) != 1:
            raise ValueError(f"conv_transpose needs X, W and B of one dtype among "
                             f"{', '.join(SUPPORTED_DTYPES)}, got {', '.join(map(str, dtypes))}")
        x, w = tuple(shapes[0]), tuple(shapes[1])
        if len(x) not in (3, 4):
            raise ValueError(f"conv_transpose supports 1-D and 2-D inputs: X must be (N, C, W) "
                             f"or (N, C, H, W), got shape {x}")
        if len(w) != len(x):
            raise ValueError(f"conv_transpose weight must have the rank of X ({len(x)}), got "
                             f"shape {w}")
        spatial = len(x) - 2
        group = 1 if params.get("group") is None else int(params["group"])
        if group < 1 or x[1] % group or w[0] != x[1]:
            raise ValueError(f"conv_transpose needs W's first dimension ({w[0]}) equal to X's "
                             f"channels ({x[1]}), divisible by group {group}")
        if len(shapes) == 3 and tuple(shapes[2]) != (w[1] * group,):
            raise ValueError(f"conv_transpose bias must be ({w[1] * group},), got "
                             f"{tuple(shapes[2])}")
        kernel = w[2:]
        if params.get("kernel_shape") is not None and \
                tuple(int(k) for k in params["kernel_shape"]) != kernel:
            raise ValueError(f"conv_transpose kernel_shape {list(params['kernel_shape'])} does "
                             f"not match the weight's {list(kernel)}")
        strides = _ints("strides", params.get("strides"), spatial, 1, 1)
        dilations = _ints("dilations", params.get("dilations"), spatial, 1, 1)
        output_padding = _ints("output_padding", params.get("output_padding"), spatial, 0, 0)
        if any(p >= max(s, d) for p, s, d in zip(output_padding, strides, dilations,
                                                  strict=True)):
            raise ValueError(f"conv_transpose output_padding {list(output_padding)} must be "
                             f"smaller than the stride or the dilation")
        auto_pad = str(params.get("auto_pad", "NOTSET") or "NOTSET").upper()
        if isinstance(params.get("auto_pad"), bytes):
            auto_pad = params["auto_pad"].decode().upper()
        if auto_pad not in AUTO_PADS:
            raise ValueError(f"conv_transpose auto_pad must be one of {', '.join(AUTO_PADS)}, "
                             f"got {auto_pad!r}")
        output_shape = params.get("output_shape")
        if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if output_shape is not None:
                wanted = tuple(int(v) for v in output_shape)[-spatial:]
            else:
                wanted = tuple(size * s for size, s in zip(x[2:], strides, strict=True))
            begins, ends = [], []
            for size, k, s, d, op, out in zip(x[2:], kernel, strides, dilations, output_padding,
                                              wanted, strict=True):
                total = self.out_size(size, k, s, d, op, 0) - out  # < 0: the output grows
                small, large = total // 2, total - total // 2
                upper = auto_pad == "SAME_UPPER"  # as ONNX's reference implementation splits
                begins.append(small if upper else large)
                ends.append(large if upper else small)
            pads = (*begins, *ends)
        elif auto_pad == "VALID":
            pads = (0,) * (2 * spatial)
        else:
            # negative where an output_shape beyond the full result was resolved (see above)
            pads = _ints("pads", params.get("pads"), 2 * spatial, 0, -(1 << 62))
        result = {"strides": tuple(strides), "dilations": tuple(dilations), "pads": tuple(pads),
                  "output_padding": tuple(output_padding), "group": group}
        problem = Problem.create(self.name, [tuple(s) for s in shapes], list(map(str, dtypes)),
                                 result)
        geo = geometry(problem)
        if geo.out_h < 1 or geo.out_w < 1:
            raise ValueError(f"conv_transpose pads {list(pads)} crop the whole output")
        return result

    def output_shape(self, problem: Problem) -> Shape:
        return output_shape(problem)

    def output_dtype(self, problem: Problem) -> np.dtype:
        return np.dtype(problem.dtypes[0])

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """Tap by tap in float64: each kernel tap's product, spread over the full result's
        strided grid, then the crop and the bias."""
        out = spread_taps(geometry(problem), *(np.asarray(a, np.float64) for a in inputs))
        return out.reshape(output_shape(problem)).astype(problem.dtypes[0])

    def work(self, problem: Problem) -> float:
        geo = geometry(problem)
        return float(geo.batch * geo.channels * geo.height * geo.width * geo.kh * geo.kw
                     * geo.out_channels // geo.group)


def as_2d(geo: Geometry, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """X as (N, C, H, W) and W as (C, K/group, kh, kw)."""
    return (x.reshape(geo.batch, geo.channels, geo.height, geo.width),
            w.reshape(geo.channels, geo.out_channels // geo.group, geo.kh, geo.kw))


def spread_taps(geo: Geometry, x: np.ndarray, w: np.ndarray,
                bias: np.ndarray | None = None) -> np.ndarray:
    """The (N, K, out_h, out_w) result, one BLAS product per (group, tap): the tap's weights
    (K/group, C/group) times the group's input (C/group, H*W), added to the full result at
    rows ``ih * sh + r * dh`` and columns ``iw * sw + s * dw``, then cropped."""
    x, w = as_2d(geo, x, w)
    per_in, per_out = geo.channels // geo.group, geo.out_channels // geo.group
    full = np.empty((geo.batch, geo.out_channels, geo.full_h, geo.full_w), x.dtype)
    # The bias starts every sum.  Added to the cropped result instead, numpy's broadcasting
    # ``+=`` would buffer up to 8192 of its elements: an allocation the workspace misses.
    np.copyto(full, 0 if bias is None else bias.reshape(1, -1, 1, 1))
    for g in range(geo.group):
        xs = x[:, g * per_in:(g + 1) * per_in].reshape(geo.batch, per_in, -1)
        for r in range(geo.kh):
            for s in range(geo.kw):
                tap = w[g * per_in:(g + 1) * per_in, :, r, s]  # (C/group, K/group)
                product = np.matmul(tap.T, xs)  # (N, K/group, H*W)
                first_row, first_col = geo.before_h + r * geo.dh, geo.before_w + s * geo.dw
                rows = slice(first_row, first_row + geo.sh * (geo.height - 1) + 1, geo.sh)
                cols = slice(first_col, first_col + geo.sw * (geo.width - 1) + 1, geo.sw)
                full[:, g * per_out:(g + 1) * per_out, rows, cols] += product.reshape(
                    geo.batch, per_out, geo.height, geo.width)
    top, left = geo.before_h + geo.top, geo.before_w + geo.left
    out = full[:, :, top:top + geo.out_h, left:left + geo.out_w]
    return np.ascontiguousarray(out)
