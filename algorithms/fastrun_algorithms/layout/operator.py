"""The ``reorder`` operator: a tensor converted between NCHW and the channel-blocked
``nchw16c`` layout (see :mod:`fastrun_algorithms.layout.blocking`).

A runtime inserts it where a step that computes in ``nchw16c`` meets one that computes in
NCHW.  Parameters: ``to`` (``nchw16c`` or ``nchw``) and, going back to NCHW, ``channels`` (the
blocked shape does not say how many of the last block's lanes are channels).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastrun.operator import Shape
from fastrun_algorithms._common import CanonicalOperator, parallel_pays
from fastrun_algorithms.layout.blocking import (
    BLOCKED,
    LANES,
    LAYOUTS,
    NCHW,
    blocked_shape,
    check_blocked,
    nchw_shape,
    to_blocked,
    to_nchw,
)

SUPPORTED_DTYPES = ("float32", "float64")


class ReorderOperator(CanonicalOperator):
    """``to=nchw16c``: X (N, C, spatial...) -> (N, ceil(C/16), spatial..., 16), zero padding
    lanes.  ``to=nchw, channels=C``: the way back, padding lanes dropped."""

    name = "reorder"

    def canonical_params(self, shapes: Sequence[Shape], dtypes: Sequence[str],
                         params: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(params) - {"to", "channels"})
        if unknown:
            raise ValueError(f"reorder has no parameter(s) {', '.join(unknown)}; known: "
                             "channels, to")
        to = str(params.get("to", "")).lower()
        if to not in LAYOUTS:
            raise ValueError(f"reorder needs to= one of {', '.join(LAYOUTS)}, got "
                             f"{params.get('to')!r}")
        if len(shapes) != 1:
            raise ValueError(f"reorder takes one input, got {len(shapes)}")
        if dtypes[0] not in SUPPORTED_DTYPES:
            raise ValueError(f"reorder supports {', '.join(SUPPORTED_DTYPES)}, got {dtypes[0]}")
        shape = shapes[0]
        if to == BLOCKED:
            if params.get("channels") is not None:
                raise ValueError("reorder to nchw16c takes no channels (X's dimension 1 is C)")
            if len(shape) < 3:
                raise ValueError(f"reorder to {BLOCKED} needs X of shape (N, C, spatial...), "
                                 f"got {tuple(shape)}")
            return {"to": to}
        if params.get("channels") is None:
            raise ValueError(f"reorder to {NCHW} needs channels= (how many of the blocked "
                             "input's lanes are channels)")
        channels = int(params["channels"])
        if channels < 1:
            raise ValueError(f"reorder channels must be positive, got {channels}")
        check_blocked(shape, channels, "reorder's input")
        if len(shape) < 4:
            raise ValueError(f"reorder to {NCHW} needs X of shape (N, C/{LANES}, spatial..., "
                             f"{LANES}), got {tuple(shape)}")
        return {"to": to, "channels": channels}

    def output_shape(self, problem) -> Shape:
        shape = problem.shapes[0]
        if problem.param("to") == BLOCKED:
            return blocked_shape(shape)
        return nchw_shape(shape, problem.param("channels"))

    def reference(self, problem, inputs) -> np.ndarray:
        x = np.asarray(inputs[0])
        if problem.param("to") == BLOCKED:
            return to_blocked(x)
        return to_nchw(x, problem.param("channels"))

    def parallel_pays(self, problem) -> bool:
        """Whether the parallel conversion goes first: from an eighth of the activations'
        measured threshold of bytes on (see :func:`fastrun_algorithms._common.parallel_rank`);
        numpy's below."""
        from fastrun_algorithms.activation.operator import PARALLEL_MIN_BYTES

        size = math.prod(problem.shapes[0]) * np.dtype(problem.dtypes[0]).itemsize
        return parallel_pays(size, PARALLEL_MIN_BYTES // 8)
