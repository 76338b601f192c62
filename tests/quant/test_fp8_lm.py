"""check_lm on an FP8 model through the plugin: captured as the OCP checkpoint, an FNUZ port's
perplexity, KL and token agreement are judged with its quantization noise allowed (docs/fp8.md),
and a conversion bug still fails with its module named and its cause beside it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

TEST_FILE = f'''
import os, sys
sys.path[:0] = [{str(TESTS)!r}, {str(TESTS / "quant")!r}]
import fp8_catalogue as C
from parity_models import tokens

def test_lm(parity):
    case = os.environ.get("FP8_CASE")
    m = C.reference() if not case else C.candidate(next(c for c in C.CASES if c.id == case))
    parity.check_lm(m, tokens("none")["input_ids"], name="fp8-lm", dtypes=["bfloat16", "float32"], generate=4)
'''


def test_check_lm_on_an_fnuz_port(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_port=TEST_FILE)
    monkeypatch.delenv("FP8_CASE", raising=False)
    pytester.runpytest("--rocm-parity", "--parity-regen", "-p", "no:cacheprovider").assert_outcomes(passed=1)

    monkeypatch.setenv("FP8_CASE", "alt_fnuz_converted")
    pytester.runpytest("--rocm-parity", "-p", "no:cacheprovider", "--parity-report=rep").assert_outcomes(passed=1)
    # its KV-cache decode carries the same quantization noise, and is judged against it
    doc = json.loads((pytester.path / "rep" / "parity-report.json").read_text())
    cached = next(c for c in doc["checks"] if c["dtype"] == "float32")["extra"]["lm"]["cached_decode"]
    assert cached["quant_noise"] > cached["err_ref"] and cached["ratio"] <= cached["budget"] == 3.0

    monkeypatch.setenv("FP8_CASE", "bug_fnuz_scale_not_doubled")
    result = pytester.runpytest("--rocm-parity", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*culprit: model.layers.1.mlp.down_proj*",
                                 "*likely cause: its dequantized weight is 0.5x the reference's*"])


QWEN3_TEST = '''
import os
import torch
import transformers as tf
from pytest_rocm_parity import convert_to_fnuz, quantize_model

def test_lm(parity):
    torch.manual_seed(0)
    cfg = tf.Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, head_dim=8,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    m = quantize_model(tf.Qwen3ForCausalLM(cfg).eval(), "e4m3fn", weight="channel", activation="token")
    if os.environ.get("FNUZ"):
        convert_to_fnuz(m)
        m.model.layers[1].mlp.down_proj.weight_scale.data /= 2   # the scale not doubled
    ids = torch.randint(2, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, :15], mask[1, :15] = 0, 0
    parity.check_lm(m, ids, attention_mask=mask, name="qwen3-fp8", dtypes=["bfloat16"], generate=3)
'''


def test_the_flip_is_located_beyond_the_quantization_noise_only(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the tokens first flip confidently, a layer is named only where its error there exceeds
    what its own verdict allows, the FNUZ port's activation-quantization noise included: the
    correctly converted layers before the culprit carry that noise at every position."""
    pytester.makepyfile(test_qwen3=QWEN3_TEST)
    monkeypatch.delenv("FNUZ", raising=False)
    pytester.runpytest("--rocm-parity", "--parity-mode=capture", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    monkeypatch.setenv("FNUZ", "1")
    result = pytester.runpytest("--rocm-parity", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*culprit: model.layers.1.mlp.down_proj*"])
    located = [line for line in result.stdout.lines if "layer that diverged first there" in line]
    assert located and not any("model.layers.0" in line for line in located), located
