"""An enum argument is a mode switch: which member the model is called with is recorded, so a
changed one is a changed input, not a numerical fault."""
from __future__ import annotations

import enum
import json

import pytest
import torch
from torch import nn

from manifest_edits import rewrite_manifest
from pytest_rocm_parity import CheckSpec, GoldenStale, GoldenStore, capture, replay


class Act(enum.Enum):
    TANH = "tanh"
    RELU = "relu"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, act: Act) -> torch.Tensor:
        h = self.a(x)
        return self.b(torch.tanh(h) if act is Act.TANH else torch.relu(h))


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def _golden(tmp_path) -> tuple[GoldenStore, CheckSpec]:
    store, spec = GoldenStore(tmp_path), CheckSpec(name="e", dtypes=["float32"])
    capture(Net().eval(), (_x(), Act.TANH), spec, store, "cpu")
    return store, spec


def test_a_changed_enum_argument_is_a_stale_golden_naming_both_members(tmp_path) -> None:
    """It was recorded as its type alone, so the replay judged RELU against TANH's outputs and blamed
    the code between the two layers."""
    store, spec = _golden(tmp_path)
    with pytest.raises(GoldenStale, match=r"non-tensor input args.1 changed \('<Act.TANH>' -> '<Act.RELU>'\)"):
        replay(Net().eval(), (_x(), Act.RELU), spec, store, "cpu")


def test_a_golden_that_recorded_the_enum_by_its_type_alone_still_replays(tmp_path) -> None:
    store, spec = _golden(tmp_path)
    path = store.manifest_path("e")
    manifest = json.loads(path.read_text())
    for rung in manifest["rungs"].values():
        assert rung["inputs"]["const"]["args.1"] == "<Act.TANH>"
        rung["inputs"]["const"]["args.1"] = "<Act>"
    rewrite_manifest(path, manifest)
    (res,) = replay(Net().eval(), (_x(), Act.TANH), spec, store, "cpu")
    assert res.passed
