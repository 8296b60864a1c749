"""What several operator packages of the compute library share."""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from fastrun import numba_cache
from fastrun.operator import Operator, Problem, Shape

#: ``cache=`` of every numba kernel: False where numba has nowhere to keep them
#: (:mod:`fastrun.numba_cache`), so the library still loads, uncached.
CACHE = numba_cache.enabled()

#: fastmath flags of the numba kernels that promise reproducible results: contraction into
#: fused multiply-adds only.  Whether LLVM fuses is decided once per instruction at compile
#: time, so results stay bit-identical run to run; no reassociation is allowed, so every sum
#: keeps the order it is written in.
FASTMATH = {"contract"}

#: Unsigned index cast for numba kernels.  numba wraps negative indices around, which for a
#: signed index means a compare and select per access, and that keeps LLVM from vectorising
#: the loop; an unsigned index cannot be negative, so the check disappears.
U = numba.uint64


@functools.cache
def _thread_count_function() -> Callable[[], int]:
    """numba's own reader of the calling thread's count, once its pool is started; numba's
    public function where that reader is not found."""
    numba.get_num_threads()  # starts the pool, as every later call would check
    try:
        from numba.np.ufunc.parallel import _get_num_threads
    except ImportError:
        return numba.get_num_threads
    return _get_num_threads


def thread_count() -> int:
    """``numba.get_num_threads()`` for the kernels' plans, at a seventh of its cost.

    Why: numba's function takes two locks (one of them a multiprocessing lock) on every call
    to check that its pool has started, 1.5 us on the 2-core VM, and an algorithm's ``run``
    asks two or three times: with a model's hundred steps, a tenth of a millisecond per
    inference.  Once the pool has started, the value is what numba's own ctypes reader
    returns (0.2 us), the calling thread's count as ``set_num_threads`` left it."""
    return _thread_count_function()()


def parallel_pays(nbytes: int, threshold: int, min_threads: int = 2) -> bool:
    """The heuristics' rule for a memory-bound pass: a parallel kernel goes first from
    ``threshold`` bytes on, with at least ``min_threads`` numba threads (below, waking the
    workers costs more than the pass).  Each operator measured its own threshold."""
    return nbytes >= threshold and thread_count() >= min_threads


#: The rule of thumb of the memory-bound families (activations, elementwise operations, tensor
#: copies, layout reorders), as ranks their algorithms declare (``heuristic_rank``): numpy's
#: one call is the cheapest on small arrays, a numba loop on one thread comes next, and the
#: parallel numba loop goes first from the size where its operator says a parallel pass pays
#: (the operator's ``parallel_pays(problem)``, handed to the algorithm when it is registered),
#: last below it.
NUMPY_RANK = (1.0,)
SERIAL_RANK = (2.0,)


def parallel_rank(pays: bool) -> tuple[float, ...]:
    """The rank of a parallel memory-bound loop: first where a parallel pass pays, else last."""
    return (0.0,) if pays else (3.0,)


class NumpyRanked:
    """Mixin (before ``Algorithm`` in the bases) of a memory-bound family's numpy algorithm:
    ranked :data:`NUMPY_RANK`."""

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return NUMPY_RANK


class ParallelRanked:
    """Mixin (before ``Algorithm`` in the bases) of a memory-bound family's parallel loop:
    ranked by :func:`parallel_rank` of ``pays``, the operator's ``parallel_pays`` that the
    family's ``register`` hands to the algorithm, first of its constructor's arguments (the
    rest go to the next base)."""

    def __init__(self, pays: Callable[[Problem], bool], *args: Any):
        #: the operator's rule for where a parallel pass pays
        self.pays = pays
        super().__init__(*args)

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        return parallel_rank(self.pays(problem))


class RunsThroughBind:
    """For an algorithm that overrides :meth:`~fastrun.algorithm.Algorithm.bind` to work out
    once what its calls share: :meth:`run` is the bound call, so the two cannot differ.  List
    it before the algorithm's base class."""

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: Any,
            prepared: Any = None) -> Any:
        return self.bind(problem, ctx, prepared)(*inputs)


@intrinsic
def stack_buffer(typingctx, count, dtype):
    """``stack_buffer(COUNT, dtype)`` in a numba kernel: a pointer to COUNT (a literal) elements
    of ``dtype`` on the stack; wrap it with ``numba.carray`` to index it.

    Why: a register-tiled kernel keeps its accumulator tile in registers only when LLVM can
    prove that nothing else in the loop touches that memory.  A stack slot proves it; an array
    from ``np.zeros`` (numba's heap, an allocation per call that the workspace figures would have
    to count) or a workspace argument (opaque memory that may alias the operands) does not, and
    the tile is then stored and reloaded on every multiply-add: 7 GFLOP/s instead of 200 in the
    matmul kernel.  The slot is reserved once in the function's entry block, so calling this in
    a loop does not grow the stack.
    """
    if not isinstance(count, types.IntegerLiteral) or not isinstance(dtype, types.DTypeSpec):
        return None
    item = dtype.dtype
    size = count.literal_value

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, context.get_data_type(item), size=size)

    return types.CPointer(item)(count, dtype), codegen


@intrinsic
def next_task(typingctx, counter):
    """``next_task(counter)`` in a numba kernel: atomically returns ``counter[0]`` (a 1-D int64
    array) and adds one to it, so that workers take tasks one at a time, each exactly once.

    Why: numba's OpenMP layer splits a ``prange`` into one equal slice per thread before the
    loop starts.  On the 16-core host a worker that starts late or runs slower (a vCPU the
    hypervisor paused, a core busy with an interrupt) then holds up the whole region, and
    slices of unequal work cannot even out.  With many small tasks taken from a shared counter,
    the other workers take over what a slow one has not started: 256 tasks of a 0.43 ms region
    ran 9% faster than the static split of the same tasks (mean 409 against 449 us).  The
    counter is reset before the parallel loop, outside it.

    It pays for tasks of tens of microseconds (``conv.pointwise``'s gemm blocks), not for tiny
    ones: every task is one atomic add on a cache line all workers share.  ``depthwise`` and
    ``direct`` taking their tasks this way made MobileNetV2 slower on 16 threads (median 4.17
    -> 5.07 ms at batch 1, 20.5 -> 23.2 ms at batch 8), so they keep their static slices.
    """
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64
            and counter.ndim == 1):
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        array = context.make_array(array_type)(context, builder, args[0])
        first = context.get_constant(types.intp, 0)
        pointer = cgutils.get_item_pointer(context, builder, array_type, array, [first])
        one = context.get_constant(types.int64, 1)
        return builder.atomic_rmw("add", pointer, one, "monotonic")

    return types.int64(counter), codegen


@intrinsic
def prefetch(typingctx, array, index):
    """``prefetch(array, index)`` in a numba kernel: ask the processor to bring the cache line of
    element ``index`` of the C-contiguous ``array`` (counted flat, from its start) into the
    first-level cache, without waiting for it; an index past the end is harmless (a prefetch
    never faults).

    Why: a kernel that streams a large constant operand once per call (a model's weights, which
    the layers before have pushed out of every cache) waits for memory where the hardware's own
    prefetcher has not run far enough ahead; asking a few steps early overlaps the wait with
    the multiply-adds (``linear``'s ``packed``)."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        bytes_pointer = ir.IntType(8).as_pointer()
        flag = ir.IntType(32)
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [bytes_pointer, flag, flag, flag]),
            "llvm.prefetch.p0i8")
        pointer = builder.bitcast(builder.gep(data, [args[1]]), bytes_pointer)
        # read (0), keep in every level (3), data cache (1)
        builder.call(function, [pointer, flag(0), flag(3), flag(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


# An 8-row register tile (matmul's register_tiled, conv's implicit_gemm and tiled_1x1): rows
# of A (or output channels) past the last are clamped to it, so every tile runs the same eight
# multiply-adds per column; the caller stores only the real rows.  Its width comes from
# tile_columns.

@functools.cache
def vector_registers() -> tuple[int, int]:
    """(vector registers, float32 lanes in each) of the code numba compiles here.

    The features are numba's (``NUMBA_CPU_FEATURES`` if the user set it, else the host's);
    on AVX-512 the width is the one :mod:`fastrun.devices.cpu.vectors` has numba use, which
    depends only on the environment and the processor, so a kernel module imported before the
    library registers gets the same answer as one imported after."""
    from numba.core import config as numba_config

    from fastrun.devices.cpu import vectors

    features = numba_config.CPU_FEATURES
    if not features:
        from llvmlite import binding

        features = binding.get_host_cpu_features().flatten()
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in enabled:
        fact = vectors.category_fact()
        wide = fact == "512" or (fact == "numba-user" and f"-{vectors.PREFER_256}" in features)
        return 32, (16 if wide else 8)
    if platform.machine().lower() in ("aarch64", "arm64"):
        return 32, 4
    return 16, (8 if "avx" in enabled else 4)


def tile_columns(wanted: int) -> int:
    """Columns of an 8-row float32 register tile: ``wanted``, at most what keeps the
    accumulators in half the vector registers (two per row with 32 registers, one with 16).

    Why: the tile's accumulators, its input vectors and eight broadcast weights must all stay
    in registers.  Sixteen columns on AVX2 are 16 accumulators in 16 registers, and LLVM
    spilled the tile to the stack on every multiply-add: ``implicit_gemm`` ran ResNet's layers
    at 12-26 GFLOP/s on one core of an AVX2 EPYC, and at 33-38 GFLOP/s with 8 columns
    (``benchmarks/probe_conv_kernels.py``, docs/performance.md).  On AVX-512 with 512-bit
    vectors every width the kernels want fits, and is kept."""
    registers, lanes = vector_registers()
    return min(wanted, lanes * (registers // 16))


def register_tile(columns: int) -> tuple[int, int]:
    """(rows, columns) of a float32 register tile whose rows take one broadcast value each
    and whose columns are vectors: 8 x ``columns`` (:func:`tile_columns`) where there are 32
    vector registers; 4 x two vectors where there are 16.

    Why: with AVX2's 16 registers an 8-row tile is one vector wide, so each step of the sum
    costs one load and eight broadcasts for eight multiply-adds; four rows of two vectors
    take two loads and four broadcasts for the same eight.  ``tiled_1x1``'s tile ran at
    0.67-0.87 of the 8-row one's time on ShuffleNet's and MobileNet's 1x1 layers on the 2-core
    AVX2 VM, and ``implicit_gemm``'s on the 3-channel first layers of MobileNetV3, ShuffleNet
    and EfficientNet (``benchmarks/probe_conv_kernels.py``, ``docs/conv.md``)."""
    registers, lanes = vector_registers()
    if registers >= 32:
        return 8, tile_columns(columns)
    return 4, 2 * lanes


def three_row_tile() -> tuple[int, int]:
    """(3, four vectors): the register tile of the 1x1 and implicit-GEMM conv kernels where
    there are 16 vector registers (AVX2).  Twelve accumulators, three broadcast weights and one
    input vector fill the 16 registers, for four loads and three broadcasts per twelve
    multiply-adds, where :func:`register_tile`'s 4 x two vectors takes two loads and four
    broadcasts per eight.  On the 2-core AVX2 VM it took 0.80 of the 4 x 16 tile's time summed
    over 14 MobileNet and ShuffleNet 1x1 layers (``tiled_1x1``) and 0.85-0.95 on 3x3 layers
    whose output rows are 27 or more wide (``implicit_gemm``)."""
    return 3, 4 * vector_registers()[1]


@numba.njit(inline="always")
def tile_rows8(i0, last):
    """The eight row indices of the tile starting at ``i0``, clamped to ``last``."""
    return (i0, min(i0 + 1, last), min(i0 + 2, last), min(i0 + 3, last), min(i0 + 4, last),
            min(i0 + 5, last), min(i0 + 6, last), min(i0 + 7, last))


@numba.njit(inline="always")
def tile_fma3(acc, t, x, w0, w1, w2):
    """Column ``t`` of a 3-row tile: ``acc[i, t] += w_i * x`` (see :func:`tile_fma8`)."""
    acc[0, t] += w0 * x
    acc[1, t] += w1 * x
    acc[2, t] += w2 * x


@numba.njit(inline="always")
def tile_fma4(acc, t, x, w0, w1, w2, w3):
    """Column ``t`` of a 4-row tile: ``acc[i, t] += w_i * x`` (see :func:`tile_fma8`)."""
    acc[0, t] += w0 * x
    acc[1, t] += w1 * x
    acc[2, t] += w2 * x
    acc[3, t] += w3 * x


@numba.njit(inline="always")
def tile_fma8(acc, t, x, w0, w1, w2, w3, w4, w5, w6, w7):
    """Column ``t`` of an 8-row tile: ``acc[i, t] += w_i * x``.  Called in a loop over t, the
    eight lines become eight vector multiply-adds of one broadcast weight each."""
    acc[0, t] += w0 * x
    acc[1, t] += w1 * x
    acc[2, t] += w2 * x
    acc[3, t] += w3 * x
    acc[4, t] += w4 * x
    acc[5, t] += w5 * x
    acc[6, t] += w6 * x
    acc[7, t] += w7 * x


def check_known_params(name: str, params: Mapping[str, Any], known: Sequence[str]) -> None:
    """Refuse a parameter the operator ``name`` does not have, naming the ones it has."""
    unknown = sorted(set(params) - set(known))
    if unknown:
        listed = ", ".join(known) if known else "none"
        raise ValueError(f"{name} has no parameter(s) {', '.join(unknown)}; known: {listed}")


class CanonicalOperator(Operator):
    """An operator whose problems are built with their parameters in one canonical form.

    ONNX lets one computation be spelled many ways (defaults left out, negative axes, sentinel
    values); the cache key must not depend on the spelling, so :meth:`problem` resolves the
    parameters with :meth:`canonical_params` first, and :meth:`validate` rejects a problem that
    was built by hand in another form.
    """

    def canonical_params(self, shapes: Sequence[Shape], dtypes: Sequence[str],
                         params: Mapping[str, Any]) -> dict[str, Any]:
        """Check shapes, dtypes and parameters and return the parameters in canonical form.
        Idempotent, so :meth:`validate` can recognise a canonical problem by building it
        again."""
        raise NotImplementedError

    def problem(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                **params: Any) -> Problem:
        shapes = [tuple(int(d) for d in shape) for shape in shapes]
        dtypes = [np.dtype(d).name for d in dtypes]
        return Problem.create(self.name, shapes, dtypes,
                              self.canonical_params(shapes, dtypes, params))

    def validate(self, problem: Problem) -> None:
        if problem.operator != self.name:
            raise ValueError(f"{self.name} cannot validate a {problem.operator!r} problem")
        canonical = self.problem(problem.shapes, problem.dtypes, **dict(problem.params))
        if canonical.key != problem.key:
            raise ValueError(f"{self.name} problem {problem.key!r} is not in canonical form "
                             f"({canonical.key!r}); build problems with the operator's "
                             "problem()")


def error_with_special_values(problem: Problem, output: Any, reference: np.ndarray,
                              finite_error: Callable[[Problem, Any, np.ndarray], float]) -> float:
    """``finite_error`` over the elements where the reference is finite; a non-finite element
    that does not match (inf vs inf of the same sign, NaN vs NaN), a wrong shape or a wrong
    dtype is an infinite error (a float result where numpy gives int32 would otherwise pass a
    numerical comparison)."""
    output = np.asarray(output)
    if output.shape != reference.shape or output.dtype != reference.dtype:
        return float("inf")
    if reference.dtype.kind == "f":
        finite = np.isfinite(reference)
        same_special = (output == reference) | (np.isnan(output) & np.isnan(reference))
        if not np.all(same_special | finite) or not np.all(np.isfinite(output[finite])):
            return float("inf")
        output, reference = output[finite], reference[finite]
    return finite_error(problem, output, reference)


@numba.njit(cache=CACHE, inline="always")
def floor_div(a, b):
    """``a // b`` for b >= 1: a division takes tens of cycles, and strides 1 and 2 (nearly
    every layer) become nothing or a shift."""
    if b == 1:
        return a
    if b == 2:
        return a >> 1
    return a // b


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up, for b >= 1 (tiles, blocks and work-groups that cover ``a``)."""
    return -(-a // b)


def same_pads(size: int, kernel: int, stride: int, dilation: int,
              upper: bool) -> tuple[int, int]:
    """ONNX's auto_pad SAME_UPPER/SAME_LOWER for one axis (conv and pooling alike):
    ``ceil(size / stride)`` outputs, the total padding that needs split evenly, the odd one at
    the end (UPPER) or the beginning (LOWER)."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + dilation * (kernel - 1) + 1 - size)
    small, large = total // 2, total - total // 2
    return (small, large) if upper else (large, small)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` (>= 1) that is >= ``value``."""
    return ceil_div(value, multiple) * multiple


#: Parallel kernels deal their work in this many parts per thread, to whichever thread is free:
#: enough for a thread that starts late (woken from sleep, or its core taken) to leave its share
#: to the others, few enough that a part's call (its arguments, its buffer views) stays small
#: beside its work.  One call per depthwise plane made MobileNetV2's 7x7 layers 1.6x slower on
#: one thread (960 parts of about 0.1 us each); one part per thread waited for the slowest.
PARTS_PER_THREAD = 8


class ScratchPool:
    """Per-thread buffers a kernel keeps from one call to the next, for a problem it runs again.

    Why: a small layer's call is mostly overhead.  A depthwise layer of MobileNetV2 at 16
    threads computes for about 10 us, and allocating, aligning and zeroing its per-thread
    buffers on every call cost about as much again; staged blocks kept between calls also keep
    their zero padding, which is written once, when the buffers are made.

    Buffers are keyed by what decides their shapes and contents (the problem and the thread
    count).  Two calls at once (two Python threads running one model) each take their own set:
    the second finds the list empty and makes another, and both go back.  At most
    :attr:`limit_bytes` are kept (counting one set per key); past it, buffers are made per call
    as before, so a process that meets thousands of shapes holds no more than that.
    """

    def __init__(self, limit_bytes: int = 64 << 20):
        self.limit_bytes = limit_bytes
        self._free: dict[object, list[tuple[np.ndarray, ...]]] = {}
        self._kept_bytes = 0

    @property
    def kept_bytes(self) -> int:
        """Bytes of the buffer sets kept (one set per key)."""
        return self._kept_bytes

    def clear(self) -> None:
        """Drop every kept buffer (the next call of each problem makes its own again)."""
        self._free.clear()
        self._kept_bytes = 0

    def take(self, key: object, make) -> tuple[np.ndarray, ...]:
        """A set of buffers for ``key``: a kept one, or ``make()``'s."""
        free = self._free.get(key)
        if free:
            try:
                return free.pop()  # atomic: two threads never get the same set
            except IndexError:  # another thread took the last one meanwhile
                pass
        return make()

    def give(self, key: object, buffers: tuple[np.ndarray, ...]) -> None:
        """Return ``buffers`` after the call, to be kept if the limit allows."""
        free = self._free.get(key)
        if free is None:
            size = sum(b.nbytes for b in buffers)
            if self._kept_bytes + size > self.limit_bytes:
                return
            self._kept_bytes += size
            free = self._free.setdefault(key, [])
        if len(free) < 4:  # sets beyond the fourth came from a burst of concurrent calls
            free.append(buffers)
