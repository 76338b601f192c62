"""Turn leaf metrics into per-layer verdicts, the culprit and the first divergent layer."""
from __future__ import annotations

import math

from pytest_rocm_parity.records import CheckResult, LayerRecord, LeafMetrics
from pytest_rocm_parity.tolerance import Tolerance


def _round_up(x: float) -> float:
    """Two significant digits, rounded up: a tolerance a user can paste."""
    if not math.isfinite(x) or x <= 0:
        return x
    e = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10**e) * 10**e


def leaf_failure(m: LeafMetrics, tol: Tolerance, rung: str, isolated: bool) -> str:
    """'' if the leaf passes, else the reason."""
    if m.note.startswith("shape"):
        return m.note
    if m.kind == "exact":
        return m.note if m.mismatches else ""
    if m.nonfinite:
        return m.note
    if isolated:
        budget = tol.ratio_for(rung)
        if m.ratio_lo > budget and m.z > tol.z:
            return (f"isolated error {m.ratio:.3g}x the reference's (>= {m.ratio_lo:.3g}x at "
                    f"{tol.confidence:g} sigma; budget {budget:g}x; sign test z={m.z:+.1f})")
        return ""
    k = tol.propagated_for(rung)
    # Dynamo's additive tolerance, as one rounding of the output: an exact reference (lookups, tiny
    # outputs) must not turn a single-ulp difference into a multiple of nothing.
    denom = max(m.err_ref, tol.unit_roundoff(rung) * m.rms_truth)
    ratio = m.err_cand / denom if denom > 0 else (0.0 if m.err_cand == 0 else math.inf)
    if ratio > k:
        return f"propagated error {ratio:.3g}x the reference's (budget {k:g}x)"
    return ""


def judge_layer(rec: LayerRecord, iso: list[LeafMetrics], prop: list[LeafMetrics], tol: Tolerance, rung: str) -> None:
    t = tol.for_layer(rec.name)
    rec.budget = t.ratio_for(rung)
    rec.prop_budget = t.propagated_for(rung)
    iso_reasons = [(m, leaf_failure(m, t, rung, True)) for m in iso]
    prop_reasons = [(m, leaf_failure(m, t, rung, False)) for m in prop]
    rec.iso_passed = not any(r for _, r in iso_reasons)
    rec.prop_passed = not any(r for _, r in prop_reasons)
    rec.passed = rec.iso_passed
    if iso:   # the worst leaf: a failing one first, then the largest bound
        rec.iso = max(iso_reasons, key=lambda mr: (bool(mr[1]), mr[0].ratio_lo))[0]
    if prop:
        rec.prop = max(prop_reasons, key=lambda mr: (bool(mr[1]), mr[0].ratio))[0]
    reasons = [r for _, r in iso_reasons if r]
    if reasons:
        rec.reason = reasons[0]
        if rec.iso is not None and rec.iso.kind == "float" and not rec.iso.nonfinite and math.isfinite(rec.iso.ratio_lo):
            rec.would_pass_ratio = _round_up(rec.iso.ratio_lo)
    elif not rec.prop_passed:
        rec.reason = next(r for _, r in prop_reasons if r)


def finish(result: CheckResult, tol: Tolerance) -> CheckResult:
    """Culprit = the first (in execution order) failing module with no failing selected descendant."""
    failing = [l for l in result.layers if not l.iso_passed]
    minimal = [l for l in failing if not any(o is not l and o.name.startswith(l.name + ".") for o in failing)]
    result.culprit = minimal[0].name if minimal else None
    result.culprit_block = minimal[0].primary if minimal else None
    div = next((l for l in result.layers if not l.prop_passed), None)
    while div is not None:  # a block is entered before its children: descend to the earliest failing child
        child = next((l for l in result.layers if not l.prop_passed and l.name.startswith(div.name + ".")), None)
        if child is None:
            break
        div = child
    result.first_divergent = div.name if div else None
    outputs_ok = all(o.prop_passed for o in result.outputs)
    result.passed = not failing and outputs_ok
    if not outputs_ok and not failing:
        result.notes.append("model outputs drifted beyond budget although no single layer is out of bounds in "
                            "isolation: accumulated drift (see first divergent layer)")
    return result
