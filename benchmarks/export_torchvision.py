"""Export torchvision models to ONNX (opset 17, random weights, batch 1), as a user would.

Runs under any Python that has torch and torchvision, which fastrun's own environment need not
have (``check_torchvision`` calls it with ``--python``); it imports nothing of fastrun.
Segmentation models are wrapped to return their ``"out"`` tensor, and GoogLeNet and
Inception v3 are built without their auxiliary heads (what inference runs).  Parameters a
model initialises to all zeros are drawn at random like the rest.

    python benchmarks/export_torchvision.py OUT_DIR resnet18 vit_b_16 fcn_resnet50 ...
"""

from __future__ import annotations

import os
import sys
import time
import warnings

#: torchvision's classification and segmentation models that the checks cover
MODELS = ("alexnet", "convnext_tiny", "deeplabv3_mobilenet_v3_large", "densenet121",
          "efficientnet_b0", "fcn_resnet50", "googlenet", "inception_v3",
          "lraspp_mobilenet_v3_large", "mnasnet1_0", "mobilenet_v3_large", "mobilenet_v3_small",
          "regnet_y_400mf", "resnext50_32x4d", "shufflenet_v2_x1_0", "squeezenet1_1", "swin_t",
          "vgg11", "vit_b_16", "wide_resnet50_2")
SEGMENTATION = ("fcn_", "deeplabv3_", "lraspp_")


def export(name: str, path: str) -> None:
    import torch
    import torchvision

    segmentation = name.startswith(SEGMENTATION)
    family = torchvision.models.segmentation if segmentation else torchvision.models
    options: dict = {"weights": None}
    if segmentation:
        options["weights_backbone"] = None
    if name in ("googlenet", "inception_v3"):
        options.update(aux_logits=False, init_weights=True)
    model = getattr(family, name)(**options).eval()
    # Some models start with all-zero tensors (ViT's classifier head): their output would be a
    # constant that any engine matches, so --check would prove nothing.  Draw those too.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and not parameter.any():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)

    class Output(torch.nn.Module):
        """The segmentation models' ``"out"`` tensor (they return a dict)."""

        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)["out"]

    size = 299 if name == "inception_v3" else 224
    torch.onnx.export(Output(model) if segmentation else model,
                      (torch.randn(1, 3, size, size),), path, opset_version=17, dynamo=False,
                      input_names=["input"], output_names=["output"])


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR MODEL [MODEL ...] (models: {', '.join(MODELS)})")
    warnings.filterwarnings("ignore")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for name in sys.argv[2:]:
        started = time.perf_counter()
        export(name, os.path.join(out_dir, f"{name}.onnx"))
        print(f"{name}: exported in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
