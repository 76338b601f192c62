"""A loss computed otherwise whose gradients move by a near-constant factor (label smoothing: every
gradient about 0.9x, the loss's value hardly moved) is named as the loss, not as a loss scale: only
a loss and gradients moved by one factor are a scale."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.train import capture_train, replay_train


class Classifier(nn.Module):
    """A classifier whose forward returns its cross-entropy, the targets among its inputs."""

    def __init__(self, smoothing: float = 0.0, scale: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.smoothing, self.scale = smoothing, scale
        self.net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.scale * F.cross_entropy(self.net(x), y, label_smoothing=self.smoothing)


_g = torch.Generator().manual_seed(1)
INPUTS = (torch.randn(32, 32, generator=_g), torch.randint(0, 10, (32,), generator=_g))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out


@pytest.fixture(scope="module")
def golden(tmp_path_factory: Any) -> tuple[GoldenStore, CheckSpec]:
    spec = CheckSpec(name="ce", dtypes=["float32"])
    store = GoldenStore(tmp_path_factory.mktemp("ce"))
    capture_train(Classifier(), INPUTS, spec, store, "cpu", loss=_loss)
    return store, spec


def test_label_smoothing_is_named_as_the_loss_not_as_a_scale(golden) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    (r,) = replay_train(Classifier(smoothing=0.1), INPUTS, spec, store, "cpu", loss=_loss)
    assert not r.passed and r.culprit is None
    assert "loss_factor" not in r.extra and r.extra["loss_otherwise"] > 100, (r.extra, r.notes)
    assert "culprit: the loss itself" in message(r), message(r)
    (note,) = [n for n in r.notes if "every gradient is" in n]
    assert "every gradient is 0.9011x the golden's while the loss is 1.00028x" in note and "the loss is computed otherwise" in note, note
    assert not any("loss scale not undone" in n for n in r.notes), r.notes


def test_a_loss_scale_not_undone_is_still_one_factor(golden) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    (r,) = replay_train(Classifier(scale=4.0), INPUTS, spec, store, "cpu", loss=_loss)
    assert not r.passed and r.culprit is None and abs(r.extra["loss_factor"] - 4) < 1e-3, (r.extra, r.notes)
    assert any(n.startswith("the loss and every gradient are 4x the golden's") for n in r.notes), r.notes
