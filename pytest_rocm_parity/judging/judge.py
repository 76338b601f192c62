"""Turn leaf metrics into per-layer verdicts, the culprit and the first divergent layer."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_rocm_parity.judging.records import CheckResult, LayerRecord, LeafMetrics
from pytest_rocm_parity.judging.dtypes import UNIT_ROUNDOFF
from pytest_rocm_parity.judging.tolerance import LOW_PRECISION_ULPS, Tolerance


def _round_up(x: float) -> float:
    """Two significant digits, rounded up: a tolerance a user can paste."""
    if not math.isfinite(x) or x <= 0:
        return x
    e = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10**e) * 10**e


@dataclass(frozen=True)
class Rule:
    """One layer's tolerance resolved for one rung: the numbers its leaves are judged against.

    Why apart from Tolerance: the policy's lookups (the per-layer globs, the rung's canonical name,
    the defaults) would otherwise run for every leaf of every pass, host time a GPU replay adds to
    the forward it is compared with (docs/performance.md). A replay resolves a rule per layer once
    per rung, from the module's name, so every call of a module is judged by its per-layer
    tolerance.
    """

    budget: float        # isolated: the allowed error ratio
    z: float             # isolated: the sign test's z a failure also needs
    confidence: float    # the z of the ratio's lower bound, as reported
    k: float             # propagated: Dynamo's multiplier
    floor: float         # propagated: the additive floor per unit of RMS (Tolerance.propagated_floor)
    quant_noise: float = 3.0   # both: allowed error in units of a leaf's activation-quantization noise
    low_budget: float | None = None   # isolated, float32 rung: a leaf computed at low precision (autocast)

    @classmethod
    def of(cls, tol: Tolerance, rung: str) -> Rule:
        """``tol`` as resolved for the layer already (Tolerance.for_layer)."""
        return cls(tol.ratio_for(rung), tol.z, tol.confidence, tol.propagated_for(rung), tol.propagated_floor(rung),
                   tol.quant_noise, tol.low_precision_ratio(rung))

    def budget_for(self, m: LeafMetrics) -> float:
        """The isolated budget of this leaf: the low-precision one where, on the float32 rung, its
        reference computed it at bf16/fp16 precision (Tolerance.low_precision_ratio)."""
        if self.low_budget is not None and m.err_ref > LOW_PRECISION_ULPS * UNIT_ROUNDOFF["float32"] * m.rms_truth:
            return self.low_budget
        return self.budget

    def propagated_ratio(self, m: LeafMetrics) -> float:
        """The candidate's error over the reference's, floored at one rounding of the output (Dynamo's
        additive tolerance): an exact reference (lookups, tiny outputs) must not turn a single-ulp
        difference into a multiple of nothing."""
        denom = max(m.err_ref, self.floor * m.rms_truth)
        return m.err_cand / denom if denom > 0 else (0.0 if m.err_cand == 0 else math.inf)

    def failure(self, m: LeafMetrics, isolated: bool) -> str:
        """'' if the leaf passes, else the reason."""
        if m.note.startswith("shape"):
            return m.note
        if m.kind == "exact":
            return m.note if m.mismatches else ""
        if m.nonfinite:
            return m.note
        if m.noise > m.err_ref:
            # the candidate quantizes its activations on another grid: its own quantization noise is
            # allowed, neither the sign test (it is always farther) nor the reference's rounding applies
            if m.ratio > self.quant_noise:   # the ratio is against the noise (LeafMetrics.allow_noise)
                return (f"{'isolated' if isolated else 'propagated'} error {m.ratio:.3g}x the activation-quantization "
                        f"noise (budget {self.quant_noise:g}x)")
            return ""
        if isolated:
            budget = self.budget_for(m)
            if m.ratio_lo > budget and m.z > self.z:
                low = (", the bf16/fp16 one: its reference computed at low precision, as under torch.autocast"
                       if budget != self.budget else "")
                return (f"isolated error {m.ratio:.3g}x the reference's (>= {m.ratio_lo:.3g}x at "
                        f"{self.confidence:g} sigma; budget {budget:g}x{low}; sign test z={m.z:+.1f})")
            return ""
        ratio = self.propagated_ratio(m)
        if ratio > self.k:
            return f"propagated error {over(ratio, self.k)}x the reference's (budget {self.k:g}x)"
        return ""

    @property
    def sketch_budget(self) -> float:
        """A sketch golden's budget: it holds no inputs, so its propagated verdict is the verdict,
        judged like an isolated one against the larger of the ratio budget and Dynamo's multiplier."""
        return max(self.budget, self.k)

    def sketch_failure(self, m: LeafMetrics) -> str:
        """'' if a leaf judged against a sketch golden passes, else the reason: the ratio's bound and
        the sign test over the sketch entries (which are few) against sketch_budget."""
        if m.note.startswith("shape") or m.kind == "exact" or m.nonfinite:
            return self.failure(m, True)
        if m.noise > m.err_ref:   # the candidate quantizes its activations otherwise: the noise rule
            return self.failure(m, False)
        budget = max(self.budget_for(m), self.k)
        if m.ratio_lo > budget and m.z > self.z:
            return (f"drift {m.ratio:.3g}x the reference's error (>= {m.ratio_lo:.3g}x at {self.confidence:g} sigma "
                    f"over the sketch; budget {budget:g}x; sign test z={m.z:+.1f})")
        return ""


def leaf_failure(m: LeafMetrics, tol: Tolerance, rung: str, isolated: bool) -> str:
    """'' if the leaf passes, else the reason (``tol`` resolved for the layer)."""
    return Rule.of(tol, rung).failure(m, isolated)


def may_fail(m: LeafMetrics, tol: Tolerance, rung: str, isolated: bool) -> bool:
    """Whether the leaf fails, or may fail once its layer is judged whole: far over budget on a few
    blocks or by its bound, which fails a module that makes no discrete choice (_fail_confined)."""
    r = Rule.of(tol, rung)
    return bool(r.failure(m, isolated)) or (isolated and (
        _on_few_blocks(m, r.budget_for(m)) or _by_ratio(m) and m.ratio_lo > CONFINED_BOUND_OVER * r.budget_for(m)))


# At most this share of an integer output's elements may differ where every floating output of the
# same call passes: a router's top-k indices flip at near-ties of its scores (docs/judging.md). Two
# tied experts listed the other way round differ in two elements (NEAR_TIE_ELEMENTS), more than 1% of
# a few dozen tokens' choices: that many may differ too, where they are at most NEAR_TIE_CAP of the
# leaf (a small output, a batch's arg-max, is not excused by it).
NEAR_TIE_SHARE = 0.01
NEAR_TIE_ELEMENTS = 2
NEAR_TIE_CAP = 0.02


# how many may, in words
NEAR_TIE_TEXT = f"{NEAR_TIE_SHARE:.0%} of its elements, or {NEAR_TIE_ELEMENTS} of at least {NEAR_TIE_ELEMENTS / NEAR_TIE_CAP:.0f},"


def near_ties(m: LeafMetrics) -> bool:
    """Whether an integer leaf that differs (not in shape) differs in few enough elements to be
    choices flipped at near-ties, and nowhere the reference's own scores for a token do not tie
    (``untied``, where the call returns its scores: choices.Decisions)."""
    return m.kind == "exact" and bool(m.mismatches) and not m.note.startswith("shape") and not m.untied and \
        m.mismatches <= max(NEAR_TIE_SHARE * m.numel, min(NEAR_TIE_ELEMENTS, NEAR_TIE_CAP * m.numel))


def _leaf_reasons(leaves: list[LeafMetrics], r: Rule, isolated: bool) -> list[tuple[LeafMetrics, str]]:
    """Each leaf with its failure reason ('' when it passes). Integer outputs that a call computes
    beside floating ones (a router's indices beside its scores) may differ in a few elements when
    every floating output passes: the flipped choices were near-ties, and a flip that was not shows
    in the scores chosen with it."""
    reasons = [(m, r.failure(m, isolated)) for m in leaves]
    floats = [why for m, why in reasons if m.kind != "exact"]
    if not floats or any(floats):
        return reasons
    return [(m, "" if why and near_ties(m) else why) for m, why in reasons]


def _worst(mr: tuple[LeafMetrics, str]) -> tuple[bool, bool, float]:
    """A leaf's rank for the record's readout: failing first (by bound), then floating leaves by
    ratio, so a passing leaf far over its budget on a few blocks is the one shown and weighed
    (_few_blocks), not an exact one beside it."""
    m, why = mr
    return bool(why), m.kind != "exact", m.ratio_lo if why else (m.ratio if math.isfinite(m.ratio) else 0.0)


def judge_layer(rec: LayerRecord, iso: list[LeafMetrics], prop: list[LeafMetrics], r: Rule,
                sketch: bool = False) -> None:
    """The record's verdicts from its leaves' metrics, by its layer's rule (Rule.of). The record's
    propagated leaf shows the ratio its verdict used (Rule.propagated_ratio: floored at one rounding),
    except a sketch golden's, judged like an isolated one (Rule.sketch_failure)."""
    rec.budget = r.budget
    rec.prop_budget = r.k
    iso_reasons = _leaf_reasons(iso, r, True)
    prop_reasons = _leaf_reasons(prop, r, False)
    first_iso = next((why for _, why in iso_reasons if why), "")
    first_prop = next((why for _, why in prop_reasons if why), "")
    rec.iso_passed = not first_iso
    rec.prop_passed = not first_prop
    rec.passed = rec.iso_passed
    if iso:   # the worst leaf: a failing one by the largest bound, else the largest ratio
        rec.iso = iso[0] if len(iso) == 1 else max(iso_reasons, key=_worst)[0]
        rec.budget = r.budget_for(rec.iso)
        if rec.iso.noise > rec.iso.err_ref:
            rec.budget = r.quant_noise   # judged against the activation-quantization noise
    if prop:
        rec.prop = prop[0] if len(prop) == 1 else max(prop_reasons, key=lambda mr: (bool(mr[1]), mr[0].ratio))[0]
        if rec.prop.noise > rec.prop.err_ref:
            rec.prop_budget = r.quant_noise
        elif rec.prop.kind == "float" and not rec.prop.nonfinite and not sketch:
            ratio = r.propagated_ratio(rec.prop)
            # the bound rescaled with its ratio: against the quarter floor it stood over the
            # propagated ratio wherever one rounding floors the reference's error (lookups)
            lo = rec.prop.ratio_lo * ratio / rec.prop.ratio if rec.prop.ratio > 0 and math.isfinite(rec.prop.ratio) \
                else rec.prop.ratio_lo
            rec.prop = dataclasses.replace(rec.prop, ratio=ratio, ratio_lo=lo)
    if first_iso:
        # the reason of the leaf the record shows (its worst), named when the module has several outputs
        shown = r.failure(rec.iso, True) if rec.iso is not None else ""
        rec.reason = (shown or first_iso) + (f" (output {rec.iso.leaf})" if len(iso) > 1 and rec.iso is not None
                                             else "")
        if rec.iso is not None and rec.iso.kind == "float" and not rec.iso.nonfinite and math.isfinite(rec.iso.ratio_lo) \
                and not rec.iso.noise > rec.iso.err_ref:   # a noise-judged leaf: no ratio= would pass it
            rec.would_pass_ratio = _round_up(rec.iso.ratio_lo)
    elif first_prop:
        rec.reason = first_prop


# A passing ratio over this multiple of its budget, with a bound within it, is reported as undecided.
# A correct alternate whose ratio lands above its budget does so by the bound's own spread, a few
# tenths; twice the budget is beyond that, and the migration matrix's correct alternates stay under
# it (tests/migrations/test_migration_matrix.py, the undecided test's correct router among them).
UNDECIDED_OVER = 2.0


def _by_ratio(m: LeafMetrics) -> bool:
    """A floating leaf with finite values, judged by its ratio to the reference's error (not against
    activation-quantization noise): the leaves the ratio's bound and the sign test speak for."""
    return m.kind == "float" and not m.nonfinite and not m.noise > m.err_ref


def _on_few_blocks(m: LeafMetrics, budget: float) -> bool:
    """The error is far over budget, yet its lower bound is within budget because the excess sits on
    a few of the blocks: a few tokens routed to other experts, or a row a kernel computed wrong."""
    return _by_ratio(m) and m.ratio > UNDECIDED_OVER * budget and m.ratio_lo <= budget


def _over_on_few_blocks(m: LeafMetrics, budget: float, z: float) -> bool:
    """_on_few_blocks, and consistent (the sign test): what near-ties upstream do to a module's output."""
    return _on_few_blocks(m, budget) and m.z > z


def _few_blocks(l: LayerRecord, z: float) -> bool:
    """A pass the data could not decide (_over_on_few_blocks): the tensor is too small to tell it
    from near-ties."""
    return l.iso_passed and l.iso is not None and _over_on_few_blocks(l.iso, l.budget, z)


def _few_blocks_note(l: LayerRecord, inside_judged: bool = False) -> str:
    """``inside_judged``: modules inside it were judged too (drilling deeper is no advice then)."""
    assert l.iso is not None
    return (f"{l.name}: isolated error {l.iso.ratio:.3g}x the reference's, consistently (sign test "
            f"z={l.iso.z:+.1f}), but concentrated on a few blocks of the tensor, so its lower bound "
            f"{l.iso.ratio_lo:.3g}x is within the budget {l.budget:g}x and it passes: too few elements to "
            f"tell it from near-ties. To decide, capture more tokens"
            + ("; the modules inside it are judged on their own (their rows)" if inside_judged else
               " or judge the modules inside it (drill)"))


# Below this many elements an error over budget on a few blocks, with the sign test short of
# significance, may be a handful of roundings that chance put on one side (a 2-logit head: |z| is at
# most sqrt(2)); from it on, each of the 64 blocks holds 16 elements or more, and a ratio twice the
# budget is no rounding's
CONFINED_NUMEL = 1024

# A bound this many times over its budget is no correct backend's, whatever the sign test says: the
# test falls short of significance where the excess sits on few elements among many that a correct
# reordering puts on either side of the reference (a kernel's tail zeroed beside a GEMM summed in
# another order: bound 1.75e6x, z=-0.3), and a module that makes no discrete choice has no near-tie
# to put it there
CONFINED_BOUND_OVER = 10.0

# A first divergence this many times over its propagated budget is one fault in the code before it,
# not errors that each module kept within bounds adding up (accumulated drift crosses its budget
# gradually, a layer or a few at a time)
JUMP = 100.0


def over(ratio: float, budget: float) -> str:
    """A ratio over its budget, with digits enough to read as over it (3.0004, not 3)."""
    for digits in (3, 4, 5, 6):
        text = f"{ratio:.{digits}g}"
        if float(text) > budget:
            return text
    return f"{ratio:.6g}"


def jumped(l: LayerRecord) -> bool:
    """Whether a record's propagated error is over JUMP times its budget: one fault, not drift."""
    return l.prop is not None and l.prop_budget > 0 and l.prop.ratio > JUMP * l.prop_budget


def _fail_confined(result: CheckResult, tol: Tolerance) -> None:
    """Fail the layers whose reference call made no discrete choice and whose error is confined to
    part of the tensor: with no near-tie to flip, such an error is a fault there (a block or tile of a
    kernel computed wrong, a wavefront-size assumption), however few elements it covers. Confined:
    far over budget on a few blocks (_on_few_blocks), whatever the sign test says where the tensor has
    CONFINED_NUMEL elements (a port that rounds once where the reference rounds twice is closer to the
    truth everywhere else, z < 0), or a bound far over budget (CONFINED_BOUND_OVER) that the sign
    test does not find significant, since most elements differ by rounding only."""
    for l in result.layers:
        if l.decides is not False or not l.iso_passed or l.iso is None or not _by_ratio(l.iso):
            continue
        m = l.iso
        if _on_few_blocks(m, l.budget) and (m.z > tol.for_layer(l.name).z or m.numel >= CONFINED_NUMEL):
            # the bound is of the whole tensor's blocks, low because most of them agree: said as such,
            # a bare "bound 3e-09x" reads as a pass beside the failing ratio
            where = (f"concentrated on a few blocks of the tensor (the rest agree, so the bound over all "
                     f"of them is {m.ratio_lo:.3g}x)")
        elif m.ratio_lo > CONFINED_BOUND_OVER * l.budget:
            where = (f"its bound {m.ratio_lo:.3g}x, over {CONFINED_BOUND_OVER:g} times the budget, while most "
                     f"elements differ by rounding only")
        else:
            continue
        l.iso_passed = l.passed = False
        l.reason = (f"part of its output{f' {m.leaf}' if m.leaf not in ('', '0') else ''} is computed "
                    f"wrong: isolated error {m.ratio:.3g}x the reference's (sign test z={m.z:+.1f}; "
                    f"budget {l.budget:g}x), {where}, in a module that makes no discrete choice on its "
                    f"activations (no comparison, top-k or rounding), so no near-tie explains it")


def fail_moved_choices(layers: Sequence[LayerRecord], moved: dict[str, tuple[int, int, list[str]]]) -> None:
    """Fail the layers over budget in isolation inside which a choice (a router's top-k) sent tokens
    elsewhere where the reference's own scores do not nearly tie (choices.Decisions): the few-blocks
    pass (undecided) stands for near-ties, and these are none, so the excess on those tokens is a
    fault of the choice or of the code before it. ``moved``: Decisions.moved_without_tie()."""
    for l in layers:
        got = moved.get(l.name)
        if got is None or not l.iso_passed or l.iso is None or not _by_ratio(l.iso) or l.iso.ratio <= l.budget:
            continue
        n, total, deciders = got
        l.iso_passed = l.passed = False
        l.reason = (f"isolated error {l.iso.ratio:.3g}x the reference's (budget {l.budget:g}x; bound "
                    f"{l.iso.ratio_lo:.3g}x): {n} of {total} tokens took other choices at "
                    f"{', '.join(deciders[:2])} inside it where the reference's own scores for them do not "
                    f"tie, so no near-tie explains the error on them")


def _near_tie_outputs(result: CheckResult, tol: Tolerance) -> list[str]:
    """Pass the model outputs that fail the propagated rule on a few blocks only, in a model whose
    reference made discrete choices (a router's top-k): a near-tie flipped upstream sends a few
    tokens elsewhere, and their outputs differ whole, as on a correct backend; the notes say so.
    Returns the names passed."""
    deciding = [l.name for l in result.layers if l.decides]
    # the innermost: a block decides because its router does, and the router is the one to name
    deciders = [n for n in deciding if not any(o.startswith(n + ".") for o in deciding)]
    passed = []
    for o in result.outputs:
        m = o.prop
        if deciders and not o.prop_passed and m is not None and _by_ratio(m) and m.ratio > 0 \
                and math.isfinite(m.ratio):
            ratio = Rule.of(tol.for_layer(o.name), result.dtype).propagated_ratio(m)
            bound = m.ratio_lo / m.ratio * ratio   # the ratio's lower bound, against this rule's floor
            if bound <= o.prop_budget:
                o.prop_passed = o.passed = True
                o.reason = ""   # it passes: the note says why it is undecided
                passed.append(o.name)
                result.notes.append(
                    f"{o.name}: propagated error {ratio:.3g}x the reference's (budget {o.prop_budget:g}x), but "
                    f"concentrated on a few blocks (bound {bound:.3g}x) of a model whose reference makes discrete "
                    f"choices ({', '.join(deciders[:2])}{'...' if len(deciders) > 2 else ''}): tokens sent "
                    f"elsewhere at near-ties, as a correct backend does too; it passes. To decide, capture more "
                    f"tokens")
    return passed


def _near_tie_exact_outputs(result: CheckResult) -> None:
    """The model's integer outputs judged together with its floating ones, as a call's leaves are
    (_leaf_reasons): an arg-max or a threshold over floating values flips where they are within
    rounding of a tie, so where every floating output passes, at most NEAR_TIE_SHARE of an integer
    output's elements may differ; more fails, saying so."""
    if not any(o.prop is not None and o.prop.kind != "exact" for o in result.outputs) or \
            not all(o.prop_passed for o in result.outputs if o.prop is not None and o.prop.kind != "exact"):
        return
    for o in result.outputs:
        m = o.prop
        if o.prop_passed or m is None or m.kind != "exact" or not m.mismatches or m.note.startswith("shape"):
            continue   # a shape change fails as such
        if near_ties(m):
            o.prop_passed = o.passed = True
            o.reason = ""
            result.notes.append(f"{o.name}: {m.mismatches} of {m.numel} elements differ where every floating output "
                                f"passes: choices at near-ties of the values they are made from (an arg-max, a "
                                f"threshold), as on a correct backend (at most {NEAR_TIE_TEXT} may)")
        else:
            o.reason = (f"{m.note}: more than the {NEAR_TIE_TEXT} that near-ties of the values it is computed "
                        f"from may flip while every floating output passes")


def note_undecided(result: CheckResult, tol: Tolerance, outputs: Sequence[str] = ()) -> None:
    """Name the passing layers the data could not decide (_few_blocks), in extra and in notes."""
    undecided = [l for l in result.layers if _few_blocks(l, tol.for_layer(l.name).z)]
    if undecided or outputs:
        result.extra["undecided"] = [l.name for l in undecided] + list(outputs)
        result.notes += [_few_blocks_note(l, any(l.holds(o) and o.iso is not None for o in result.layers))
                         for l in undecided[:3]]


def note_over_bound(result: CheckResult, tol: Tolerance) -> None:
    """A note for each passing layer (up to three) whose bound is over its budget but whose sign test
    is not significant: a failure needs both, and the user is told why such a layer passed."""
    over = []
    for l in result.layers:
        m = l.iso
        if l.iso_passed and m is not None and _by_ratio(m) and m.ratio_lo > l.budget \
                and m.z <= tol.for_layer(l.name).z:
            over.append(f"{l.name}: isolated error {m.ratio:.3g}x the reference's, bound {m.ratio_lo:.3g}x over the "
                        f"budget {l.budget:g}x, but not farther from the truth than the reference on more elements "
                        f"than chance gives (sign test z={m.z:+.1f}, a failure needs > {tol.for_layer(l.name).z:g}): "
                        f"it passes. " + (
                            "It makes discrete choices (a router's top-k): tokens sent elsewhere at near-ties differ "
                            "whole, as on a correct backend" if l.decides else
                            "Its excess sits in fewer, larger errors than the reference's; a lower z= in its "
                            "tolerance would fail it"))
    result.notes += over[:3]


def minimal_failing(failing: list[LayerRecord]) -> list[LayerRecord]:
    """The failing modules with no failing module inside them, in order: where a fault is its own.
    A module called several times counts any call of a module inside it (a shared block's second
    call holds its children's second calls)."""
    return [l for l in failing if not any(o is not l and l.holds(o) for o in failing)]


def finish(result: CheckResult, tol: Tolerance) -> CheckResult:
    """Culprit = the first (in execution order) failing module with no failing selected descendant."""
    _fail_confined(result, tol)
    failing = [l for l in result.layers if not l.iso_passed]
    minimal = minimal_failing(failing)
    result.culprit = minimal[0].name if minimal else None
    result.culprit_block = minimal[0].primary if minimal else None
    div = next((l for l in result.layers if not l.prop_passed), None)
    while div is not None:  # a block is entered before its children: descend to the earliest failing child
        child = next((l for l in result.layers if not l.prop_passed and div.holds(l)), None)
        if child is None:
            break
        div = child
    result.first_divergent = div.name if div else None
    # near-ties excuse the outputs of a model whose every module passes; beside a failing one (a
    # router named the culprit) they would excuse the very fault
    note_undecided(result, tol, [] if failing else _near_tie_outputs(result, tol))
    _near_tie_exact_outputs(result)
    note_over_bound(result, tol)
    outputs_ok = all(o.prop_passed for o in result.outputs)
    result.passed = not failing and outputs_ok
    if not outputs_ok and not failing:
        result.notes.append(
            "model outputs drifted beyond budget although no single layer is out of bounds in isolation: "
            "accumulated drift (see first divergent layer)" if div is not None else
            f"model outputs beyond budget although every selected layer passed"
            f"{', isolated and propagated' if any(l.prop is not None for l in result.layers) else ''}: the "
            "difference arises after the last selected module, in the code that makes the outputs from it")
    return result
