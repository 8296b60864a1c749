"""The fused epilogue: bias add and activation, applied where the output is written.

numba algorithms apply :func:`epilogue_value` to each value in their output loop; algorithms
whose inner product is a BLAS call apply ``_gemm_common.epilogue_in_place`` (a numba loop over
:func:`epilogue_value` too) to each output block right after it is produced, while it is still
in cache.  Either way the runtime gets Conv+Bias+Relu in
one call instead of three passes over memory.
"""

from __future__ import annotations

import numba

from fastrun_algorithms.conv.geometry import ConvGeometry

#: Activation codes the numba kernels take (strings cannot be compile-time constants cheaply).
NONE, RELU, CLIP = 0, 1, 2
_CODES = {"none": NONE, "relu": RELU, "clip": CLIP}


def activation_code(geo: ConvGeometry) -> int:
    return _CODES[geo.activation]


@numba.njit(inline="always")
def epilogue_value(value, bias, code, low, high):
    """One output value after bias and activation (inlined into the kernels' output loops)."""
    value = value + bias
    if code == RELU:
        return value if value > 0 else value * 0
    if code == CLIP:
        return min(max(value, low), high)
    return value
