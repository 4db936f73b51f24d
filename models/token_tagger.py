"""A per-token tagger: an embedding table (most of the weights) and a two-layer MLP head.

The example for embedding quantization (``8da4w`` with ``embedding: 4``): the table
is what shrinks. Its ``ids`` input is int64 token ids in ``[0, vocab)``. The embedding
runs in portable (or quantized) kernels, never in XNNPACK; the MLP is delegated.
"""

import torch
from torch import nn


class TokenTagger(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64, num_tags: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, num_tags))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(ids))


def build(vocab: int = 1000, dim: int = 64, num_tags: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return TokenTagger(vocab, dim, num_tags)
