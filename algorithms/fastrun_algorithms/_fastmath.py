"""exp, erf and the sigmoid that LLVM can vectorise, for the float32 kernels of softmax, GELU
and the sigmoid and SiLU activations (alone and in the conv epilogue).

Why: without Intel's SVML, numba calls the scalar libm ``exp`` and ``erf`` once per element,
which keeps a loop scalar and costs 5-20 ns an element (the activations' ``parallel.py`` measured
sigmoid 5x slower per thread than numpy's SIMD loop).  Written as multiply-adds, selects and a
bit cast, the same formulas run 8 or 16 lanes at a time.

Only what the kernels need, and only where float32 tolerates it:

* :func:`exp_nonpositive` is exp for x <= 0, the one range softmax (x minus the row's maximum)
  and GELU (exp of -z^2) use: so 2^k is always a normal float and nothing overflows.  x is
  split as k ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r keeps its low bits), exp(r) is
  its Taylor polynomial of degree 7 (remainder below 6e-9 relative, under float32's half ulp),
  and 2^k is built from its exponent bits.  Below -87.3 the result is 0; NaN stays NaN.
* :func:`erfc_nonnegative` is 1 - erf(z) for z >= 0 by Abramowitz and Stegun's formula 7.1.26,
  ``t (a1 + t (a2 + ... a5)) exp(-z^2)`` with ``t = 1 / (1 + p z)``: absolute error below
  1.5e-7 over the whole range.  Kept as 1 - erf, GELU's negative side ``x/2 (1 - erf(|z|))``
  is computed without the cancellation of ``1 + erf``.

* :func:`sigmoid_float32` is the logistic function from ``exp(-|x|)``, so exp's argument is
  never positive (see its docstring).

float64 callers get the libm functions through the same names (:func:`exp_le0`,
:func:`erfc_ge0`, :func:`sigmoid`), so one kernel source serves both dtypes.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

LOG2E = 1.4426950408889634
#: ln 2 in two parts: the high part has few enough bits that ``k * LN2_HI`` is exact for the
#: k of float32's range
LN2_HI = 0.693145751953125
LN2_LO = 1.428606765330187e-06
#: below this, exp is under float32's smallest normal number: the result is 0
EXP_LOW = -87.3


@intrinsic
def _float32_from_exponent(typingctx, biased):
    """The float32 whose bits are ``biased << 23``: 2^(biased - 127) for biased in 1..254."""

    def codegen(context, builder, signature, args):
        bits = context.cast(builder, args[0], signature.args[0], types.int32)
        return builder.bitcast(builder.shl(bits, ir.Constant(ir.IntType(32), 23)),
                               ir.FloatType())

    return types.float32(biased), codegen


@register_jitable
def exp_nonpositive(x):
    """exp(x) in float32 for x <= 0 (see the module docstring)."""
    k = np.floor(x * np.float32(LOG2E) + np.float32(0.5))
    k = np.float32(-126.0) if k < np.float32(-126.0) else k
    r = (x - k * np.float32(LN2_HI)) - k * np.float32(LN2_LO)
    p = np.float32(1.0 / 5040)
    p = p * r + np.float32(1.0 / 720)
    p = p * r + np.float32(1.0 / 120)
    p = p * r + np.float32(1.0 / 24)
    p = p * r + np.float32(1.0 / 6)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    scaled = p * _float32_from_exponent(np.int32(k) + np.int32(127))
    return np.float32(0.0) if x < np.float32(EXP_LOW) else scaled


@register_jitable
def erfc_nonnegative(z):
    """1 - erf(z) in float32 for z >= 0 (see the module docstring)."""
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * z)
    poly = np.float32(1.061405429)
    poly = poly * t + np.float32(-1.453152027)
    poly = poly * t + np.float32(1.421413741)
    poly = poly * t + np.float32(-0.284496736)
    poly = poly * t + np.float32(0.254829592)
    return poly * t * exp_nonpositive(-z * z)


@register_jitable
def sigmoid_float32(x):
    """1 / (1 + exp(-x)) in float32 from one vectorisable exp of -|x| (never above 0, so it
    never overflows): ``e = exp(-|x|)`` gives ``1 / (1 + e)`` for x >= 0 and ``e / (1 + e)``
    below, the same value without the cancellation; NaN stays NaN."""
    e = exp_nonpositive(-abs(x))
    # np.divide, not ``/``: numba checks ``/`` for a zero divisor under its default (Python)
    # error model, and that branch kept every loop calling this scalar (9x slower).
    s = np.divide(np.float32(1.0), np.float32(1.0) + e)
    return s if x >= np.float32(0.0) else e * s


def sigmoid(x):
    """The logistic function: vectorisable in float32, libm's exp in float64 (numba only)."""
    return 1.0 / (1.0 + math.exp(-x))


def exp_le0(x):
    """exp(x) for x <= 0: vectorisable in float32, libm's in float64 (numba only)."""
    return math.exp(x)


def erfc_ge0(z):
    """1 - erf(z) for z >= 0: vectorisable in float32, libm's in float64 (numba only)."""
    return math.erfc(z)


@overload(exp_le0)
def _exp_le0(x):
    if x == types.float32:
        return lambda x: exp_nonpositive(x)
    return lambda x: math.exp(x)


@overload(sigmoid)
def _sigmoid(x):
    if x == types.float32:
        return lambda x: sigmoid_float32(x)
    return lambda x: 1.0 / (1.0 + math.exp(-x))


@overload(erfc_ge0)
def _erfc_ge0(z):
    if z == types.float32:
        return lambda z: erfc_nonnegative(z)
    return lambda z: math.erfc(z)
