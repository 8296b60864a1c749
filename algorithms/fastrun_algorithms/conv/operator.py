"""The conv operator: ONNX Conv semantics for 1-D and 2-D inputs, with a fused epilogue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fastrun.operator import Epilogue, Operator, Problem, Shape
from fastrun_algorithms.conv.geometry import SUPPORTED_DTYPES, canonical_params, geometry
from fastrun_algorithms.layout.blocking import check_blocked, to_blocked, to_nchw

if TYPE_CHECKING:
    pass


class ConvOperator(Operator):
    """``Y = act(conv(X, W) + B)`` as ONNX Conv defines it (NCHW, OIHW weights), plus fastrun's
    epilogue parameters.

    Inputs: X (N, C, H, W) or (N, C, W); W (K, C/group, R, S) or (K, C/group, S); optional
    bias B (K,); with ``residual``, Z of the output's shape last (``Y = act(conv + B + Z)``).
    Parameters: ONNX's strides, dilations, pads (begins then ends), auto_pad (NOTSET,
    SAME_UPPER, SAME_LOWER, VALID), group, kernel_shape; and activation (none, relu, clip or
    relu6 with clip_min/clip_max, hard_swish, sigmoid, silu = x * sigmoid(x)), residual and
    weight_preprocess.  Problems are built in one
    canonical form (explicit 2-D pads and strides), so equal convolutions share a cache key.
    """

    name = "conv"
    #: bias, batch norm, activation and a residual add fold into its output loop
    epilogue = Epilogue(residual=True)
    preprocesses_weights = True

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        canonical = canonical_params(shapes, params)
        problem = Problem.create(self.name, shapes, dtypes, canonical)
        self.validate(problem)
        return problem

    def validate(self, problem: Problem) -> None:
        if problem.param("strides") is None or problem.param("pads") is None:
            raise ValueError("conv problems must be built with ConvOperator.problem() so that "
                             "their parameters are canonical (explicit strides and pads)")
        unsupported = sorted(set(problem.dtypes) - set(SUPPORTED_DTYPES))
        if unsupported or len(set(problem.dtypes)) != 1:
            raise ValueError(f"conv needs all inputs of one dtype, float32 or float64; got "
                             f"{', '.join(problem.dtypes)}")
        geo = geometry(problem)
        x_shape, w_shape = problem.shapes[0], problem.shapes[1]
        if geo.blocked:
            check_blocked(x_shape, geo.c, "conv X")
        if geo.c % geo.group:
            raise ValueError(f"conv input channels C={geo.c} are not divisible by group="
                             f"{geo.group} (X shape {x_shape})")
        if geo.k % geo.group:
            raise ValueError(f"conv output channels K={geo.k} are not divisible by group="
                             f"{geo.group} (W shape {w_shape})")
        if w_shape[1] != geo.cg:
            raise ValueError(f"conv weight shape {w_shape} does not match X shape {x_shape} "
                             f"with group={geo.group}: W must have C/group={geo.cg} channels, "
                             f"has {w_shape[1]}")
        if min(geo.r, geo.s, geo.n, geo.c, geo.k) < 1 or min(geo.h, geo.w) < 1:
            raise ValueError(f"conv shapes must not be empty: X {x_shape}, W {w_shape}")
        if geo.oh < 1 or geo.ow < 1:
            raise ValueError(
                f"conv output would be empty ({geo.oh}x{geo.ow}): the dilated kernel "
                f"({geo.dil_h * (geo.r - 1) + 1}x{geo.dil_w * (geo.s - 1) + 1}) is larger than "
                f"the padded input ({geo.h + geo.pad_top + geo.pad_bottom}x"
                f"{geo.w + geo.pad_left + geo.pad_right})")
        if geo.has_bias and tuple(problem.shapes[2]) != (geo.k,):
            raise ValueError(f"conv bias must have shape ({geo.k},) for K={geo.k}, got "
                             f"{tuple(problem.shapes[2])}")
        if geo.has_residual and tuple(problem.shapes[-1]) != geo.out_shape:
            raise ValueError(f"conv residual must have the output's shape {geo.out_shape}, "
                             f"got {tuple(problem.shapes[-1])}")

    def output_shape(self, problem: Problem) -> Shape:
        return geometry(problem).out_shape

    def size_axes(self, shapes: Sequence[Shape]) -> tuple[int, ...]:
        """X's axes, the output channels and the kernel's size: the bias repeats the output
        channels, the residual the output's shape, and W's second axis X's channels."""
        return (*shapes[0], shapes[1][0], *shapes[1][2:])

    def lane_axes(self, shapes: Sequence[Shape]) -> tuple[int, ...]:
        """The channels only (X's second axis and the output channels).  The pixels are not a
        vector cliff for the conv kernels: the direct kernels tile them by 6, Winograd by its
        tiles (:meth:`~fastrun.algorithm.Algorithm.work` counts both), the depthwise kernels
        run a remainder.  On the 16-core Xeon, treating them as one left MobileNetV2's 18x18
        depthwise layers (288-pixel images) to the rule of thumb, 1.6-1.9x slower than the
        kernel measured at 14x14."""
        return (1, len(shapes[0]))

    def batch_inputs(self, problem: Problem) -> tuple[int, ...]:
        """The images, and the residual input (one per output image); every layout keeps
        the batch on axis 0."""
        return (0, len(problem.shapes) - 1) if geometry(problem).has_residual else (0,)

    def reference(self, problem: Problem, inputs: Sequence[np.ndarray]) -> np.ndarray:
        """Float64 conv by summing one shifted input slice per kernel offset: few lines, no
        tricks, the result every algorithm is checked against."""
        geo = geometry(problem)
        x = np.asarray(inputs[0], np.float64)
        if geo.blocked:
            x = to_nchw(x, geo.c)
        x, w = geo.as_4d(x, np.asarray(inputs[1], np.float64))
        padded = np.pad(x, ((0, 0), (0, 0), (geo.pad_top, geo.pad_bottom),
                            (geo.pad_left, geo.pad_right)))
        out = np.zeros((geo.n, geo.k, geo.oh, geo.ow))
        for g in range(geo.group):
            xs = padded[:, g * geo.cg:(g + 1) * geo.cg]
            ws = w[g * geo.kg:(g + 1) * geo.kg]
            for i in range(geo.r):
                for j in range(geo.s):
                    top, left = i * geo.dil_h, j * geo.dil_w
                    window = xs[:, :, top:top + geo.stride_h * (geo.oh - 1) + 1:geo.stride_h,
                                left:left + geo.stride_w * (geo.ow - 1) + 1:geo.stride_w]
                    out[:, g * geo.kg:(g + 1) * geo.kg] += np.einsum(
                        "nchw,kc->nkhw", window, ws[:, :, i, j])
        if geo.has_bias:
            out += np.asarray(inputs[2], np.float64).reshape(1, -1, 1, 1)
        if geo.has_residual:
            z = np.asarray(inputs[-1], np.float64)
            out += to_nchw(z, geo.k) if geo.blocked else geo.as_4d_output(z)
        if geo.activation == "relu":
            out = np.maximum(out, 0)
        elif geo.activation == "clip":
            out = np.clip(out, geo.clip_min, geo.clip_max)
        elif geo.activation == "hard_swish":
            out = out * np.clip((out + 3) / 6, 0, 1)
        elif geo.activation == "hard_sigmoid":
            out = np.clip(out * geo.alpha + geo.beta, 0, 1)
        elif geo.activation in ("sigmoid", "silu"):
            with np.errstate(over="ignore"):  # exp(-x) overflows to inf: the gate is 0
                gate = 1 / (1 + np.exp(-out))
            out = gate if geo.activation == "sigmoid" else out * gate
        if geo.blocked:
            return to_blocked(out)
        return geo.output_view(out)

    def tolerance(self, problem: Problem) -> float:
        # Winograd's transforms add rounding (F(4,3) most): still far from any wrong result.
        return 2e-3 if "float32" in problem.dtypes else 1e-9

