"""A variable-length sequence model: token ids [1, seq] (int64) and features [1, seq, dim] share one
dynamic dim; returns per-position scores and a pooled vector. Declare the shared dim in
pipeline.yaml as ``{min: 1, max: 64, name: seq}`` on both inputs."""

import torch
from torch import nn


class TokenSeq(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor, x: torch.Tensor):
        h = self.norm(self.embed(ids) + self.proj(x))
        attn = torch.softmax(h @ h.transpose(1, 2) / 4.0, dim=-1) @ h
        return self.head(attn), attn.mean(dim=1)


def build(vocab: int = 50, dim: int = 16) -> nn.Module:
    return TokenSeq(vocab, dim)
