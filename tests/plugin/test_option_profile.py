"""--parity-profile: operator time shares recorded at capture, growth flagged at replay."""
from __future__ import annotations

import json

import pytest

SLOW_TEST = '''
import os
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(2))
        self.head = nn.Linear(64, 8)
    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)

def test_profiled(parity):
    torch.manual_seed(0)
    m = Net()
    if os.environ.get("SLOW"):
        lin = m.blocks[1][0]
        def slow(x):  # a planted slow path: an unfused product recomputed many times
            for _ in range(40):
                out = torch.mm(x, lin.weight.t()) + lin.bias
            return out
        lin.forward = slow
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    parity.check(m, x, name="profiled", dtypes=["float32"])
'''


def test_profile_flags_grown_operator(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SLOW", raising=False)
    pytester.makepyfile(test_prof=SLOW_TEST)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-profile").assert_outcomes(passed=1)
    manifest = json.loads((pytester.path / "goldens" / "profiled" / "manifest.json").read_text())
    assert manifest["rungs"]["float32"]["extra"]["profile"]
    monkeypatch.setenv("SLOW", "1")
    result = pytester.runpytest("--rocm-parity", "--parity-profile", "--parity-report=rep")
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "rep" / "parity-report.json").read_text())
    flags = doc["checks"][0]["extra"]["profile"]["flags"]
    assert any(f.get("op") == "aten::mm" for f in flags), flags


def test_profile_against_a_golden_without_one_says_so(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked at replay only, profiler parity compares nothing: the result says so, not silence."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SLOW", raising=False)
    pytester.makepyfile(test_prof=SLOW_TEST)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    pytester.runpytest("--rocm-parity", "--parity-profile", "--parity-report=rep").assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "rep" / "parity-report.json").read_text())
    check = doc["checks"][0]
    assert "profile" not in check["extra"]
    assert [n for n in check["notes"] if "--parity-profile" in n and "holds no operator profile" in n]
