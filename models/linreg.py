"""Linear regression, 4 features in and 1 out, as in the multi-backend demo."""

import torch
from torch import nn


class LinearRegression(nn.Module):
    def __init__(self, in_features: int = 4, out_features: int = 1):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def build(in_features: int = 4) -> nn.Module:
    model = LinearRegression(in_features)
    # The demo's fitted line y = 2*x0 - x1 + 0.5*x2 + 3*x3 + 1, so outputs are
    # meaningful rather than random.
    with torch.no_grad():
        weights = torch.tensor([[2.0, -1.0, 0.5, 3.0]])[:, :in_features]
        model.linear.weight.copy_(weights)
        model.linear.bias.fill_(1.0)
    return model
