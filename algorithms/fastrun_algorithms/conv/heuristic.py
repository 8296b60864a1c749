"""The thresholds of the conv algorithms' rules of thumb, and the measurements behind them.

Each conv algorithm states its own rank for a problem (``conv_rank`` on its class, see
:class:`fastrun_algorithms.conv.base.ConvAlgorithm`); the framework sorts the candidates by
those ranks: what HEURISTIC picks, and the order fast-run times candidates in (a good first
candidate lets early stopping drop the rest quickly).  Ranks are tuples compared across
algorithms; their first element is the class of layer the algorithm is for, 0 (specialised
kernels: depthwise, 1x1) to 9 (naive).

The rules follow the three shape classes that decide which convolution algorithm wins (see
OpenPPL's write-up in shared/seeds): a specialised kernel when one applies (depthwise, 1x1),
Winograd for 3x3 stride-1 layers with enough channels to amortise its transforms, the implicit
GEMM and then the direct kernels for the few-input-channel first layer, the blocked direct
kernel (then im2col + GEMM and the implicit GEMM) for everything else, and the naive loops
last.  ``docs/conv.md`` lists them
with the measurements behind them.
"""

from __future__ import annotations

from fastrun_algorithms.conv.geometry import ConvGeometry

#: Winograd needs this many input and output channels per group before its transform cost is
#: paid back by the cheaper products.
WINOGRAD_MIN_CHANNELS = 16
#: F(4x4,3x3) before F(2x2,3x3) from this many output pixels (all images together): below it
#: the larger transforms and the 4x4 tiles' overhang cost more than the 1.8x fewer products
#: save.  Measured on ResNet-18's 3x3 layers (docs/performance.md): F(4) won at 56x56 and 28x28
#: (batch 1 and 8) and at 14x14 and 7x7 with batch 8 (1568 and 392 pixels); F(2) won at 14x14
#: and 7x7 with batch 1 (196 and 49 pixels).
WINOGRAD_F4_MIN_PIXELS = 256
#: At most this many input channels per group makes a layer "few-channel" (the RGB first layer):
#: the unfold of im2col is then mostly copying, and the kernels that read the input in place win
#: (ResNet-18's 7x7 stride-2 first layer: implicit_gemm 1.39 ms, direct 1.62, im2col 2.01).
DIRECT_MAX_CHANNELS = 4
#: ``pointwise`` before ``conv1x1`` for one image from this many threads: on the 16-core host
#: (16 threads, heuristic-only, 2 process pairs) MobileNetV2 at batch 1 went from 4.97-6.42 to
#: 4.78-5.27 ms and ResNet-50 from 20.1-22.0 to 19.8-20.5 ms; at batch 8 MobileNetV2 lost (17.5-18.6
#: against 19.5-20.2 ms), and on 2 threads both models were 2-3% slower with it.
POINTWISE_MIN_THREADS = 8
#: From this many threads ``blocked_direct`` goes before the Winograd kernels on layers of fewer
#: than :data:`BLOCKED_MAX_WINOGRAD_PIXELS` output pixels (all images together), and before
#: ``pointwise`` on 1x1 layers of one image.  On the 16-core host (16 threads, resnet50 at
#: batch 1, fast-run's picks timed in the model) it took 285-320 us on the 128-channel 28x28
#: 3x3 layers against Winograd F(4x4)'s 370-420, 288-322 against 426-451 on the 256-channel
#: 14x14 ones and 339-361 against 509-592 (F(2x2)) on the 7x7 ones; fast-run chose it for 41
#: of the 53 convolutions, most 1x1 ones among them, and the model ran 14.9 and 15.7 ms against
#: 18.7 and 17.6 without it.  On 2 cores Winograd won those layers (resnet18's 512-channel
#: 7x7 layer: F(2x2) 0.425 against 0.538 ms), and on both machines F(4x4) won at 56x56.
BLOCKED_MIN_THREADS = 8
BLOCKED_MAX_WINOGRAD_PIXELS = 1024
#: ... but before ``pointwise`` only from this many input channels: with a shallow sum, storing
#: its tile (a transpose into NCHW) outweighs the multiply-adds.  MobileNetV2's 1x1 layers on
#: 2 threads, hot / cold cache (us): 16->96 at 112x112 blocked_direct 352 / 597 against
#: pointwise 254 / 351, 24->144 at 56x56 165 / 292 against 134 / 219; from 96 input channels on
#: blocked_direct won (96->576 at 14x14: 79 / 168 against 121 / 180).
BLOCKED_MIN_DEPTH_1X1 = 64
#: ``tiled_1x1`` goes first on 1x1 stride-1 layers only with a tile this many output channels
#: high (``_common.register_tile``: 8 with 32 vector registers, 4 with AVX2's 16); otherwise
#: after ``pointwise`` and ``conv1x1``.  AVX2's earlier 8 x 8 tile lost to ``pointwise`` on 8
#: of MNASNet's 9 distinct 1x1 layers alone on 2 threads (16->48 at 112x112 641 against 328
#: us).  Its 4 x 16 tile, interleaved with ``pointwise`` on nine ShuffleNet and MobileNet
#: layers, won five by 1.1-1.6x (58->58 at 28x28 85 against 113 us) and lost four by
#: 1.1-1.2x (16->48 at 112x112 681 against 606).  In MNASNet, searched with each tile, its
#: steps took 10-90% more than their searched times where ``pointwise``'s took up to 40% more,
#: and the steps' sums came out the same (12.48 against 12.51 ms, one run each), so the order
#: on AVX2 is unchanged and the search decides.
TILED_1X1_MIN_ROWS = 8
#: ``depthwise_lanes`` before ``depthwise`` on output rows narrower than this: where a
#: vector over a row's pixels is mostly idle.  Each layer alone on 2 threads (the 2-core VM,
#: AVX2; min over 8 interleaved rounds, with Relu): 576 x 14x14 3x3 133 against 382 us,
#: 1152 x 7x7 5x5 128 against 277, 240 x 28x28 5x5 stride 2 (14 wide out) 155 against 239;
#: on 72 x 56x56 3x3 ``depthwise`` won, 110 against 270.
DEPTHWISE_LANES_MAX_WIDTH = 16
#: ``blocked_direct`` wastes the lanes of a 16-channel block past a group's output channels.
BLOCKED_MIN_CHANNELS = 16


def few_channels(geo: ConvGeometry) -> bool:
    """A "few-channel" layer (the RGB first layer): see :data:`DIRECT_MAX_CHANNELS`."""
    return geo.cg <= DIRECT_MAX_CHANNELS
