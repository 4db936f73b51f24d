"""Ultralytics YOLO11n from its packaged YAML (yolo11n.yaml), random weights: nothing is downloaded.

Ultralytics is AGPL-3.0, so it is not one of etforge's dependencies: this example installs it on
demand (examples/yolo/install.sh, pinned) and the factory says how when it is missing.

In eval mode the Detect head returns ``(predictions [1, 4 + classes, anchors], [P3, P4, P5 maps])``.
The app ships only the decoded predictions (boxes + class scores, before NMS), as seed 000's
exporter does, so the factory returns them alone: the three feature maps are not outputs of the
program, not validated, and not listed in the manifests.
"""

from __future__ import annotations

ULTRALYTICS = "ultralytics==8.4.190"


def build(variant: str = "yolo11n.yaml", num_classes: int = 80):
    import torch

    try:
        from ultralytics.nn.tasks import DetectionModel
    except ImportError:
        raise ImportError(
            f"this example needs Ultralytics (AGPL-3.0, not an etforge dependency): "
            f"sh examples/yolo/install.sh  (pip install {ULTRALYTICS})"
        ) from None

    torch.manual_seed(0)
    model = DetectionModel(variant, nc=num_classes, verbose=False).eval()
    return Predictions(model)


def _predictions_class():
    import torch

    class _Predictions(torch.nn.Module):
        """forward(image [1,3,H,W]) -> decoded predictions [1, 4 + classes, anchors] only."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, image):
            out = self.model(image)
            return out[0] if isinstance(out, (tuple, list)) else out

    return _Predictions


def Predictions(model):  # noqa: N802 - made lazily: importing this module needs no torch
    return _predictions_class()(model)
