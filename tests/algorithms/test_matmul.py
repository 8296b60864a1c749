"""The matmul operator and every registered matmul algorithm.

Every algorithm is checked against the operator's reference on random shapes (2-D, batched with
broadcasting, 1-D operands, strided views), and the claims the chooser relies on are checked
directly: validate's errors, the sub-problems strassen declares, the workspace each algorithm
reports, the attributes and the heuristic order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrun.algorithm import Algorithm
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun.registry import Registry
from fastrun_algorithms import matmul
from fastrun_algorithms.matmul import strassen
from fastrun_algorithms.matmul.strassen import PRODUCTS, half_problem
from tests.algorithms._helpers import (
    TRACEMALLOC_SLACK,
    assert_matches_reference,
    numba_threads,
    traced_peak,
)

REGISTRY = Registry(load_plugins=False)
matmul.register(REGISTRY)
OPERATOR = REGISTRY.operator("matmul")
# The CPU algorithms; the OpenCL ones take device arrays and are tested on an OpenCL device
# in test_matmul_opencl.py.
ALGORITHMS = [a for a in REGISTRY.algorithms("matmul") if a.device_kind == "cpu"]
BY_TEXT = {algorithm.desc.text: algorithm for algorithm in ALGORITHMS}
BLAS = BY_TEXT["blas"]
STRASSEN = BY_TEXT["strassen"]
BLOCKED = [a for a in ALGORITHMS if a.desc.name == "blocked"]
TILED = BY_TEXT["register_tiled"]
SPLIT = BY_TEXT["blas_split"]
GEMV = BY_TEXT["gemv"]
#: blas_split needs the OpenBLAS numpy's wheels ship; with another numpy build it is unusable
#: (and says why), and its tests are skipped with that reason.
SPLIT_REASON = SPLIT.unusable_reason(OPERATOR.problem([(2, 2), (2, 2)], ["float32", "float32"]))
#: the algorithms that can run here
RUNNABLE = [a for a in ALGORITHMS if a is not SPLIT or SPLIT_REASON is None]
needs_split = pytest.mark.skipif(SPLIT_REASON is not None, reason=str(SPLIT_REASON))



class CheckingContext:
    """A RunContext that insists every call is a declared sub-problem with matching inputs.

    Products are computed with ``strassen`` again down to ``strassen_levels`` levels (where
    usable) and with ``blas`` below, so the calls of each level can be counted.
    """

    def __init__(self, strassen_levels: int = 1):
        self.strassen_levels = strassen_levels
        #: (level, problem) of every call, level 1 being the calls of the top-level algorithm
        self.calls: list[tuple[int, Problem]] = []
        self._declared: list[list[Problem]] = []

    def run(self, algorithm: Algorithm, problem: Problem, inputs: Any) -> Any:
        self._declared.append(list(algorithm.sub_problems(problem)))
        try:
            return algorithm.run(problem, inputs, self)
        finally:
            self._declared.pop()

    def call(self, problem: Problem, *inputs: Any) -> Any:
        level = len(self._declared)
        assert level > 0, "ctx.call outside of a run"
        assert problem in self._declared[-1], f"{problem} was not declared as a sub-problem"
        assert len(inputs) == len(problem.shapes)
        for index, (x, shape, dtype) in enumerate(zip(inputs, problem.shapes, problem.dtypes,
                                                      strict=True)):
            assert x.shape == shape, f"input {index}: shape {x.shape} != declared {shape}"
            assert x.dtype == np.dtype(dtype), f"input {index}: {x.dtype} != declared {dtype}"
        self.calls.append((level, problem))
        deeper = level < self.strassen_levels and STRASSEN.usable(problem)
        return self.run(STRASSEN if deeper else BLAS, problem, inputs)


def check_against_reference(algorithm: Algorithm, problem: Problem,
                            inputs: list[np.ndarray]) -> np.ndarray:
    output = CheckingContext().run(algorithm, problem, inputs)
    assert_matches_reference(OPERATOR, algorithm, problem, inputs, output)
    return output


# -- random problems -------------------------------------------------------------------------

def _dim(even: bool) -> st.SearchStrategy[int]:
    """Matrix dimensions up to 40, with 1 and small odd sizes drawn often."""
    if even:
        return st.integers(1, 20).map(lambda h: 2 * h)
    return st.one_of(st.sampled_from([1, 2, 3, 7]), st.integers(1, 40))


@st.composite
def matmul_cases(draw: st.DrawFn, even: bool = False, allow_1d: bool = True,
                 one_row: bool = False) -> tuple[Problem, list[np.ndarray]]:
    m, k, n = draw(_dim(even)), draw(_dim(even)), draw(_dim(even))
    if one_row:  # what gemv computes: n up to 200, to cross several 64-column chunks
        m, n = 1, draw(st.one_of(st.integers(1, 70), st.integers(60, 200)))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    kinds = ["2d", "batched", "batched"] + (["1d_a", "1d_b", "1d_both"] if allow_1d else [])
    kind = draw(st.sampled_from(kinds))
    batch = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))

    def batch_of_operand() -> tuple[int, ...]:
        # Drop leading batch dimensions and set others to 1: both broadcast in numpy.
        dims = batch[draw(st.integers(0, len(batch))):]
        return tuple(d if draw(st.booleans()) else 1 for d in dims)

    a_shape: tuple[int, ...] = (m, k)
    b_shape: tuple[int, ...] = (k, n)
    if kind in ("batched", "1d_a", "1d_b"):
        # a 1-D operand broadcasts against the other's batch dimensions
        a_shape, b_shape = (*batch_of_operand(), m, k), (*batch_of_operand(), k, n)
    if kind in ("1d_a", "1d_both"):
        a_shape = (k,)
    if kind in ("1d_b", "1d_both"):
        b_shape = (k,)
    problem = OPERATOR.problem([a_shape, b_shape], [dtype, dtype])
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = [_maybe_strided(x, draw(st.sampled_from(["contiguous", "strided", "fortran"])))
              for x in OPERATOR.random_inputs(problem, rng)]
    return problem, inputs


def _maybe_strided(x: np.ndarray, layout: str) -> np.ndarray:
    """The same values as a non-contiguous view, as strassen's quadrants or a transpose are."""
    if layout == "strided":
        wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "fortran":
        return np.asfortranarray(x)
    return x


@pytest.mark.parametrize("algorithm", RUNNABLE, ids=lambda a: a.desc.text)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_reference(algorithm: Algorithm, data: st.DataObject) -> None:
    needs_even = algorithm is STRASSEN
    problem, inputs = data.draw(matmul_cases(even=needs_even, allow_1d=not needs_even,
                                             one_row=algorithm is GEMV))
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    check_against_reference(algorithm, problem, inputs)


@pytest.mark.parametrize("algorithm", RUNNABLE, ids=lambda a: a.desc.text)
def test_fixed_shapes(algorithm: Algorithm) -> None:
    """Shapes with more than one tile in every direction and a K that is no multiple of 4."""
    rng = np.random.default_rng(1)
    for shapes in [((150, 130), (130, 270)), ((2, 70, 66), (66, 134)), ((66,), (3, 66, 34))]:
        problem = OPERATOR.problem(shapes, ["float32", "float32"])
        if algorithm.usable(problem):
            check_against_reference(algorithm, problem, OPERATOR.random_inputs(problem, rng))


@pytest.mark.parametrize("algorithm", [a for a in RUNNABLE if a is not STRASSEN],
                         ids=lambda a: a.desc.text)
@pytest.mark.parametrize("shapes", [((3, 0), (0, 4)), ((0, 5), (5, 4)), ((2, 0, 3, 4), (4, 5))])
def test_empty_dimensions(algorithm: Algorithm, shapes: tuple) -> None:
    problem = OPERATOR.problem(shapes, ["float64", "float64"])
    if not algorithm.usable(problem):
        pytest.skip(algorithm.unusable_reason(problem))
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(0))
    output = algorithm.run(problem, inputs, CheckingContext())
    np.testing.assert_array_equal(output, np.matmul(*inputs))


@pytest.mark.parametrize("algorithm", RUNNABLE, ids=lambda a: a.desc.text)
def test_reproducible(algorithm: Algorithm) -> None:
    """REPRODUCIBLE means bit-identical; the numba kernels also claim independence of the
    thread count, which is checked for them."""
    assert AlgoAttribute.REPRODUCIBLE in algorithm.attributes
    shapes = [(3, 1, 130), (130, 200)] if algorithm is GEMV else [(3, 96, 130), (130, 72)]
    problem = OPERATOR.problem(shapes, ["float32", "float32"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(2))
    first = CheckingContext().run(algorithm, problem, inputs)
    np.testing.assert_array_equal(CheckingContext().run(algorithm, problem, inputs), first)
    if algorithm.desc.name in ("naive", "blocked", "register_tiled", "gemv"):
        with numba_threads(1):
            single = CheckingContext().run(algorithm, problem, inputs)
        np.testing.assert_array_equal(single, first)


# -- layout helper ---------------------------------------------------------------------------

def test_layout_does_not_copy_operands_that_are_not_broadcast() -> None:
    a = np.ones((2, 8, 6))
    b = np.ones((2, 6, 4))
    layout = matmul.matmul_layout(a.shape, b.shape)
    a3, b3 = layout.to_3d(a, b)
    assert np.shares_memory(a3, a) and np.shares_memory(b3, b)
    quadrant = a[:, 4:, 3:]
    layout = matmul.matmul_layout(quadrant.shape, (3, 2))
    q3, _ = layout.to_3d(quadrant, np.ones((3, 2)))
    assert np.shares_memory(q3, a)
    assert (layout.batch_shape, layout.m, layout.k, layout.n) == ((2,), 4, 3, 2)
    assert q3.shape == (2, 4, 3)


def test_layout_of_1d_operands() -> None:
    layout = matmul.matmul_layout((5,), (3, 5, 2))
    assert (layout.batch_shape, layout.m, layout.k, layout.n) == ((3,), 1, 5, 2)
    assert layout.out_shape == (3, 2)
    assert matmul.matmul_layout((5,), (5,)).out_shape == ()


# -- validate --------------------------------------------------------------------------------

@pytest.mark.parametrize(("shapes", "dtypes", "expected"), [
    ([(2, 3)], ["float32"], ["exactly 2 inputs", "got 1"]),
    ([(2, 3), (3, 4), (4, 5)], ["float32"] * 3, ["exactly 2 inputs", "got 3"]),
    ([(), (3, 4)], ["float32"] * 2, ["operand A is 0-d"]),
    ([(3, 4), ()], ["float64"] * 2, ["operand B is 0-d"]),
    ([(3, 4), (5, 6)], ["float32"] * 2, ["inner dimensions", "(3, 4)", "(5, 6)", "K=4", "K=5"]),
    ([(3, 4), (5,)], ["float32"] * 2, ["inner dimensions", "(3, 4)", "(5,)"]),
    ([(2, 3, 4), (3, 4, 5)], ["float32"] * 2, ["batch dimensions do not broadcast",
                                               "(2, 3, 4)", "(3, 4, 5)"]),
    ([(2, 3), (3, 4)], ["int32", "int32"], ["int32", "float32 and float64"]),
    ([(2, 3), (3, 4)], ["float16", "float32"], ["float16"]),
    ([(2, 3), (3, 4)], ["float32", "float64"], ["same dtype", "float32", "float64"]),
])
def test_validate_rejects(shapes: list, dtypes: list, expected: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        OPERATOR.problem(shapes, dtypes)
    for text in expected:
        assert text in str(error.value), f"{text!r} not in {str(error.value)!r}"


shape_st = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)


@settings(max_examples=200, deadline=None)
@given(a_shape=shape_st, b_shape=shape_st)
def test_shape_rules_agree_with_numpy(a_shape: tuple, b_shape: tuple) -> None:
    try:
        expected = np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape
    except ValueError:
        with pytest.raises(ValueError, match="matmul"):
            OPERATOR.problem([a_shape, b_shape], ["float64", "float64"])
        return
    problem = OPERATOR.problem([a_shape, b_shape], ["float64", "float64"])
    assert OPERATOR.output_shape(problem) == expected


def test_reference_is_float64() -> None:
    problem = OPERATOR.problem([(3, 4), (4,)], ["float32", "float32"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(0))
    reference = OPERATOR.reference(problem, inputs)
    assert reference.dtype == np.float64
    np.testing.assert_allclose(reference, inputs[0].astype(np.float64) @ inputs[1])


# -- strassen --------------------------------------------------------------------------------

@pytest.mark.parametrize("levels", [1, 2])
def test_strassen_calls_seven_declared_products_per_level(levels: int) -> None:
    problem = OPERATOR.problem([(2, 1, 24, 20), (3, 20, 28)], ["float64", "float64"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(3))
    declared = STRASSEN.sub_problems(problem)
    assert len(declared) == PRODUCTS == 7
    assert all(p == half_problem(problem) for p in declared)
    assert declared[0].shapes == ((2, 1, 12, 10), (3, 10, 14))
    ctx = CheckingContext(strassen_levels=levels)
    output = ctx.run(STRASSEN, problem, inputs)
    np.testing.assert_allclose(output, np.matmul(*inputs), rtol=1e-10, atol=1e-12)
    per_level = [sum(1 for level, _ in ctx.calls if level == n) for n in (1, 2)]
    assert per_level == ([7, 0] if levels == 1 else [7, 49])


@pytest.mark.parametrize(("shapes", "reason"), [
    ([(6, 5), (5, 4)], "K=5"),
    ([(3, 4), (4, 6)], "M=3"),
    ([(2, 4, 4), (4, 1)], "N=1"),
    ([(4,), (4, 6)], "1-D"),
    ([(4, 6), (6,)], "1-D"),
])
def test_strassen_unusable_reason(shapes: list, reason: str) -> None:
    problem = OPERATOR.problem(shapes, ["float32", "float32"])
    assert not STRASSEN.usable(problem)
    assert reason in STRASSEN.unusable_reason(problem)


# -- workspace -------------------------------------------------------------------------------



@pytest.mark.parametrize("algorithm", BLOCKED, ids=lambda a: a.desc.text)
@pytest.mark.parametrize("shapes", [((3, 70, 50), (3, 50, 90)), ((20, 20), (20, 20))])
def test_blocked_workspace_is_what_run_allocates(algorithm: Algorithm, shapes: tuple) -> None:
    problem = OPERATOR.problem(shapes, ["float64", "float64"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(4))
    algorithm.run(problem, inputs, CheckingContext())  # warm-up: compile/load the kernel
    with traced_peak() as peak:
        output = algorithm.run(problem, inputs, CheckingContext())
    workspace = algorithm.workspace_bytes(problem)
    assert workspace > 0
    expected = workspace + output.nbytes
    assert expected <= peak[0] <= expected + TRACEMALLOC_SLACK


def test_blocked_workspace_counts_only_busy_workers() -> None:
    """One tile keeps one worker busy, however many threads numba has; a tile larger than the
    problem is clamped to it (a 10x20 output with K=30 needs a 10x20 accumulator and a 30x20
    panel, not 128x128 and 64x128)."""
    algorithm = BY_TEXT["blocked(kb=64,mb=128,nb=128)"]
    problem = OPERATOR.problem([(10, 30), (30, 20)], ["float32", "float32"])
    assert algorithm.workspace_bytes(problem) == (10 * 20 + 30 * 20) * 4
    many = OPERATOR.problem([(8, 512, 300), (300, 512)], ["float32", "float32"])
    threads = numba.get_num_threads()
    assert algorithm.workspace_bytes(many) == threads * (128 * 128 + 64 * 128) * 4


def test_numba_kernels_allocate_nothing_themselves() -> None:
    """tracemalloc does not see numba's allocator (NRT), so count NRT allocations instead: a
    kernel call may only wrap its array arguments (one allocation each), whatever the shape."""
    nrt = pytest.importorskip("numba.core.runtime")
    try:
        nrt._nrt_python.memsys_enable_stats()
    except AttributeError:
        pytest.skip("this numba has no NRT statistics switch")

    def allocations(function: Any, *args: Any) -> int:
        function(*args)  # warm-up
        before = nrt.rtsys.get_allocation_stats().alloc
        function(*args)
        return nrt.rtsys.get_allocation_stats().alloc - before

    for shapes in [((4, 4), (4, 4)), ((3, 130, 70), (70, 150))]:
        problem = OPERATOR.problem(shapes, ["float32", "float32"])
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(5))
        ctx = CheckingContext()
        assert allocations(BY_TEXT["naive"].run, problem, inputs, ctx) == 3  # A, B, C
        for blocked in BLOCKED:  # A, B, C and the two workspace buffers
            assert allocations(blocked.run, problem, inputs, ctx) == 5
        assert allocations(TILED.run, problem, inputs, ctx) == 3  # its tile is on the stack
        if SPLIT_REASON is None:  # pointers into A, B and C
            assert allocations(SPLIT.run, problem, inputs, ctx) == 3
    x = np.ones((2, 8, 6))
    combine = strassen._compiled_combine(x.dtype)
    assert allocations(combine, x[:, :4, :3], x[:, 4:, 3:], -1.0, x[:, :4, 3:]) == 3


@pytest.mark.parametrize("shapes", [((2, 64, 48), (2, 48, 32)), ((64, 48), (3, 48, 40)),
                                    ((3, 1, 40, 40), (4, 40, 40))])
def test_strassen_workspace_is_what_run_allocates(shapes: tuple) -> None:
    problem = OPERATOR.problem(shapes, ["float64", "float64"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(6))
    CheckingContext().run(STRASSEN, problem, inputs)
    half = half_problem(problem)
    itemsize = 8
    products = int(np.prod(OPERATOR.output_shape(half)))
    assert STRASSEN.workspace_bytes(problem) == itemsize * (
        int(np.prod(half.shapes[0])) + int(np.prod(half.shapes[1])) + products)
    with traced_peak() as peak:
        output = CheckingContext().run(STRASSEN, problem, inputs)
    expected = STRASSEN.workspace_bytes(problem) + output.nbytes
    assert expected <= peak[0] <= expected + TRACEMALLOC_SLACK


@pytest.mark.parametrize("algorithm", [BY_TEXT["naive"], BLAS], ids=lambda a: a.desc.text)
def test_algorithms_without_workspace_allocate_only_the_output(algorithm: Algorithm) -> None:
    problem = OPERATOR.problem([(2, 40, 30), (30, 50)], ["float64", "float64"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(7))
    assert algorithm.workspace_bytes(problem) == 0
    algorithm.run(problem, inputs, CheckingContext())
    with traced_peak() as peak:
        output = algorithm.run(problem, inputs, CheckingContext())
    assert output.nbytes <= peak[0] <= output.nbytes + TRACEMALLOC_SLACK


# -- register_tiled ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m", [1, 7, 8, 9, 17])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 40])
def test_register_tiled_edges(dtype: str, m: int, n: int) -> None:
    """Rows past a multiple of 8 (repeated, not stored), the last column tile shifted left to
    overlap its neighbour, and products narrower than one tile."""
    problem = OPERATOR.problem([(2, m, 37), (2, 37, n)], [dtype, dtype])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(m * 100 + n))
    check_against_reference(TILED, problem, inputs)


@pytest.mark.parametrize(("shapes", "copied"), [
    (((3, 20, 30), (3, 30, 40)), 0),            # own batch each
    (((20, 30), (3, 30, 40)), 0),               # A shared by every product
    (((1, 20, 30), (3, 30, 40)), 0),            # A's batch of one, shared
    (((2, 1, 20, 30), (1, 3, 30, 40)), 6 * 20 * 30 + 6 * 30 * 40),  # partial broadcasts
])
@pytest.mark.parametrize("algorithm", [a for a in RUNNABLE if a in (TILED, SPLIT)],
                         ids=lambda a: a.desc.text)
def test_3d_kernels_workspace_is_what_run_allocates(algorithm: Algorithm, shapes: tuple,
                                                    copied: int) -> None:
    problem = OPERATOR.problem(shapes, ["float64", "float64"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(8))
    assert algorithm.workspace_bytes(problem) == copied * 8
    algorithm.run(problem, inputs, CheckingContext())
    with traced_peak() as peak:
        output = algorithm.run(problem, inputs, CheckingContext())
    expected = algorithm.workspace_bytes(problem) + output.nbytes
    assert expected <= peak[0] <= expected + TRACEMALLOC_SLACK


# -- heuristic and attributes ----------------------------------------------------------------

def test_heuristic_puts_register_tiled_first_for_winograd_products() -> None:
    winograd = OPERATOR.problem([(36, 64, 64), (36, 64, 196)], ["float32", "float32"])
    assert OPERATOR.heuristic_order(winograd, ALGORITHMS)[0] is TILED
    for shapes in ([(512, 2304), (2304, 49)],            # one product: BLAS
                   [(16, 512, 2048), (16, 2048, 16)],    # deep K: BLAS
                   [(8, 1, 128), (8, 128, 1000)]):       # one row, 512 KB of B: BLAS
        problem = OPERATOR.problem(shapes, ["float32", "float32"])
        for threads, first in ((1, [BLAS, TILED]), (2, [SPLIT, BLAS, TILED])):
            with numba_threads(threads):
                order = OPERATOR.heuristic_order(problem, ALGORITHMS)
            assert order[:len(first)] == first, (shapes, threads)


def test_heuristic_puts_gemv_first_for_a_classifier_on_several_threads() -> None:
    classifier = OPERATOR.problem([(1, 1280), (1280, 1000)], ["float32", "float32"])
    with numba_threads(2):
        assert OPERATOR.heuristic_order(classifier, ALGORITHMS)[0] is GEMV
    with numba_threads(1):
        assert OPERATOR.heuristic_order(classifier, ALGORITHMS)[0] is BLAS
    assert "M == 1" in GEMV.unusable_reason(OPERATOR.problem([(2, 8), (8, 4)],
                                                              ["float32", "float32"]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 63, 64, 65, 130, 1000])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemv_edges(dtype: str, n: int, threads: int) -> None:
    """Fewer columns than a chunk, the last chunk shifted back to overlap its neighbour, a
    1-D A, and a batch of rows against one shared B; the same bits on any thread count."""
    rng = np.random.default_rng(n)
    for shapes in ([(1, 37), (37, n)], [(37,), (37, n)], [(3, 1, 37), (37, n)]):
        problem = OPERATOR.problem(shapes, [dtype, dtype])
        inputs = OPERATOR.random_inputs(problem, rng)
        with numba_threads(min(threads, numba.config.NUMBA_NUM_THREADS)):
            output = check_against_reference(GEMV, problem, inputs)
        with numba_threads(1):
            np.testing.assert_array_equal(CheckingContext().run(GEMV, problem, inputs), output)


def test_heuristic_large_problem() -> None:
    problem = OPERATOR.problem([(1024, 1024), (1024, 1024)], ["float32", "float32"])
    with numba_threads(2):
        order = OPERATOR.heuristic_order(problem, ALGORITHMS)
    assert sorted(a.desc.text for a in order) == sorted(BY_TEXT)
    assert [a.desc.name for a in order[:3]] == ["blas_split", "blas", "strassen"]
    assert order[-1].desc.name == "naive"
    with numba_threads(1):  # nothing to split over: BLAS on the calling thread first
        order = OPERATOR.heuristic_order(problem, ALGORITHMS)
    assert [a.desc.name for a in order[:2]] == ["blas", "strassen"]


def test_heuristic_small_odd_problem() -> None:
    problem = OPERATOR.problem([(64, 32, 31), (31, 31)], ["float64", "float64"])
    candidates = [a for a in ALGORITHMS if a is not GEMV]  # M = 32: gemv is not usable
    with numba_threads(1):
        order = OPERATOR.heuristic_order(problem, list(reversed(candidates)))
    assert len(order) == len(candidates)
    names = [a.desc.name for a in order]
    assert names[0] == "blas" and names[-1] == "naive"
    assert names.index("strassen") > max(i for i, n in enumerate(names) if n == "blocked")
    assert order[1:3] == [TILED, SPLIT]  # a batch against one shared matrix: BLAS first
    # the tile that hangs over a 32 x 31 output least comes first among the blocked ones
    assert order[3].desc.text == "blocked(kb=256,mb=32,nb=32)"


def test_heuristic_tiny_problem_keeps_blas_first() -> None:
    problem = OPERATOR.problem([(2, 2), (2, 2)], ["float32", "float32"])
    order = OPERATOR.heuristic_order(problem, ALGORITHMS)
    assert order[0] is BLAS and order[-1].desc.name == "naive"


def test_attributes_and_identities() -> None:
    assert all(a.desc.operator == "matmul" for a in ALGORITHMS)
    assert BY_TEXT["naive"].attributes == AlgoAttribute.NAIVE | AlgoAttribute.REPRODUCIBLE
    assert AlgoAttribute.NAIVE not in BLAS.attributes
    assert STRASSEN.attributes == (AlgoAttribute.USABLE_DEPEND_ON_SHAPE
                                   | AlgoAttribute.REPRODUCIBLE)
    texts = [a.desc.text for a in BLOCKED]
    assert len(BLOCKED) == len(matmul.BLOCKED_TILES) >= 4
    assert len(set(texts)) == len(texts)
    assert "blocked(kb=256,mb=32,nb=32)" in texts


def test_blocked_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="'kb'"):
        matmul.BlockedMatmul({"mb": 8, "nb": 8})
    with pytest.raises(ValueError, match="'mb'"):
        matmul.BlockedMatmul({"mb": 0, "nb": 8, "kb": 8})


# -- blas_split --------------------------------------------------------------------------------

def test_split_plan_gives_every_thread_work_and_splits_few_rows_by_columns() -> None:
    from fastrun_algorithms.matmul.blas_split import split_plan

    assert split_plan(batch=1, m=512, n=49, threads=2) == (2, 1)
    assert split_plan(batch=1, m=1, n=1000, threads=2) == (1, 2)  # one row: by columns
    assert split_plan(batch=36, m=64, n=196, threads=2) == (1, 1)  # whole products
    assert split_plan(batch=3, m=64, n=64, threads=8) == (3, 1)
    assert split_plan(batch=1, m=40, n=64, threads=4) == (1, 4)  # 10 rows a block: too few


@needs_split
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shapes", [((1, 300), (300, 70)), ((97, 40), (40, 5)),
                                    ((2, 33, 17), (17, 65)), ((5,), (5, 40))])
def test_blas_split_matches_reference(threads: int, shapes: tuple) -> None:
    problem = OPERATOR.problem(shapes, ["float32", "float32"])
    inputs = OPERATOR.random_inputs(problem, np.random.default_rng(threads))
    with numba_threads(threads):
        check_against_reference(SPLIT, problem, inputs)


@needs_split
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("grid", [(1, 1), (2, 1), (1, 2), (3, 1), (1, 5), (2, 3), (3, 2),
                                  (40, 1), (1, 40), (5, 8)])
@pytest.mark.parametrize("n", [31, 100])
def test_blas_split_kernel_blocks_cover_the_output_once(dtype: str, grid: tuple[int, int],
                                                        n: int) -> None:
    """Any grid of blocks (more than rows or columns too: empty blocks are skipped), by rows,
    by columns or both, over a batch with a shared B."""
    from fastrun_algorithms.matmul.blas_split import split_kernel

    rng = np.random.default_rng(sum(grid) + n)
    a = rng.uniform(-1, 1, (3, 23, 19)).astype(dtype)
    b = rng.uniform(-1, 1, (1, 19, n)).astype(dtype)
    out = np.full((3, 23, n), np.nan, dtype=dtype)
    split_kernel(dtype)(a, b, out, *grid, ())
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


@needs_split
def test_blas_split_reads_strided_operands_in_place_or_copies_them() -> None:
    rng = np.random.default_rng(9)
    a = rng.uniform(-1, 1, (60, 90)).astype(np.float32)[:, 10:70]  # rows contiguous: in place
    b = rng.uniform(-1, 1, (80, 60)).astype(np.float32).T          # columns contiguous: copied
    c = rng.uniform(-1, 1, (60, 200)).astype(np.float32)[:, ::4]   # every fourth column: copied
    problem = OPERATOR.problem([(60, 60), (60, 80)], ["float32", "float32"])
    check_against_reference(SPLIT, problem, [a, b])
    check_against_reference(SPLIT, OPERATOR.problem([(60, 60), (60, 50)], ["float32"] * 2),
                            [a, c])


def test_blas_split_says_why_without_numpys_openblas(monkeypatch, tmp_path) -> None:
    import _ctypes
    import shutil

    from fastrun.devices.cpu import openblas
    from fastrun_algorithms.matmul import blas_split

    def look_in(folder: Path) -> None:
        monkeypatch.setattr(openblas, "library_folders", lambda: [str(folder)])
        openblas._load.cache_clear()
        blas_split._gemm_functions.cache_clear()

    problem = OPERATOR.problem([(8, 8), (8, 8)], ["float32", "float32"])
    try:
        look_in(tmp_path)
        reason = SPLIT.unusable_reason(problem)
        assert reason is not None and "numpy ships no OpenBLAS library" in reason
        assert str(tmp_path) in reason
        # a library that loads but has no gemm of this interface
        shutil.copy(_ctypes.__file__, tmp_path / "libother_openblas.so")
        look_in(tmp_path)
        reason = SPLIT.unusable_reason(problem)
        assert reason is not None and "exports none of scipy_cblas_sgemm64_" in reason
    finally:
        monkeypatch.undo()
        openblas._load.cache_clear()
        blas_split._gemm_functions.cache_clear()
    assert SPLIT.unusable_reason(problem) is None  # numpy's own library again
