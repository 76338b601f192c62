"""Modules that change their input in place (ReLU(inplace=True), `x += ...`) are recorded and replayed right."""
from __future__ import annotations

import torch
from torch import nn

from pytest_rocm_parity.capture import capture
from pytest_rocm_parity.engine import CheckSpec
from pytest_rocm_parity.golden import GoldenStore, RungReader
from pytest_rocm_parity.replay import replay


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def test_inplace_module_output_is_its_result_not_its_input(tmp_path) -> None:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="inplace", dtypes=["float32"], drill=2)
    store = GoldenStore(tmp_path)
    manifest = capture(model, x, spec, store, "cpu")
    meta = manifest["rungs"]["float32"]
    act = next(e for e in meta["layers"] if e["name"] == "act")
    reader = RungReader(store.rung_file("inplace", manifest, "float32"), "cpu")
    got_in, got_out = reader.get(act["in"]["args.0"]), reader.get(act["out"]["0"])
    with torch.no_grad():
        pre = model.fc1(x)
    torch.testing.assert_close(got_in, pre)                 # the input as it was before the ReLU
    torch.testing.assert_close(got_out, torch.relu(pre))    # the output after it
    assert (got_in < 0).any()
    (res,) = replay(model, x, spec, store, "cpu")
    assert res.passed, [(l.name, l.reason) for l in res.layers]
