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


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.lin(x)
        return y if mask is None else y * mask


class MaskedTwice(nn.Module):
    """One module called on all rows, then on two: the reference passes no mask where none is needed
    (a causal prefill under SDPA), the candidate an all-ones one (another attention implementation)."""

    def __init__(self, builds_mask: bool) -> None:
        super().__init__()
        self.gated = Gated()
        self.builds_mask = builds_mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.gated(x, mask=torch.ones_like(x) if self.builds_mask else None)
        b = self.gated(x[:2], mask=torch.ones_like(x[:2]))
        return a.sum(0) + b.sum(0)


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_an_input_one_side_leaves_none_keeps_each_call_its_own_key(mode: str) -> None:
    """None on the reference's first call, a tensor on the candidate's: no constant tells the calls
    apart, so each keeps its place in order and is judged on its own golden inputs (keyed by the None,
    the first call would take the second's key and go unjudged, and a StaticCache decode would run on
    another call's shapes)."""
    torch.manual_seed(0)
    reference = MaskedTwice(builds_mask=False)
    torch.manual_seed(0)
    candidate = MaskedTwice(builds_mask=True)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    (res,) = capture_then_replay(reference, candidate, x, CheckSpec(name="m", dtypes=["float32"], replay=mode))
    assert res.passed, verdicts([res])
    judged = {l.name: l.iso.numel for l in res.layers if l.iso is not None}
    assert judged == {"gated": 32, "gated.lin": 32, "gated#1": 16, "gated.lin#1": 16}, judged
    assert not any("other shapes" in n for n in res.notes), res.notes


def test_a_blocks_later_call_as_culprit_is_not_said_to_be_inside_itself() -> None:
    from pytest_rocm_parity.judging.assertion import message

    torch.manual_seed(0)
    reference = MaskedTwice(builds_mask=False)
    torch.manual_seed(0)
    candidate = MaskedTwice(builds_mask=False)
    candidate.gated.register_forward_hook(lambda mod, args, out: out * 1.05 if out.shape[0] == 2 else out)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    (res,) = capture_then_replay(reference, candidate, x, CheckSpec(name="m", dtypes=["float32"], drill=0))
    assert res.culprit == "gated#1" and res.culprit_block == "gated", verdicts([res])
    text = message(res)
    assert "culprit: gated#1: " in text and "inside block" not in text, text
