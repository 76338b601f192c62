"""Overlapping selections, tied weights and outputs that are views of one storage: recorded, compared
and exported (golden files and the failing-tensor export of --parity-report) without error."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.golden.store import GoldenStore, storable
from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.reports.report import save_failing_tensors
from pytest_rocm_parity.runner.selection import select

import parity_models as fm


class Split(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.lin(x)
        return y[0], y[1], y.view(-1), y     # four views of one storage


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.split = Split()
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight   # tied weights
        self.again = self.split              # one module under two names

    def forward(self, ids: torch.Tensor) -> Any:
        a, b, flat, y = self.split(self.emb(ids))
        return self.head(a + b), flat[:4], y


def _scale(mod: nn.Module, factor: float) -> None:
    inner = mod.forward
    mod.forward = lambda *a, **k: inner(*a, **k) * factor


def _run(model: nn.Module, inputs: Any, spec: CheckSpec, tmp_path: Path, bug: str) -> list[Any]:
    store = GoldenStore(tmp_path / "goldens")
    capture(model, inputs, spec, store, "cpu")
    _scale(model.get_submodule(bug), 1.01)
    return replay(model, inputs, spec, store, "cpu")


def test_views_of_one_storage_and_tied_weights_are_exported(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    ids = torch.randint(0, 10, (2, 5), generator=torch.Generator().manual_seed(0))
    spec = CheckSpec(name="views", dtypes=["float32"], drill=2, report_dir=tmp_path / "report")
    (result,) = _run(model, ids, spec, tmp_path, "split.lin")
    assert not result.passed and result.culprit == "split.lin"
    saved = load_file(tmp_path / "report" / result.extra["failing_tensors"])
    views = [k for k in saved if k.startswith("split/")]
    assert len(views) >= 4                # every view written, each as its own tensor
    assert torch.equal(saved["split/2/isolated"].view(2, 5, 8)[0], saved["split/0/isolated"])


def test_a_module_under_two_names_is_selected_once() -> None:
    names = [s.name for s in select(Net(), drill=2)]
    assert "split" in names and not any(n.startswith("again") for n in names)


def test_overlapping_globs_on_a_unet_name_the_deep_module_and_export(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, inputs = fm.build_unet()
    layers = ["down_blocks.*", "mid_block", "up_blocks.*"]   # parents and their children
    spec = CheckSpec(name="unet", dtypes=["float32"], layers=layers, report_dir=tmp_path / "report")
    (result,) = _run(model, inputs, spec, tmp_path, fm.FAMILY_BUGS["unet"][0])
    assert result.culprit == fm.FAMILY_BUGS["unet"][0]
    saved = load_file(tmp_path / "report" / result.extra["failing_tensors"])
    # down_blocks.1 returns its last resnet's output both as its output and among its skips
    assert "down_blocks.1/0/isolated" in saved and "down_blocks.1/1.1/isolated" in saved


def test_storable_copies_shared_storage(tmp_path: Path) -> None:
    y = torch.arange(12.0)
    tensors = {"a": y[:6], "b": y[6:], "c": y, "empty": torch.empty(0), "empty2": torch.empty(0)}
    out, _, _ = storable(tensors)
    save_file(out, tmp_path / "x.safetensors")
    back = load_file(tmp_path / "x.safetensors")
    assert all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_save_failing_tensors_with_a_tensor_twice(tmp_path: Path) -> None:
    y = torch.randn(3, 4)
    result = {"name": "c", "dtype": "float32", "passed": False,
              "layers": [{"name": "m", "passed": False, "prop_passed": True}], "outputs": []}
    path = save_failing_tensors(result, {"m/0/isolated": y, "m/1/isolated": y, "m/2/isolated": y.view(-1)}, tmp_path)
    assert path is not None
    back = load_file(path)
    assert torch.equal(back["m/1/isolated"], y) and torch.equal(back["m/2/isolated"], y.view(-1))
