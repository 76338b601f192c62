"""The one place where parity records become a test failure, with a readable message."""
from __future__ import annotations

import math

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_rocm_parity.judging.records import CheckResult, LayerRecord
from pytest_rocm_parity.options import regen_command
from pytest_rocm_parity.tables import text_table

MAX_ROWS = 24
MAX_CHARS = 6000


def env_line(env: dict[str, Any]) -> str:
    if not env:
        return "unknown"
    parts = [str(env.get("device", "?"))]
    if env.get("device_name"):
        parts.append(str(env["device_name"]))
    if env.get("arch") and env.get("arch") != env.get("device_name"):   # a CPU's name is its arch
        parts.append(f"({env['arch']})")
    parts.append(f"torch {env.get('torch', '?')}")
    if env.get("hip"):
        parts.append(f"HIP {env['hip']}")
    elif env.get("cuda") and str(env.get("device", "")).startswith("cuda"):
        parts.append(f"CUDA {env['cuda']}")
    return " ".join(parts)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}"


def verdict_label(iso_failed: bool, prop_failed: bool, judged_isolated: bool, failed: bool = False,
                  nonfinite: int = 0) -> str:
    """A layer row's verdict in the failure table and the HTML report. A row without an isolated
    measurement (a sketch golden's, a model output) that fails, failed propagated. ``nonfinite``: the
    non-finite candidate values of the failing run, which its ratio columns (computed on the finite
    elements) do not show."""
    if iso_failed:
        label = "FAIL propagated" if not judged_isolated else \
            "FAIL isolated" + ("; drift propagated" if prop_failed else "")
    elif prop_failed:
        label = "FAIL propagated" if failed and not judged_isolated else "drift propagated"
    else:
        label = "FAIL" if failed else "ok"
    return f"{label} ({nonfinite} non-finite)" if nonfinite and label != "ok" else label


def _verdict(l: LayerRecord) -> str:
    if not l.passed and not l.prop_passed and l.prop is None:
        # failed with no measurement behind it: a training step's gradient the candidate never
        # produced (a detached forward, runner/train.py _judge_graph), which no ratio can show
        return "FAIL no gradient"
    return verdict_label(not l.iso_passed, not l.prop_passed, l.iso is not None, not l.passed, _nonfinite(l))


def _nonfinite(l: LayerRecord) -> int:
    """The non-finite candidate values of the run a row's verdict names: the isolated one where it
    failed there, else the propagated one."""
    m = l.iso if not l.iso_passed and l.iso is not None else l.prop if not l.prop_passed else None
    return m.nonfinite if m is not None else 0


def _cells(l: LayerRecord, culprit: str | None = None) -> tuple[str, ...]:
    iso, prop = l.iso, l.prop
    mark = "  <- culprit" if culprit and l.name == culprit else ""
    return (l.name, _fmt(iso.ratio if iso else None), _fmt(iso.ratio_lo if iso else None), _fmt(l.budget),
            _fmt(iso.z if iso else None),
            _fmt(prop.ratio if prop else None), _fmt(prop.rel_to_ref if prop else None), " " + _verdict(l) + mark)


# "ratio lo" is the ratio's lower confidence bound: the isolated verdict compares it, not the ratio,
# with the budget (docs/judging.md), so a row may show a ratio above its budget and still pass
_HEADERS = ("layer", "iso ratio", "ratio lo", "budget", "z", "prop ratio", "rel->ref", " verdict")
_WIDTHS = (None, 9, 8, 6, 7, 10, 9, None)   # names whole: the tail is what tells modules apart


def table(result: CheckResult, max_rows: int = MAX_ROWS) -> list[str]:
    """The rows that explain a failure: isolated failures, propagated drift and the culprit; then a count.

    Rows that passed both checks are counted, never listed; a row that failed a check is never
    folded into that count (when there are more than ``max_rows`` of them, drift rows are cut
    first, and the rest are counted by kind).
    """
    rows = result.layers
    important = [l for l in rows if not l.iso_passed or not l.prop_passed or l.name == result.culprit]
    rest = [l for l in rows if l not in important]
    # a module the candidate never called (its weights used by a fused kernel) passed nothing: named
    # apart, since the fused kernel is where a bug of the culprit above it would sit
    not_called = [l.name for l in rest if l.not_called]
    ok = len(rest) - len(not_called)
    # the culprit and the isolated failures first, then drift, each in execution order
    first = [l for l in important if l.name == result.culprit or not l.iso_passed]
    keep = {id(l) for l in (first + [l for l in important if l not in first])[:max_rows]}
    shown = [l for l in important if id(l) in keep]
    hidden = [l for l in important if id(l) not in keep]
    lines = text_table([_cells(l, result.culprit) for l in shown], _HEADERS, right=range(1, 7), widths=_WIDTHS,
                       indent="  ", sep=" ") if shown else []
    if hidden:
        n_iso = sum(1 for l in hidden if not l.iso_passed)
        n_prop = sum(1 for l in hidden if l.iso_passed and not l.prop_passed)
        what = [s for s in (f"{n_iso} failed isolated" if n_iso else "",
                            f"{n_prop} drifted propagated" if n_prop else "") if s]
        lines.append(f"  ... {len(hidden)} more failing rows not listed ({', '.join(what) or 'culprit'}; "
                     f"full table: --parity-report=DIR)")
    if ok:
        props = [l.prop is not None for l in rest if not l.not_called]
        how = "isolated and propagated" if all(props) else "isolated" if not any(props) else \
            f"isolated; {sum(props)} of them propagated too"
        lines.append(f"  {ok} more ok (passed {how})")
    if not_called:
        lines.append(f"  {len(not_called)} not called by the candidate (fused or bypassed), judged only through their "
                     f"parents: {', '.join(not_called[:5])}{' ...' if len(not_called) > 5 else ''}")
    if not rows:
        lines.append("  (no layer records)")
    return lines


def _device_kind(env: dict[str, Any]) -> tuple[str, str, str]:
    return (str(env.get("device", "")).split(":")[0], str(env.get("device_name", "")), str(env.get("arch", "")))


def same_platform(ref: dict[str, Any], cand: dict[str, Any]) -> bool:
    """Whether the candidate ran on the same kind of device as the golden's capture."""
    return bool(ref) and bool(cand) and bool(ref.get("device")) and _device_kind(ref) == _device_kind(cand)


def regen_hint(result: CheckResult) -> str:
    """The regenerate line, or '' when the failure is likely a backend difference, not an old golden.

    A golden may simply be out of date when the candidate ran on the same kind of device as the
    capture: there the reference's numerics are reproduced, so a failure comes from a change in
    the model, its code or its inputs.
    """
    if result.passed or not same_platform(result.reference_env, result.candidate_env):
        return ""
    return (f"  this run used the same kind of device as the capture, so the difference comes from the model, its "
            f"code or its inputs; if this change is intended, regenerate with "
            f"{result.regen or regen_command(result.name, result.test)}")


SUGGEST_WITHIN = 10.0   # a tolerance is suggested only up to this multiple of the layer's budget
SUGGEST_LAYERS = 6      # a per-layer suggestion lists every layer it needs, so only up to this many


def ratio_tolerance(rung: str, ratio: float) -> str:
    """``Tolerance(ratio=...)`` widening ``rung`` alone: a plain number would also set every other
    rung's budget to it (float32's 10 down to a bf16 ratio of 2)."""
    return f'Tolerance(ratio={{"{rung}": {ratio:g}}})'


def tolerance_hint(result: CheckResult) -> str:
    """A tolerance that would pass, only when it is a modest widening (within 10x of each budget).

    A larger ratio, a non-finite or exact-kind failure, or propagated drift is a bug to fix, not a
    tolerance to widen, so no suggestion is made for them. Each suggestion passes as printed: it
    names every failing layer, and widens only this rung.
    """
    failing = [l for l in result.layers if not l.iso_passed]
    if not failing or any(not o.prop_passed for o in result.outputs) or result.extra.get("changed_at_float32"):
        return ""   # the float32 rung failed too: the computation changed, no tolerance is the fix
    fixes: dict[str, float] = {}
    for l in failing:
        if not l.would_pass_ratio or not l.budget or l.would_pass_ratio > SUGGEST_WITHIN * l.budget:
            return ""
        fixes[l.module] = max(fixes.get(l.module, 0.0), l.would_pass_ratio)   # per-layer keys are module names
    rung = result.dtype
    text = f"  would have passed with tolerance={ratio_tolerance(rung, max(fixes.values()))}"
    if len(fixes) <= SUGGEST_LAYERS:
        text += (" (or only these layers: tolerance=Tolerance(layers={"
                 + ", ".join(f'"{k}": {ratio_tolerance(rung, v)}' for k, v in fixes.items()) + "}))")
    return text


def steps_text(steps: Any) -> str:
    """First divergent generation steps per sequence, in words (``[None, 3]`` -> "sequence 1 at step 3")."""
    if not isinstance(steps, (list, tuple)):
        return "none" if steps is None else str(steps)
    hit = [f"sequence {b} at step {s}" for b, s in enumerate(steps) if s is not None]
    if not hit:
        return f"none (all {len(steps)} sequences match)"
    return ", ".join(hit) + (f"; {len(steps) - len(hit)} of {len(steps)} sequences match" if len(hit) < len(steps) else "")


def optimizer_groups(extra: Mapping[str, Any]) -> list[str]:
    """The parameter groups (by module) whose optimizer update failed in a training check."""
    failed = extra.get("optimizer") or {}
    return [str(name).split(":", 1)[1] for name, ok in failed.items() if not ok] if isinstance(failed, dict) else []


def headline(extra: Mapping[str, Any]) -> str:
    """What failed, in a few words, where no module is the culprit: the loss's scaling, the optimizer."""
    if extra.get("loss_factor") is not None:
        return f"loss off by one factor ({extra['loss_factor']:.4g}x)"
    if extra.get("loss_otherwise") is not None:
        return f"the loss computed otherwise ({extra['loss_otherwise']:.3g}x the reference's error)"
    if extra.get("backward_jump") is not None:
        return f"the gradient reaching {extra['backward_jump']} is wrong; no module's own backward is"
    if optimizer_groups(extra):
        return f"optimizer update out of bounds ({optimizer_share(extra)})"
    return lm_failure(extra) or "no culprit in isolation"


def nonfinite_logits(lm: Mapping[str, Any]) -> str:
    """Where a language-model check met NaN or Inf candidate logits, in words ('' where it met none)."""
    nonfinite = {k: v for k, v in (lm.get("nonfinite") or {}).items() if v}
    if not nonfinite:
        return ""
    where = {"forward": "the full forward", "cached_decode": "KV-cache decoding", "generation": "greedy generation"}
    unit = {"generation": " step(s)"}
    return ("non-finite candidate logits where the reference's are finite ("
            + ", ".join(f"{n}{unit.get(k, '')} in {where.get(k, k)}" for k, n in nonfinite.items()) + ")")


def lm_failure(extra: Mapping[str, Any]) -> str:
    """What a language-model check failed on, in a few words ('' when its metrics passed)."""
    lm = extra.get("lm") or {}
    fails = lm.get("fails") or []
    if not fails:
        return ""
    # a NaN or Inf is the cause to name: the metrics it makes fail (or NaN) follow from it
    nonfinite = nonfinite_logits(lm)
    if nonfinite:
        return nonfinite
    if all(str(f).startswith("KV-cache decoding") for f in fails):
        return "KV-cache decoding out of bounds; the full forward within them"
    return "language-model metrics out of bounds"


def optimizer_share(extra: Mapping[str, Any]) -> str:
    """'3 of 20 parameter groups': how many groups' optimizer update failed."""
    return f"{len(optimizer_groups(extra))} of {len(extra.get('optimizer') or {})} parameter groups"


def property_text(result: CheckResult) -> str:
    """The JUnit XML property value of one check: verdict, culprit and first divergent layer, in words."""
    parts = ["PASS" if result.passed else "FAIL"]   # as the summary writes them, and ERROR
    if result.culprit:
        parts.append(f"culprit={result.culprit}")
    elif not result.passed:
        parts.append(headline(result.extra))
    if result.first_divergent:
        parts.append(f"first_divergent={result.first_divergent}")
    return "; ".join(parts)


def _inside(result: CheckResult, culprit: LayerRecord) -> str:
    """Where inside the culprit to look, when modules inside it were judged: all pass (else one of
    them would be the culprit), so the fault is in the culprit's own code. '' when none was."""
    records = [l for l in result.layers if culprit.holds(l) and l.iso is not None]
    if not records:
        return ""
    # a module inside that passed only under a looser per-layer tolerance than the culprit's
    # (Tolerance(layers=...)) is where the fault may be: say so rather than blame the code between them
    loose = [l for l in records if culprit.budget and l.budget > culprit.budget and l.iso is not None
             and l.iso.ratio_lo > culprit.budget]
    if loose:
        return ("inside it, " + ", ".join(f"{l.name[len(culprit.module) + 1:]} ({l.iso.ratio:.3g}x the reference's "
                                          f"error)" for l in loose[:3] if l.iso is not None)
                + f" passed only under {'their' if len(loose) > 1 else 'its'} per-layer tolerance (budget "
                  f"{loose[0].budget:g}x, the culprit's {culprit.budget:g}x): look there first")
    inner = [l.name[len(culprit.module) + 1:] for l in records]
    # a training check judges each module's backward: the fault is in the gradient of the parent's own code
    what = "backward through its own" if result.kind == "train" else "own forward's"
    return (f"inside it: {', '.join(inner[:4])}{' ...' if len(inner) > 4 else ''} "
            f"{'each pass' if len(inner) > 1 else 'passes'} in isolation, so the fault is in its {what} "
            f"code between them (a softmax, mask, scale, rotary embedding or residual add it computes itself, or "
            f"a kernel that replaced them)")


def message(result: CheckResult) -> str:
    lines = [f"parity check failed: {result.name} [{result.dtype}]",
             f"  reference: {env_line(result.reference_env)}",
             f"  candidate: {env_line(result.candidate_env)}"]
    setting = result.extra.get("setting")
    if setting:
        lines.append(f"  setting: {setting}")
    culprit = next((l for l in result.layers if l.name == result.culprit), None)
    if culprit is not None:
        # a block's later call (block#1) is the block itself, not inside it
        inside = f" (inside block {result.culprit_block})" \
            if result.culprit_block and result.culprit_block != culprit.module else ""
        lines.append(f"  culprit: {result.culprit}{inside}: {culprit.reason}"
                     + (" (the first module the setting above changes, not necessarily a bug)" if setting else ""))
        # a note about the culprit itself (an FP8 layer's likely cause: quant/diagnosis.py) goes beside it
        prefix = f"{result.culprit}: "
        cause = next((n[len(prefix):] for n in result.notes if n.startswith(prefix)), "")
        if cause:
            lines.append(f"    likely cause: {cause}")
        # an input its caller built otherwise is where the difference starts, not the culprit's own code
        inside_it = "" if "built by its caller" in cause else _inside(result, culprit)
        if inside_it:
            lines.append(f"    {inside_it}")
        if "sketch_after" in result.extra:
            after = result.extra["sketch_after"]
            lines.append(f"    a sketch golden keeps no module inputs, so the drift may come in with its input: from "
                         f"code that ran after {after or 'the model inputs'} and before it (a parent's own forward, "
                         f"or code between modules); a full golden (sketch off) judges each module on its own")
    elif result.extra.get("no_gradient"):
        n_params = len(result.extra["no_gradient"])
        lines.append(f"  culprit: none among the selected modules' outputs: {n_params} "
                     f"parameter{'s' if n_params > 1 else ''} "
                     f"received no gradient on the candidate, the graph cut in code between the selected "
                     f"modules (see the note)")
    elif result.extra.get("loss_factor") is not None:
        lines.append(f"  culprit: none among the modules: every gradient is {result.extra['loss_factor']:.4g}x the "
                     f"golden's, one factor: the loss or its scaling (see the note)")
    elif result.extra.get("loss_otherwise") is not None:
        lines.append(f"  culprit: the loss itself: {result.extra['loss_otherwise']:.3g}x the reference's error with "
                     f"every module's backward within bounds: a term missing or added, or another reduction "
                     f"(see the note)")
    elif optimizer_groups(result.extra):
        lines.append(f"  culprit: the optimizer: its update is out of bounds for {optimizer_share(result.extra)} "
                     f"(the note names the worst); every module's backward is within bounds")
    elif lm_failure(result.extra) and all(l.passed for l in result.layers) and all(o.passed for o in result.outputs):
        fails = result.extra["lm"]["fails"]
        decode = all(str(f).startswith("KV-cache decoding") for f in fails)
        lines.append(f"  culprit: none among the modules, each within bounds with the model's outputs: {fails[0]}"
                     + (". Only decoding with the cache fails: look at what a full forward never runs (a "
                        "single-query or paged attention kernel, the cache update)" if decode else ""))
    elif any(not l.iso_passed for l in result.layers):
        lines.append("  culprit: none named (the failing layers are listed below)")
    elif result.extra.get("unselected_region"):
        from pytest_rocm_parity.runner.selection import region_text

        lines.append(f"  culprit: none among the selected modules; {region_text(result.extra['unselected_region'])}")
        first = next((l for l in result.layers if l.name == result.first_divergent), None)
        if first is not None and first.prop is not None and first.prop.nonfinite and first.iso_passed:
            # NaN out of inputs within budget: the module may be at fault on values the golden lacks
            lines.append(f"    or {first.name} itself: its propagated output holds {first.prop.nonfinite} non-finite "
                         f"value(s) where the truth is finite, from inputs within their budget, and it passed on "
                         f"the golden's inputs: a fault at input values the golden does not hold (an FP8 code at "
                         f"negative zero, a value past a format's range)")
    elif result.first_divergent:
        lines.append("  culprit: none in isolation; the model outputs drifted (accumulated error)")
    else:
        lines.append("  culprit: none among the selected modules (each passed, isolated and propagated): the "
                     "outputs differ after the last of them")
    if result.first_divergent:
        lines.append(f"  first divergent layer (propagated): {result.first_divergent}")
    elif any(l.prop is not None for l in result.layers):
        lines.append("  first divergent layer (propagated): none, every selected layer within its propagated budget")
    elif result.layers:   # a fast replay runs no propagated pass
        lines.append("  first divergent layer (propagated): not judged by the fast replay (--parity-replay=full "
                     "judges it and every model output)")
    bad_out = [o for o in result.outputs if not o.passed or not o.prop_passed]
    # the worst first (a training check's optimizer rows come one per module, in name order)
    bad_out.sort(key=lambda o: -max([m.ratio for m in (o.iso, o.prop) if m is not None] or [math.inf]))
    for o in bad_out[:3]:
        lines.append(f"  output {o.name}: {o.reason}")
    if len(bad_out) > 3:
        lines.append(f"  ... and {len(bad_out) - 3} more outputs out of bounds")
    lm = result.extra.get("lm")
    if lm:
        gen = lm.get("generation") or {}
        nonfinite = nonfinite_logits(lm)
        lines.append(f"  lm: ppl {lm['ppl']:.6g} vs reference {lm['ppl_ref']:.6g} (rel {lm['ppl_rel_delta']:+.2e}), "
                     f"top-1 agreement {lm['top1_agreement']:.4f} ({lm['confident_flips']} confident flips), "
                     f"KL mean {lm['kl_mean']:.2e} max {lm['kl_max']:.2e}"
                     + (f", {nonfinite}" if nonfinite else "")
                     + (f", first divergent generation step: {steps_text(gen.get('first_divergent_step'))}" if gen else ""))
    lines += table(result)
    hint = tolerance_hint(result)
    if hint:
        lines.append(hint)
    for n in result.notes:
        if n != setting and not (result.culprit and n.startswith(f"{result.culprit}: ")):
            lines.append(f"  note: {n}")
    regen = regen_hint(result)
    if regen:
        lines.append(regen)
    lines.append(f"  golden: {result.golden}")
    text = "\n".join(lines)
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + "\n  ... (message capped; see --parity-report=DIR)"
    return text


def raise_if_failed(results: Sequence[CheckResult]) -> None:
    __tracebackhide__ = True
    failed = [r for r in results if not r.passed]
    if failed:
        raise AssertionError("\n\n".join(message(r) for r in failed))
