"""Layers shared by the in-repo models.

etforge follows a factory's imports into the project (etforge.config.code_deps):
editing this file rebuilds every model that imports it, and only those.
"""

from torch import nn


def conv_bn_relu(cin: int, cout: int, stride: int) -> nn.Sequential:
    """3x3 convolution (no bias), BatchNorm, ReLU."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )
