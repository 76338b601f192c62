"""check_train on a model whose forward updates its own buffers (an EMA of the activations' scale, a
step counter): every pass starts from the same buffers, so the candidate's two runs agree and a
backward bug is not hidden behind a spread read as nondeterminism."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from parity_models import TRAIN_SGD, TRAIN_X, mean_square, scaled_grad, wrap_input
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.train import capture_train, replay_train


class EmaNorm(nn.Module):
    """Divides by a running mean of the squares that its forward updates, in eval mode too (as
    activation-scale trackers and quantisation observers do), and counts its calls."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.register_buffer("ema", torch.ones(d))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.ema.mul_(0.5).add_(0.5 * x.detach().pow(2).mean(0))
            self.calls += 1
        return x / torch.sqrt(self.ema + 1e-5) * self.weight


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.norm, self.mid, self.out = nn.Linear(32, 64), EmaNorm(64), nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(torch.tanh(self.norm(self.inp(x))))))


X, SGD, _loss = TRAIN_X, TRAIN_SGD, mean_square


@pytest.fixture(scope="module")
def golden(tmp_path_factory: Any) -> tuple[GoldenStore, CheckSpec]:
    spec = CheckSpec(name="ema", dtypes=["float32"])
    store = GoldenStore(tmp_path_factory.mktemp("ema"))
    reference = Net()
    capture_train(reference, X, spec, store, "cpu", loss=_loss, optimizer=SGD)
    assert float(reference.norm.calls) == 0 and torch.equal(reference.norm.ema, torch.ones(64))
    return store, spec


def test_a_correct_candidate_passes_and_keeps_its_buffers(golden) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    model = Net()
    r = replay_train(model, X, spec, store, "cpu", loss=_loss, optimizer=SGD)[0]
    assert r.passed, ([(l.name, l.reason) for l in r.layers if not l.passed], r.notes)
    assert not r.extra["nondeterministic"]
    # the check leaves the caller's model as given, as the forward check does
    assert torch.equal(model.norm.ema, torch.ones(64)) and int(model.norm.calls) == 0


@pytest.mark.parametrize("factor", [3.0, 1.05])
def test_a_backward_bug_is_named_despite_the_buffer_updates(golden, factor: float) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    model = Net()
    wrap_input(model.mid, scaled_grad(factor))
    r = replay_train(model, X, spec, store, "cpu", loss=_loss, optimizer=SGD)[0]
    assert not r.extra["nondeterministic"]
    assert not r.passed and r.culprit == "mid", ([(l.name, l.reason) for l in r.layers], r.notes)
