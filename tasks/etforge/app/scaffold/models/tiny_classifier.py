"""An example model factory: etforge imports `build` and calls it with the pipeline's kwargs."""

from torch import nn


def build(num_classes: int = 4) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, num_classes),
    ).eval()
