"""A small image classifier: conv/BN/ReLU blocks, global pooling, linear head."""

import torch
from torch import nn

from models.blocks import conv_bn_relu


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn_relu(3, width, 1),
            conv_bn_relu(width, width * 2, 2),
            conv_bn_relu(width * 2, width * 4, 2),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(width * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


def build(num_classes: int = 10, width: int = 16) -> nn.Module:
    return SmallCNN(num_classes, width)
