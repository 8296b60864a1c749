"""OpenCL matmul algorithms: ``cl_naive``, ``cl_tiled``, ``cl_direct`` and ``cl_gemm``.

They run on an OpenCL device (``device_kind = "opencl"``): inputs and output are
``pyopencl.array.Array`` values on ``ctx.device`` (a :class:`fastrun.devices.opencl.OpenCLDevice`).
pyopencl is imported only inside :meth:`run`, so registering them costs nothing on machines
without OpenCL.

Usability has two halves.  ``unusable_reason(problem)`` answers what depends on the problem
alone (batch broadcasting, tiles far larger than the product).  What depends on the device
(float64 support, work-group size, local memory) is answered by
:meth:`OpenCLMatmul.device_unusable_reason` (the :class:`~fastrun.algorithm.Algorithm` hook the
chooser asks before timing), so a configuration the device cannot run is excluded with its
reason and never launched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrun.algorithm import Algorithm, RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms._common import round_up
from fastrun_algorithms.matmul._batch import MatmulLayout, layout_of
from fastrun_algorithms.matmul.opencl import _kernels, heuristic
from fastrun_algorithms.matmul.opencl.space import a_vector_width


def _operand_batch(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-2]) if len(shape) > 2 else 1


def batch_strides(layout: MatmulLayout) -> tuple[int, int] | None:
    """Element strides between the batch entries of A and B in the (batch, M, K) x
    (batch, K, N) form, or None when an operand is broadcast only partly.

    An operand either has the whole batch (stride M*K or K*N) or none of it (stride 0, read
    by every entry); ``A (2, 1, M, K) @ B (1, 3, K, N)`` would need a per-dimension stride
    and is left to the CPU algorithms.
    """
    strides = []
    for shape, size in ((layout.a_shape, layout.m * layout.k),
                        (layout.b_shape, layout.k * layout.n)):
        count = _operand_batch(shape)
        if count == layout.batch:
            strides.append(size if layout.batch > 1 else 0)
        elif count == 1:
            strides.append(0)
        else:
            return None
    return strides[0], strides[1]


def _buffer(x: Any, which: str) -> tuple[Any, int]:
    """(buffer, element offset) of a contiguous device array."""
    if not x.flags.c_contiguous:
        raise ValueError(f"OpenCL matmul needs a contiguous {which}; got strides {x.strides}")
    return x.base_data, x.offset // x.dtype.itemsize


class OpenCLMatmul(Algorithm):
    """What every OpenCL matmul algorithm shares: device checks, operand plumbing, the
    kernel cache, and the empty-product cases (no kernel can be launched on a 0-sized
    NDRange, so those are answered directly)."""

    operator = "matmul"
    device_kind = "opencl"
    # One work-item sums each output in a fixed k order, no atomics: bit-identical run to run
    # for one device, driver and configuration.
    attributes = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE
    #: kernel source and entry point, set by subclasses
    source: str = ""
    kernel_name: str = ""

    def heuristic_rank(self, problem: Problem) -> tuple[float, ...]:
        """The OpenCL families' order (:mod:`.heuristic`), each class ranking itself
        (:meth:`family_rank`); only ever candidates on an OpenCL device, where they are all
        the candidates there are."""
        return (6, *self.family_rank(layout_of(problem)))

    def family_rank(self, layout: MatmulLayout) -> tuple[float, ...]:
        """This configuration's sort key among the OpenCL matmul algorithms."""
        return heuristic.OTHER_RANK

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        #: (device, dtype, kernel name, shape defines) -> (program, kernel): a program is
        #: built (or looked up) once and its kernel object reused, since creating a kernel
        #: costs more than launching it.
        self._kernels: dict[tuple, tuple[Any, Any]] = {}

    # -- usability -----------------------------------------------------------------------------
    def unusable_reason(self, problem: Problem) -> str | None:
        if batch_strides(layout_of(problem)) is None:
            return ("batch dimensions broadcast partly within an operand (OpenCL kernels take "
                    "an operand with the whole batch or with none)")
        return None

    def work_group_size(self) -> int:
        """Work-items per work-group this configuration requires (0: driver's choice)."""
        return 0

    def local_bytes(self, itemsize: int) -> int:
        """Local memory one work-group of this configuration allocates."""
        return 0

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        """Why this configuration cannot run ``problem`` on ``device`` (an OpenCLDevice), or
        None.  Checks float64 support, the work-group size and the local memory."""
        reason = (common.fp64_reason(device, problem.dtypes)
                  or common.work_group_reason(device, self.work_group_size()))
        if reason is not None:
            return reason
        itemsize = np.dtype(problem.dtypes[0]).itemsize
        local = self.local_bytes(itemsize)
        if local > device.local_mem_size:
            return (f"needs {local} B of local memory, over the device's "
                    f"{device.local_mem_size} B")
        return None

    # -- running -------------------------------------------------------------------------------
    def options(self, dtype: np.dtype, shape_defines: dict[str, int] | None = None) -> list[str]:
        """Build options: the dtype, this configuration's -D values and the problem's
        (:meth:`shape_defines`)."""
        defines = {"REAL_DOUBLE": int(dtype == np.float64), **self.defines(),
                   **(shape_defines or {})}
        return [f"-D{key}={value}" for key, value in sorted(defines.items())]

    def defines(self) -> dict[str, int]:
        return {}

    def shape_defines(self, layout: MatmulLayout) -> dict[str, int]:
        """-D values that depend on the product's shape (none unless a kernel has some)."""
        return {}

    def build(self, problem: Problem, device: Any) -> None:
        """Compile this configuration's program for ``problem`` (every kernel it launches is
        in it); the search calls this for many configurations at once."""
        device.build(self.source, self.options(np.dtype(problem.dtypes[0]),
                                               self.shape_defines(layout_of(problem))))

    def kernel(self, device: Any, dtype: np.dtype, name: str | None = None,
               shape_defines: dict[str, int] | None = None) -> Any:
        name = name or self.kernel_name
        key = (id(device), dtype.str, name, tuple(sorted((shape_defines or {}).items())))
        program = device.build(self.source, self.options(dtype, shape_defines))
        cached = self._kernels.get(key)
        if cached is not None and cached[0] is program:
            return cached[1]
        import pyopencl as cl

        kernel = cl.Kernel(program, name)
        self._kernels[key] = (program, kernel)
        return kernel

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        layout = layout_of(problem)
        dtype = np.dtype(problem.dtypes[0])
        out = device.empty(layout.out_shape, dtype)
        if layout.batch * layout.m * layout.n == 0:
            return out
        if layout.k == 0:
            out.fill(0)
            return out
        a_stride, b_stride = batch_strides(layout)
        a_buf, a_off = _buffer(inputs[0], "A")
        b_buf, b_off = _buffer(inputs[1], "B")
        c_buf, c_off = _buffer(out, "output")
        self.launch(device, dtype, layout, (a_buf, a_off, a_stride), (b_buf, b_off, b_stride),
                    (c_buf, c_off))
        return out

    def launch(self, device: Any, dtype: np.dtype, layout: MatmulLayout,
               a: tuple[Any, int, int], b: tuple[Any, int, int], c: tuple[Any, int]) -> None:
        """Enqueue the kernel(s) computing ``c = a @ b`` (buffer, offset[, batch stride])."""
        raise NotImplementedError


def _simple_args(layout: MatmulLayout, a: tuple, b: tuple, c: tuple) -> tuple:
    """Arguments of the naive, tiled and direct kernels: M, N, K, A, a_off, a_bs, B, b_off,
    b_bs, C, c_off."""
    return (np.int32(layout.m), np.int32(layout.n), np.int32(layout.k),
            a[0], np.int64(a[1]), np.int64(a[2]), b[0], np.int64(b[1]), np.int64(b[2]),
            c[0], np.int64(c[1]))


class NaiveCLMatmul(OpenCLMatmul):
    """One work-item per output element, the driver picks the local size: the baseline.

    NAIVE, so fast-run leaves it out; full-run still times it.
    """

    name = "cl_naive"
    attributes = OpenCLMatmul.attributes | AlgoAttribute.NAIVE
    source = _kernels.NAIVE
    kernel_name = "mm_naive"

    def family_rank(self, layout: MatmulLayout) -> tuple[float, ...]:
        return heuristic.NAIVE_RANK

    def launch(self, device, dtype, layout, a, b, c):
        device.launch(self.kernel(device, dtype), _simple_args(layout, a, b, c),
                      (layout.n, layout.m, layout.batch), None)


class TiledCLMatmul(OpenCLMatmul):
    """TS x TS tiles of A and B in local memory, one output per work-item (``param``:
    ``{"ts": tile side}``).  Edges load zeros, so any shape runs without padded copies."""

    name = "cl_tiled"
    source = _kernels.TILED
    kernel_name = "mm_tiled"

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.ts = int(self.param["ts"])

    def family_rank(self, layout: MatmulLayout) -> tuple[float, ...]:
        return heuristic.tiled_rank(self.param)

    def defines(self) -> dict[str, int]:
        return {"TS": self.ts}

    def work_group_size(self) -> int:
        return self.ts * self.ts

    def local_bytes(self, itemsize: int) -> int:
        return 2 * self.ts * (self.ts + 1) * itemsize

    def launch(self, device, dtype, layout, a, b, c):
        ts = self.ts
        device.launch(self.kernel(device, dtype), _simple_args(layout, a, b, c),
                      (round_up(layout.n, ts), round_up(layout.m, ts), layout.batch), (ts, ts, 1))


class DirectCLMatmul(OpenCLMatmul):
    """WM x WN outputs per work-item read straight from global memory, no padding, with an
    explicit LX x LY local size (``param``: wm, wn, lx, ly).

    The local sizes are registered as a fixed grid of powers of two; for a given problem only
    those that fit its global size are usable (as mobile tuners generate local-size
    candidates from the global size), so a 3 x 5 product is not timed with 256-wide groups
    that would be almost entirely idle.
    """

    name = "cl_direct"
    source = _kernels.DIRECT
    kernel_name = "mm_direct"

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.wm, self.wn = int(self.param["wm"]), int(self.param["wn"])
        self.lx, self.ly = int(self.param["lx"]), int(self.param["ly"])

    def global_extent(self, layout: MatmulLayout) -> tuple[int, int]:
        """Work-items needed along N and M (before rounding up to the local size)."""
        return -(-layout.n // self.wn), -(-layout.m // self.wm)

    def unusable_reason(self, problem: Problem) -> str | None:
        reason = super().unusable_reason(problem)
        if reason is not None:
            return reason
        gx, gy = self.global_extent(layout_of(problem))
        # The smallest candidate in each direction (LX 8, LY 1) is always allowed, so every
        # problem keeps at least one local size.
        return (common.group_per_extent_reason(self.lx, gx, "group along N",
                                               "work-items along N", smallest=8)
                or common.group_per_extent_reason(self.ly, gy, "group along M",
                                                  "work-items along M", smallest=1))

    def family_rank(self, layout: MatmulLayout) -> tuple[float, ...]:
        return heuristic.direct_rank(layout, self.param)

    def defines(self) -> dict[str, int]:
        return {"WM": self.wm, "WN": self.wn}

    def work_group_size(self) -> int:
        return self.lx * self.ly

    def launch(self, device, dtype, layout, a, b, c):
        gx, gy = self.global_extent(layout)
        device.launch(self.kernel(device, dtype), _simple_args(layout, a, b, c),
                      (round_up(gx, self.lx), round_up(gy, self.ly), layout.batch),
                      (self.lx, self.ly, 1))


class GemmCLMatmul(OpenCLMatmul):
    """The register-tiled kernel (see ``_kernels.GEMM``), one algorithm per configuration.

    ``param``: mwg, nwg, kwg (work-group tile in M, N, K), mdimc, ndimc (local size along M
    and N; each work-item computes mwg/mdimc x nwg/ndimc outputs), vw (vector width of loads
    and stores along N and K, and of local reads of A along M where the rows split that way),
    sa, sb (stage the A / B tile in local memory), db (double-buffer both staged tiles, with
    the next tile prefetched into registers).

    The kernel handles the edges of a product that is no tile multiple itself (clamped loads,
    zeros past K, guarded stores; see ``_kernels.GEMM``), so the common unaligned product (a
    token or pixel count) is one launch with no copies.  Only a K or N that is no multiple of
    VW is copied into a zero-padded buffer (and the result out of a padded one); those copies
    and split-K's slices are this algorithm's workspace.

    ``split`` (optional, default 1): split-K, for products whose output tiles alone leave
    most of the device idle (M- or N-skinny with a deep K).  Work-groups sum slices of the
    reduction into a workspace, and the last of each tile's slices to finish adds them in
    order into C (one launch, the same bits every run; see ``conv_igemm``).  Registered for
    the double-buffered configurations only, and usable only where the tiles alone would
    not fill the device twice over.
    """

    name = "cl_gemm"
    #: 2: the edges handled in the kernel (no padded copies for them), so unaligned products
    #: time differently
    version = 2
    source = _kernels.GEMM_PROGRAM
    kernel_name = "mm_gemm"
    KEYS = ("mwg", "nwg", "kwg", "mdimc", "ndimc", "vw", "sa", "sb", "db")

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        missing = [key for key in self.KEYS if key not in self.param]
        if missing:
            raise ValueError(f"cl_gemm needs parameters {', '.join(self.KEYS)}; missing "
                             f"{', '.join(missing)} in {self.param!r}")
        (self.mwg, self.nwg, self.kwg, self.mdimc, self.ndimc, self.vw, self.sa,
         self.sb, self.db) = (int(self.param[key]) for key in self.KEYS)
        if self.db and not (self.sa and self.sb):
            raise ValueError(f"cl_gemm: db=1 needs both tiles staged (sa=sb=1); got {param!r}")
        self.split = int(self.param.get("split", 1))
        #: (id(device), padded M, N, batch) -> split-K's counters per tile, kept zeroed
        self._counters: dict[tuple[int, int, int, int], Any] = {}

    def family_rank(self, layout: MatmulLayout) -> tuple[float, ...]:
        return heuristic.gemm_rank(layout, self.param)

    def unusable_reason(self, problem: Problem) -> str | None:
        reason = super().unusable_reason(problem)
        if reason is not None:
            return reason
        layout = layout_of(problem)
        # A tile bigger than the next power of two of the product (beyond the smallest tile)
        # only multiplies padding: a smaller registered tile covers the same work.
        for label, tile, size, smallest in (("MWG", self.mwg, layout.m, 32),
                                            ("NWG", self.nwg, layout.n, 32),
                                            ("KWG", self.kwg, layout.k, 16)):
            if tile > max(smallest, common.next_pow2(size)):
                return f"{label}={tile} is larger than the product needs ({size})"
        if self.split > 1 and self.padded(layout)[2] // self.kwg < 2 * self.split:
            return (f"{self.split} reduction slices need {2 * self.split} steps of "
                    f"{self.kwg}; K is {layout.k}")
        return None

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        """Split-K only where the output tiles alone would not fill the device twice over
        (two work-groups per compute unit): elsewhere it only adds the slices' traffic."""
        reason = super().device_unusable_reason(device, problem)
        if reason is not None or self.split == 1:
            return reason
        layout = layout_of(problem)
        mp, np_, _ = self.padded(layout)
        tiles = (mp // self.mwg) * (np_ // self.nwg) * layout.batch
        if tiles >= 2 * device.max_compute_units:
            return (f"{tiles} output tiles already fill the device's "
                    f"{device.max_compute_units} compute units twice over")
        return None

    def defines(self) -> dict[str, int]:
        values = {key.upper(): value for key, value in zip(
            self.KEYS, (self.mwg, self.nwg, self.kwg, self.mdimc, self.ndimc, self.vw,
                        self.sa, self.sb, self.db), strict=True)}
        return {**values, "SPLIT_K": int(self.split > 1)}

    def slices(self, kp: int) -> tuple[int, int]:
        """(reduction elements per slice, slices that get any) for a padded depth ``kp``: a
        whole number of KWG steps each."""
        steps = kp // self.kwg
        per = -(-steps // self.split)
        return per * self.kwg, -(-steps // per)

    def work_group_size(self) -> int:
        return self.mdimc * self.ndimc

    def local_bytes(self, itemsize: int) -> int:
        # A's rows carry one vector of VWM words of padding, and double buffering doubles
        # both tiles (see _kernels.GEMM)
        return ((1 + self.db) * (self.sa * (self.mwg + a_vector_width(self.mwg, self.mdimc,
                                                                       self.vw, self.sa))
                                 * self.kwg + self.sb * self.kwg * self.nwg) * itemsize)

    def padded(self, layout: MatmulLayout) -> tuple[int, int, int]:
        """(M, N, K) rounded up to the tile."""
        return (round_up(layout.m, self.mwg), round_up(layout.n, self.nwg),
                round_up(layout.k, self.kwg))

    def shape_defines(self, layout: MatmulLayout) -> dict[str, int]:
        """The kernel's edge switches: only the dimensions that are no tile multiple pay for
        a clamp or a select (see ``_kernels.GEMM``)."""
        kr, nr = self.extents(layout)
        return {"EDGE_M": int(layout.m % self.mwg != 0), "EDGE_N": int(nr % self.nwg != 0),
                "EDGE_K": int(kr % self.kwg != 0)}

    def extents(self, layout: MatmulLayout) -> tuple[int, int]:
        """(K, N) as the kernel sees them: rounded up to a multiple of VW, the width of its
        loads along both (a vector must not straddle the edge); M needs no rounding."""
        return round_up(layout.k, self.vw), round_up(layout.n, self.vw)

    def _copies(self, layout: MatmulLayout) -> tuple[bool, bool, bool]:
        """Which of A, B and C go through a padded copy: only where K or N is no multiple of
        VW (the kernel handles every other edge)."""
        kr, nr = self.extents(layout)
        pad_k, pad_n = kr != layout.k, nr != layout.n
        return pad_k, pad_k or pad_n, pad_n

    def workspace_bytes(self, problem: Problem) -> int:
        """Bytes of the padded copies :meth:`run` allocates: A as M x Kr, B as Kr x Nr (once
        per batch entry it has, one for a broadcast operand), C as M x Nr per batch entry
        (Kr, Nr: :meth:`extents`), each only where K or N needs it; and split-K's slices."""
        layout = layout_of(problem)
        itemsize = np.dtype(problem.dtypes[0]).itemsize
        mp, np_, kp = self.padded(layout)
        kr, nr = self.extents(layout)
        pad_a, pad_b, pad_c = self._copies(layout)
        strides = batch_strides(layout) or (1, 1)
        a_batch = layout.batch if strides[0] else 1
        b_batch = layout.batch if strides[1] else 1
        m = layout.m
        total = (pad_a * a_batch * m * kr + pad_b * b_batch * kr * nr
                 + pad_c * layout.batch * m * nr)
        if self.split > 1:
            total += self.slices(kp)[1] * layout.batch * mp * np_
        return total * itemsize

    def launch(self, device, dtype, layout, a, b, c):
        mp, np_, kp = self.padded(layout)
        kr, nr = self.extents(layout)
        m = layout.m
        pad_a, pad_b, pad_c = self._copies(layout)
        batch = layout.batch
        edges = self.shape_defines(layout)
        keep: list[Any] = []  # padded buffers stay referenced until the kernels are enqueued
        if pad_a:
            a = self._pad(device, dtype, a, m, layout.k, m, kr, batch, keep, edges)
        if pad_b:
            b = self._pad(device, dtype, b, layout.k, layout.n, kr, nr, batch, keep, edges)
        target = c
        if pad_c:
            cbuf = device.empty((batch, m, nr), dtype)
            keep.append(cbuf)
            target = (cbuf.base_data, cbuf.offset // dtype.itemsize)
        if self.split > 1:
            chunk, slices = self.slices(kp)
            partial = device.empty((slices * batch, mp, np_), dtype)
            keep.append(partial)
            split = (np.int32(chunk), np.int32(slices), partial.base_data,
                     self._tile_counters(device, mp, np_, batch).base_data)
        else:  # never read: C stands in
            slices = 1
            split = (np.int32(kp), np.int32(1), target[0], target[0])
        global_size = (np_ // self.nwg * self.ndimc, mp // self.mwg * self.mdimc,
                       batch * slices)
        args = (np.int32(mp), np.int32(np_), np.int32(kp),
                np.int32(m), np.int32(nr), np.int32(kr),
                a[0], np.int64(a[1]), np.int64(a[2]),
                b[0], np.int64(b[1]), np.int64(b[2]),
                target[0], np.int64(target[1]), np.int64(m * nr), *split)
        device.launch(self.kernel(device, dtype, None, edges), args, global_size,
                      (self.ndimc, self.mdimc, 1))
        if pad_c:
            args = (np.int32(m), np.int32(layout.n), target[0], np.int32(m),
                    np.int32(nr), c[0], np.int64(c[1]))
            device.launch(self.kernel(device, dtype, "unpad_copy", edges), args,
                          (layout.n, m, batch), None)
        del keep  # pyopencl releases buffers only after the enqueued work is done

    def _tile_counters(self, device: Any, mp: int, np_: int, batch: int) -> Any:
        """Split-K's counter per output tile for this product's shape, made zeroed once."""
        key = (id(device), mp, np_, batch)
        counters = self._counters.get(key)
        if counters is None:
            tiles = (mp // self.mwg) * (np_ // self.nwg) * batch
            counters = self._counters[key] = device.zeros((tiles,), np.int32)
        return counters

    def _pad(self, device, dtype, src, rows, cols, prows, pcols, batch, keep, edges) -> tuple:
        """``src`` (buffer, offset, batch stride; stride 0: broadcast) zero-padded to
        ``prows`` x ``pcols`` in a new buffer kept in ``keep``; returns the padded operand."""
        count = batch if src[2] else 1
        dst = device.empty((count, prows, pcols), dtype)
        keep.append(dst)
        args = (np.int32(rows), np.int32(cols), src[0], np.int64(src[1]), np.int64(src[2]),
                np.int32(prows), np.int32(pcols), dst.base_data)
        device.launch(self.kernel(device, dtype, "pad_copy", edges), args, (pcols, prows, count),
                      None)
        return dst.base_data, dst.offset // dtype.itemsize, src[2] and prows * pcols
