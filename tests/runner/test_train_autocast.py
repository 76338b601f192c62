"""check_train of a model that opens torch.autocast in its own forward (AMP as training scripts write
it): each module's isolated backward runs under the autocast its call ran under in the full forward,
so the capture does not meet bf16 activations with float32 weights, and a backward bug is named."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from parity_models import TRAIN_SGD, TRAIN_X, mean_square, scaled_grad, wrap_input
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.train import capture_train, replay_train


class AmpNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.m, self.b = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.b(torch.relu(self.m(torch.relu(self.a(x))))).float()


X, SGD, _loss = TRAIN_X, TRAIN_SGD, mean_square


@pytest.fixture(scope="module")
def golden(tmp_path_factory: Any) -> tuple[GoldenStore, CheckSpec]:
    spec = CheckSpec(name="amp", dtypes=["bfloat16", "float32"])
    store = GoldenStore(tmp_path_factory.mktemp("amp"))
    capture_train(AmpNet(), X, spec, store, "cpu", loss=_loss, optimizer=SGD)
    return store, spec


def test_the_same_model_passes_with_every_module_judged_in_isolation(golden) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    for r in replay_train(AmpNet(), X, spec, store, "cpu", loss=_loss, optimizer=SGD):
        assert r.passed, (r.dtype, [(l.name, l.reason) for l in r.layers if not l.passed], r.notes)
        assert all(l.iso is not None for l in r.layers), r.dtype
        assert not [n for n in r.notes if "autocast" in n]


def test_a_backward_bug_under_the_models_own_autocast_is_named(golden) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    model = AmpNet()
    wrap_input(model.m, scaled_grad(1.05))
    for r in replay_train(model, X, spec, store, "cpu", loss=_loss, optimizer=SGD):
        assert not r.passed and r.culprit == "m", (r.dtype, r.culprit, r.notes)


class NoAmpNet(AmpNet):
    """The same model, its forward without the autocast: the golden's bf16 activations reach float32
    weights in each isolated call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.m(torch.relu(self.a(x)))))


def test_a_candidate_without_the_references_autocast_is_told_so(golden) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    spec32 = CheckSpec(name=spec.name, dtypes=["float32"])
    with pytest.raises(InvalidArgument, match=r"m \(Linear\) could not be called in isolation.*the input is "
                                              r"bfloat16 and the module's parameters float32.*"
                                              r"open the same torch.autocast in this model's forward"):
        replay_train(NoAmpNet(), X, spec32, store, "cpu", loss=_loss, optimizer=SGD)
