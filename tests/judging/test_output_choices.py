"""A model's integer outputs (arg-max labels) are judged with its floating ones: a few flips at
near-ties pass where every floating output does, as a call's integer leaves do."""
from __future__ import annotations

import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec


class Classifier(nn.Module):
    """Logits and their arg-max labels; ``flips`` labels changed as near-ties flip on another backend."""

    def __init__(self, flips: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head, self.flips = nn.Linear(32, 32), nn.Linear(32, 4), flips

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.head(torch.tanh(self.body(x)))
        label = logits.argmax(-1)
        label[:self.flips] = (label[:self.flips] + 1) % 4
        return {"logits": logits, "label": label}


def test_integer_model_outputs_may_flip_at_near_ties_where_the_floating_outputs_pass() -> None:
    x = torch.randn(512, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="m", dtypes=["float32"], drill=0)
    res, = capture_then_replay(Classifier, Classifier(flips=2).eval(), x, spec)   # 0.4% of the labels
    assert res.passed, verdicts([res])
    assert any(n.startswith("<output>.label: 2 of 512 elements differ where every floating output passes")
               for n in res.notes), res.notes
    res, = capture_then_replay(Classifier, Classifier(flips=20).eval(), x, spec)
    label = next(o for o in res.outputs if o.name == "<output>.label")
    assert not res.passed and "more than the 1% of its elements, or 2 of at least 100, that near-ties" in label.reason, verdicts([res])
