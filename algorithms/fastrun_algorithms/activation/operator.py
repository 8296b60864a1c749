"""The activation operators: ONNX semantics, one canonical parameter form per call.

The ONNX runtime lowers nodes onto these operators by name, so the names and parameters are a
contract: ``relu``, ``sigmoid``, ``tanh``, ``hard_swish`` and the math functions ``sqrt``,
``exp``, ``log``, ``neg``, ``abs``, ``reciprocal``, ``erf`` (no parameters), ``leaky_relu``
(alpha), ``hard_sigmoid`` (alpha, beta), ``clip`` (min, max), ``softmax`` (axis, opset-13
semantics) and ``batch_norm`` (inference, epsilon).

Why canonical parameters: the problem key is the cache key, so a call that spells a default out
and one that leaves it implicit, or a negative and a positive axis, must give one key.  Scalars
that the computation rounds to the input dtype (alpha, clip bounds, epsilon) are rounded when
the problem is built, because two values that round to the same float32 compute the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastrun.operator import Epilogue, Problem, Shape
from fastrun_algorithms._common import (
    CanonicalOperator,
    check_known_params,
    error_with_special_values,
    parallel_pays,
)

FLOAT_DTYPES = ("float32", "float64")
#: clip also takes integers: ONNX defines it for them (the spec's own int8 examples), and the
#: runtime would otherwise need a fallback for a cheap, common node.
CLIP_DTYPES = (*FLOAT_DTYPES, "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
               "uint64")

#: From this many bytes of input on, ``parallel`` goes first in the rule of thumb
#: (:meth:`ActivationOperator.parallel_pays`).  Taken from quick timeit runs (float32, fresh output
#: per call; the crossover is measured per problem when profiling).  ``parallel`` / ``numpy`` time:
#:
#: * 16-core host (the accelerator machine's CPU): relu 0.86 at 1 MiB, 0.28 at 2 MiB, 0.11 at
#:   24.5 MiB ((8, 64, 112, 112)); leaky_relu 0.57, 0.17, 0.05; clip 0.72, 0.28, 0.11; at
#:   256 KiB parallel is ~3x slower (waking the sleeping OpenMP workers costs ~25 us);
#: * 2-core development VM, shared with other processes: leaky_relu 0.6-0.85 at 1-2 MiB and
#:   0.45 at 24.5 MiB; relu and clip about even (0.9-1.2) from 2 MiB on, since numpy's
#:   single-threaded SIMD clip nearly saturates the memory bandwidth there.
PARALLEL_MIN_BYTES = 2 * 1024 * 1024

#: Threads from which ``parallel`` goes first (above :data:`PARALLEL_MIN_BYTES`) for a
#: compute-bound activation (sigmoid: numba's scalar exp is ~5x slower per thread than numpy's
#: SIMD loop; measured 0.33x numpy's time on 16 threads, 2.5x on 2).
COMPUTE_BOUND_MIN_THREADS = 8


def _real(name: str, param: str, value: Any) -> float:
    """A scalar parameter as a float; ONNX gives some (Clip's bounds) as 0-d or 1-element
    tensors, so those are accepted too."""
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biuf":
        raise ValueError(f"{name} {param} must be a number, got {value!r}")
    number = float(array.reshape(-1)[0])
    if math.isnan(number):
        raise ValueError(f"{name} {param} must not be NaN")
    return number


class ActivationOperator(CanonicalOperator):
    """Shared by the activation operators: problems are built in canonical form, and outputs
    are checked with non-finite values compared by position (a NaN where the reference has a
    NaN is right, anywhere else it is an infinite error)."""

    version = 1
    #: dtypes the input X may have
    dtypes: tuple[str, ...] = FLOAT_DTYPES
    #: number of inputs
    arity = 1
    #: numba threads from which ``parallel`` goes first on large inputs: 2 where the loop is
    #: memory bound, :data:`COMPUTE_BOUND_MIN_THREADS` where it is compute bound
    parallel_min_threads = 2

    def _check_inputs(self, shapes: Sequence[Shape], dtypes: Sequence[str]) -> None:
        if len(shapes) != self.arity:
            raise ValueError(f"{self.name} takes exactly {self.arity} input(s), got "
                             f"{len(shapes)} with shapes {list(shapes)}")
        if dtypes[0] not in self.dtypes:
            raise ValueError(f"{self.name} supports dtypes {', '.join(self.dtypes)}, got "
                             f"{dtypes[0]}; cast the input first")

    def output_shape(self, problem: Problem) -> Shape:
        return problem.shapes[0]

    def output_dtype(self, problem: Problem) -> np.dtype:
        return np.dtype(problem.dtypes[0])

    def output_bytes(self, problem: Problem) -> int:
        return math.prod(problem.shapes[0]) * self.output_dtype(problem).itemsize

    def error(self, problem: Problem, output: Any, reference: np.ndarray) -> float:
        """The base class's relative max difference over the finite elements; non-finite
        elements and the dtype must match exactly (see :func:`error_with_special_values`)."""
        return error_with_special_values(problem, output, reference, super().error)

    def tolerance(self, problem: Problem) -> float:
        """A few ulp: the registered algorithms compute in the input dtype, the references in
        float64 where that makes a difference."""
        dtype = self.output_dtype(problem)
        return float(64 * np.finfo(dtype).eps) if dtype.kind == "f" else 0.0

    def parallel_pays(self, problem: Problem) -> bool:
        """Whether a parallel pass goes first: from :data:`PARALLEL_MIN_BYTES` of output with
        at least :attr:`parallel_min_threads` numba threads (the algorithms' ranks read it,
        see :func:`fastrun_algorithms._common.parallel_rank`)."""
        return parallel_pays(self.output_bytes(problem), PARALLEL_MIN_BYTES,
                             self.parallel_min_threads)


# -- unary activations ---------------------------------------------------------------------------

class UnaryActivation(ActivationOperator):
    """Base of the one-input activations: same shape and dtype out."""

    known: tuple[str, ...] = ()

    def canonical_params(self, shapes, dtypes, params):
        self._check_inputs(shapes, dtypes)
        check_known_params(self.name, params, self.known)
        return self._params(np.dtype(dtypes[0]), params)

    def _params(self, dtype: np.dtype, params: Mapping[str, Any]) -> dict[str, Any]:
        return {}


class ReluOperator(UnaryActivation):
    """``max(x, 0)``; NaN stays NaN."""

    name = "relu"

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0])
        return np.where(x < 0, np.zeros((), x.dtype), x)


class SigmoidOperator(UnaryActivation):
    """``1 / (1 + exp(-x))``."""

    name = "sigmoid"
    parallel_min_threads = COMPUTE_BOUND_MIN_THREADS

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0], np.float64)
        with np.errstate(over="ignore"):
            return (1.0 / (1.0 + np.exp(-x))).astype(problem.dtypes[0])


class TanhOperator(UnaryActivation):
    """``tanh(x)``."""

    name = "tanh"

    def reference(self, problem, inputs):
        return np.tanh(np.asarray(inputs[0], np.float64)).astype(problem.dtypes[0])


class LeakyReluOperator(UnaryActivation):
    """``x`` where ``x >= 0``, else ``alpha * x`` (ONNX LeakyRelu; alpha defaults to 0.01).

    alpha is rounded to the input dtype in the key: the product is computed in that dtype."""

    name = "leaky_relu"
    known = ("alpha",)

    def _params(self, dtype, params):
        alpha = params.get("alpha")
        alpha = 0.01 if alpha is None else _real(self.name, "alpha", alpha)
        if not math.isfinite(alpha):
            raise ValueError(f"{self.name} alpha must be finite, got {alpha}")
        return {"alpha": float(dtype.type(alpha))}

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0])
        alpha = x.dtype.type(problem.param("alpha"))
        with np.errstate(invalid="ignore"):
            return np.where(x >= 0, x, x * alpha)


class ClipOperator(UnaryActivation):
    """``min(max(x, min), max)`` (ONNX Clip): an absent bound is no bound, and with
    ``min > max`` every element becomes ``max``, as the specification says.

    Bounds are converted to the input dtype (ONNX gives them as tensors of that type); a bound
    that cannot bind (-inf or +inf for floats, the dtype's extreme for integers) is the same
    as an absent one and is left out of the key."""

    name = "clip"
    known = ("min", "max")
    dtypes = CLIP_DTYPES

    def _params(self, dtype, params):
        result = {}
        for param, unbounded in (("min", -math.inf), ("max", math.inf)):
            value = params.get(param)
            if value is None:
                continue
            number = _real(self.name, param, value)
            if dtype.kind == "f":
                bound = float(dtype.type(number))
                if bound == unbounded:
                    continue
                result[param] = bound
            else:
                info = np.iinfo(dtype)
                if not number.is_integer() or not info.min <= number <= info.max:
                    raise ValueError(f"{self.name} {param} must be a {dtype.name} value, got "
                                     f"{value!r}")
                bound = int(number)
                if bound == (info.min if param == "min" else info.max):
                    continue
                result[param] = bound
        return result

    @staticmethod
    def bounds(problem: Problem) -> tuple[Any, Any]:
        """(min, max) as scalars of the input dtype, the dtype's extremes where absent."""
        dtype = np.dtype(problem.dtypes[0])
        if dtype.kind == "f":
            low, high = -np.inf, np.inf
        else:
            low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
        return (dtype.type(problem.param("min", low)), dtype.type(problem.param("max", high)))

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0])
        low, high = self.bounds(problem)
        out = np.where(x < low, low, x)
        return np.where(out > high, high, out).astype(x.dtype)

    def random_inputs(self, problem, rng):
        dtype = np.dtype(problem.dtypes[0])
        if dtype.kind == "f":
            return super().random_inputs(problem, rng)
        info = np.iinfo(dtype)
        return [rng.integers(max(info.min, -100), min(info.max, 100), size=problem.shapes[0],
                             endpoint=True).astype(dtype)]


class HardSigmoidOperator(UnaryActivation):
    """``max(0, min(1, alpha * x + beta))`` (ONNX HardSigmoid; alpha defaults to 0.2, beta to
    0.5).  alpha and beta are rounded to the input dtype in the key: the algorithms compute
    in that dtype."""

    name = "hard_sigmoid"
    known = ("alpha", "beta")
    #: ONNX's defaults, in parameter order
    defaults = (("alpha", 0.2), ("beta", 0.5))

    def _params(self, dtype, params):
        result = {}
        for param, default in self.defaults:
            value = params.get(param)
            value = default if value is None else _real(self.name, param, value)
            if not math.isfinite(value):
                raise ValueError(f"{self.name} {param} must be finite, got {value}")
            result[param] = float(dtype.type(value))
        return result

    @staticmethod
    def coefficients(problem: Problem) -> tuple[Any, Any]:
        """(alpha, beta) as scalars of the input dtype."""
        dtype = np.dtype(problem.dtypes[0]).type
        return dtype(problem.param("alpha")), dtype(problem.param("beta"))

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0], np.float64)
        alpha, beta = (float(c) for c in self.coefficients(problem))
        # np.maximum and np.minimum keep a NaN a NaN, as the specification's max and min do
        # (alpha 0 times an infinity is one)
        with np.errstate(invalid="ignore"):
            gate = alpha * x + beta
        return np.minimum(np.maximum(gate, 0.0), 1.0).astype(problem.dtypes[0])


class HardSwishOperator(UnaryActivation):
    """``x * max(0, min(1, x / 6 + 0.5))`` (ONNX HardSwish, MobileNetV3's activation): NaN
    stays NaN, and -inf gives NaN (-inf times a zero gate), as in ONNX's own reference."""

    name = "hard_swish"

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0], np.float64)
        with np.errstate(invalid="ignore"):
            gate = np.minimum(np.maximum(x / 6 + 0.5, 0.0), 1.0)
            return (x * gate).astype(problem.dtypes[0])


class _MathUnary(UnaryActivation):
    """A unary math function of ONNX (Sqrt, Exp, Log, Neg, Abs, Reciprocal, Erf), with numpy's
    values at the edges: sqrt of a negative and log of a negative are NaN, log(0) is -inf,
    1/0 is inf."""

    #: the float64 function the reference applies
    function: Any = None

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0], np.float64)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return np.asarray(type(self).function(x)).astype(problem.dtypes[0])


class SqrtOperator(_MathUnary):
    name = "sqrt"
    function = np.sqrt


class ExpOperator(_MathUnary):
    name = "exp"
    function = np.exp
    parallel_min_threads = COMPUTE_BOUND_MIN_THREADS


class LogOperator(_MathUnary):
    name = "log"
    function = np.log
    parallel_min_threads = COMPUTE_BOUND_MIN_THREADS


class NegOperator(_MathUnary):
    name = "neg"
    function = np.negative


class AbsOperator(_MathUnary):
    name = "abs"
    function = np.abs


class ReciprocalOperator(_MathUnary):
    name = "reciprocal"
    function = np.reciprocal


class ErfOperator(_MathUnary):
    """The error function (GELU's exact form is ``x / 2 * (1 + erf(x / sqrt(2)))``).  numpy
    has no erf: the reference applies Python's ``math.erf`` element by element, and the
    algorithms are numba loops."""

    name = "erf"
    function = np.vectorize(math.erf, otypes=[np.float64])
    parallel_min_threads = COMPUTE_BOUND_MIN_THREADS


def gelu_error(problem: Problem, output: Any, reference: np.ndarray) -> float:
    """The largest difference relative to the largest reference magnitude, floored at 1: the
    error measure of anything that ends in a GELU.  GELU is ``x * p(x)`` with ``p`` a
    probability computed to a few ulp of 1, so its error scales with |x|, not with the
    output: where every x is negative the outputs are tiny (``gelu(-4.5)`` is -1.5e-5) and
    their relative error says nothing of the algorithm."""
    def floored(problem, output, reference):
        if not reference.size:
            return 0.0
        worst = float(np.max(np.abs(output.astype(np.float64) - reference)))
        return worst / max(1.0, float(np.max(np.abs(reference))))
    return error_with_special_values(problem, output, reference, floored)


class GeluOperator(UnaryActivation):
    """GELU (ONNX opset 20): ``x / 2 * (1 + erf(x / sqrt(2)))``, or with ``approximate="tanh"``
    ``x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))``.  One operator rather than the
    five steps the formula spells (a transformer's MLP runs it on its widest activation), so
    that its algorithms read and write the tensor once."""

    name = "gelu"
    known = ("approximate",)
    #: ``approximate`` values ONNX defines
    FORMS = ("none", "tanh")

    def _params(self, dtype, params):
        form = params.get("approximate", "none")
        if isinstance(form, bytes):
            form = form.decode()
        if form not in self.FORMS:
            raise ValueError(f"{self.name} approximate must be 'none' or 'tanh', got {form!r}")
        return {"approximate": form}

    def error(self, problem, output, reference):
        return gelu_error(problem, output, reference)

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0], np.float64)
        if problem.param("approximate") == "tanh":
            gate = np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
        else:
            gate = ErfOperator.function(x / math.sqrt(2)) if x.size else x
        with np.errstate(invalid="ignore"):
            return (0.5 * x * (1.0 + gate)).astype(problem.dtypes[0])


# -- softmax and batch_norm ----------------------------------------------------------------------

def _epsilon(name: str, params: Mapping[str, Any], dtype: str) -> float:
    """A norm's epsilon (default 1e-5), finite and >= 0, rounded to X's dtype, in which it is
    added."""
    epsilon = params.get("epsilon")
    epsilon = 1e-5 if epsilon is None else _real(name, "epsilon", epsilon)
    if not 0 <= epsilon < math.inf:
        raise ValueError(f"{name} epsilon must be finite and >= 0, got {epsilon}")
    return float(np.dtype(dtype).type(epsilon))


def _axis(name: str, value: Any, rank: int) -> int:
    try:
        axis = int(value)
        if axis != value:
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"{name} axis must be an integer, got {value!r}") from None
    if not -rank <= axis < rank:
        raise ValueError(f"{name} axis {axis} is out of range for an input of rank {rank} "
                         f"(allowed {-rank} to {rank - 1})")
    return axis % rank


class SoftmaxOperator(ActivationOperator):
    """``exp(s*x) / sum(exp(s*x))`` along one axis (ONNX Softmax from opset 13; axis defaults
    to -1).  Older opsets' flattening to 2-D is the runtime's job: it changes the shape, not
    the operation.  ``scale`` s (positive, default 1: then left out of the key) is the
    attention's 1/sqrt(d) that an exporter spells as a Div or Mul before the Softmax
    (``fastrun/runtime/patterns.py`` folds it in)."""

    name = "softmax"

    def canonical_params(self, shapes, dtypes, params):
        self._check_inputs(shapes, dtypes)
        check_known_params(self.name, params, ("axis", "scale"))
        rank = len(shapes[0])
        if rank == 0:
            raise ValueError(f"{self.name} needs an input of rank >= 1, got a 0-d input")
        axis = params.get("axis")
        canonical = {"axis": _axis(self.name, -1 if axis is None else axis, rank)}
        scale = float(params.get("scale", 1.0))
        if not 0 < scale < math.inf:
            raise ValueError(f"{self.name} scale must be a positive number, got {scale!r}")
        if scale != 1.0:
            canonical["scale"] = scale
        return canonical

    def reference(self, problem, inputs):
        x = np.asarray(inputs[0], np.float64) * problem.param("scale", 1.0)
        if x.size == 0:
            return x.astype(problem.dtypes[0])
        axis = problem.param("axis")
        with np.errstate(invalid="ignore"):
            e = np.exp(x - np.max(x, axis=axis, keepdims=True))
            return (e / np.sum(e, axis=axis, keepdims=True)).astype(problem.dtypes[0])


class BatchNormOperator(ActivationOperator):
    """Inference BatchNormalization: ``scale * (x - mean) / sqrt(var + epsilon) + B`` per
    channel (axis 1), then a Relu with ``activation="relu"``.  Inputs X (N, C, ...), scale,
    B, mean, var (each (C,)); epsilon defaults to 1e-5 and is rounded to X's dtype, in which
    it is added.  Training mode (batch
    statistics, three outputs) is not an inference operation and is refused."""

    name = "batch_norm"
    arity = 5
    #: a following Relu fuses into the step (``activation="relu"``); there are no weights to
    #: fold a batch norm or bias add into
    epilogue = Epilogue(weights=False)

    def canonical_params(self, shapes, dtypes, params):
        self._check_inputs(shapes, dtypes)
        check_known_params(self.name, params, ("epsilon", "training_mode", "activation"))
        activation = params.get("activation", "none")
        if activation not in ("none", "relu"):
            raise ValueError(f"{self.name} takes activation 'none' or 'relu', got "
                             f"{activation!r}")
        if params.get("training_mode"):
            raise ValueError(f"{self.name} computes inference BatchNormalization only; "
                             f"training_mode={params['training_mode']!r} is not supported")
        x_shape = shapes[0]
        if len(x_shape) < 2:
            raise ValueError(f"{self.name} X must be (N, C, ...) of rank >= 2, got shape "
                             f"{x_shape}")
        channels = x_shape[1]
        for index, label in enumerate(("scale", "B", "mean", "var"), start=1):
            if tuple(shapes[index]) != (channels,):
                raise ValueError(f"{self.name} {label} must have shape ({channels},) for X of "
                                 f"shape {x_shape}, got {tuple(shapes[index])}")
            if dtypes[index] not in FLOAT_DTYPES:
                raise ValueError(f"{self.name} {label} must be float32 or float64, got "
                                 f"{dtypes[index]}")
        canonical = {"epsilon": _epsilon(self.name, params, dtypes[0])}
        if activation == "relu":  # omitted at "none", so a plain batch norm keeps its key
            canonical["activation"] = activation
        return canonical

    def reference(self, problem, inputs):
        x, scale, bias, mean, var = (np.asarray(a, np.float64) for a in inputs)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = (scale.reshape(shape) * (x - mean.reshape(shape))
                 / np.sqrt(var.reshape(shape) + problem.param("epsilon")) + bias.reshape(shape))
        if problem.param("activation") == "relu":
            y = np.where(y < 0, 0.0, y)  # NaN stays NaN, as relu's
        return y.astype(problem.dtypes[0])

    def random_inputs(self, problem, rng):
        """var in [0.1, 1]: a variance is never negative."""
        inputs = super().random_inputs(problem, rng)
        inputs[4] = rng.uniform(0.1, 1.0, size=problem.shapes[4]).astype(problem.dtypes[4])
        return inputs

    def tolerance(self, problem):
        """Wider than the elementwise activations: ``scale * (x - mean)`` and ``+ B`` can
        partly cancel, and the error is measured relative to the largest output."""
        return float(256 * np.finfo(self.output_dtype(problem)).eps)


UNARY_OPERATORS = (ReluOperator, LeakyReluOperator, ClipOperator, SigmoidOperator, TanhOperator,
                   HardSigmoidOperator, HardSwishOperator, SqrtOperator, ExpOperator,
                   LogOperator, NegOperator, AbsOperator, ReciprocalOperator, ErfOperator)


class LayerNormOperator(ActivationOperator):
    """LayerNormalization (ONNX, opset 17): each row of X over axes ``axis``.. normalised to
    zero mean and unit variance, then ``* scale + bias``.  Inputs X, scale and bias, the two
    last of X's normalised shape (the runtime broadcasts constant ones and makes an absent
    bias zeros); epsilon defaults to 1e-5 and is rounded to X's dtype.  Only Y: ONNX's
    optional Mean and InvStdDev outputs are built by the runtime from other operators."""

    name = "layer_norm"
    arity = 3

    def canonical_params(self, shapes, dtypes, params):
        self._check_inputs(shapes, dtypes)
        check_known_params(self.name, params, ("axis", "epsilon"))
        x_shape = shapes[0]
        if not x_shape:
            raise ValueError(f"{self.name} needs an input of rank >= 1, got a 0-d input")
        axis = params.get("axis")
        axis = _axis(self.name, -1 if axis is None else axis, len(x_shape))
        normalized = tuple(x_shape[axis:])
        for index, label in ((1, "scale"), (2, "bias")):
            if tuple(shapes[index]) != normalized:
                raise ValueError(f"{self.name} {label} must have X's normalised shape "
                                 f"{normalized}, got {tuple(shapes[index])}")
            if dtypes[index] != dtypes[0]:
                raise ValueError(f"{self.name} {label} must be {dtypes[0]} like X, got "
                                 f"{dtypes[index]}")
        return {"axis": axis, "epsilon": _epsilon(self.name, params, dtypes[0])}

    def reference(self, problem, inputs):
        x, scale, bias = (np.asarray(a, np.float64) for a in inputs)
        if x.size == 0:
            return x.astype(problem.dtypes[0])
        axes = tuple(range(problem.param("axis"), x.ndim))
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.mean(x, axis=axes, keepdims=True)
            diff = x - mean
            var = np.mean(diff * diff, axis=axes, keepdims=True)
            y = diff / np.sqrt(var + problem.param("epsilon")) * scale + bias
        return y.astype(problem.dtypes[0])

    def tolerance(self, problem):
        """As batch_norm's: the normalisation and ``+ bias`` can partly cancel."""
        return float(256 * np.finfo(self.output_dtype(problem)).eps)

