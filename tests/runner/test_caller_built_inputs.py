"""A culprit whose own arithmetic is exact but whose caller built its index input otherwise (T5's
relative position buckets off by one): the failure says where the difference starts."""
from __future__ import annotations

import torch
from torch import nn

from parity_models import capture_then_replay, plant, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec


class PositionBias(nn.Module):
    def __init__(self, shift: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.bias = nn.Embedding(12, 16)
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = (torch.arange(x.shape[1]) + self.shift) % 12   # built here, not from the model's input
        return self.proj(x) + self.bias(idx)


def _x() -> torch.Tensor:
    return torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))


def test_an_index_built_otherwise_by_the_caller_is_named_as_the_start() -> None:
    (r,) = capture_then_replay(PositionBias, PositionBias(shift=1), _x(), CheckSpec(name="m", dtypes=["float32"]))
    assert not r.passed and r.culprit == "bias", verdicts([r])
    (note,) = [n for n in r.notes if "built by its caller" in n]
    assert note.startswith("bias: its input args.0 (") and "the code that builds it" in note


def test_a_bug_in_the_module_itself_gets_no_such_note() -> None:
    (r,) = capture_then_replay(PositionBias, plant(PositionBias(), "bias"), _x(), CheckSpec(name="m", dtypes=["float32"]))
    assert not r.passed and r.culprit == "bias", verdicts([r])
    assert not [n for n in r.notes if "built by its caller" in n]
