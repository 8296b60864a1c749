"""Convolution layers of well-known networks, as (name, count, conv parameters).

``count`` is how often the layer occurs in the network, so summed figures weigh layers the way
the network does.  Shapes are for 224x224 inputs at batch 1; ``problems`` scales the batch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    name: str
    count: int
    c: int
    hw: int
    k: int
    kernel: int
    stride: int = 1
    pad: int = 0
    group: int = 1

    def shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, self.c, self.hw, self.hw),
                (self.k, self.c // self.group, self.kernel, self.kernel), (self.k,)]

    def params(self) -> dict:
        return {"strides": (self.stride, self.stride), "pads": (self.pad,) * 4,
                "group": self.group}


RESNET18 = [
    Layer("conv1 7x7/2 3->64 @224", 1, 3, 224, 64, 7, 2, 3),
    Layer("layer1 3x3 64->64 @56", 4, 64, 56, 64, 3, 1, 1),
    Layer("layer2.0 3x3/2 64->128 @56", 1, 64, 56, 128, 3, 2, 1),
    Layer("layer2.ds 1x1/2 64->128 @56", 1, 64, 56, 128, 1, 2, 0),
    Layer("layer2 3x3 128->128 @28", 3, 128, 28, 128, 3, 1, 1),
    Layer("layer3.0 3x3/2 128->256 @28", 1, 128, 28, 256, 3, 2, 1),
    Layer("layer3.ds 1x1/2 128->256 @28", 1, 128, 28, 256, 1, 2, 0),
    Layer("layer3 3x3 256->256 @14", 3, 256, 14, 256, 3, 1, 1),
    Layer("layer4.0 3x3/2 256->512 @14", 1, 256, 14, 512, 3, 2, 1),
    Layer("layer4.ds 1x1/2 256->512 @14", 1, 256, 14, 512, 1, 2, 0),
    Layer("layer4 3x3 512->512 @7", 3, 512, 7, 512, 3, 1, 1),
]

# MobileNetV2 (width 1.0): the first conv, then for each inverted-residual stage its distinct
# expand (pointwise), depthwise and project (pointwise) layers.
MOBILENET_V2 = [
    Layer("conv0 3x3/2 3->32 @224", 1, 3, 224, 32, 3, 2, 1),
    Layer("dw 3x3 32 @112", 1, 32, 112, 32, 3, 1, 1, 32),
    Layer("pw 32->16 @112", 1, 32, 112, 16, 1),
    Layer("pw 16->96 @112", 1, 16, 112, 96, 1),
    Layer("dw 3x3/2 96 @112", 1, 96, 112, 96, 3, 2, 1, 96),
    Layer("pw 96->24 @56", 1, 96, 56, 24, 1),
    Layer("pw 24->144 @56", 2, 24, 56, 144, 1),
    Layer("dw 3x3 144 @56", 1, 144, 56, 144, 3, 1, 1, 144),
    Layer("pw 144->24 @56", 1, 144, 56, 24, 1),
    Layer("dw 3x3/2 144 @56", 1, 144, 56, 144, 3, 2, 1, 144),
    Layer("pw 144->32 @28", 1, 144, 28, 32, 1),
    Layer("pw 32->192 @28", 3, 32, 28, 192, 1),
    Layer("dw 3x3 192 @28", 2, 192, 28, 192, 3, 1, 1, 192),
    Layer("pw 192->32 @28", 2, 192, 28, 32, 1),
    Layer("dw 3x3/2 192 @28", 1, 192, 28, 192, 3, 2, 1, 192),
    Layer("pw 192->64 @14", 1, 192, 14, 64, 1),
    Layer("pw 64->384 @14", 4, 64, 14, 384, 1),
    Layer("dw 3x3 384 @14", 4, 384, 14, 384, 3, 1, 1, 384),
    Layer("pw 384->64 @14", 3, 384, 14, 64, 1),
    Layer("pw 384->96 @14", 1, 384, 14, 96, 1),
    Layer("pw 96->576 @14", 3, 96, 14, 576, 1),
    Layer("dw 3x3 576 @14", 2, 576, 14, 576, 3, 1, 1, 576),
    Layer("pw 576->96 @14", 2, 576, 14, 96, 1),
    Layer("dw 3x3/2 576 @14", 1, 576, 14, 576, 3, 2, 1, 576),
    Layer("pw 576->160 @7", 1, 576, 7, 160, 1),
    Layer("pw 160->960 @7", 3, 160, 7, 960, 1),
    Layer("dw 3x3 960 @7", 3, 960, 7, 960, 3, 1, 1, 960),
    Layer("pw 960->160 @7", 2, 960, 7, 160, 1),
    Layer("pw 960->320 @7", 1, 960, 7, 320, 1),
    Layer("pw 320->1280 @7", 1, 320, 7, 1280, 1),
]

SUITES = {"resnet18": RESNET18, "mobilenet_v2": MOBILENET_V2}
