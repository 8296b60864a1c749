"""OpenCL conv algorithms: ``cl_direct``, ``cl_depthwise``, ``cl_im2col``, ``cl_conv1x1``
and ``cl_igemm``.

They run on an OpenCL device (``device_kind = "opencl"``): X, W and the optional bias are
``pyopencl.array.Array`` values on ``ctx.device`` and the output is one too.  pyopencl is
imported only inside :meth:`run`, so registering them costs nothing on machines without
OpenCL.  Every algorithm applies the fused epilogue (bias, relu / clip) where it writes the
output: the direct kernels in their store, the GEMM-based ones in one small kernel over the
product (in place when the product is the output).

``cl_im2col`` and ``cl_conv1x1`` hand their products to matmul sub-problems through
``ctx.call``, so on an OpenCL session the OpenCL matmul search picks (and caches) the GEMM
configuration for each product shape, and the execution policy shows it as a child.

None of them preprocesses weights (no ``preprocess``): with weight preprocessing on, the
framework hands them ``prepared=None`` and they read W as it is, which is all they need.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastrun.algorithm import RunContext
from fastrun.attribute import AlgoAttribute
from fastrun.operator import Problem
from fastrun_algorithms import _opencl_common as common
from fastrun_algorithms._common import ceil_div, round_up
from fastrun_algorithms.conv._gemm_common import matmul_problem
from fastrun_algorithms.conv.base import ConvAlgorithm
from fastrun_algorithms.conv.epilogue import epilogue_args
from fastrun_algorithms.conv.geometry import ConvGeometry, geometry
from fastrun_algorithms.conv.opencl import _kernels, heuristic, space

#: Taps (R x S) up to which ``cl_depthwise`` unrolls its kernel window with the weights in
#: registers; larger windows (rare in depthwise layers) are left to ``cl_direct``.
DEPTHWISE_MAX_TAPS = 64



def _epilogue_args(geo: ConvGeometry, dtype: np.dtype, inputs: Sequence[Any],
                   dummy: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """((bias buffer, offset, has_bias), (act, lo, hi)) kernel arguments.

    Without a bias the kernels never read the bias argument, but OpenCL needs a buffer there:
    ``dummy`` (the output's buffer) stands in, so no call allocates a placeholder.
    """
    if geo.has_bias:
        buf, off = common.buffer(inputs[2], "bias")
        bias = (buf, off, np.int32(1))
    else:
        bias = (dummy, np.int64(0), np.int32(0))
    code, low, high = epilogue_args(geo)
    act = (np.int32(code), dtype.type(low), dtype.type(high))
    return bias, act


def _residual_args(geo: ConvGeometry, inputs: Sequence[Any], dummy: Any) -> tuple[Any, ...]:
    """(residual buffer, offset, has_residual) kernel arguments: the last input, of the
    output's shape, added before the activation (a ResNet block's shortcut, fused by the
    runtime); without one, ``dummy`` stands in and is never read."""
    if geo.has_residual:
        buf, off = common.buffer(inputs[-1], "residual")
        return buf, off, np.int32(1)
    return dummy, np.int64(0), np.int32(0)


def _in_output_shape(out: Any, geo: ConvGeometry) -> Any:
    """``out`` with the problem's output shape; reshaped only when it differs (a 1-D conv, a
    flat product), because a device array's reshape costs as much host time as a launch."""
    return out if out.shape == geo.out_shape else out.reshape(geo.out_shape)


def _has_epilogue(geo: ConvGeometry) -> bool:
    return geo.has_bias or geo.activation != "none"


class OpenCLConv(ConvAlgorithm):
    """What every OpenCL conv algorithm shares: device checks, build options and kernels.

    REPRODUCIBLE: every kernel sums in a fixed order without atomics; the GEMM-based ones are
    as reproducible as the OpenCL matmul chosen for their sub-problem (all of which are).
    """

    operator = "conv"
    device_kind = "opencl"
    attributes = AlgoAttribute.REPRODUCIBLE
    source: str = ""
    #: whether the kernels add a residual input before the activation (a ResNet block's
    #: shortcut Add, which the runtime then fuses into the conv instead of a step of its own)
    takes_residual = False

    def work_group_size(self) -> int:
        """Work-items per work-group this configuration launches (0: driver's choice)."""
        return 0

    def conv_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        """The OpenCL families' order (:mod:`.heuristic`), each class ranking itself
        (:meth:`family_rank`); only ever candidates on an OpenCL device, where they are all
        the candidates there are."""
        return (7, *self.family_rank(geo))

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        """This configuration's sort key among the OpenCL conv algorithms."""
        return heuristic.OTHER_RANK

    def conv_unusable_reason(self, problem: Problem) -> str | None:
        if geometry(problem).has_residual and not self.takes_residual:
            return f"{self.name} does not add a residual input (cl_igemm and cl_winograd do)"
        return self.config_unusable_reason(problem)

    def config_unusable_reason(self, problem: Problem) -> str | None:
        """Why this configuration cannot compute ``problem`` (shapes, parameters), or None."""
        return None

    def device_unusable_reason(self, device: Any, problem: Problem) -> str | None:
        """float64 needs ``cl_khr_fp64``; the local size must fit the device."""
        return (common.fp64_reason(device, problem.dtypes)
                or common.work_group_reason(device, self.work_group_size()))

    def defines(self, geo: ConvGeometry) -> dict[str, int]:
        """This configuration's compile-time constants (``-D`` options) for ``geo``."""
        return {}

    def kernel(self, device: Any, geo: ConvGeometry, name: str) -> Any:
        """The kernel ``name`` built for ``geo``'s dtype and this configuration (built and
        created once per process by the device)."""
        return device.kernel(self.source, name, self._options(geo))

    def build(self, problem: Problem, device: Any) -> None:
        """Compile this configuration's program for ``problem`` (every kernel it launches is
        in it); the search calls this for many configurations at once."""
        device.build(self.source, self._options(geometry(problem)))

    def _options(self, geo: ConvGeometry) -> list[str]:
        defines = {"REAL_DOUBLE": int(geo.itemsize == 8), **self.defines(geo)}
        return [f"-D{key}={value}" for key, value in sorted(defines.items())]


class _LocalSized(OpenCLConv):
    """A direct kernel with an explicit 1-D local size ``l`` along the output pixels.

    Only local sizes that fit the problem's work along that dimension are usable (as the
    OpenCL matmul's ``cl_direct`` does), so a 7x7 output is not timed with 128-wide groups
    that would idle most of their work-items; the smallest one is always usable.
    """

    attributes = OpenCLConv.attributes | AlgoAttribute.USABLE_DEPEND_ON_SHAPE

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.local = int(self.param["l"])

    def work_group_size(self) -> int:
        return self.local

    def pixel_work(self, geo: ConvGeometry) -> int:
        """Work-items per (image, channel block) along dimension 0."""
        raise NotImplementedError

    def config_unusable_reason(self, problem: Problem) -> str | None:
        return common.group_per_extent_reason(self.local, self.pixel_work(geometry(problem)),
                                              "group", "work-items of an output plane")


class DirectCLConv(_LocalSized):
    """Direct convolution for every parameter set: ``ko`` output channels of one group per
    work-item at one output pixel, ``l`` work-items per group along the pixels.

    No workspace, no sub-problem.  Each input value a work-item loads serves its ``ko``
    channels; more channels per work-item mean fewer input reads but fewer work-items (and
    idle accumulators when ``ko`` does not divide the group's channels).
    """

    name = "cl_direct"
    source = _kernels.DIRECT

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return heuristic.direct_rank(geo, self.param)

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.ko = int(self.param["ko"])

    def pixel_work(self, geo: ConvGeometry) -> int:
        return geo.oh * geo.ow

    def config_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if self.ko > 1 and self.ko > common.next_pow2(geo.kg):
            return (f"{self.ko} output channels per work-item, but a group has only {geo.kg} "
                    f"(a smaller ko does the same work with fewer idle accumulators)")
        return super().config_unusable_reason(problem)

    def defines(self, geo: ConvGeometry) -> dict[str, int]:
        return {"KO": self.ko}

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        geo = geometry(problem)
        device, dtype = ctx.device, np.dtype(geo.dtype)
        out = device.empty((geo.n, geo.k, geo.oh, geo.ow), dtype)
        x_buf, x_off = common.buffer(inputs[0], "X")
        w_buf, w_off = common.buffer(inputs[1], "W")
        bias, act = _epilogue_args(geo, dtype, inputs, out.base_data)
        kblocks = ceil_div(geo.kg, self.ko)
        ints = [geo.c, geo.h, geo.w, geo.k, geo.r, geo.s, geo.oh, geo.ow, geo.stride_h,
                geo.stride_w, geo.dil_h, geo.dil_w, geo.pad_top, geo.pad_left, geo.cg, geo.kg,
                kblocks]
        args = [*map(np.int32, ints), x_buf, x_off, w_buf, w_off, *bias, out.base_data,
                np.int64(0), *act]
        device.launch(self.kernel(device, geo, "conv_direct"), args,
                      (round_up(geo.oh * geo.ow, self.local), geo.group * kblocks, geo.n),
                      (self.local, 1, 1))
        return _in_output_shape(out, geo)


class DepthwiseCLConv(_LocalSized):
    """Depthwise convolution (group == C; a channel multiplier K/C > 1 is allowed): ``px``
    neighbouring outputs of one row per work-item, the kernel window unrolled at compile time
    (one program per window size) with its weights in registers.

    Depthwise layers do few multiply-adds per value moved, so the win over ``cl_direct`` is in
    the unrolled taps and in reusing each loaded row segment for ``px`` outputs.
    """

    name = "cl_depthwise"
    source = _kernels.DEPTHWISE

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return heuristic.depthwise_rank(geo, self.param)

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        self.px = int(self.param["px"])

    def pixel_work(self, geo: ConvGeometry) -> int:
        return geo.oh * ceil_div(geo.ow, self.px)

    def config_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if not geo.is_depthwise:
            return (f"cl_depthwise needs group == C with one input channel per group; got "
                    f"group={geo.group}, C={geo.c}")
        if geo.r * geo.s > DEPTHWISE_MAX_TAPS:
            return (f"a {geo.r}x{geo.s} window is over the {DEPTHWISE_MAX_TAPS} taps "
                    f"cl_depthwise unrolls")
        if self.px > 1 and self.px > common.next_pow2(geo.ow):
            return f"{self.px} outputs per work-item along a row of {geo.ow}"
        return super().config_unusable_reason(problem)

    def defines(self, geo: ConvGeometry) -> dict[str, int]:
        return {"PX": self.px, "KR": geo.r, "KS": geo.s}

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        geo = geometry(problem)
        device, dtype = ctx.device, np.dtype(geo.dtype)
        out = device.empty((geo.n, geo.k, geo.oh, geo.ow), dtype)
        x_buf, x_off = common.buffer(inputs[0], "X")
        w_buf, w_off = common.buffer(inputs[1], "W")
        bias, act = _epilogue_args(geo, dtype, inputs, out.base_data)
        ints = [geo.c, geo.h, geo.w, geo.k, geo.oh, geo.ow, geo.stride_h, geo.stride_w,
                geo.dil_h, geo.dil_w, geo.pad_top, geo.pad_left, geo.kg]
        args = [*map(np.int32, ints), x_buf, x_off, w_buf, w_off, *bias, out.base_data,
                np.int64(0), *act]
        device.launch(self.kernel(device, geo, "conv_depthwise"), args,
                      (round_up(self.pixel_work(geo), self.local), geo.n * geo.k), (self.local, 1))
        return _in_output_shape(out, geo)


class _GemmCLConv(OpenCLConv):
    """A conv computed by OpenCL matmul sub-problems plus the epilogue kernel.

    One product covers every image when the OpenCL matmul can batch it: with one group the
    weights (K, rows) are broadcast over the images' (N, rows, pixels) operand, and the
    (N, K, pixels) product *is* the NCHW output, finished by the epilogue in place.  With
    groups the weights are (G, K/G, rows) and the images' operand would be (N, G, rows,
    pixels): a partial broadcast the OpenCL matmul refuses, so then each image gets its own
    product, which the epilogue kernel writes into the image's slot of the output.
    """

    source = _kernels.GEMM_HELPERS
    sub_operators = ("matmul",)

    @staticmethod
    def batched(geo: ConvGeometry) -> bool:
        """Whether one product covers all images."""
        return geo.group == 1 or geo.n == 1

    def sub_problems(self, problem: Problem) -> Sequence[Problem]:
        geo = geometry(problem)
        return [_product(problem)] * (1 if self.batched(geo) else geo.n)

    def product_bytes(self, geo: ConvGeometry) -> int:
        """The per-image product held until the epilogue has copied it into the output (none
        when the product is the output)."""
        return 0 if self.batched(geo) else geo.k * geo.oh * geo.ow * geo.itemsize

    def epilogue(self, device: Any, geo: ConvGeometry, inputs: Sequence[Any], product: Any,
                 out: Any, out_offset: int, images: int) -> None:
        """Enqueue ``out = act(product + bias)`` for ``images`` images starting at element
        ``out_offset`` of ``out`` (in place when ``product`` is ``out``)."""
        dtype = np.dtype(geo.dtype)
        p_buf, p_off = common.buffer(product, "product")
        o_buf, o_off = common.buffer(out, "output")
        bias, act = _epilogue_args(geo, dtype, inputs, o_buf)
        pixels = geo.oh * geo.ow
        args = [np.int32(geo.k), np.int32(pixels), p_buf, p_off, *bias, o_buf,
                np.int64(o_off + out_offset), *act]
        device.launch(self.kernel(device, geo, "epilogue"), args, (pixels, geo.k, images), None)

    def multiply(self, device: Any, geo: ConvGeometry, problem: Problem, ctx: RunContext,
                 inputs: Sequence[Any], right: Any, image: int | None, out: Any) -> Any:
        """The product of the weights and ``right`` through the sub-problem; with ``image``
        (per-image mode) written through the epilogue into that image's slot of ``out``,
        else returned as the output with the epilogue applied in place."""
        a_shape, b_shape = _shapes(geo)
        result = ctx.call(_product(problem), inputs[1].reshape(a_shape),
                          right.reshape(b_shape))
        if image is None:
            if _has_epilogue(geo):
                self.epilogue(device, geo, inputs, result, result, 0, geo.n)
            return result
        self.epilogue(device, geo, inputs, result, out, image * geo.k * geo.oh * geo.ow, 1)
        return out


def _shapes(geo: ConvGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Operand shapes of a product: the weights, and one image's (or all images') right
    operand, dimensions of size one left out (a plain 2-D or a broadcast batched product in
    the common cases).  The depth is C/group*R*S for both algorithms: the unfolded rows for
    im2col, the input channels for a 1x1 kernel."""
    rows, pixels = geo.cg * geo.r * geo.s, geo.oh * geo.ow
    if geo.group > 1:
        return (geo.group, geo.kg, rows), (geo.group, rows, pixels)
    if geo.n > 1:
        return (geo.k, rows), (geo.n, rows, pixels)
    return (geo.k, rows), (rows, pixels)


@functools.lru_cache(maxsize=1024)
def _product(problem: Problem) -> Problem:
    geo = geometry(problem)
    a_shape, b_shape = _shapes(geo)
    return matmul_problem(a_shape, b_shape, geo.dtype)


class Im2colCLConv(_GemmCLConv):
    """Unfold kernel + matmul sub-problem + epilogue kernel; usable for every parameter set.

    The unfold writes ``cols`` as (C*R*S, OH*OW) per image (rows = channel and tap, columns
    = output pixels), so ``W (K, C*R*S) @ cols`` is the image's NCHW output with no
    transpose.  One group: every image is unfolded by one launch and multiplied by one
    broadcast batched product.  Groups with several images: one image at a time, reusing one
    ``cols`` buffer (the in-order queue orders the reuse).
    """

    name = "cl_im2col"

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return heuristic.im2col_rank(geo)

    def workspace_bytes(self, problem: Problem) -> int:
        """``cols`` (for all images when batched, one image otherwise) plus, per image, the
        product held until the epilogue copies it into the output."""
        geo = geometry(problem)
        images = geo.n if self.batched(geo) else 1
        cols = images * geo.c * geo.r * geo.s * geo.oh * geo.ow * geo.itemsize
        return cols + self.product_bytes(geo)

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        geo = geometry(problem)
        device, dtype = ctx.device, np.dtype(geo.dtype)
        batched = self.batched(geo)
        images = geo.n if batched else 1
        pixels, rows = geo.oh * geo.ow, geo.c * geo.r * geo.s
        cols = device.empty((images, rows, pixels), dtype)
        x_buf, x_off = common.buffer(inputs[0], "X")
        c_buf, c_off = common.buffer(cols, "cols")
        unfold = self.kernel(device, geo, "unfold")
        ints = [geo.c, geo.h, geo.w, geo.r, geo.s, geo.oh, geo.ow, geo.stride_h, geo.stride_w,
                geo.dil_h, geo.dil_w, geo.pad_top, geo.pad_left]
        image_elements = geo.c * geo.h * geo.w

        def unfold_images(first: int) -> None:
            args = [*map(np.int32, ints), x_buf, np.int64(x_off + first * image_elements), c_buf,
                    c_off]
            device.launch(unfold, args, (pixels, rows, images), None)

        if batched:
            unfold_images(0)
            out = self.multiply(device, geo, problem, ctx, inputs, cols, None, None)
        else:
            out = device.empty((geo.n, geo.k, geo.oh, geo.ow), dtype)
            for n in range(geo.n):
                unfold_images(n)
                self.multiply(device, geo, problem, ctx, inputs, cols, n, out)
        return _in_output_shape(out, geo)


class Conv1x1CLConv(_GemmCLConv):
    """1x1 stride-1 unpadded convs as matmul sub-problems with no unfold: image ``n`` viewed
    as (C, H*W) is the right operand where it lies, ``W (K, C) @ X`` its NCHW output.

    One group: all images in one broadcast batched product, which is the output (no
    workspace).  Groups with several images: one product per image, held until the epilogue
    copies it into the output.  Strided or padded 1x1 convs need a gather first: they are
    ``cl_im2col``'s (whose unfold of a 1x1 kernel is exactly that gather).
    """

    name = "cl_conv1x1"

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return heuristic.CONV1X1_RANK

    def config_unusable_reason(self, problem: Problem) -> str | None:
        geo = geometry(problem)
        if geo.r != 1 or geo.s != 1:
            return f"cl_conv1x1 needs a 1x1 kernel, got {geo.r}x{geo.s}"
        if (geo.stride_h, geo.stride_w) != (1, 1) or any(
                (geo.pad_top, geo.pad_left, geo.pad_bottom, geo.pad_right)):
            return "cl_conv1x1 needs stride 1 and no padding (cl_im2col gathers the others)"
        return None

    def workspace_bytes(self, problem: Problem) -> int:
        """Nothing when the product is the output; else one image's product."""
        return self.product_bytes(geometry(problem))

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        geo = geometry(problem)
        device = ctx.device
        x = inputs[0]
        if self.batched(geo):
            out = self.multiply(device, geo, problem, ctx, inputs, x, None, None)
        else:
            out = device.empty((geo.n, geo.k, geo.oh, geo.ow), np.dtype(geo.dtype))
            images = x.reshape(geo.n, geo.c * geo.h * geo.w)
            for n in range(geo.n):
                self.multiply(device, geo, problem, ctx, inputs, images[n], n, out)
        return _in_output_shape(out, geo)


class ImplicitGemmCLConv(OpenCLConv):
    """The conv as one register-tiled GEMM whose right operand (im2col's ``cols``) is gathered
    from the input tile by tile inside the kernel: no unfold buffer, no padded copies, the
    epilogue in the store (bias, residual, activation), and one launch, split-K included.
    Every valid tile configuration is its own algorithm (``space.igemm_configurations``);
    usable for every parameter set.

    ``split`` > 1 sums the reduction (C/G*R*S) in that many slices by separate work-groups
    into a workspace; the last work-group of each output tile to finish adds the slices in
    order and applies the epilogue (a counter per tile, kept zeroed between calls): more
    work-groups for small outputs with deep reductions, one launch, still reproducible.
    """

    name = "cl_igemm"
    source = _kernels.IGEMM
    attributes = OpenCLConv.attributes | AlgoAttribute.USABLE_DEPEND_ON_SHAPE
    takes_residual = True

    def family_rank(self, geo: ConvGeometry) -> tuple[float, ...]:
        return heuristic.igemm_rank(geo, self.param)

    def __init__(self, param: dict[str, Any] | None = None):
        super().__init__(param)
        p = self.param
        self.mwg, self.nwg, self.kwg = int(p["mwg"]), int(p["nwg"]), int(p["kwg"])
        self.mdimc, self.ndimc, self.split = int(p["mdimc"]), int(p["ndimc"]), int(p["split"])
        self.vw = int(p["vw"])
        self._launch_cache: dict[tuple[int, Problem], _IgemmLaunches] = {}

    def work_group_size(self) -> int:
        return self.mdimc * self.ndimc

    def config_unusable_reason(self, problem: Problem) -> str | None:
        """Tiles larger than the problem (beyond the smallest registered) only add idle
        work-items, and a split needs at least two reduction steps per slice."""
        geo = geometry(problem)
        pixels = geo.n * geo.oh * geo.ow
        if self.mwg > max(space.IGEMM_MWG[0], common.next_pow2(geo.kg)):
            return f"a {self.mwg}-channel tile for {geo.kg} output channels per group"
        if self.nwg > max(space.IGEMM_NWG[0], common.next_pow2(pixels)):
            return f"a {self.nwg}-pixel tile for {pixels} output pixels"
        depth = geo.cg * geo.r * geo.s
        if self.kwg > max(space.IGEMM_KWG[0], common.next_pow2(depth)):
            return f"a {self.kwg}-deep step for a reduction of {depth}"
        if self.split > 1 and ceil_div(depth, self.kwg) < 2 * self.split:
            return (f"{self.split} reduction slices need {2 * self.split} steps of "
                    f"{self.kwg}; the reduction has {depth}")
        return None

    def slices(self, geo: ConvGeometry) -> tuple[int, int]:
        """(reduction elements per slice, slices that get any): a whole number of steps each."""
        steps = ceil_div(geo.cg * geo.r * geo.s, self.kwg)
        per = ceil_div(steps, self.split)
        return per * self.kwg, ceil_div(steps, per)

    def workspace_bytes(self, problem: Problem) -> int:
        """The partial sums of the slices (split-K only)."""
        geo = geometry(problem)
        if self.split == 1:
            return 0
        return self.slices(geo)[1] * geo.k * geo.n * geo.oh * geo.ow * geo.itemsize

    def defines(self, geo: ConvGeometry) -> dict[str, int]:
        return {"MWG": self.mwg, "NWG": self.nwg, "KWG": self.kwg, "MDIMC": self.mdimc,
                "NDIMC": self.ndimc, "VW": self.vw, "SPLIT_K": int(self.split > 1), "KR": geo.r,
                "KS": geo.s}

    def _launches(self, device: Any, problem: Problem) -> _IgemmLaunches:
        """What every call of ``problem`` on ``device`` launches, worked out on the first
        (the host work of a call is what a batch-1 layer on a large GPU waits for)."""
        key = (id(device), problem)
        launches = self._launch_cache.get(key)
        if launches is None:
            geo = geometry(problem)
            dtype = np.dtype(geo.dtype)
            pixels = geo.n * geo.oh * geo.ow
            chunk, slices = self.slices(geo)
            mtiles = ceil_div(geo.kg, self.mwg)
            ints = [geo.c, geo.h, geo.w, geo.k, geo.oh, geo.ow, geo.stride_h, geo.stride_w,
                    geo.dil_h, geo.dil_w, geo.pad_top, geo.pad_left, geo.cg, geo.kg, pixels,
                    mtiles, chunk]
            tiles = ceil_div(pixels, self.nwg) * geo.group * mtiles
            launches = _IgemmLaunches(
                geo=geo, dtype=dtype,
                out_shape=(geo.n, geo.k, geo.oh, geo.ow),
                partial_shape=(slices, geo.k, pixels) if self.split > 1 else None,
                kernel=self.kernel(device, geo, "conv_igemm"),
                global_size=(ceil_div(pixels, self.nwg) * self.ndimc,
                             geo.group * mtiles * self.mdimc, slices),
                local_size=(self.ndimc, self.mdimc, 1),
                ints=tuple(ints),
                counters=device.zeros((tiles,), np.int32) if self.split > 1 else None,
                scalars={})
            self._launch_cache[key] = launches
        return launches

    def run(self, problem: Problem, inputs: Sequence[Any], ctx: RunContext,
            prepared: Any = None) -> Any:
        device = ctx.device
        plan = self._launches(device, problem)
        out = device.empty(plan.out_shape, plan.dtype)
        x_buf, x_off = common.buffer(inputs[0], "X")
        w_buf, w_off = common.buffer(inputs[1], "W")
        bias, act = _epilogue_args(plan.geo, plan.dtype, inputs, out.base_data)
        residual = _residual_args(plan.geo, inputs, out.base_data)
        if plan.partial_shape is None:  # never read: the output stands in
            split = (out.base_data, out.base_data)
        else:
            split = (device.empty(plan.partial_shape, plan.dtype).base_data,
                     plan.counters.base_data)
        scalars = plan.pack(x_off, w_off, bias[1], np.int64(0), residual[1], bias[2],
                            residual[2], *act)
        args = [scalars, x_buf, w_buf, bias[0], out.base_data, residual[0], *split]
        device.launch(plan.kernel, args, plan.global_size, plan.local_size)
        return _in_output_shape(out, plan.geo)


@dataclass(frozen=True)
class _IgemmLaunches:
    """A ``cl_igemm`` configuration's launches for one problem, less the buffers."""

    geo: ConvGeometry
    dtype: np.dtype
    out_shape: tuple[int, ...]
    #: (slices, K, N*OH*OW) with split-K, else None (the kernel writes the output)
    partial_shape: tuple[int, ...] | None
    kernel: Any
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    #: the kernel's integer scalars fixed by the problem (C ... kchunk)
    ints: tuple[int, ...]
    #: split-K's counter per output tile (zeroed, and left zeroed by every launch), else None
    counters: Any
    #: the packed ``igemm_scalars`` argument by the scalars that vary with the call's arrays
    scalars: dict[tuple[Any, ...], np.ndarray]

    def pack(self, *varying: Any) -> np.ndarray:
        """The kernel's ``igemm_scalars`` argument: the offsets (x, w, bias, output,
        residual), has_bias, has_z, act, lo and hi, with :attr:`ints`; packed once per
        distinct set (a call's arrays almost always sit at the same offsets)."""
        packed = self.scalars.get(varying)
        if packed is None:
            if len(self.scalars) >= 64:  # arrays at ever new offsets: keep the dict small
                self.scalars.clear()
            packed = np.zeros(1, igemm_scalars(self.dtype))
            values = (*varying[:5], *self.ints, *varying[5:])
            for name, value in zip(packed.dtype.names, values, strict=True):
                packed[name] = value
            self.scalars[varying] = packed
        return packed


@functools.cache
def igemm_scalars(dtype: np.dtype) -> np.dtype:
    """The layout of the ``cl_igemm`` kernel's ``igemm_scalars`` struct (C's: ``align``)."""
    names = ["x_off", "w_off", "b_off", "o_off", "z_off", "C", "H", "W", "K", "OH", "OW",
             "sh", "sw", "dh", "dw", "pt", "pl", "cg", "kg", "NP", "mtiles", "kchunk",
             "has_bias", "has_z", "act", "lo", "hi"]
    types = [np.int64] * 5 + [np.int32] * 20 + [np.dtype(dtype)] * 2
    return np.dtype(list(zip(names, types, strict=True)), align=True)


#: ``cl_direct`` configurations: (output channels per work-item, local size).
DIRECT_CONFIGS = tuple((ko, local) for ko in (1, 4, 8) for local in (32, 128))
#: ``cl_depthwise`` configurations: (outputs per work-item along a row, local size).
DEPTHWISE_CONFIGS = tuple((px, local) for px in (1, 4) for local in (32, 128))
