"""check_lm's verdicts where its metrics could pass in silence: non-finite logits (a NaN is never
over a budget), cached decoding of a model that is not a Hugging Face one, outputs the engine cannot
record, and which batch rows a decode failure is in."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

HERE = Path(__file__).parent

CONFTEST = '''
import os
import types
import torch
from parity_models import llama

def nan_hook(decode_only):
    """One non-finite logit: in the decode steps' single-token calls, or in the full forward's."""
    def hook(_m, _a, out):
        if (out.shape[1] == 1) != decode_only:
            return out
        out = out.clone()
        out[0, -1, 5] = float("nan")
        return out
    return hook

def build():
    m = llama("sdpa")
    bug = os.environ.get("BUG", "")
    if bug == "nan-decode":
        m.lm_head.register_forward_hook(nan_hook(decode_only=True))
    return m

class Logits(torch.nn.Module):
    """A plain module returning the logits of the Llama inside, where a port's own code after the
    last module puts a NaN in the full forward's logits."""
    def __init__(self, lm):
        super().__init__()
        self.lm = lm
    def forward(self, input_ids, attention_mask=None):
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        if os.environ.get("BUG") == "nan-forward":
            logits = logits.clone()
            logits[0, -1, 5] = float("nan")
        return logits

def ids():
    return torch.randint(3, 96, (2, 12), generator=torch.Generator().manual_seed(0))
'''

TEST = '''
from conftest import build, ids

def test_lm(parity):
    parity.check_lm(build(), ids(), name="lm", dtypes=["bfloat16"], generate=3)
'''


@pytest.fixture
def project(parity_project: Any) -> pytest.Pytester:
    p = parity_project(CONFTEST, "BUG", test_lm=TEST)
    shutil.copy(HERE.parent / "parity_models.py", p.path / "parity_models.py")
    return p


def _lm(project: pytest.Pytester, dtype: str) -> dict[str, Any]:
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    return next(c for c in doc["checks"] if c["dtype"] == dtype)["extra"]["lm"]


def test_nan_only_in_kv_cache_decoding_fails_every_rung_and_the_headline_names_it(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN error ratio is never over budget: the cached decode counts non-finite candidate values
    where the reference's are finite, and fails on them, as the full forward's outputs do."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "nan-decode")
    result = project.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*lm: KV-cache decoding (the continuation's 3 steps, one token each with the cache): 3 non-finite candidate "
        "value(s) where the reference is finite; first at batch row 0, step 0 of 0-2, vocabulary index 5*",
        "*FAIL lm [[]bfloat16[]]  non-finite candidate logits where the reference's are finite (3 in KV-cache "
        "decoding)*",
        "*FAIL lm [[]float32[]]  non-finite candidate logits*"])
    assert _lm(project, "bfloat16")["cached_decode"]["nonfinite"] == 3


def test_nan_in_the_full_forward_logits_is_named_in_the_metrics_and_the_headline(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """KL and perplexity over a NaN logit are NaN, which no budget fails: the non-finite logit is
    the failure, and the headline says so rather than 'metrics out of bounds'."""
    project.makepyfile(test_lm=TEST.replace("build()", "Logits(build())").replace("import build", "import Logits, build"))
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "nan-forward")
    result = project.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*lm: 1 non-finite candidate logit(s) where the reference's are finite; first at batch row 0, position 14, "
        "vocabulary index 5*",
        "*greedy generation: non-finite candidate logits at 3 step(s) where the reference's are finite; first at "
        "batch row 0, step 0*",
        "*FAIL lm [[]bfloat16[]]  non-finite candidate logits where the reference's are finite (1 in the full "
        "forward, 3 in greedy generation)*"])
    assert "language-model metrics out of bounds" not in result.stdout.str()
    assert _lm(project, "bfloat16")["nonfinite"] == {"forward": 1, "generation": 3}
