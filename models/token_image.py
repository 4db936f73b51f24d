"""A model with an integer input and a structured output: token ids (int64) through an
nn.Embedding, an image through a conv, returned as a dict holding a tensor and a tuple.

Its ids must lie in [0, vocab): declare ``range: [0, <vocab>]`` on that input.
"""

import torch
from torch import nn


class TokenImage(nn.Module):
    def __init__(self, vocab: int = 100, dim: int = 16, channels: int = 3, classes: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.conv = nn.Conv2d(channels, dim, 3, padding=1)
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, ids: torch.Tensor, image: torch.Tensor):
        tokens = self.embed(ids).mean(dim=1)  # [B, dim]
        pixels = torch.relu(self.conv(image)).mean(dim=(2, 3))  # [B, dim]
        joint = torch.cat([tokens, pixels], dim=1)
        return {"logits": self.head(joint), "features": (tokens, pixels)}


def build(vocab: int = 100, dim: int = 16, classes: int = 5) -> nn.Module:
    return TokenImage(vocab, dim, classes=classes)
