"""Conv parameters in one canonical form, and the geometry every algorithm computes from.

ONNX lets one convolution be written many ways (auto_pad or explicit pads, defaults left out,
1-D or 2-D).  The problem key must not depend on the spelling, so :func:`canonical_params`
resolves everything to explicit 2-D values before the problem is built, and algorithms read one
:class:`ConvGeometry` instead of re-deriving shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrun.operator import Problem
from fastrun_algorithms._common import same_pads
from fastrun_algorithms.layout.blocking import BLOCKED, LANES, LAYOUTS, NCHW, blocks

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
ACTIVATIONS = ("none", "relu", "clip", "hard_swish", "sigmoid", "silu", "hard_sigmoid")
SUPPORTED_DTYPES = ("float32", "float64")


def _pair(value: Any, spatial: int, name: str, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * spatial
    try:
        values = tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    except (OverflowError, TypeError, ValueError):
        raise ValueError(f"conv {name} must be positive integers, got {value!r}") from None
    if len(values) == 1 and spatial > 1:
        values = values * spatial
    if len(values) != spatial:
        raise ValueError(f"conv {name} needs {spatial} value(s) for a {spatial}-D convolution, "
                         f"got {list(values)}")
    if any(v < 1 for v in values):
        raise ValueError(f"conv {name} must be positive, got {list(values)}")
    return values


def _pads(params: Mapping[str, Any], sizes: Sequence[int], kernel: Sequence[int],
          strides: Sequence[int], dilations: Sequence[int]
          ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(begins, ends) of the padding, from explicit pads or ONNX's auto_pad."""
    spatial = len(sizes)
    auto_pad = str(params.get("auto_pad", "NOTSET") or "NOTSET").upper()
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"conv auto_pad must be one of {', '.join(AUTO_PADS)}, got {auto_pad!r}")
    if auto_pad == "VALID":
        return (0,) * spatial, (0,) * spatial
    if auto_pad != "NOTSET":
        split = [same_pads(*axis, upper=auto_pad == "SAME_UPPER")
                 for axis in zip(sizes, kernel, strides, dilations, strict=True)]
        return tuple(b for b, _ in split), tuple(e for _, e in split)
    pads = tuple(int(p) for p in params.get("pads") or (0,) * (2 * spatial))
    if len(pads) != 2 * spatial:
        raise ValueError(f"conv pads needs {2 * spatial} values (begins then ends), got "
                         f"{list(pads)}")
    if any(p < 0 for p in pads):
        raise ValueError(f"conv pads must not be negative, got {list(pads)}")
    return pads[:spatial], pads[spatial:]


def _epilogue_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The activation (relu6 spelled as clip(0, 6)) with its clip bounds or hard_sigmoid's
    alpha and beta, only where not at their defaults."""
    activation = str(params.get("activation", "none") or "none").lower()
    if activation == "relu6":  # the common spelling of clip(0, 6)
        activation = "clip"
    if activation not in ACTIVATIONS:
        raise ValueError(f"conv activation must be one of {', '.join(ACTIVATIONS)} (or relu6), "
                         f"got {activation!r}")
    result: dict[str, Any] = {} if activation == "none" else {"activation": activation}
    if activation == "clip":
        low = float(params.get("clip_min", 0.0) if params.get("clip_min") is not None else 0.0)
        high = float(params.get("clip_max", 6.0) if params.get("clip_max") is not None else 6.0)
        if low > high:
            raise ValueError(f"conv clip_min {low} is above clip_max {high}")
        result["clip_min"], result["clip_max"] = low, high
    elif params.get("clip_min") is not None or params.get("clip_max") is not None:
        raise ValueError("conv clip_min/clip_max need activation='clip'")
    if activation == "hard_sigmoid":  # ONNX's HardSigmoid: max(0, min(1, alpha x + beta))
        alpha, beta = params.get("alpha"), params.get("beta")
        result["alpha"] = float(0.2 if alpha is None else alpha)
        result["beta"] = float(0.5 if beta is None else beta)
    elif params.get("alpha") is not None or params.get("beta") is not None:
        raise ValueError("conv alpha/beta need activation='hard_sigmoid'")
    return result


def canonical_params(shapes: Sequence[Sequence[int]], params: Mapping[str, Any]) -> dict[str, Any]:
    """Resolve ONNX Conv attributes (and fastrun's epilogue options) to one explicit form.

    Result keys: strides, dilations, pads (top, left, bottom, right), group, and only when not
    at their defaults: residual, activation (+ clip_min and clip_max, or hard_sigmoid's alpha
    and beta), weight_preprocess, layout.  1-D convolutions are expressed as 2-D ones with a
    height of 1.

    ``layout``: ``nchw`` (the default) or ``nchw16c``, where X, Z and Y are channel-blocked
    (N, ceil(C/16), H, W, 16) tensors (2-D only; W and B keep their shapes).

    ``residual``: the last input Z, of the output's shape, is added before the activation,
    ``Y = act(conv(X, W) + B + Z)``: a ResNet block's shortcut fused into the conv that ends
    the block, so the sum costs no pass over memory of its own.
    """
    known = {"strides", "dilations", "pads", "auto_pad", "group", "kernel_shape", "activation",
             "clip_min", "clip_max", "alpha", "beta", "weight_preprocess", "residual", "layout"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"conv has no parameter(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    residual = bool(params.get("residual"))
    if len(shapes) - residual not in (2, 3):
        expected = "X, W[, B], Z" if residual else "X, W[, B]"
        raise ValueError(f"conv takes {2 + residual} or {3 + residual} inputs ({expected}), "
                         f"got {len(shapes)}")
    x_shape, w_shape = tuple(shapes[0]), tuple(shapes[1])
    layout = str(params.get("layout", NCHW) or NCHW).lower()
    if layout not in LAYOUTS:
        raise ValueError(f"conv layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == BLOCKED:
        if len(x_shape) != 5 or len(w_shape) != 4:
            raise ValueError(f"conv in layout {BLOCKED} is 2-D: X must be (N, C/{LANES}, H, W, "
                             f"{LANES}) and W (K, C/group, R, S); got X {x_shape}, W {w_shape}")
        x_shape = x_shape[:4]  # (N, blocks, H, W): the spatial dimensions are what matter here
    if len(x_shape) not in (3, 4):
        raise ValueError(f"conv supports 1-D and 2-D convolutions: X must be (N, C, W) or "
                         f"(N, C, H, W), got shape {x_shape}")
    if len(w_shape) != len(x_shape):
        raise ValueError(f"conv weight must have the rank of X ({len(x_shape)}), got shape "
                         f"{w_shape} for X {x_shape}")
    spatial = len(x_shape) - 2
    kernel = w_shape[2:]
    if params.get("kernel_shape") is not None and \
            tuple(int(k) for k in params["kernel_shape"]) != kernel:
        raise ValueError(f"conv kernel_shape {list(params['kernel_shape'])} does not match the "
                         f"weight's spatial shape {list(kernel)}")
    strides = _pair(params.get("strides"), spatial, "strides", 1)
    dilations = _pair(params.get("dilations"), spatial, "dilations", 1)
    begins, ends = _pads(params, x_shape[2:], kernel, strides, dilations)
    if spatial == 1:  # as 2-D with height 1
        strides, dilations = (1, *strides), (1, *dilations)
        begins, ends = (0, *begins), (0, *ends)
    group = 1 if params.get("group") is None else int(params["group"])
    if group < 1:
        raise ValueError(f"conv group must be positive, got {group}")
    result: dict[str, Any] = {
        "strides": tuple(strides),
        "dilations": tuple(dilations),
        "pads": (*begins, *ends),
        "group": group,
    }
    result.update(_epilogue_params(params))
    if params.get("weight_preprocess"):
        result["weight_preprocess"] = True
    if residual:
        result["residual"] = True
    if layout != NCHW:
        result["layout"] = layout
    return result


@dataclass(frozen=True)
class ConvGeometry:
    """Everything about one conv problem, always as 2-D (a 1-D conv has h == r == 1)."""

    n: int
    c: int
    h: int
    w: int
    k: int  # output channels
    r: int  # kernel height
    s: int  # kernel width
    oh: int
    ow: int
    stride_h: int
    stride_w: int
    dil_h: int
    dil_w: int
    pad_top: int
    pad_left: int
    pad_bottom: int
    pad_right: int
    group: int
    has_bias: bool
    #: the last input is a residual Z added before the activation (see canonical_params)
    has_residual: bool
    activation: str
    clip_min: float
    clip_max: float
    one_d: bool
    dtype: str
    #: ``nchw``, or ``nchw16c``: X, Z and Y channel-blocked (see fastrun_algorithms.layout)
    layout: str = NCHW
    #: hard_sigmoid's slope and offset
    alpha: float = 0.2
    beta: float = 0.5

    @property
    def blocked(self) -> bool:
        return self.layout == BLOCKED

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.c // self.group

    @property
    def kg(self) -> int:
        """Output channels per group."""
        return self.k // self.group

    @property
    def is_depthwise(self) -> bool:
        return self.group == self.c and self.cg == 1

    @property
    def out_shape(self) -> tuple[int, ...]:
        if self.blocked:
            return (self.n, blocks(self.k), self.oh, self.ow, LANES)
        if self.one_d:
            return (self.n, self.k, self.ow)
        return (self.n, self.k, self.oh, self.ow)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def macs(self) -> int:
        """Multiply-adds of the direct method (for GFLOP/s figures and heuristics)."""
        return self.n * self.k * self.oh * self.ow * self.cg * self.r * self.s

    def as_4d(self, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Views of X and W as (N, C, H, W) and (K, C/group, R, S)."""
        if self.one_d:
            return x[:, :, None, :], w[:, :, None, :]
        return x, w

    def as_4d_output(self, y: np.ndarray) -> np.ndarray:
        """An array of the output's shape (the residual Z) viewed as (N, K, OH, OW)."""
        return y[:, :, None, :] if self.one_d else y

    def output_view(self, out4: np.ndarray) -> np.ndarray:
        """The (N, K, OH, OW) result in the caller's rank."""
        return out4[:, :, 0, :] if self.one_d else out4


@functools.lru_cache(maxsize=4096)
def geometry(problem: Problem) -> ConvGeometry:
    """The geometry of a canonical conv problem (see :func:`canonical_params`)."""
    x_shape, w_shape = problem.shapes[0], problem.shapes[1]
    layout = problem.param("layout", NCHW)
    if layout == BLOCKED:  # C is not in X's shape: the weights give it
        x_shape = (x_shape[0], w_shape[1] * problem.param("group"), *x_shape[2:4])
    one_d = len(x_shape) == 3
    if one_d:
        x_shape = (x_shape[0], x_shape[1], 1, x_shape[2])
        w_shape = (w_shape[0], w_shape[1], 1, w_shape[2])
    n, c, h, w = x_shape
    k, _, r, s = w_shape
    stride_h, stride_w = problem.param("strides")
    dil_h, dil_w = problem.param("dilations")
    top, left, bottom, right = problem.param("pads")
    residual = bool(problem.param("residual"))
    oh = (h + top + bottom - (dil_h * (r - 1) + 1)) // stride_h + 1
    ow = (w + left + right - (dil_w * (s - 1) + 1)) // stride_w + 1
    return ConvGeometry(
        n=n, c=c, h=h, w=w, k=k, r=r, s=s, oh=oh, ow=ow,
        stride_h=stride_h, stride_w=stride_w, dil_h=dil_h, dil_w=dil_w,
        pad_top=top, pad_left=left, pad_bottom=bottom, pad_right=right,
        group=problem.param("group"),
        has_bias=len(problem.shapes) - residual == 3, has_residual=residual,
        activation=problem.param("activation", "none"),
        clip_min=problem.param("clip_min", 0.0), clip_max=problem.param("clip_max", 6.0),
        one_d=one_d, dtype=problem.dtypes[0], layout=layout,
        alpha=problem.param("alpha", 0.2), beta=problem.param("beta", 0.5),
    )
