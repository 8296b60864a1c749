"""Pooling parameters in one canonical form, and the window geometry every algorithm uses.

ONNX lets one pooling be written many ways: auto_pad or explicit pads, defaults left out,
ceil_mode set where it changes nothing, count_include_pad set without any pads.  The problem key
must not depend on the spelling, so :func:`canonical_pool_params` resolves all of it before the
problem is built, and the algorithms read one :class:`PoolGeometry` instead of re-deriving the
output size (ONNX's ceil_mode rule is easy to get subtly wrong twice).

Window semantics (ONNX MaxPool / AveragePool, opsets 1-22), along each spatial axis: output
``o`` reads input positions ``o * stride - pad_begin + j * dilation`` for ``j < kernel``.
Positions outside the input are padding; padding never wins a max.  For an average the divisor
is the number of real positions (count_include_pad=0) or of positions inside the explicitly
padded input (count_include_pad=1): positions that only ceil_mode's extra window reaches, past
the end padding, never count.  A window is a product of per-axis windows, so both divisors are
products of per-axis counts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastrun.operator import Problem
from fastrun_algorithms._common import same_pads

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
SUPPORTED_DTYPES = ("float32", "float64")
#: Spatial ranks maxpool and avgpool accept (X is (N, C, D1[, D2[, D3]])).
SPATIAL_RANKS = (1, 2, 3)


def check_dtypes(operator: str, dtypes: Sequence[str]) -> None:
    """One float32 or float64 input: what every pooling operator computes in."""
    if len(dtypes) != 1 or dtypes[0] not in SUPPORTED_DTYPES:
        raise ValueError(f"{operator} needs one float32 or float64 input, got "
                         f"{', '.join(dtypes) or 'none'}")


def _flag(operator: str, params: Mapping[str, Any], name: str) -> int:
    value = params.get(name, 0)
    value = 0 if value is None else value
    if value not in (0, 1) or isinstance(value, float):
        raise ValueError(f"{operator} {name} must be 0 or 1, got {value!r}")
    return int(value)


def _per_axis(operator: str, value: Any, spatial: int, name: str,
              default: int | None) -> tuple[int, ...]:
    """``value`` as one positive int per spatial axis (a single value applies to all)."""
    if value is None:
        if default is None:
            raise ValueError(f"{operator} needs kernel_shape (one size per spatial axis)")
        return (default,) * spatial
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if any(isinstance(v, (bool, float)) for v in values):
        raise ValueError(f"{operator} {name} must be integers, got {list(values)}")
    values = tuple(int(v) for v in values)
    if len(values) == 1 and spatial > 1:
        values = values * spatial
    if len(values) != spatial:
        raise ValueError(f"{operator} {name} needs {spatial} value(s) for {spatial}-D pooling, "
                         f"got {list(values)}")
    if any(v < 1 for v in values):
        raise ValueError(f"{operator} {name} must be positive, got {list(values)}")
    return values


def output_size(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int,
                ceil_mode: bool) -> int:
    """ONNX's output length along one axis (may be < 1: the caller reports it).

    ``floor`` or ``ceil`` of ``(size + begin + end - extent) / stride`` plus one; with
    ceil_mode, a last window that would start in the end padding (at or after
    ``size + begin`` in padded coordinates) is dropped, as onnx's reference does.
    """
    span = size + begin + end - (dilation * (kernel - 1) + 1)
    if span < 0:
        return 0
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + begin:
        out -= 1
    return out


def _pool_pads(operator: str, params: Mapping[str, Any], sizes: Sequence[int],
               kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
               ) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """(begins, ends, whether auto_pad set them) of the padding: explicit pads, or ONNX's
    auto_pad (which refuses explicit pads beside it)."""
    spatial = len(sizes)
    auto_pad = params.get("auto_pad", "NOTSET") or "NOTSET"
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    auto_pad = str(auto_pad).upper()
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"{operator} auto_pad must be one of {', '.join(AUTO_PADS)}, "
                         f"got {auto_pad!r}")
    pads = params.get("pads")
    if pads is not None:
        pads = tuple(pads) if isinstance(pads, (list, tuple)) else (pads,)
        if any(isinstance(p, (bool, float)) for p in pads):
            raise ValueError(f"{operator} pads must be integers, got {list(pads)}")
        pads = tuple(int(p) for p in pads)
        if len(pads) != 2 * spatial:
            raise ValueError(f"{operator} pads needs {2 * spatial} values (begins then ends) "
                             f"for {spatial}-D pooling, got {list(pads)}")
        if any(p < 0 for p in pads):
            raise ValueError(f"{operator} pads must not be negative, got {list(pads)}")
    if auto_pad == "NOTSET":
        pads = pads or (0,) * (2 * spatial)
        return pads[:spatial], pads[spatial:], False
    if pads is not None and any(pads):
        raise ValueError(f"{operator} cannot take both pads {list(pads)} and "
                         f"auto_pad={auto_pad}")
    if auto_pad == "VALID":
        return (0,) * spatial, (0,) * spatial, True
    split = [same_pads(*axis, upper=auto_pad == "SAME_UPPER")
             for axis in zip(sizes, kernel, strides, dilations, strict=True)]
    return tuple(b for b, _ in split), tuple(e for _, e in split), True


def canonical_pool_params(operator: str, shapes: Sequence[Sequence[int]],
                          params: Mapping[str, Any], average: bool) -> dict[str, Any]:
    """Resolve ONNX MaxPool (``average=False``) or AveragePool attributes to one explicit form.

    Result keys: kernel_shape, strides, dilations, pads (begins then ends), ceil_mode and, for
    averages, count_include_pad; all explicit, one value per axis.  auto_pad is resolved into
    pads (ONNX gives SAME/VALID the same output size with and without ceil_mode, so ceil_mode
    is then 0); ceil_mode stays 1 only where it adds a window; count_include_pad is 0 when there
    are no pads (it changes nothing then); storage_order (it only orders the Indices output,
    which is not supported) is dropped.
    """
    known = {"kernel_shape", "strides", "dilations", "pads", "auto_pad", "ceil_mode",
             "storage_order"}
    if average:
        known.add("count_include_pad")
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{operator} has no parameter(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    if len(shapes) != 1:
        raise ValueError(f"{operator} takes one input X, got {len(shapes)}")
    x_shape = tuple(int(d) for d in shapes[0])
    spatial = len(x_shape) - 2
    if spatial not in SPATIAL_RANKS:
        raise ValueError(f"{operator} supports 1-D, 2-D and 3-D pooling: X must be (N, C, D1), "
                         f"(N, C, D1, D2) or (N, C, D1, D2, D3), got shape {x_shape}")
    if min(x_shape) < 1:
        raise ValueError(f"{operator} input must not be empty, got shape {x_shape}")
    sizes = x_shape[2:]
    kernel = _per_axis(operator, params.get("kernel_shape"), spatial, "kernel_shape", None)
    strides = _per_axis(operator, params.get("strides"), spatial, "strides", 1)
    dilations = _per_axis(operator, params.get("dilations"), spatial, "dilations", 1)
    ceil_mode = _flag(operator, params, "ceil_mode")
    _flag(operator, params, "storage_order")
    count_include_pad = _flag(operator, params, "count_include_pad") if average else 0
    begins, ends, auto = _pool_pads(operator, params, sizes, kernel, strides, dilations)
    if auto:
        ceil_mode = 0  # auto_pad fixes the output size itself
    floors = [output_size(*axis, False)
              for axis in zip(sizes, kernel, strides, dilations, begins, ends, strict=True)]
    if min(floors) < 1:
        extents = [d * (k - 1) + 1 for k, d in zip(kernel, dilations, strict=True)]
        padded = [s + b + e for s, b, e in zip(sizes, begins, ends, strict=True)]
        raise ValueError(f"{operator} output would be empty: the dilated kernel {extents} is "
                         f"larger than the padded input {padded}")
    if ceil_mode:
        ceils = [output_size(*axis, True)
                 for axis in zip(sizes, kernel, strides, dilations, begins, ends, strict=True)]
        ceil_mode = int(ceils != floors)
    if not any(begins) and not any(ends):
        count_include_pad = 0
    result: dict[str, Any] = {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dilations,
        "pads": (*begins, *ends),
        "ceil_mode": ceil_mode,
    }
    if average:
        result["count_include_pad"] = count_include_pad
    return result


def _taps(kernel: int, stride: int, dilation: int, begin: int, low: int, high: int,
          out: int) -> tuple[int, ...]:
    """Per output along one axis: how many of its taps (input coordinates
    ``o * stride - begin + j * dilation``) fall in ``[low, high)``."""
    return tuple(sum(1 for j in range(kernel) if low <= o * stride - begin + j * dilation < high)
                 for o in range(out))


def _runs(counts: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """``counts`` as (first, end, count) runs of equal values."""
    runs: list[tuple[int, int, int]] = []
    for o, count in enumerate(counts):
        if runs and runs[-1][2] == count:
            runs[-1] = (runs[-1][0], o + 1, count)
        else:
            runs.append((o, o + 1, count))
    return tuple(runs)


@dataclass(frozen=True)
class PoolGeometry:
    """Everything about one canonical maxpool or avgpool problem, per spatial axis."""

    n: int
    c: int
    sizes: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begins: tuple[int, ...]
    ends: tuple[int, ...]
    out: tuple[int, ...]
    average: bool
    count_include_pad: bool
    dtype: str
    #: per axis, per output: how many taps read the input (count_include_pad=0's divisor)
    real_counts: tuple[tuple[int, ...], ...]
    #: per axis, per output: how many taps lie inside the explicitly padded input
    padded_counts: tuple[tuple[int, ...], ...]

    @property
    def spatial(self) -> int:
        return len(self.sizes)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.out)

    @property
    def extents(self) -> tuple[int, ...]:
        """The dilated kernel's length per axis."""
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilations, strict=True))

    @property
    def reach(self) -> tuple[int, ...]:
        """Per axis, the padded-coordinate length the windows read: the padded input, or more
        when ceil_mode's last window runs past the end padding."""
        return tuple(max(b + s + e, (o - 1) * st + x) for s, b, e, o, st, x in zip(
            self.sizes, self.begins, self.ends, self.out, self.strides, self.extents,
            strict=True))

    @property
    def reads_outside(self) -> bool:
        """Whether any window reads a position outside the input (padding or ceil_mode's
        overhang): only then must an algorithm that pads make a padded copy."""
        return self.reach != self.sizes

    @property
    def divisor_counts(self) -> tuple[tuple[int, ...], ...]:
        """Per axis, per output: the average's divisor factor along that axis."""
        return self.padded_counts if self.count_include_pad else self.real_counts

    @property
    def divisor_runs(self) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """:attr:`divisor_counts` per axis as (first, end, count) runs: usually one run, or
        three (a left border, the interior, a right border)."""
        return tuple(_runs(counts) for counts in self.divisor_counts)

    @property
    def uniform_divisor(self) -> int | None:
        """The divisor when every window has the same one, else None."""
        if any(len(set(counts)) != 1 for counts in self.divisor_counts):
            return None
        return math.prod(counts[0] for counts in self.divisor_counts)


@functools.lru_cache(maxsize=4096)
def pool_geometry(problem: Problem) -> PoolGeometry:
    """The geometry of a canonical maxpool or avgpool problem (see
    :func:`canonical_pool_params`); cached, as every run of every algorithm asks for it."""
    x_shape = problem.shapes[0]
    sizes = tuple(x_shape[2:])
    spatial = len(sizes)
    kernel = problem.param("kernel_shape")
    strides = problem.param("strides")
    dilations = problem.param("dilations")
    pads = problem.param("pads")
    begins, ends = tuple(pads[:spatial]), tuple(pads[spatial:])
    ceil_mode = bool(problem.param("ceil_mode"))
    out = tuple(output_size(*axis, ceil_mode) for axis in zip(
        sizes, kernel, strides, dilations, begins, ends, strict=True))
    axes = list(zip(sizes, kernel, strides, dilations, begins, ends, out, strict=True))
    # real taps lie in the input; padded ones in the explicitly padded input (not in ceil_mode's
    # overhang past the end padding)
    real = tuple(_taps(k, st, d, b, 0, s, o) for s, k, st, d, b, _e, o in axes)
    padded = tuple(_taps(k, st, d, b, -b, s + e, o) for s, k, st, d, b, e, o in axes)
    return PoolGeometry(
        n=x_shape[0], c=x_shape[1], sizes=sizes, kernel=tuple(kernel), strides=tuple(strides),
        dilations=tuple(dilations), begins=begins, ends=ends, out=out,
        average=problem.operator == "avgpool",
        count_include_pad=bool(problem.param("count_include_pad", 0)),
        dtype=problem.dtypes[0], real_counts=real, padded_counts=padded,
    )
