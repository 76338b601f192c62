"""A module called several times has a record per call (``block#1`` its second): the culprit is the
smallest failing call, and a per-layer tolerance the message suggests names the module, as
Tolerance(layers=...) matches module names."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from parity_models import capture_then_replay, suggested_tolerances, verdicts
from pytest_rocm_parity import Tolerance
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.engine import CheckSpec


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class Shared(nn.Module):
    """One block called twice (ALBERT's weight sharing)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.block, self.head = nn.Linear(32, 32), Block(), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.block(self.embed(x))))


def wrong_on_second_call(module: nn.Module, factor: float) -> None:
    calls = {"n": 0}

    def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return out * factor if calls["n"] % 2 == 0 else out
    module.register_forward_hook(hook)


def x() -> torch.Tensor:
    return torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(0))


def test_a_fault_in_a_shared_blocks_second_call_is_named_at_the_child() -> None:
    cand = Shared().eval()
    wrong_on_second_call(cand.block.act, 1.01)
    res = capture_then_replay(lambda: Shared().eval(), cand, x(), CheckSpec(name="m", dtypes=["float32"]))
    assert res[0].culprit == "block.act#1", verdicts(res)


def test_the_suggested_per_layer_tolerance_names_the_module_and_is_accepted() -> None:
    cand = Shared().eval()
    wrong_on_second_call(cand.block.down, 1 + 2.0**-7)
    spec = CheckSpec(name="m", dtypes=["bfloat16"])
    res = capture_then_replay(lambda: Shared().eval(), cand, x(), spec)
    assert res[0].culprit == "block.down#1", verdicts(res)
    text = message(res[0])
    per_layer = suggested_tolerances(text)[-1]
    assert list(per_layer.layers) == ["block.down"], text
    loose = CheckSpec(name="m", dtypes=["bfloat16"], tolerance=per_layer)
    assert capture_then_replay(lambda: Shared().eval(), cand, x(), loose)[0].passed


def test_a_shared_blocks_second_call_wrong_in_its_own_code_says_where_inside_it() -> None:
    """Every child of the second call passes: the fault is the block's own code, and the message
    names the children judged inside it; the propagated divergence descends to the second call."""
    class OwnCode(Block):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            OwnCode.calls += 1
            out = super().forward(x)
            return out * 1.01 if OwnCode.calls % 2 == 0 else out   # the residual add of the second call

    cand = Shared().eval()
    own = OwnCode()
    own.load_state_dict(cand.block.state_dict())
    cand.block = own
    res = capture_then_replay(lambda: Shared().eval(), cand, x(), CheckSpec(name="m", dtypes=["float32"]))
    assert res[0].culprit == "block#1", verdicts(res)
    text = message(res[0])
    assert "inside it: up, act, down" in text and "so the fault is in its own forward's code" in text, text
    assert res[0].first_divergent == "block#1", verdicts(res)


def test_the_suggested_tolerance_of_a_module_covers_every_failing_call_of_it() -> None:
    cand = Shared().eval()
    calls = {"n": 0}

    def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return out * (1 + (2.0**-6 if calls["n"] % 2 else 2.0**-7))   # the first call the worse
    cand.block.down.register_forward_hook(hook)
    res = capture_then_replay(lambda: Shared().eval(), cand, x(), CheckSpec(name="m", dtypes=["bfloat16"]))
    text = message(res[0])
    ratio = suggested_tolerances(text)[-1].layers["block.down"].ratio_for("bfloat16")
    worst = max(l.would_pass_ratio or 0.0 for l in res[0].layers if l.module == "block.down")
    assert ratio == worst and sum(1 for l in res[0].layers if l.module == "block.down" and not l.passed) == 2, text
