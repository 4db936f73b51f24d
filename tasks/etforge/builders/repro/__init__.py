"""``etforge repro CELL``: a standalone script (and its inputs) that rebuilds one cell with plain
torch, torchao and ExecuTorch calls and prints the figure its verdict was made of (docs/repro.md)."""
