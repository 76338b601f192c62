"""What a replay remembers between passes is dropped when the model changes under it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec, walk_model
from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.runner.wrappers import cast_in_place


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))


def _recast(model: nn.Module, dtype: torch.dtype) -> None:
    """A cast that keeps every parameter object and gives it new storage."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)


@pytest.mark.parametrize("change", ["to", "data"])
def test_a_model_cast_after_a_replay_is_cast_again_for_the_next(tmp_path, change: str) -> None:
    model = _net()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="net", dtypes=["float32"], drill=1, replay="fast")
    store = GoldenStore(tmp_path)
    capture(model, x, spec, store, "cpu")
    assert all(r.passed for r in replay(model, x, spec, store, "cpu"))
    assert all(r.passed for r in replay(model, x, spec, store, "cpu"))   # found in place, not scanned

    # float64 holds the float32 weights exactly, so the golden is not stale: only the dtype changed
    if change == "to":
        model.to(torch.float64)
    else:
        _recast(model, torch.float64)
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed, [(l.name, l.reason) for l in res.layers if not l.passed]   # run in float32 again
    assert all(p.dtype == torch.float64 for p in model.parameters())             # and put back as it was


def test_cast_in_place_scans_again_when_the_stamp_changes() -> None:
    model = _net()
    walk = walk_model(model)
    with cast_in_place(model, "cpu", torch.float32, walk.modules, walk.stamp()):
        assert model[0].weight.dtype == torch.float32
    _recast(model, torch.float16)
    walk = walk_model(model)
    with cast_in_place(model, "cpu", torch.float32, walk.modules, walk.stamp()):
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.float16 for p in model.parameters())
