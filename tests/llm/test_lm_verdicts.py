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
import math
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
    if bug == "decode-nomask":
        # a single-query attention kernel that ignores the padding mask: only left-padded rows go wrong
        for layer in m.model.layers:
            def nomask(self, hidden_states, *a, **kw):
                if hidden_states.shape[1] == 1:
                    kw["attention_mask"] = None
                return type(self).forward(self, hidden_states, *a, **kw)
            layer.self_attn.forward = types.MethodType(nomask, layer.self_attn)
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

class CachedLM(torch.nn.Module):
    """A serving team's own decoder, no Hugging Face config: one attention block whose KV cache is a
    pair of plain tensors, returned as past_key_values in a transformers ModelOutput (OUT=ns: in a
    SimpleNamespace, whose tensors the golden cannot record)."""
    def __init__(self, vocab=96, d=32, heads=4):
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        with torch.no_grad():
            self.qkv.weight.normal_(0, 0.5)
    def forward(self, input_ids, attention_mask=None, use_cache=False, past_key_values=None):
        b, t = input_ids.shape
        x = self.emb(input_ids)
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if os.environ.get("BUG") == "decode-scale" and t == 1:
            q = q * 1.05   # a single-query kernel's softmax scale off by 5%
        start = 0
        if past_key_values is not None:
            start = past_key_values[0].shape[2]
            k, v = torch.cat([past_key_values[0], k], 2), torch.cat([past_key_values[1], v], 2)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~torch.ones(t, start + t, dtype=torch.bool).tril(start), float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        logits = self.head(x + self.o(y))
        past = (k, v) if use_cache else None
        if os.environ.get("OUT") == "ns":
            return types.SimpleNamespace(logits=logits, past_key_values=past)
        from transformers.modeling_outputs import CausalLMOutputWithPast
        return CausalLMOutputWithPast(logits=logits, past_key_values=past)
'''

TEST = '''
from conftest import build, ids

def test_lm(parity):
    parity.check_lm(build(), ids(), name="lm", dtypes=["bfloat16"], generate=3)
'''


@pytest.fixture
def project(parity_project: Any, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("OUT", raising=False)
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
        "forward, 3 step(s) in greedy generation)*"])
    assert "language-model metrics out of bounds" not in result.stdout.str()
    assert _lm(project, "bfloat16")["nonfinite"] == {"forward": 1, "generation": 3}


CACHED_TEST = '''
from conftest import CachedLM, ids

def test_lm(parity):
    parity.check_lm(CachedLM(), ids(), name="lm", dtypes=["float32"], generate=3)
'''


def test_a_model_that_is_not_hugging_faces_is_decoded_with_the_cache_it_returns(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a model decodes with a cache is decided by what it returns, not by a config with a
    vocab_size: a hand-written decoder returning past_key_values has its cached decoding recorded,
    and a decode-only bug in it fails."""
    project.makepyfile(test_lm=CACHED_TEST)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    ok = project.runpytest("--rocm-parity", "--parity-report=rep")
    ok.assert_outcomes(passed=1)
    assert _lm(project, "float32")["cached_decode"]["steps"] == 3
    monkeypatch.setenv("BUG", "decode-scale")
    bad = project.runpytest("--rocm-parity")
    bad.assert_outcomes(failed=1)
    bad.stdout.fnmatch_lines(["*lm: KV-cache decoding (the continuation's 3 steps, one token each with the cache): "
                              "propagated error *x the reference's (budget 3x)*",
                              "*FAIL lm [[]float32[]]  KV-cache decoding out of bounds*"])


def test_a_passing_check_whose_decoding_is_not_judged_warns_and_says_why(project: pytest.Pytester) -> None:
    """A PASS shows no notes: a model whose forward takes no cache still passes on its full forward
    and greedy generation, with a warning that names why its cached decoding was not judged."""
    project.makepyfile(test_lm='''
from conftest import Logits, build, ids

def test_lm(parity):
    parity.check_lm(Logits(build()), ids(), name="lm", dtypes=["float32"], generate=2)
''')
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*UserWarning: rocm-parity: lm: generate=2: the golden holds no cached decoding "
                                 "(its forward takes no past_key_values (or cache) argument to decode with), so "
                                 "decoding step by step with a KV cache is not judged*"])


def test_an_output_whose_logits_the_golden_cannot_record_is_refused_at_capture(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SimpleNamespace has the .logits check_lm reads but no tensor leaf a golden records: refused
    before the golden is written, naming the outputs that work, instead of a StopIteration at replay."""
    project.makepyfile(test_lm=CACHED_TEST)
    monkeypatch.setenv("OUT", "ns")
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*InvalidArgument: check_lm: CachedLM returned a SimpleNamespace, whose logits the "
                                 "golden cannot record*CausalLMOutputWithPast(logits=..., past_key_values=...)*"])
    assert not (project.path / "goldens" / "lm").exists()


def test_a_decode_failure_names_the_batch_rows_it_is_in(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode kernel that ignores the padding mask fails only the left-padded rows: the failure
    names them, and says they are the padded ones."""
    project.makepyfile(test_lm='''
import torch
from conftest import build, ids

def test_lm(parity):
    x = ids()
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    parity.check_lm(build(), x, attention_mask=mask, name="lm", dtypes=["float32"], generate=3)
''')
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "decode-nomask")
    result = project.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*lm: KV-cache decoding (the continuation's 3 steps*propagated error *x the "
                                 "reference's (budget 3x)*; it fails only in batch row 1 of 0-1, exactly the row with "
                                 "padding in the prompt (attention_mask 0)*"])
    rows = _lm(project, "float32")["cached_decode"]["row_ratios"]
    assert rows[0] <= 3 < rows[1]
