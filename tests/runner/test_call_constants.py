"""Repeated calls of one module told apart by a constant argument are matched by it, not by their
order: Gemma3 computes its rotary tables in a loop over set(config.layer_types), whose order follows
each process's hash seed, so a correct model failed in half of the processes."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec


class Table(nn.Module):
    def __init__(self, bug: str | None) -> None:
        super().__init__()
        self.bug = bug

    def forward(self, x: torch.Tensor, kind: str) -> torch.Tensor:
        y = torch.sin(x) if kind == "sliding" else torch.cos(x) * 3
        return y * 1.01 if kind == self.bug else y


class Model(nn.Module):
    def __init__(self, order: tuple[str, ...], bug: str | None = None) -> None:
        super().__init__()
        self.order = order
        self.proj = nn.Linear(8, 8)
        self.table = Table(bug)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        tables = {kind: self.table(h, kind) for kind in self.order}
        return self.head(tables["sliding"] * tables["full"])


def model(order: tuple[str, ...], bug: str | None = None) -> Model:
    torch.manual_seed(0)
    return Model(order, bug)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_calls_in_another_order_pass_and_a_bug_is_still_named(mode: str) -> None:
    spec = CheckSpec(name="m", dtypes=["float32"], layers=["proj", "table", "head"], drill=0, replay=mode)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    res = capture_then_replay(lambda: model(("sliding", "full")), model(("full", "sliding")), x, spec)
    assert res[0].passed, verdicts(res)
    res = capture_then_replay(lambda: model(("sliding", "full")), model(("full", "sliding"), bug="full"), x, spec)
    assert not res[0].passed and res[0].culprit == "table#1", verdicts(res)   # the golden's second call
