"""A port that declares the same modules in another order (a hand-written attention or MLP class
that reuses the original projections) holds the same weights: it is judged by its numbers, not
refused as a stale golden."""
from __future__ import annotations

import torch
from torch import nn

from parity_models import capture_then_replay, llama, plant, tokens, verdicts


class PortedMLP(nn.Module):
    """Llama's MLP with its projections declared down, up, gate (the original: gate, up, down)."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.down_proj, self.up_proj, self.gate_proj = mlp.down_proj, mlp.up_proj, mlp.gate_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def ported() -> nn.Module:
    model = llama("sdpa")
    for layer in model.model.layers:
        layer.mlp = PortedMLP(layer.mlp)
    return model


def test_modules_declared_in_another_order_are_the_same_model() -> None:
    res = capture_then_replay(lambda: llama("sdpa"), ported(), tokens())
    assert res[0].passed, verdicts(res)
    bad = plant(ported(), "model.layers.1.mlp.up_proj", 1.02)
    res = capture_then_replay(lambda: llama("sdpa"), bad, tokens())
    assert not res[0].passed and res[0].culprit == "model.layers.1.mlp.up_proj", verdicts(res)
