"""Through the plugin: a UNet selected with overlapping globs (parents and their children), a planted bug,
and --parity-report: the verdict, the report and the failing tensors are written (two recorded outputs
of down_blocks.1 are one tensor, which safetensors refuses to save twice)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

TESTS = Path(__file__).parents[1]

TEST = '''
import torch
import parity_models as fm

torch.set_num_threads(1)


def test_unet(parity):
    model, inputs = fm.family("unet")
    parity.check(model, inputs, name="unet", dtypes=["float32"], layers=["down_blocks.*", "mid_block", "up_blocks.*"])
'''


def test_overlapping_globs_report_and_failing_tensors(parity_project: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester = parity_project("", "FAMILY_BUG", parity_models=(TESTS / "parity_models.py").read_text(),
                              test_unet=TEST)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("FAMILY_BUG", "1")
    result = pytester.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*culprit: down_blocks.1.resnets.0.conv2 (inside block down_blocks.1)*"])
    doc = json.loads((pytester.path / "rep" / "parity-report.json").read_text())
    (check,) = doc["checks"]
    assert check["culprit"] == "down_blocks.1.resnets.0.conv2"
    saved = load_file(pytester.path / "rep" / check["extra"]["failing_tensors"])
    assert "down_blocks.1/0/isolated" in saved and "down_blocks.1/1.1/isolated" in saved
