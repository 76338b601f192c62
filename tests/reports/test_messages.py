"""Failure messages: which rows they list, the hints they add, and no Python values leaking into text."""
from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_rocm_parity.judging.assertion import MAX_ROWS, env_line, message, property_text, steps_text, table
from pytest_rocm_parity.judging.records import CheckResult, LayerRecord, LeafMetrics

HERE = Path(__file__).parent
CPU = {"device": "cpu", "device_name": "x86_64", "arch": "x86_64", "torch": "2.13.0+cpu"}
H200 = {"device": "cuda:0", "device_name": "NVIDIA H200", "arch": "sm_90", "torch": "2.11.0+cu130", "cuda": "13.0"}
MI300 = {"device": "cuda:0", "device_name": "AMD Instinct MI300X", "arch": "gfx942", "torch": "2.9.0+rocm6.4",
         "hip": "6.4"}
REPR = re.compile(r"\bNone\b|\[None|\bTrue\b|\bFalse\b")


def _layer(name: str, iso_ok: bool = True, prop_ok: bool = True, ratio: float = 1.0,
           would_pass: float | None = None, budget: float = 10.0) -> LayerRecord:
    iso = LeafMetrics("0", 64, ratio=ratio, ratio_lo=ratio * 0.9, z=0.0 if iso_ok else 9.0)
    prop = LeafMetrics("0", 64, ratio=1.0 if prop_ok else 40.0, rel_to_ref=1e-7 if prop_ok else 1e-4)
    return LayerRecord(name, passed=iso_ok, iso_passed=iso_ok, prop_passed=prop_ok, budget=budget, prop_budget=3.0,
                       iso=iso, prop=prop, would_pass_ratio=would_pass,
                       reason="" if iso_ok and prop_ok else ("isolated error" if not iso_ok else "propagated error"))


def _result(layers: list[LayerRecord], culprit: str | None, first: str | None, ref: dict[str, Any] = H200,
            cand: dict[str, Any] = MI300, **kw: Any) -> CheckResult:
    return CheckResult(test="tests/test_m.py::test_m", name="m", dtype="float32", passed=False, culprit=culprit,
                       culprit_block=culprit, first_divergent=first, layers=layers, reference_env=ref,
                       candidate_env=cand, golden="goldens/m/float32.safetensors", **kw)


def _deep(n: int = 40, bad: int = 20) -> CheckResult:
    """n blocks; block ``bad`` fails in isolation, the three after it drift (propagated only)."""
    layers = [_layer(f"blocks.{i}") for i in range(n)]
    layers[bad] = _layer(f"blocks.{bad}", iso_ok=False, prop_ok=False, ratio=30.0, would_pass=28.0)
    for i in range(bad + 1, bad + 4):
        layers[i] = _layer(f"blocks.{i}", prop_ok=False)
    return _result(layers, f"blocks.{bad}", f"blocks.{bad}")


def test_table_lists_failures_drift_and_culprit_then_counts_the_ok_rows() -> None:
    lines = table(_deep())
    body = lines[1:]
    listed = [l.split()[0] for l in body if l.strip().startswith("blocks.")]
    assert listed == ["blocks.20", "blocks.21", "blocks.22", "blocks.23"]
    assert "<- culprit" in next(l for l in body if l.split()[0] == "blocks.20")
    for name in ("blocks.21", "blocks.22", "blocks.23"):
        assert next(l for l in body if l.split()[0] == name).rstrip().endswith("drift propagated")
    assert body[-1].strip() == "36 more ok (passed isolated and propagated)"
    assert not any("passed (full table" in l or "more layers passed" in l for l in lines)


def test_the_culprits_row_is_listed_however_many_rows_drift_before_it() -> None:
    """A backward bug in the head makes every block before it drift in the gradient pass: the rows
    cut for length are drift rows, never the culprit's or an isolated failure's."""
    layers = [_layer(f"blocks.{i}", prop_ok=False) for i in range(MAX_ROWS + 5)]
    layers.append(_layer("head", iso_ok=False, prop_ok=False, ratio=30.0))
    body = table(_result(layers, "head", "blocks.0"))
    listed = [l.split()[0] for l in body[1:] if l.strip().startswith(("blocks.", "head"))]
    assert listed[-1] == "head" and len(listed) == MAX_ROWS
    assert "<- culprit" in next(l for l in body if l.split()[0] == "head")
    assert body[-1].strip().startswith("... 6 more failing rows not listed (6 drifted propagated")


def test_failing_outputs_are_listed_worst_first_and_the_rest_counted() -> None:
    """A training check's optimizer rows come one per module in name order: the message lists the
    three worst, then how many more."""
    outs = []
    for name, ratio in (("optimizer:a", 5.0), ("optimizer:b", 900.0), ("optimizer:c", 40.0), ("optimizer:d", 7.0),
                        ("optimizer:e", 1.0)):
        rec = _layer(name, iso_ok=ratio < 2, ratio=ratio)
        rec.reason = f"update error {ratio:g}x"
        outs.append(rec)
    text = message(_result([_layer("blocks.0")], None, None, outputs=outs))
    listed = [l.split()[1] for l in text.splitlines() if l.strip().startswith("output optimizer:")]
    assert listed == ["optimizer:b:", "optimizer:c:", "optimizer:d:"], text
    assert "  ... and 1 more outputs out of bounds" in text


def test_modules_the_candidate_never_called_are_named_apart_from_the_ok_count() -> None:
    """A block whose fused kernel used its projection's weights fails; the projection, never called,
    passed nothing and is named, not counted as ok; nested rows judged in isolation only say so."""
    from pytest_rocm_parity.judging.records import NOT_CALLED

    bad = _layer("blocks.0", iso_ok=False, prop_ok=False, ratio=30.0)
    up = _layer("blocks.0.up")
    up.prop = None
    down = LayerRecord("blocks.0.down", level=1, reason=NOT_CALLED)
    lines = table(_result([bad, up, down], "blocks.0", "blocks.0"))
    assert lines[-2].strip() == "1 more ok (passed isolated)"
    assert lines[-1].strip() == ("1 not called by the candidate (fused or bypassed), judged only through their "
                                 "parents: blocks.0.down")
    mixed = table(_result([bad, up, _layer("blocks.1")], "blocks.0", "blocks.0"))
    assert mixed[-1].strip() == "2 more ok (passed isolated; 1 of them propagated too)"


def test_a_row_shows_the_lower_bound_that_decides_the_isolated_verdict() -> None:
    """A ratio far above the budget passes isolated when its lower bound does not exceed the budget
    (an error on a few tokens): the row shows the bound, so it does not read as a failure."""
    few = _layer("blocks.3", prop_ok=False, ratio=5.8e4, budget=1.75)
    assert few.iso is not None
    few.iso.ratio_lo = 1.3
    lines = table(_result([few, _layer("blocks.4")], None, "blocks.3"))
    head = lines[0].split()
    row = next(l for l in lines if l.split()[0] == "blocks.3").split()
    assert head[:5] == ["layer", "iso", "ratio", "ratio", "lo"]
    assert row[1:4] == ["5.8e+04", "1.3", "1.75"]
    assert row[-2:] == ["drift", "propagated"]


def test_more_failing_rows_than_fit_are_counted_as_failing_not_as_passed() -> None:
    n = MAX_ROWS + 10
    layers = [_layer(f"l.{i}", prop_ok=False) for i in range(n)] + [_layer("ok.0"), _layer("ok.1")]
    layers[0] = _layer("l.0", iso_ok=False, prop_ok=False, ratio=50, would_pass=48)
    lines = table(_result(layers, "l.0", "l.0"))
    assert sum(1 for l in lines if l.strip().startswith("l.")) == MAX_ROWS
    assert "... 10 more failing rows not listed (10 drifted propagated" in "\n".join(lines)
    assert lines[-1].strip() == "2 more ok (passed isolated and propagated)"


def test_outputs_that_differ_after_every_layer_passed_say_so_once() -> None:
    """No layer fails either check, the outputs do: no table header without rows, and no line that
    points at a first divergent layer there is none of."""
    from pytest_rocm_parity.judging.judge import finish
    from pytest_rocm_parity.judging.tolerance import Tolerance

    out = LayerRecord("<output>.logits", passed=False, prop_passed=False, reason="propagated error 40x")
    r = finish(_result([_layer("blocks.0"), _layer("blocks.1")], None, None, outputs=[out]), Tolerance())
    text = message(r)
    assert "iso ratio" not in text and "2 more ok" in text
    assert "culprit: none among the selected modules" in text and "accumulated" not in text
    assert "see first divergent layer" not in text and "after the last selected module" in text


def test_suggested_tolerance_only_within_ten_times_the_budget() -> None:
    modest = _deep()   # would pass at ratio 28 with a budget of 10: 2.8x the budget
    assert 'would have passed with tolerance=Tolerance(ratio={"float32": 28})' in message(modest)
    absurd = _deep()
    absurd.layers[20] = _layer("blocks.20", iso_ok=False, prop_ok=False, ratio=1e6, would_pass=990000)
    text = message(absurd)
    assert "would have passed" not in text and "990000" not in text
    # the limit is ten times the layer's own budget
    edge = _deep()
    edge.layers[20] = _layer("blocks.20", iso_ok=False, ratio=101, would_pass=101, budget=10.0)
    assert "would have passed" not in message(edge)
    edge.layers[20] = _layer("blocks.20", iso_ok=False, ratio=100, would_pass=100, budget=10.0)
    assert 'Tolerance(ratio={"float32": 100})' in message(edge)


def test_regen_hint_only_when_the_candidate_runs_where_the_golden_was_captured() -> None:
    cross = _deep()
    assert "regenerate" not in message(cross)   # H200 golden, MI300 candidate: a backend difference
    same = _result(_deep().layers, "blocks.20", "blocks.20", ref=CPU, cand=dict(CPU))
    text = message(same)
    assert ("if this change is intended, regenerate with pytest --rocm-parity --parity-regen='m' "
            "'tests/test_m.py::test_m'") in text
    # another GPU index of the same kind is the same platform
    gpu = _result(_deep().layers, "blocks.20", "blocks.20", ref=H200, cand={**H200, "device": "cuda:3"})
    assert "--parity-regen='m'" in message(gpu)


def test_no_python_values_in_messages_or_junit_properties() -> None:
    drift_only = _result([_layer("a"), _layer("b")], None, None,
                         extra={"lm": {"ppl": 3.0, "ppl_ref": 3.0, "ppl_rel_delta": 0.0, "top1_agreement": 1.0,
                                       "confident_flips": 0, "kl_mean": 0.0, "kl_max": 0.0,
                                       "generation": {"first_divergent_step": [None, None]}}})
    text = message(drift_only)
    assert not REPR.search(text), text
    assert "first divergent generation step: none (all 2 sequences match)" in text
    assert steps_text([None, 3]) == "sequence 1 at step 3; 1 of 2 sequences match"
    passing = _result([_layer("a")], None, None)
    passing.passed = True
    assert property_text(passing) == "PASS"
    assert property_text(drift_only) == "FAIL; no culprit in isolation"
    assert property_text(_deep()) == "FAIL; culprit=blocks.20; first_divergent=blocks.20"


# ---------------------------------------------------------------------------------------------
# through pytest

TEST_FILE = '''
import os
import parity_models


def test_tiny(parity):
    bug = os.environ.get("PARITY_TEST_BUG", "")
    m, x = parity_models.block_stack(int(bug)) if bug else parity_models.block_stack()
    if os.environ.get("PARITY_TEST_WIDER"):
        m.blocks[0].fc1 = type(m.blocks[0].fc1)(32, 64)
    parity.check(m, x, name="tiny", dtypes=["float32"])
'''

HYPOTHESIS_FILE = '''
from hypothesis import given, strategies as st


@given(st.integers(0, 3))
def test_fuzzed(parity, n):
    parity.compare_op(abs, abs, n)
'''


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    shutil.copy(HERE.parent / "parity_models.py", pytester.path / "parity_models.py")
    monkeypatch.syspath_prepend(str(pytester.path))
    pytester.makepyfile(test_tiny=TEST_FILE)
    cap = pytester.runpytest_inprocess("--rocm-parity", "--parity-mode=capture", "-p", "no:cacheprovider")
    cap.assert_outcomes(passed=1)
    return pytester


def test_failure_through_pytest_regen_hint_and_clean_junit(project: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rep = project.runpytest_inprocess("--rocm-parity", "--junitxml=ok.xml", "-p", "no:cacheprovider")
    rep.assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(project.path / "ok.xml").iter("property")}
    assert props["parity[tiny][float32]"] == "PASS"      # not "culprit=None; first_divergent=None"
    monkeypatch.setenv("PARITY_TEST_BUG", "2")
    rep = project.runpytest_inprocess("--rocm-parity", "--junitxml=bad.xml", "-p", "no:cacheprovider")
    rep.assert_outcomes(failed=1)
    out = rep.stdout.str()
    # captured and replayed on this CPU: the golden may simply be out of date
    assert "if this change is intended, regenerate with pytest --rocm-parity --parity-regen='tiny'" in out
    assert "15 more ok (passed isolated; 3 of them propagated too)" in out and "more layers passed" not in out
    assert not re.search(r"\bNone\b", out)
    props = {p.get("name"): p.get("value") for p in ET.parse(project.path / "bad.xml").iter("property")}
    assert props["parity[tiny][float32]"] == "FAIL; culprit=blocks.2; first_divergent=blocks.2"


def test_a_plugin_error_is_printed_once(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_TEST_WIDER", "1")   # the model's structure changed: a stale golden
    rep = project.runpytest_inprocess("--rocm-parity", "-p", "no:cacheprovider")
    rep.assert_outcomes(failed=1)
    out = rep.stdout.str()
    assert "During handling of the above exception" not in out
    failures = out.split("= FAILURES =")[1].split("rocm-parity summary")[0]
    assert failures.count("stale golden") == 1, failures
    summary = out.split("rocm-parity summary")[1].split("short test summary")[0]
    assert summary.count("stale golden") == 1, summary   # the check's line there says why it has no verdict


def test_hypothesis_test_with_the_parity_fixture_is_told_to_use_parity_ops(project: pytest.Pytester) -> None:
    project.makepyfile(test_fuzz=HYPOTHESIS_FILE)
    rep = project.runpytest_inprocess("--rocm-parity", "test_fuzz.py", "-p", "no:cacheprovider")
    rep.assert_outcomes(errors=1)
    out = rep.stdout.str()
    assert "use the session-scoped 'parity_ops' fixture instead" in out
    assert "FailedHealthCheck" not in out and "function_scoped_fixture" not in out.split("parity_ops")[0]


def test_long_module_names_are_shown_whole_in_the_table() -> None:
    """Two sibling norms differ only in their names' tails; both tails must reach the table."""
    a, b = "model.decoder.layers.1.encoder_attn_layer_norm", "model.decoder.layers.1.self_attn_layer_norm_x"
    res = _result([_layer(a, iso_ok=False, ratio=30.0), _layer(b, prop_ok=False)], a, b)
    text = "\n".join(table(res))
    assert a in text and b in text


def test_a_fast_replay_says_it_did_not_judge_the_propagated_pass() -> None:
    """The fast replay runs no propagated pass: its message must not claim every layer stayed within
    its propagated budget, which the full replay of the same bug contradicts."""
    from parity_models import capture_then_replay, llama, plant, tokens
    from pytest_rocm_parity.runner.engine import CheckSpec

    texts = {}
    for kind in ("fast", "full"):
        res, = capture_then_replay(llama, plant(llama(), "model.layers.1.mlp.act_fn"), tokens(),
                                   CheckSpec(name="m", dtypes=["float32"], replay=kind))
        assert not res.passed and res.culprit == "model.layers.1.mlp.act_fn"
        texts[kind] = message(res)
    assert "first divergent layer (propagated): not judged by the fast replay" in texts["fast"]
    assert "within its propagated budget" not in texts["fast"]
    assert "first divergent layer (propagated): model.layers.1" in texts["full"]


def test_the_environment_line_names_a_cpu_once_and_a_gpu_with_its_arch() -> None:
    assert env_line({"device": "cpu", "device_name": "x86_64", "arch": "x86_64", "torch": "2.13.0+cpu"}) == \
        "cpu x86_64 torch 2.13.0+cpu"
    assert env_line({"device": "cuda", "device_name": "NVIDIA H200", "arch": "sm_90", "torch": "2.11.0",
                     "cuda": "13.0"}) == "cuda NVIDIA H200 (sm_90) torch 2.11.0 CUDA 13.0"


def test_a_culprit_whose_inner_modules_all_pass_is_said_to_hold_the_fault_in_its_own_code() -> None:
    """An attention block fails while its projections pass: the softmax or scaling it computes
    itself is where to look, and the message says so; a culprit with nothing judged inside gets no such line."""
    layers = [_layer("attn", iso_ok=False, prop_ok=False, ratio=30.0)] + [
        _layer(f"attn.{p}") for p in ("q_proj", "k_proj", "v_proj", "o_proj", "rotary")] + [_layer("mlp")]
    text = message(_result(layers, "attn", "attn"))
    line = next(l for l in text.splitlines() if l.strip().startswith("inside it:"))
    assert line.strip().startswith("inside it: q_proj, k_proj, v_proj, o_proj ... each pass in isolation")
    assert "own forward's code" in line
    alone = message(_result([_layer("attn", iso_ok=False, prop_ok=False, ratio=30.0), _layer("mlp")], "attn", "attn"))
    assert "inside it:" not in alone


def test_nan_out_of_inputs_within_budget_names_the_first_divergent_module_beside_the_code_between() -> None:
    """A module that passes on the golden's inputs and turns its propagated inputs, within budget,
    into NaN may be at fault on values the golden lacks (an FP8 code at negative zero): the message
    names it beside the parent's code, which the region alone would blame."""
    nan = _layer("blocks.1", prop_ok=False)
    assert nan.prop is not None
    nan.prop.nonfinite = 256
    region = {"after": "blocks.0", "before": "blocks.1", "modules": [], "layers": []}
    text = message(_result([_layer("blocks.0"), nan, _layer("blocks.2", prop_ok=False)], None, "blocks.1",
                           extra={"unselected_region": region}))
    assert "in no module: the forward code of their parent" in text
    assert ("or blocks.1 itself: its propagated output holds 256 non-finite value(s) where the truth is finite, "
            "from inputs within their budget, and it passed on the golden's inputs") in text, text
    finite = message(_result([_layer("blocks.0"), _layer("blocks.1", prop_ok=False)], None, "blocks.1",
                             extra={"unselected_region": region}))
    assert "itself" not in finite


def test_the_lm_line_names_non_finite_logits_where_notes_may_be_capped() -> None:
    lm = {"ppl": float("nan"), "ppl_ref": 280.0, "ppl_rel_delta": float("nan"), "top1_agreement": 0.0,
          "confident_flips": 56, "kl_mean": float("nan"), "kl_max": float("nan"), "fails": ["perplexity"],
          "nonfinite": {"forward": 14336, "generation": 8}}
    text = message(_result([_layer("blocks.0")], None, None, extra={"lm": lm}))
    line = next(l for l in text.splitlines() if l.strip().startswith("lm: ppl"))
    assert line.endswith("non-finite candidate logits where the reference's are finite (14336 in the full forward, "
                         "8 step(s) in greedy generation)"), line
