"""The judging rule on synthetic errors with known answers (no model involved)."""
from __future__ import annotations

import math

import pytest
import torch

from pytest_rocm_parity.judging.compare import exact_metrics, float_metrics
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.judging.judge import Rule, judge_layer, leaf_failure
from pytest_rocm_parity.judging.records import LayerRecord
from pytest_rocm_parity.judging.tolerance import Tolerance, coerce

U_BF16 = 2.0**-8


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).to(torch.float64)


@pytest.fixture
def truth() -> torch.Tensor:
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_same_rounding_is_ratio_one(truth: torch.Tensor) -> None:
    ref = _rounded(truth, torch.bfloat16)
    m = float_metrics("0", ref, ref, truth, U_BF16)
    assert m.ratio == pytest.approx(1.0) and m.z == 0.0
    assert leaf_failure(m, Tolerance(), "bfloat16", isolated=True) == ""


def test_independent_equal_noise_passes(truth: torch.Tensor) -> None:
    """Two correct backends: independent rounding-sized errors of the same scale."""
    g = torch.Generator().manual_seed(1)
    ref = truth + truth.abs() * U_BF16 * 0.3 * torch.randn(truth.shape, generator=g, dtype=torch.float64)
    cand = truth + truth.abs() * U_BF16 * 0.3 * torch.randn(truth.shape, generator=g, dtype=torch.float64)
    m = float_metrics("0", cand, ref, truth, U_BF16)
    assert 0.9 < m.ratio < 1.1
    assert abs(m.z) < 4
    assert leaf_failure(m, Tolerance(), "bfloat16", isolated=True) == ""


def test_systematic_extra_error_fails(truth: torch.Tensor) -> None:
    """A 1% scale bug on top of rounding: many sigma farther from the truth."""
    ref = _rounded(truth, torch.bfloat16)
    cand = _rounded(truth * 1.01, torch.bfloat16)
    m = float_metrics("0", cand, ref, truth, U_BF16)
    assert m.ratio > 3 and m.ratio_lo > 1.25 and m.z > 3
    reason = leaf_failure(m, Tolerance(), "bfloat16", isolated=True)
    assert "isolated error" in reason and f"budget {Tolerance().ratio_for('bfloat16'):g}x" in reason
    assert leaf_failure(m, Tolerance(ratio=50), "bfloat16", isolated=True) == ""


def test_small_tensor_needs_significance() -> None:
    """Four elements cannot prove a 1.5x ratio: the jackknife bound stays low."""
    truth = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    ref = truth + torch.tensor([1e-2, -1e-2, 1e-2, -1e-2], dtype=torch.float64)
    cand = truth + torch.tensor([1.5e-2, -1e-2, 2e-2, -0.5e-2], dtype=torch.float64)
    m = float_metrics("0", cand, ref, truth, U_BF16)
    assert m.ratio > 1.25
    assert leaf_failure(m, Tolerance(), "bfloat16", isolated=True) == ""


def test_exact_reference_uses_floor() -> None:
    """An exact reference (embedding lookup) with a candidate off by a fraction of an ulp passes."""
    truth = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    ref = truth.clone()
    cand = truth * (1 + U_BF16 * 0.05)
    m = float_metrics("0", cand, ref, truth, U_BF16)
    assert math.isfinite(m.ratio) and m.ratio < 1.0


def test_nonfinite_candidate_fails_with_index(truth: torch.Tensor) -> None:
    ref = _rounded(truth, torch.float16)
    cand = ref.clone()
    cand[3, 7] = float("nan")
    cand[5, 1] = float("inf")
    m = float_metrics("0", cand, ref, truth, 2.0**-11)
    assert m.nonfinite == 2 and m.first_nonfinite == [3, 7]
    assert "non-finite" in leaf_failure(m, Tolerance(), "float16", isolated=True)


def test_nan_in_both_policy(truth: torch.Tensor) -> None:
    ref = truth.clone()
    ref[0, 0] = float("nan")
    t = ref.clone()
    cand = ref.clone()
    assert float_metrics("0", cand, ref, t, 2.0**-24).nonfinite == 0
    assert float_metrics("0", cand, ref, t, 2.0**-24, nan_policy="fail").nonfinite == 1


def test_exact_kinds_must_match() -> None:
    a = torch.tensor([1, 2, 3])
    assert exact_metrics("0", a, a).mismatches == 0
    m = exact_metrics("0", torch.tensor([1, 5, 3]), a)
    assert m.mismatches == 1 and "differ" in m.note


@pytest.mark.parametrize("flips, scores_ok, passes", [(1, True, True), (5, True, True), (6, True, False),
                                                      (1, False, False)])
def test_a_routers_indices_may_flip_at_near_ties_only(truth: torch.Tensor, flips: int, scores_ok: bool,
                                                      passes: bool) -> None:
    """Integer outputs beside floating ones (a router's top-k indices beside its scores) pass with at
    most 1% of them flipped while every floating output passes; alone they must match exactly."""
    chosen = torch.arange(512) % 8
    moved = chosen.clone()
    moved[:flips] += 1
    indices = exact_metrics("2", moved, chosen)
    ref = _rounded(truth, torch.bfloat16)
    scores = float_metrics("1", ref if scores_ok else _rounded(truth * 1.01, torch.bfloat16), ref, truth, U_BF16)
    rule = Rule.of(Tolerance(), "bfloat16")
    rec = LayerRecord(name="gate")
    judge_layer(rec, [scores, indices], [], rule)
    assert rec.iso_passed is passes, rec.reason
    alone = LayerRecord(name="argmax")
    judge_layer(alone, [indices], [], rule)
    assert not alone.iso_passed and "differ" in alone.reason


@pytest.mark.parametrize("n, flips, passes", [(128, 2, True), (128, 3, False), (64, 2, False), (4, 2, False)])
def test_one_flip_of_two_elements_is_allowed_from_a_hundred_choices(truth: torch.Tensor, n: int, flips: int,
                                                                    passes: bool) -> None:
    """Two tied experts listed the other way round differ in two of a top-2 router's indices: over 1%
    of 64 tokens x 2 choices, and a near-tie all the same; two of a batch's four labels are not."""
    chosen = torch.arange(n) % 8
    moved = chosen.clone()
    moved[:flips] += 1
    ref = _rounded(truth, torch.bfloat16)
    rec = LayerRecord(name="gate")
    judge_layer(rec, [float_metrics("1", ref, ref, truth, U_BF16), exact_metrics("2", moved, chosen)], [],
                Rule.of(Tolerance(), "bfloat16"))
    assert rec.iso_passed is passes, rec.reason


def test_shape_change_fails() -> None:
    m = float_metrics("0", torch.zeros(3), torch.zeros(4), torch.zeros(4), U_BF16)
    assert leaf_failure(m, Tolerance(), "float32", isolated=True).startswith("shape")


def test_propagated_rule_is_dynamo_multiplier(truth: torch.Tensor) -> None:
    # accumulated drift well above one rounding (the rule's additive floor)
    ref = truth + 0.02 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    worse = truth + 2.5 * (ref - truth)
    far = truth + 3.5 * (ref - truth)
    assert leaf_failure(float_metrics("0", worse, ref, truth, U_BF16), Tolerance(), "bfloat16", isolated=False) == ""
    assert "propagated" in leaf_failure(float_metrics("0", far, ref, truth, U_BF16), Tolerance(), "bfloat16", isolated=False)


def test_per_layer_override_and_would_pass(truth: torch.Tensor) -> None:
    ref = _rounded(truth, torch.bfloat16)
    cand = _rounded(truth * 1.02, torch.bfloat16)
    m = float_metrics("0", cand, ref, truth, U_BF16)
    rec = LayerRecord(name="model.layers.3.mlp")
    judge_layer(rec, [m], [], Rule.of(Tolerance().for_layer(rec.name), "bfloat16"))
    assert not rec.passed and rec.would_pass_ratio is not None and rec.would_pass_ratio >= m.ratio_lo
    rec2 = LayerRecord(name="model.layers.3.mlp")
    override = Tolerance(layers={"model.layers.*.mlp": Tolerance(ratio=rec.would_pass_ratio)})
    judge_layer(rec2, [m], [], Rule.of(override.for_layer(rec2.name), "bfloat16"))
    assert rec2.passed


def test_propagated_floor_is_one_rounding() -> None:
    """An exact reference: a single-ulp difference in a tiny output is not a multiple of nothing."""
    truth = torch.tensor([1.0, 2.0, -3.0, 0.5, 4.0, -1.0, 2.5, 3.0], dtype=torch.float64)
    cand = truth.clone()
    cand[2] = torch.nextafter(torch.tensor(-3.0, dtype=torch.float32), torch.tensor(0.0)).double()
    m = float_metrics("0", cand, truth.clone(), truth, 2.0**-24)
    assert leaf_failure(m, Tolerance(), "float32", isolated=False) == ""


def test_tf32_policy_widens_only_fp32(truth: torch.Tensor) -> None:
    ref = truth + truth * 2.0**-24 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    tf32 = truth + truth * 2.0**-11 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    strict = float_metrics("0", tf32, ref, truth, Tolerance().unit_roundoff("float32"))
    policy = float_metrics("0", tf32, ref, truth, Tolerance(tf32=True).unit_roundoff("float32"))
    assert leaf_failure(strict, Tolerance(), "float32", isolated=True)
    assert leaf_failure(policy, Tolerance(tf32=True), "float32", isolated=True) == ""


@pytest.mark.parametrize("drift, fails", [(8, False), (35, True)])
def test_tf32_policy_lets_outputs_drift_ten_tf32_roundoffs(truth: torch.Tensor, drift: float, fails: bool) -> None:
    """Against an exact reference the outputs may drift TF32_PROPAGATED x TF32_FLOOR_ULPS = 10 TF32
    roundoffs of their RMS (measured TF32 drift: 5.2-5.5), not 40."""
    noise = torch.randn(truth.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    rms = float(truth.pow(2).mean().sqrt())
    cand = truth + noise / float(noise.pow(2).mean().sqrt()) * drift * 2.0**-11 * rms
    m = float_metrics("0", cand, truth.clone(), truth, Tolerance(tf32=True).unit_roundoff("float32"))
    assert bool(leaf_failure(m, Tolerance(tf32=True), "float32", isolated=False)) == fails


@pytest.mark.parametrize("bad", [{"ratio": 0.5}, {"propagated": -1}, {"nan": "ignore"}, {"bogus": 1}])
def test_bad_tolerance_is_clear(bad: dict) -> None:
    with pytest.raises(InvalidArgument, match="Tolerance|tolerance"):
        coerce(bad)


def test_coerce_number_is_ratio() -> None:
    assert coerce(2.0).ratio == 2.0 and coerce(None) == Tolerance()


def test_metrics_from_columns_fills_each_field_from_its_column() -> None:
    """metrics_from_columns builds LeafMetrics positionally (host time): each Metric column lands in
    the field of its name."""
    import numpy as np

    from pytest_rocm_parity.judging.compare import Metric, metrics_from_columns

    cols = np.arange(1.0, len(Metric) + 1.0)[None, :]
    (m,) = metrics_from_columns(["0"], [7], cols)
    assert (m.leaf, m.numel, m.kind, m.nonfinite, m.note) == ("0", 7, "float", 0, "")
    assert {c.name.lower(): getattr(m, c.name.lower()) for c in Metric} == {c.name.lower(): c + 1.0 for c in Metric}


def test_a_blocks_row_shows_its_output_far_over_budget_not_an_exact_one_beside_it(truth: torch.Tensor) -> None:
    """A block returns (hidden, residual): the residual is exact, the hidden state is wrong on one
    tile only, so its bound is tiny. The row reads out the hidden state, the one to look at."""
    ref = _rounded(truth, torch.bfloat16)
    bad = ref.clone()
    bad[0, :64] += 0.5
    hidden = float_metrics("0", bad, ref, truth, U_BF16)
    residual = float_metrics("1", ref, ref, truth, U_BF16)
    assert hidden.ratio > 10 and hidden.ratio_lo < residual.ratio_lo, (hidden, residual)
    rec = LayerRecord(name="layers.0")
    judge_layer(rec, [hidden, residual], [], Rule.of(Tolerance().for_layer(rec.name), "bfloat16"))
    assert rec.iso_passed and rec.iso is hidden


def test_a_layer_over_its_bound_that_the_sign_test_passes_gets_a_note(truth: torch.Tensor) -> None:
    """Exact on 70% of elements, 40x the reference's error on the other 30%: the RMS bound is far
    over the budget, the sign test negative, so the layer passes, and a note says why."""
    from pytest_rocm_parity.judging.judge import finish
    from pytest_rocm_parity.judging.records import CheckResult

    g = torch.Generator().manual_seed(3)
    noise = truth.abs() * U_BF16 * torch.randn(truth.shape, generator=g, dtype=torch.float64)
    ref = truth + noise
    wrong = torch.rand(truth.shape, generator=g) < 0.3
    cand = torch.where(wrong, truth + 40 * noise, truth)
    m = float_metrics("0", cand, ref, truth, U_BF16)
    tol = Tolerance()
    assert m.ratio_lo > tol.ratio_for("bfloat16") and m.z < 0
    rec = LayerRecord(name="blocks.0")
    judge_layer(rec, [m], [], Rule.of(tol, "bfloat16"))
    result = finish(CheckResult(test="t", name="n", dtype="bfloat16", passed=True, layers=[rec]), tol)
    assert result.passed
    (note,) = [n for n in result.notes if n.startswith("blocks.0:")]
    assert "sign test z=-" in note and "a failure needs > 3" in note
    # a layer whose bound is within budget gets none
    ok = LayerRecord(name="blocks.1")
    judge_layer(ok, [float_metrics("0", ref, ref, truth, U_BF16)], [], Rule.of(tol, "bfloat16"))
    assert not [n for n in finish(CheckResult(test="t", name="n", dtype="bfloat16", passed=True, layers=[ok]),
                                  tol).notes if n.startswith("blocks.1:")]
    # a module that makes discrete choices is told apart: near-ties, not advice to fail it
    rec.decides = True
    result = finish(CheckResult(test="t", name="n", dtype="bfloat16", passed=True, layers=[rec]), Tolerance())
    (note,) = [n for n in result.notes if n.startswith("blocks.0:")]
    assert "near-ties" in note and "z=" not in note.split("passes.")[1]


def test_a_leaf_that_is_non_finite_everywhere_shows_an_infinite_ratio_not_zero() -> None:
    """With no element where both sides are finite nothing measures the error but the count of
    non-finite ones; a ratio of 0 beside FAIL in the table reads as a contradiction."""
    ref = torch.randn(4, 8)
    m = float_metrics("0", torch.full_like(ref, float("nan")), ref, ref.double(), U_BF16)
    assert m.nonfinite == 32 and m.ratio == m.ratio_lo == math.inf
    partly = ref.clone()
    partly[0, 0] = float("inf")
    m = float_metrics("0", partly, ref, ref.double(), U_BF16)
    assert m.nonfinite == 1 and math.isfinite(m.ratio)


def test_a_propagated_bound_stays_under_its_ratio_where_one_rounding_floors_the_reference(truth: torch.Tensor) -> None:
    """An exact reference (a lookup) against a candidate a rounding off: the propagated ratio is floored
    at one rounding, and its bound with it, so layers.csv never shows a bound over its ratio."""
    ref = truth.clone()
    cand = _rounded(truth, torch.bfloat16)
    m = float_metrics("0", cand, ref, truth, U_BF16)
    assert m.ratio_lo > 1.0, m   # against the quarter floor
    rec = LayerRecord(name="embed")
    judge_layer(rec, [], [m], Rule.of(Tolerance(), "bfloat16"))
    assert rec.prop is not None and 0 < rec.prop.ratio_lo <= rec.prop.ratio <= 1.0, rec.prop
    assert rec.prop.ratio_lo / rec.prop.ratio == pytest.approx(m.ratio_lo / m.ratio)
