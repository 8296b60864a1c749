"""Operator.error, the numerical check every profiled candidate passes: the largest absolute
difference relative to the largest reference magnitude, computed in one compiled pass."""

from __future__ import annotations

import numpy as np
import pytest

from fastrun.operator import Operator

ERROR = Operator().error


def _plain(output, reference):
    """The definition, written the obvious way."""
    scale = max(float(np.max(np.abs(reference))), float(np.finfo(np.float32).tiny))
    return float(np.max(np.abs(output.astype(np.float64) - reference))) / scale


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_the_error_is_the_definition_in_every_float_type(dtype):
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((3, 5, 7))
    output = (reference + rng.standard_normal(reference.shape) * 1e-3).astype(dtype)
    assert ERROR(None, output, reference) == pytest.approx(_plain(output, reference), rel=1e-12)
    assert ERROR(None, reference.astype(dtype), reference) <= np.finfo(dtype).eps


def test_strided_integer_and_boolean_outputs():
    rng = np.random.default_rng(1)
    reference = rng.standard_normal((6, 8))
    wide = rng.standard_normal((6, 16)).astype(np.float32)
    strided = wide[:, ::2]  # not contiguous
    assert ERROR(None, strided, reference) == pytest.approx(_plain(strided, reference))
    counts = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert ERROR(None, counts, counts.astype(np.float64) + 0.5) == pytest.approx(0.5 / 11.5)
    flags = np.array([True, False, True])
    assert ERROR(None, flags, np.array([1.0, 0.0, 0.0])) == 1.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_difference_on_either_side_is_an_infinite_error(bad):
    reference = np.array([1.0, 2.0, 3.0])
    output = np.array([1.0, bad, 3.0], dtype=np.float32)
    assert ERROR(None, output, reference) == float("inf")
    assert ERROR(None, reference.astype(np.float32), np.array([1.0, bad, 3.0])) == float("inf")
    assert ERROR(None, np.array([bad]), np.array([bad])) == float("inf")  # inf - inf is NaN


def test_a_tiny_reference_is_measured_against_the_smallest_normal_number():
    # float32 holds sigmoid(-100) = 3.7e-44 only as a subnormal: not the algorithm's error
    output = np.array([0.0, 1e-44], dtype=np.float32)
    reference = np.array([3.7e-44, 3.7e-44])
    assert ERROR(None, output, reference) < 1e-5


def test_a_shape_mismatch_and_an_empty_output():
    assert ERROR(None, np.zeros(3, np.float32), np.zeros(4)) == float("inf")
    assert ERROR(None, np.zeros(0, np.float32), np.zeros(0)) == 0.0
