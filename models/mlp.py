"""A small two-layer perceptron: enough weight bytes (about 10 KB) for `external_weights: true`
to move them into a .ptd (etforge.builders.lowering.lower), small enough to build in seconds."""

from torch import nn


def build(in_features: int = 16, hidden: int = 128, out_features: int = 4) -> nn.Module:
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))
