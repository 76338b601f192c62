"""The FP8 catalogue (fp8_catalogue.py): an OCP (e4m3fn) decoder captured here, replayed as each
candidate. Correct ports (FNUZ with the scales adjusted, equivalent per-channel scales, another
accumulation order, the same format, weight-only dequantized in bf16) pass; every bug fails with its
module named and, where the bug has a format pattern, the note naming its cause. docs/fp8.md has
the table."""
from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch
from torch import nn

import fp8_catalogue as C
from parity_models import tokens, verdicts
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay

LADDER = ["bfloat16", "float32"]


@pytest.fixture(scope="module")
def goldens() -> dict[bool, tuple[GoldenStore, CheckSpec]]:
    out = {}
    for weight_only in (False, True):
        spec = CheckSpec(name=f"fp8-{'w8a16' if weight_only else 'w8a8'}", dtypes=LADDER, drill=2)
        store = GoldenStore(tempfile.mkdtemp(prefix="parity-fp8-"))
        capture(C.reference(weight_only), tokens("none"), spec, store, "cpu")
        out[weight_only] = (store, spec)
    return out


@pytest.mark.parametrize("case", C.CASES, ids=lambda c: c.id)
def test_case(case: C.Case, goldens: dict[bool, Any]) -> None:
    store, spec = goldens[case.weight_only]
    results = replay(C.candidate(case), tokens("none"), spec, store, "cpu")
    if not case.bug:
        assert all(r.passed for r in results), verdicts(results)
        return
    failing = [r for r in results if not r.passed]
    assert failing, verdicts(results)
    assert all(r.culprit == case.module for r in failing), verdicts(results)
    if case.cause:
        notes = [n for r in failing for n in r.notes if n.startswith(f"{case.module}:")]
        assert notes and all(case.cause in n for n in notes), notes


def test_the_failure_message_puts_the_cause_beside_the_culprit(goldens: dict[bool, Any]) -> None:
    from pytest_rocm_parity.judging.assertion import message

    store, spec = goldens[False]
    case = next(c for c in C.CASES if c.id == "bug_fnuz_scale_not_doubled")
    failing = [r for r in replay(C.candidate(case), tokens("none"), spec, store, "cpu") if not r.passed]
    lines = message(failing[0]).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"  culprit: {case.module}"))
    assert lines[at + 1].startswith("    likely cause: its dequantized weight is 0.5x the reference's")
    assert sum("was not doubled" in line for line in lines) == 1
    # the table shows the same judgement: the ratio against the noise, the noise budget
    culprit = next(l for l in failing[0].layers if l.name == case.module)
    assert culprit.budget == 3.0 and culprit.iso is not None and culprit.iso.ratio > 3.0
    assert culprit.would_pass_ratio is None


def test_a_sketch_golden_judges_an_fnuz_port_by_its_noise_too() -> None:
    """A sketch golden keeps what each module is and the noise over its sketches: the FNUZ port
    passes, a scale left undoubled is named (the lm_head case is out of a propagated-only reach)."""
    spec = CheckSpec(name="fp8-sketch", dtypes=LADDER, drill=2, sketch=16)
    store = GoldenStore(tempfile.mkdtemp(prefix="parity-fp8-"))
    capture(C.reference(), tokens("none"), spec, store, "cpu")
    by_id = {c.id: c for c in C.CASES}
    ok = replay(C.candidate(by_id["alt_fnuz_converted"]), tokens("none"), spec, store, "cpu")
    assert all(r.passed for r in ok), verdicts(ok)
    bad = replay(C.candidate(by_id["bug_fnuz_scale_not_doubled"]), tokens("none"), spec, store, "cpu")
    assert all(not r.passed and r.culprit == C.TARGET for r in bad), verdicts(bad)


@pytest.mark.parametrize("weight,activation", [("channel", "tensor"), ("tensor", "tensor"), ("channel", None)])
def test_the_fnuz_port_passes_for_each_scale_scheme_with_padding(weight: str, activation: str | None) -> None:
    """Per-tensor dynamic activation scales and weight-only too, on a right-padded batch."""
    from parity_models import llama
    from pytest_rocm_parity.quant.fp8 import convert_to_fnuz, quantize_model

    spec = CheckSpec(name="fp8-scheme", dtypes=LADDER, drill=2)
    store = GoldenStore(tempfile.mkdtemp(prefix="parity-fp8-"))
    capture(quantize_model(llama(), weight=weight, activation=activation), tokens("right"), spec, store, "cpu")
    cand = convert_to_fnuz(quantize_model(llama(), weight=weight, activation=activation))
    results = replay(cand, tokens("right"), spec, store, "cpu")
    assert all(r.passed for r in results), verdicts(results)


def test_a_derived_golden_keeps_the_codes_and_the_noise(goldens: dict[bool, Any]) -> None:
    """golden.derive (a shallower, single-precision golden from a full one) carries the quantized
    storage and the noise: the FNUZ port passes against it and a bug still gets its cause."""
    from pytest_rocm_parity.golden.derive import derive

    store, spec = goldens[False]
    derive(store, spec.name, store, "fp8-derived", ["float32"], 1)
    shallow = CheckSpec(name="fp8-derived", dtypes=["float32"], drill=1)
    by_id = {c.id: c for c in C.CASES}
    (ok,) = replay(C.candidate(by_id["alt_fnuz_converted"]), tokens("none"), shallow, store, "cpu")
    assert ok.passed, verdicts([ok])
    (bad,) = replay(C.candidate(by_id["bug_fnuz_scale_not_doubled"]), tokens("none"), shallow, store, "cpu")
    assert not bad.passed and bad.culprit == "model.layers.1.mlp", verdicts([bad])
    # the culprit at drill 1 is the MLP; the codes inside it, kept by the derived golden, give the cause
    assert any(n.startswith(f"model.layers.1.mlp: inside it, {C.TARGET}: its dequantized weight is 0.5x")
               for n in bad.notes), bad.notes


class _OtherStacksFp8(nn.Module):
    """Another serving stack's FP8 layer: codes and scale under the usual names, no Fp8Linear API."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = (self.weight.to(torch.float32) * self.weight_scale).to(x.dtype)
        return torch.nn.functional.linear(x, w)


def test_another_stacks_fp8_layer_gets_its_weight_diagnosed(goldens: dict[bool, Any]) -> None:
    store, spec = goldens[False]
    model = C.candidate(next(c for c in C.CASES if c.id == "bug_fnuz_scale_not_doubled"))
    model.get_submodule(C.TARGET).__class__ = _OtherStacksFp8
    failing = [r for r in replay(model, tokens("none"), spec, store, "cpu") if not r.passed]
    assert failing and all(r.culprit == C.TARGET for r in failing), verdicts(failing)
    assert any(n.startswith(f"{C.TARGET}: its dequantized weight is 0.5x") for r in failing for n in r.notes)
