"""A tiny model with a switchable numerical bug, shared by the report tests and their pytester runs."""
from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)
        self.bug = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.act(self.fc1(x)))
        if self.bug and y.dtype != torch.float64:  # a float32 kernel that silently rounds through half
            y = y.half().float()
        return x + y


class Tiny(nn.Module):
    def __init__(self, d: int = 32, n: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def make(bug_block: int | None = None) -> tuple[Tiny, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    m = Tiny().eval()
    if bug_block is not None:
        m.blocks[bug_block].bug = True
    return m, torch.randn(16, 32, generator=g)
