"""A model with no sub-modules (an nn.Linear, a module of bare Parameters): the model itself is its
one selected layer, and its golden replays."""
from __future__ import annotations

import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec


def _linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(8, 8)


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_a_leaf_model_replays_its_own_golden() -> None:
    (r,) = capture_then_replay(_linear, _linear(), _x(), CheckSpec(name="leaf", dtypes=["float32"]))
    assert r.passed, verdicts([r])
    assert [o.name for o in r.outputs] == ["<output>.0"]


def test_a_leaf_model_with_a_bug_fails() -> None:
    bad = _linear()
    bad.register_forward_hook(lambda _m, _a, out: out * 1.01)
    (r,) = capture_then_replay(_linear, bad, _x(), CheckSpec(name="leaf", dtypes=["float32"]))
    assert not r.passed, verdicts([r])
