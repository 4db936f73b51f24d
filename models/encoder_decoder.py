"""Two methods in one program: ``encode`` (features [1, 8, 16] -> memory [1, 16]) and ``decode``
(token ids [1, 4] int64 and a memory [1, 16] -> logits [1, 4, vocab]). Declare them under the
model's ``methods`` in pipeline.yaml; the weights they share are stored once."""

import torch
from torch import nn


class EncoderDecoder(nn.Module):
    def __init__(self, dim: int = 16, vocab: int = 20):
        super().__init__()
        self.enc = nn.Linear(dim, dim)
        self.embed = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.enc(x)).mean(dim=1)

    def decode(self, ids: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids) + memory[:, None, :])

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.decode(ids, self.encode(x))


def build(dim: int = 16, vocab: int = 20) -> nn.Module:
    return EncoderDecoder(dim, vocab)
