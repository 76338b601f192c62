"""A derived golden equals, tensor for tensor, a capture made directly with those settings."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from parity_models import MlpBlock
from pytest_rocm_parity.golden.derive import derive
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.golden.store import GoldenStore, RungReader


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), *[MlpBlock(16) for _ in range(3)], nn.Linear(16, 4))


def _by_layer(store: GoldenStore, name: str, dtype: str) -> dict[str, torch.Tensor]:
    m = store.read_manifest(name)
    meta = m["rungs"][dtype]
    r = RungReader(store.rung_file(name, m, dtype), "cpu")
    out = {f"out:{e['key']}:{p}": r.get(k) for e in meta["layers"] for p, k in e["out"].items()}
    out.update({f"in:{e['key']}:{p}": r.get(k) for e in meta["layers"] for p, k in e["in"].items()})
    out.update({k: r.get(k) for k in r.keys if not k.startswith("t/")})
    return out


def test_derived_equals_direct_capture(tmp_path: Path) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    store = GoldenStore(tmp_path)
    capture(_model(), x, CheckSpec(name="full", dtypes=["bfloat16", "float32"], drill=2), store, "cpu", env={})
    capture(_model(), x, CheckSpec(name="direct", dtypes=["float32"], drill=0), store, "cpu", env={})
    derive(store, "full", store, "derived", ["float32"], 0)
    a, b = _by_layer(store, "derived", "float32"), _by_layer(store, "direct", "float32")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert store.read_manifest("derived")["layers"] == store.read_manifest("direct")["layers"]
    (res,) = replay(_model(), x, CheckSpec(name="derived", dtypes=["float32"], drill=0), store, "cpu", env={})
    assert res.passed and len(res.layers) == 5


def test_derive_refuses_what_the_golden_lacks(tmp_path: Path) -> None:
    x = torch.randn(4, 8)
    store = GoldenStore(tmp_path)
    capture(_model(), x, CheckSpec(name="g", dtypes=["float32"], drill=0), store, "cpu", env={})
    with pytest.raises(InvalidArgument, match="float16"):
        derive(store, "g", store, "h", ["float16"], 0)
    with pytest.raises(InvalidArgument, match="drill=1"):
        derive(store, "g", store, "h", ["float32"], 1)
