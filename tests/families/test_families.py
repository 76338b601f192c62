"""The family matrix: a vision transformer, an encoder-decoder with cross-attention, a dual-tower model,
a state-space model and a UNet, each captured and replayed through the plugin with the default
selection and drill depth. The unchanged model passes; a bug planted in one deep sub-module fails
and names exactly that sub-module as the culprit (parity_models.FAMILY_BUGS).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

TESTS = Path(__file__).parents[1]

import parity_models as fm

TEST = '''
import torch
import parity_models as fm

torch.set_num_threads(1)


def test_family(parity):
    model, inputs = fm.family("{family}")
    parity.check(model, inputs, name="{family}", dtypes=["float32"])
'''


@pytest.fixture(params=list(fm.FAMILIES))
def captured(request: pytest.FixtureRequest, parity_project: Any) -> tuple[str, pytest.Pytester]:
    family = request.param
    pytester = parity_project("", "FAMILY_BUG", parity_models=(TESTS / "parity_models.py").read_text(),
                              test_family=TEST.format(family=family))
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    return family, pytester


def test_unchanged_model_passes_and_planted_bug_names_its_module(captured: tuple[str, pytest.Pytester],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    family, pytester = captured
    clean = pytester.runpytest("--rocm-parity")
    clean.assert_outcomes(passed=1)

    monkeypatch.setenv("FAMILY_BUG", "1")
    buggy = pytester.runpytest("--rocm-parity")
    buggy.assert_outcomes(failed=1)
    out = buggy.stdout.str()
    culprits = re.findall(r"culprit: (\S+?)(?: \(inside block \S+\))?: ", out)
    bug_module = fm.FAMILY_BUGS[family][0]
    assert culprits == [bug_module], f"{family}: planted in {bug_module}, blamed {culprits}\n{out[-3000:]}"


def test_a_smaller_size_limit_drills_less_and_says_how_to_narrow(parity_project: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The golden-size limit bounds the default depth; the culprit is then the smallest selected module,
    and the failure names its unselected sub-modules and the drill that would reach them."""
    import json

    pytester = parity_project("", "FAMILY_BUG", parity_models=(TESTS / "parity_models.py").read_text(),
                              test_family=TEST.format(family="t5"))
    # 0.3 MB: room for drill 1 on this T5 (0.22 MB estimated), not for drill 2 (0.37 MB)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-golden-size-limit=0.3").assert_outcomes(
        passed=1)
    manifest = json.loads(next(pytester.path.rglob("manifest.json")).read_text())
    assert manifest["drill"] == 1
    monkeypatch.setenv("FAMILY_BUG", "1")
    buggy = pytester.runpytest("--rocm-parity")
    buggy.assert_outcomes(failed=1)
    out = buggy.stdout.str()
    assert re.findall(r"culprit: (\S+?)(?: \(inside block \S+\))?: ", out) == ["decoder.block.1.layer.1"]
    assert "drill=2 or layers=['decoder.block.1.layer.1', 'decoder.block.1.layer.1.*']" in out.replace("\n", "")
