"""The elementwise operators (add, sub, mul, div, the comparisons, max, min, add_relu) and their
algorithms.

Every operation x algorithm is checked against numpy on random broadcastable shapes (0 to 3
dimensions, size-1 and empty dimensions, 0-d operands) and values that include the awkward
ones (NaN, infinities, signed zeros, integer extremes that overflow); then the claims the
chooser relies on: validate's errors, the heuristic order, reproducibility, and dispatch through
a session.

Compilation: each (operation, dtype of a, dtype of b) compiles a serial and a parallel kernel
(about 2 s together) the first time it is used on a machine; numba's cache makes every later
run load them instead.  So the numba algorithms are checked on every same-dtype pair and on a
chosen set of mixed pairs (:data:`MIXED_PAIRS`) that covers each promotion rule, rather than
on all 16 pairs of every operation; the numpy algorithm is checked on all of them.
"""

from __future__ import annotations

import warnings

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastrun
from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import elementwise
from fastrun_algorithms.elementwise import _kernels
from fastrun_algorithms.elementwise.operator import OPS, PARALLEL_MIN_BYTES, SUPPORTED_DTYPES
from tests.algorithms._helpers import cpu_registry, numba_threads

REGISTRY = cpu_registry(elementwise)
OP_NAMES = ["add", "sub", "mul", "div", "greater_equal", "max", "min", "add_relu", "equal",
            "less", "greater", "less_equal"]
CASES = [(name, algorithm) for name in OP_NAMES for algorithm in REGISTRY.algorithms(name)]
CASE_IDS = [f"{name}-{algorithm.desc.name}" for name, algorithm in CASES]

#: Mixed operand dtypes the numba algorithms are checked on, per operation: together they cover
#: int + float -> float64, int32 + int64 -> int64, float32 + float64 -> float64, true division
#: of integers (same-dtype pairs are always checked too) and comparison in the common dtype.
MIXED_PAIRS: dict[str, list[tuple[str, str]]] = {
    "add": [("int32", "float32"), ("float32", "float64")],
    "sub": [("int32", "int64")],
    "mul": [("int64", "float32")],
    "div": [("int64", "float32"), ("int32", "float64")],
    "greater_equal": [("int64", "float64")],
    "max": [("float32", "int32")],
    "min": [("int32", "float64")],
    "add_relu": [("int32", "float32"), ("float64", "int64")],
    "equal": [("int32", "float64")],
    "less": [("float32", "int64")],
    "greater": [("int64", "int32")],
    "less_equal": [("float64", "float32")],
}
ALL_PAIRS = [(a, b) for a in SUPPORTED_DTYPES for b in SUPPORTED_DTYPES]


def dtype_pairs(op: str, algorithm: Algorithm) -> list[tuple[str, str]]:
    if algorithm.desc.name == "numpy":
        return ALL_PAIRS
    return [(d, d) for d in SUPPORTED_DTYPES] + MIXED_PAIRS[op]


# -- random problems -------------------------------------------------------------------------

@st.composite
def broadcastable_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast: an output shape of 0-3 dimensions (sizes 0 to 5), and per
    operand a suffix of it (fewer leading dimensions, possibly none: a 0-d operand) with some
    dimensions set to 1."""
    out = draw(st.lists(st.sampled_from([0, 1, 1, 2, 3, 5]), min_size=0, max_size=3))

    def operand() -> tuple[int, ...]:
        dims = out[draw(st.integers(0, len(out))):]
        return tuple(d if draw(st.booleans()) else 1 for d in dims)

    return operand(), operand()


FLOAT_VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e30, -1e-30, np.inf, -np.inf, np.nan]


def special_values(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values that exercise the edge cases: NaN, infinities and signed zeros for floats, the
    integer extremes (so add, sub and mul overflow and must wrap as numpy does) and zeros (so
    div divides by zero) for integers."""
    if np.dtype(dtype).kind == "f":
        pool = np.array(FLOAT_VALUES, dtype=dtype)
    else:
        info = np.iinfo(dtype)
        pool = np.array([0, 0, 1, -1, 2, 7, -100, info.max, info.min, info.max - 1],
                        dtype=dtype)
    return pool[rng.integers(0, len(pool), size=shape)]


def check(algorithm: Algorithm, problem: Problem, inputs: list[np.ndarray]) -> np.ndarray:
    """The algorithm's output equals numpy's exactly: shape, dtype and every bit that matters
    (NaN == NaN; signed zeros compared by sign)."""
    operator = REGISTRY.operator(problem.operator)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        output = algorithm.run(problem, inputs, None)
        expected = np.asarray(operator.op.ufunc(*inputs))
    assert isinstance(output, np.ndarray)
    assert output.shape == expected.shape == operator.output_shape(problem)
    assert output.dtype == expected.dtype == operator.output_dtype(problem)
    np.testing.assert_array_equal(output, expected)
    if output.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(output), np.signbit(expected))
    assert operator.error(problem, output, expected) == 0.0
    return output


@pytest.mark.parametrize(("op", "algorithm"), CASES, ids=CASE_IDS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_numpy(op: str, algorithm: Algorithm, data: st.DataObject) -> None:
    a_shape, b_shape = data.draw(broadcastable_shapes(), label="shapes")
    a_dtype, b_dtype = data.draw(st.sampled_from(dtype_pairs(op, algorithm)), label="dtypes")
    problem = REGISTRY.operator(op).problem([a_shape, b_shape], [a_dtype, b_dtype])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    inputs = [special_values(a_dtype, a_shape, rng), special_values(b_dtype, b_shape, rng)]
    check(algorithm, problem, inputs)


#: Shapes larger than one parallel block, cut so that blocks start mid-row, with every kind of
#: merged geometry: flat, scalar, row broadcast, column broadcast, outer product, bias.
LARGE_SHAPES = [
    ((3 * _kernels.BLOCK + 17,), (3 * _kernels.BLOCK + 17,)),
    ((), (2 * _kernels.BLOCK + 5,)),
    ((2 * _kernels.BLOCK + 5,), (1,)),
    ((7, 1500), (1500,)),
    ((1500, 7), (1500, 1)),
    ((300, 1), (1, 61)),
    ((3, 4, 35, 37), (1, 4, 1, 1)),
    ((2, 1, 3, 1), (1, 1800, 1, 5)),
]


@pytest.mark.parametrize(("op", "algorithm"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("shapes", LARGE_SHAPES, ids=str)
def test_large_and_broadcast_shapes(op: str, algorithm: Algorithm, shapes: tuple) -> None:
    problem = REGISTRY.operator(op).problem(shapes, ["float64", "float64"])
    rng = np.random.default_rng(5)
    check(algorithm, problem, [special_values("float64", s, rng) for s in shapes])


@pytest.mark.parametrize(("op", "algorithm"), CASES, ids=CASE_IDS)
def test_strided_and_read_only_inputs(op: str, algorithm: Algorithm) -> None:
    """Transposed and sliced operands (copied to contiguous ones by the numba algorithms),
    read-only ones, and a broadcast_to view (read-only, stride 0)."""
    rng = np.random.default_rng(6)
    base = special_values("float32", (6, 10), rng)
    other = special_values("float32", (10, 6), rng)
    read_only = other.T.copy()
    read_only.flags.writeable = False
    cases = [
        (base[:, ::2], other[::2, :].T),  # (6, 5) strided and (6, 5) transposed
        (base, read_only),
        (base[::2], np.broadcast_to(other[:, 0], (3, 10))),
        (np.broadcast_to(base[:1], (6, 10)), base),
    ]
    for a, b in cases:
        problem = REGISTRY.operator(op).problem_for([a, b])
        check(algorithm, problem, [a, b])


# -- semantics numpy defines ------------------------------------------------------------------

NUMBA_CASES = [(name, algorithm) for name, algorithm in CASES if algorithm.desc.name != "numpy"]


@pytest.mark.parametrize(("op", "algorithm"), NUMBA_CASES,
                         ids=[f"{name}-{algorithm.desc.name}" for name, algorithm in NUMBA_CASES])
def test_division_by_zero_and_nan_like_numpy(op: str, algorithm: Algorithm) -> None:
    """Floats: x/0 is +-inf, 0/0 and NaN operands NaN; integers: true division converts to
    float64 first, so 1/0 is inf, -1/0 is -inf and 0/0 is nan, exactly like numpy (no
    ZeroDivisionError, no wrap-around).  max/min propagate NaN from either side and return
    numpy's zero for (0.0, -0.0); greater_equal with NaN is False."""
    floats = np.array([1.0, -1.0, 0.0, -0.0, np.nan, np.inf, 0.0, -0.0, 2.0])
    zeros = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.0, 0.0, np.nan])
    ints = np.array([1, -1, 0, 5, 0], dtype=np.int64)
    int_zeros = np.zeros(5, dtype=np.int64)
    for a, b in [(floats, zeros), (zeros, floats),
                 (floats.astype(np.float32), zeros.astype(np.float32)),
                 (ints, int_zeros), (int_zeros, ints)]:
        problem = REGISTRY.operator(op).problem_for([a, b])
        output = check(algorithm, problem, [a, b])
        if op == "div" and a is ints:
            np.testing.assert_array_equal(output, [np.inf, -np.inf, np.nan, np.inf, np.nan])
            assert output.dtype == np.float64


def test_integer_division_gives_float64_and_overflow_wraps() -> None:
    operator = REGISTRY.operator("div")
    assert operator.output_dtype(operator.problem([(2,), (2,)], ["int32", "int32"])) == "float64"
    assert operator.output_dtype(operator.problem([(2,), (2,)], ["float32", "float32"])) == \
        "float32"
    assert operator.output_dtype(operator.problem([(2,), ()], ["float32", "int32"])) == "float64"
    ge = REGISTRY.operator("greater_equal")
    assert ge.output_dtype(ge.problem([(2,), (2,)], ["int32", "float32"])) == np.bool_
    big = np.array([np.iinfo(np.int32).max], dtype=np.int32)
    for algorithm in REGISTRY.algorithms("add"):
        problem = REGISTRY.operator("add").problem_for([big, big])
        assert check(algorithm, problem, [big, big])[0] == -2  # wraps like numpy


# -- shape rules and validate -----------------------------------------------------------------

shape_st = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)


@settings(max_examples=200, deadline=None)
@given(a_shape=shape_st, b_shape=shape_st)
def test_shape_rules_agree_with_numpy(a_shape: tuple, b_shape: tuple) -> None:
    operator = REGISTRY.operator("add")
    try:
        expected = np.broadcast_shapes(a_shape, b_shape)
    except ValueError:
        with pytest.raises(ValueError, match="do not broadcast"):
            operator.problem([a_shape, b_shape], ["float64", "float64"])
        return
    problem = operator.problem([a_shape, b_shape], ["float64", "float64"])
    assert operator.output_shape(problem) == expected


@pytest.mark.parametrize(("shapes", "dtypes", "expected"), [
    ([(3, 4), (5,)], ["float32"] * 2, ["add", "(3, 4)", "(5,)", "do not broadcast",
                                       "is 4 in a and 5 in b"]),
    ([(2, 3, 4), (3, 1, 4)], ["int32"] * 2, ["(2, 3, 4)", "(3, 1, 4)", "dimension -3"]),
    ([(2,)], ["float32"], ["exactly 2 inputs", "got 1"]),
    ([(2,), (2,), (2,)], ["float32"] * 3, ["exactly 2 inputs", "got 3"]),
    ([(2,), (2,)], ["float16", "float32"], ["float16", "cast the operands"]),
    ([(2,), (2,)], ["int32", "bool"], ["bool", "float32, float64, int32, int64"]),
    ([(2,), (2,)], ["uint8", "complex128"], ["uint8", "complex128"]),
])
def test_validate_rejects(shapes: list, dtypes: list, expected: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        REGISTRY.operator("add").problem(shapes, dtypes)
    for text in expected:
        assert text in str(error.value), f"{text!r} not in {str(error.value)!r}"


@pytest.mark.parametrize(("shapes", "rank", "geometry"), [
    (((4, 5), (4, 5)), 1, [[20], [1], [1]]),  # same shape: one flat loop
    (((4, 5), ()), 1, [[20], [1], [0]]),  # scalar: stride 0
    (((1,), (4, 5)), 1, [[20], [0], [1]]),  # 1-element operand
    (((4, 5), (5,)), 2, [[4, 5], [5, 1], [0, 1]]),  # row broadcast
    (((2, 3, 4, 5), (1, 3, 1, 1)), 3, [[2, 3, 20], [60, 20, 1], [0, 1, 0]]),  # bias
    (((1, 1), (1,)), 1, [[1], [1], [1]]),  # one element
])
def test_layout_merges_dimensions(shapes: tuple, rank: int, geometry: list) -> None:
    layout = elementwise.broadcast_layout(*shapes)
    assert layout.rank == rank
    assert layout.geometry.tolist() == geometry
    assert not layout.geometry.flags.writeable


def test_numba_algorithms_do_not_copy_contiguous_inputs() -> None:
    from fastrun_algorithms.elementwise._layout import flat

    x = np.ones((3, 4))
    assert np.shares_memory(flat(x), x)
    assert np.shares_memory(flat(x[1:]), x)
    assert not np.shares_memory(flat(x.T), x)  # strided: copied once, to a contiguous array


# -- registration, attributes, checking ------------------------------------------------------

def test_registered_operators_and_algorithms() -> None:
    assert set(OP_NAMES) <= set(REGISTRY.operators())
    assert set(OPS) == set(OP_NAMES)
    for name in OP_NAMES:
        texts = [a.desc.text for a in REGISTRY.algorithms(name)]
        assert texts == ["numpy", "serial", "parallel"]
        for algorithm in REGISTRY.algorithms(name):
            assert algorithm.attributes == AlgoAttribute.REPRODUCIBLE
            assert str(algorithm.desc) == f"{name}:{algorithm.desc.name}"


def test_cache_key_is_shapes_and_dtypes_only() -> None:
    problem = REGISTRY.operator("add").problem([(2, 3), (3,)], ["float32", "int32"])
    assert problem.key == "float32[2x3],int32[3]"


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_is_bit_identical_to_serial_at_any_thread_count(threads: int) -> None:
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("numba has fewer threads")
    problem = REGISTRY.operator("div").problem([(5, 1, 3000), (7, 1)], ["float32", "float32"])
    inputs = REGISTRY.operator("div").random_inputs(problem, np.random.default_rng(3))
    by_name = {a.desc.name: a for a in REGISTRY.algorithms("div")}
    with numba_threads(threads):
        parallel = by_name["parallel"].run(problem, inputs, None)
    serial = by_name["serial"].run(problem, inputs, None)
    assert parallel.tobytes() == serial.tobytes()


@pytest.mark.parametrize("op", OP_NAMES)
def test_random_inputs_and_checking(op: str) -> None:
    operator = REGISTRY.operator(op)
    for dtype in SUPPORTED_DTYPES:
        problem = operator.problem([(50, 40), (40,)], [dtype, dtype])
        a, b = operator.random_inputs(problem, np.random.default_rng(0))
        assert a.dtype == b.dtype == dtype
        assert np.count_nonzero(a) > 0 and len(np.unique(a)) > 10
        if op == "div":
            assert np.all(b != 0) and np.all(np.abs(b) >= 0.5)
        reference = operator.reference(problem, [a, b])
        assert np.all(np.isfinite(reference.astype(np.float64)))
        assert operator.error(problem, reference, reference) == 0.0
        wrong = reference.astype(np.float64) if reference.dtype != np.float64 else \
            reference.astype(np.float32)
        assert operator.error(problem, wrong, reference) == float("inf")


def test_error_of_non_finite_values() -> None:
    operator = REGISTRY.operator("div")
    problem = operator.problem([(3,), (3,)], ["float64", "float64"])
    reference = np.array([np.inf, np.nan, 1.0])
    assert operator.error(problem, reference.copy(), reference) == 0.0
    assert operator.error(problem, np.array([-np.inf, np.nan, 1.0]), reference) == float("inf")
    assert operator.error(problem, np.array([np.inf, 0.0, 1.0]), reference) == float("inf")
    assert operator.error(problem, np.array([np.inf, np.nan, np.nan]), reference) == float("inf")
    one_ulp_off = np.array([np.inf, np.nan, np.nextafter(1.0, 2.0)])
    assert 0 < operator.error(problem, one_ulp_off, reference) <= operator.tolerance(problem)


# -- heuristic order ---------------------------------------------------------------------------

def _order(op: str, shape: tuple, dtype: str) -> list[str]:
    operator = REGISTRY.operator(op)
    problem = operator.problem([shape, shape], [dtype, dtype])
    return [a.desc.name for a in operator.heuristic_order(problem, REGISTRY.algorithms(op))]


def test_heuristic_order_small_numpy_first_large_parallel_first() -> None:
    below = PARALLEL_MIN_BYTES // 4 - 1
    assert _order("add", (16,), "float32") == ["numpy", "serial", "parallel"]
    assert _order("add", (below,), "float32") == ["numpy", "serial", "parallel"]
    # the threshold is in output bytes, not elements
    assert _order("add", (below,), "float64")[0] == ("parallel" if numba.get_num_threads() > 1
                                                     else "numpy")
    # greater_equal's output is 1 byte per element whatever the operands
    assert _order("greater_equal", (below,), "float64")[0] == "numpy"
    if numba.get_num_threads() > 1:
        assert _order("mul", (1 << 22,), "int32") == ["parallel", "numpy", "serial"]
    with numba_threads(1):
        assert _order("mul", (1 << 22,), "int32")[0] == "numpy"  # one thread: nothing to gain


def test_heuristic_order_keeps_unknown_algorithms() -> None:
    class Other(Algorithm):
        operator = "add"
        name = "other"

    operator = REGISTRY.operator("add")
    problem = operator.problem([(4,), (4,)], ["float32", "float32"])
    order = operator.heuristic_order(problem, [Other(), *REGISTRY.algorithms("add")])
    assert [a.desc.name for a in order] == ["numpy", "serial", "parallel", "other"]


# -- through a session -------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["heuristic", "fast-run"])
def test_fastrun_call_through_a_session(strategy: str) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(4, dtype=np.float32)
    session = fastrun.session(strategy=strategy, cache=fastrun.InMemoryCache(),
                              registry=REGISTRY, progress=False, budget_s=0.01)
    with session:
        for op in OP_NAMES:
            with np.errstate(divide="ignore", invalid="ignore"):
                expected = OPS[op].ufunc(a, b)
                for _ in range(2):  # the second call takes the dispatch fast path
                    np.testing.assert_array_equal(fastrun.call(op, a, b), expected)
        scalar = fastrun.call("add", np.float64(1.5), np.float64(2.0))
        assert isinstance(scalar, np.ndarray) and scalar.shape == () and scalar == 3.5
    decision = session.decide(session.problem("add", [(3, 4), (4,)], ["int32", "float32"]))
    assert decision.algorithm.desc.name in ("numpy", "serial", "parallel")
    if strategy == "fast-run":
        assert {e.algorithm for e in decision.entries} == {"numpy", "serial", "parallel"}
    else:
        assert decision.algorithm.desc.name == "numpy"


def test_kernels_of_different_operations_have_different_symbol_names() -> None:
    """numba names compiled symbols after the function's qualified name (plus a per-process
    counter and the argument types).  Kernels built by one factory for different operations
    must not share it, or a kernel loaded from numba's cache can link against another
    operation's loop compiled in this process (seen: a cached ``sub`` kernel computed a + b)."""
    int32 = np.dtype(np.int32)
    names = set()
    for op in ("add", "sub"):
        for kernel in _kernels.kernels(op, int32, int32, int32, int32):
            names.add(kernel.py_func.__qualname__)
    assert names == {"add_serial", "add_parallel", "sub_serial", "sub_parallel"}


_COMPILE_ONE_PAIR = """
import sys
import numpy as np
from fastrun_algorithms.elementwise import _kernels
float32 = np.dtype(np.float32)
for kernel in _kernels.kernels("mul", float32, float32, float32, float32):
    stats = kernel.stats  # the kernels are compiled (or loaded) when they are made
    print(kernel.py_func.__qualname__, sum(stats.cache_hits.values()),
          sum(stats.cache_misses.values()))
"""


def test_a_second_process_loads_the_kernels_from_numbas_cache(tmp_path) -> None:
    """numba keys a closure's cache entry on a pickle of what it closes over; anything in it
    that pickles differently in every process (a dispatcher, an intrinsic such as
    ``stack_buffer`` named from ``span``'s globals) makes every process compile the kernels
    again, about 2 s per pair of dtypes, and grows the cache folder without bound.  The second
    process must find both kernels in the cache the first one filled."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", _COMPILE_ONE_PAIR], env=env, check=True,
                           capture_output=True, text=True).stdout.splitlines() for _ in range(2)]
    first, second = ({name: (int(hits), int(misses)) for name, hits, misses in
                      (line.split() for line in run)} for run in runs)
    assert set(first) == {"mul_serial", "mul_parallel"}
    assert all(misses == 1 for _, misses in first.values()), first
    assert all(hits == 1 and misses == 0 for hits, misses in second.values()), second
