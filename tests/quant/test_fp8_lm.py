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
