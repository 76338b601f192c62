"""--parity-device=model: keep a split model's own placement; goldens stay interchangeable."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pytest_rocm_parity.runner.capture import capture

from pytest_rocm_parity.runner.engine import KEEP_PLACEMENT, CheckSpec, substitute, prepare_model

from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.options import parse_device


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4))


@pytest.mark.parametrize("capture_on,replay_on", [(KEEP_PLACEMENT, "cpu"), ("cpu", KEEP_PLACEMENT)])
def test_goldens_interchangeable_with_single_device(tmp_path: Path, capture_on: str, replay_on: str) -> None:
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    spec = CheckSpec(name="net", dtypes=["bfloat16", "float32"])
    store = GoldenStore(tmp_path)
    capture(_net(), x, spec, store, capture_on, env={})
    results = replay(_net(), x, spec, store, replay_on, env={})
    assert [r.passed for r in results] == [True, True]


def test_prepare_model_keeps_each_modules_device() -> None:
    m = _net()
    m[2].to("meta")   # a block "on another device": meta stands in for a second GPU on the CPU
    out = prepare_model(m, KEEP_PLACEMENT, torch.float64)
    assert out[0].weight.device.type == "cpu" and out[0].weight.dtype == torch.float64
    assert out[2].weight.device.type == "meta" and out[2].weight.dtype == torch.float64
    assert m[0].weight.dtype == torch.float32   # the user's model is untouched


def test_substituted_inputs_follow_the_replaced_tensors_device() -> None:
    golden = {"t/0": torch.ones(2, 3)}
    args = (torch.empty(2, 3, device="meta"),)
    new_args, _ = substitute(args, {}, {"args.0": "t/0"}, golden.__getitem__, None, KEEP_PLACEMENT)
    assert new_args[0].device.type == "meta"


def test_model_is_an_accepted_device() -> None:
    assert parse_device("model") == "model"


def test_plugin_runs_with_kept_placement(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_split='''
import torch
from torch import nn

def test_split(parity):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    parity.check(m, torch.ones(3, 8), name="split", dtypes=["float32"])
''')
    pytester.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-device=model").assert_outcomes(passed=1)
    result = pytester.runpytest("--rocm-parity", "--parity-device=cpu")
    result.assert_outcomes(passed=1)
