"""A small MLP with one layer made fragile on purpose, for the first-divergent-layer tests.

``blocks.1.proj`` has, in every row, one weight 400x the others' spread, on an input channel
the layer before nearly silences: per-channel int8 (and 4-bit groups) scale each row to that
outlier and round the row's other weights away, so that layer, not the ones before it, is
where a quantized program leaves eager fp32. ``fragile=False`` builds the same model without
the outlier (a quantized cell that passes).
"""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width_in: int, width_out: int):
        super().__init__()
        self.proj = nn.Linear(width_in, width_out)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.proj(x))


class FragileMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(64, 128), Block(128, 128), Block(128, 64))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.blocks(x))


def build(fragile: bool = True):
    torch.manual_seed(0)
    model = FragileMLP().eval()
    if fragile:
        with torch.no_grad():
            first, second = model.blocks[0].proj, model.blocks[1].proj
            first.weight[0] *= 1e-3  # input channel 0 of blocks.1.proj is nearly dead ...
            first.bias[0] = 0.0
            second.weight[:, 0] = 400 * second.weight.std()  # ... and carries an outlier in every row
    return model
