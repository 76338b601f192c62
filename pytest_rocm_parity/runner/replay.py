"""Replay: judge a candidate against a golden on the candidate device.

The model runs propagated (each module's output compared as it appears) and isolated (each module
fed the golden inputs), comparing on the device against goldens loaded straight to it.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.judging.compare import block_stats, exact_metrics, float_metrics, metrics_many, residual_metrics
from pytest_rocm_parity.runner.engine import (
    KEEP_PLACEMENT,
    config_changes,
    model_config,
    BufferState,
    golden_regen_command,
    autocast_as,
    autocast_note,
    autocast_state,
    captured_elsewhere,
    explained_by,
    OUTPUT,
    CheckSpec,
    Hooks,
    _NotPlain,
    _patch,
    _plan,
    _run,
    cast_inputs,
    eval_mode,
    home_device,
    normalize_inputs,
    numerics,
    same_structure,
    structure_changes,
    merged_adapters,
    weights_changed,
    weights_now,
    submodule,
    walk_model,
)
from pytest_rocm_parity.errors import GoldenCorrupt, GoldenStale
from pytest_rocm_parity.options import shell_quote
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import GoldenStore, expected_digest
from pytest_rocm_parity.judging.judge import Rule, fail_moved_choices, finish, judge_layer, jumped, may_fail
from pytest_rocm_parity.judging.records import NOT_CALLED, CheckResult, LayerRecord, LeafMetrics
from pytest_rocm_parity.runner.choices import Decisions, expert_errors, present
from pytest_rocm_parity.runner.selection import Selected, select, unselected_children, unselected_region
from pytest_rocm_parity.judging.tolerance import Tolerance
from pytest_rocm_parity.runner.tree import (aligned_leaves, constant_leaves, map_tensors, named_fields, same_constant,
                                          split_leaves, tensor_leaves, top_level)
from pytest_rocm_parity.quant.allowance import noise_allowance
from pytest_rocm_parity.quant.diagnosis import quant_notes
from pytest_rocm_parity.quant.storage import quantized_tensor_ids
from pytest_rocm_parity.runner.padding import Padding
from pytest_rocm_parity.runner.wrappers import (cast_in_place, inlines_compiled_children, is_dispatched_experts, is_exported,
                                                torch_training_kinds, training_paths, unwrap)


def _replay_rung_sketch(m: Any, spec: CheckSpec, meta: dict[str, Any], reader: RungReader, rung: str,
                        args0: Any, kwargs0: Any, selected: list[Selected]) -> CheckResult:
    """Propagated replay against sketches: every module's output sketched on the device as it appears."""
    from pytest_rocm_parity.golden.sketch import leaf_group, sketch

    group = int(meta["sketch"])
    whole_below = int(meta.get("whole_below") or 0)   # 0: a golden that sketched every leaf
    tol = spec.tolerance
    u = tol.unit_roundoff(rung)
    layers = {e["key"]: e for e in meta["layers"]}
    noise = noise_allowance(meta, m)

    optional: dict[str, list[str]] = {}   # optional output leaf -> the calls only the reference returned it from

    def judge_leaves(key: str, out: Any, entry: dict[str, Any]) -> list[LeafMetrics]:
        names: dict[str, str] = entry["out"]
        got = aligned_leaves(tensor_leaves(out), entry)
        res = []
        for p, gk in names.items():
            c = got.get(p)
            if c is None and optional_leaf(p):
                optional.setdefault(p, []).append(key)
            elif c is None:
                res.append(LeafMetrics(leaf=p, numel=0, ratio=float("inf"), ratio_lo=float("inf"),
                                       note=f"shape: the module's main output {p!r} is missing on the candidate"))
            elif gk.startswith("x/"):
                res.append(exact_metrics(p, c.detach(), reader.get(gk)))
            else:
                ref_s = reader.get(gk)
                t_s = reader.get(f"skt/{key}/{p}").to(ref_s.device)
                c_s = sketch(c, leaf_group(c.numel(), group, whole_below), f"{key}/{p}").to(ref_s.device)
                mm = float_metrics(p, c_s, ref_s, t_s, u, tol.confidence, tol.nan)
                mm.numel = int(c.numel())
                mm.allow_noise(noise.get(f"{key}/{p}/propagated", 0.0))
                res.append(mm)
        return res

    prop: dict[str, list[LeafMetrics]] = {}
    with Hooks(m, selected, None, lambda k, s, o: prop.__setitem__(k, judge_leaves(k, o, layers[k]))
               if k in layers else None, golden=layers):
        out = _run(m, args0, kwargs0)
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True)
    for key, rec in _records_in_order(meta, layers):
        rule = Rule.of(tol.for_layer(layers[key]["name"]), rung)   # the module's, for each of its calls
        judge_layer(rec, [], prop.get(key, []), rule, sketch=True)
        reasons = [rule.sketch_failure(mm) for mm in prop.get(key, [])]
        rec.prop_passed = rec.iso_passed = rec.passed = not any(reasons)
        rec.budget = rule.sketch_budget
        rec.reason = next((r for r in reasons if r), "")
        result.layers.append(rec)
    for mm in judge_leaves(OUTPUT, out, meta["outputs"]):
        rec = LayerRecord(name=f"{OUTPUT}.{mm.leaf}")
        rule = Rule.of(tol.for_layer(rec.name), rung)
        judge_layer(rec, [], [mm], rule, sketch=True)
        rec.reason = rule.sketch_failure(mm)
        rec.passed = rec.prop_passed = not rec.reason
        result.outputs.append(rec)
    result.notes += optional_notes({p: [k for k in keys if k != OUTPUT] for p, keys in optional.items()},
                                   [p for p, keys in optional.items() if OUTPUT in keys])
    result.notes.append(f"sketch golden (groups of {group}): propagated judgement only; the culprit is the "
                        f"smallest module where the candidate first drifts")
    result = finish(result, tol)
    if result.culprit is not None:
        # no inputs are kept: the first drift may come in with the culprit's input, from code that ran
        # after the last module that agreed (a parent's own forward before it, glue between modules)
        at = next(i for i, l in enumerate(result.layers) if l.name == result.culprit)
        module = result.layers[at].module
        prev = next((l.name for l in reversed(result.layers[:at])
                     if l.passed and not module.startswith(f"{l.module}.")), None)
        result.extra["sketch_after"] = prev
    return result


def _records_in_order(meta: dict[str, Any], layers: dict[str, dict[str, Any]]) -> Iterator[tuple[str, LayerRecord]]:
    """An empty record for every captured module call, in execution order."""
    for key in meta.get("order", list(layers)):
        e = layers.get(key)
        if e is not None:
            yield key, _record(key, e)


def _record(key: str, e: dict[str, Any]) -> LayerRecord:
    """An empty record of the captured call ``key`` (its golden entry ``e``)."""
    return LayerRecord(name=key, level=e["level"], primary=e["primary"], decides=e.get("decides"))


def load_truth(reader: RungReader, name: str, ref: Any) -> Any:
    """Rebuild a float64 truth from its stored residual (see residual)."""
    import torch

    if ref.is_complex():
        return ref.to(torch.complex128) + reader.get(name).to(ref.device, torch.complex128)
    return ref.to(torch.float64) + reader.get(name).to(ref.device, torch.float64)


# ---------------------------------------------------------------------------------------------
# replay

def _dtypes_advice(spec: CheckSpec, held: list[str]) -> str:
    """Where this run's dtypes come from, and how to ask for the rungs a golden holds instead."""
    if spec.dtypes_from == "marker":
        return (f"set by @pytest.mark.parity(dtypes=...), which --parity-dtypes does not override). Replay the rungs "
                f"it holds (@pytest.mark.parity(dtypes={held!r}))")
    if spec.dtypes_from == "check":
        return (f"set by the check's dtypes=, which --parity-dtypes does not override). Replay the rungs it holds "
                f"(dtypes={held!r} in the check)")
    return (f"--parity-dtypes, parity_dtypes or the check's dtypes=). Replay the rungs it holds "
            f"(--parity-dtypes={','.join(held)})")


def check_stale(model: Any, inputs: Any, spec: CheckSpec, manifest: dict[str, Any], golden_path: str) -> list[str]:
    """Raise GoldenStale where the golden describes another model, selection or setting; returns notes
    on what differs and is judged all the same (modules without parameters fused away or added)."""
    regen = golden_regen_command(manifest, spec)
    old = manifest.get("fingerprint", {})
    problems = []
    notes: list[str] = []
    same_tensors = False
    # one walk of the model for the structure, the adapters and the sampled weights: a cold replay
    # pays each walk, and each of the weights' reads from a GPU
    now = weights_now(model, old)
    if not same_structure(model, old, now):
        changes = structure_changes(model, old)
        # the same parameters and buffers under another module tree: a port that fused a module
        # without parameters (an MLP's activation into its kernel) or added one is the same model
        same_tensors = not changes and bool(old.get("tensors"))
        if not same_tensors:
            problems.append(f"the model's structure changed: parameters or buffers {changes}" if changes else
                            "the model's structure (module names, parameter names or shapes) changed")
    # a quantized model's weights are its codes times scales in a format of the candidate's choosing:
    # judged by what they mean (quant/diagnosis.py), not matched by value
    merged = merged_adapters(model, old, now)
    changed = "" if problems or _quantized(model, manifest) else weights_changed(model, old, merged, now)
    if changed:
        problems.append(changed)
    elif merged and not problems:
        notes.append(f"adapter{'s' if len(merged) > 1 else ''} on {', '.join(merged[:3])}"
                     f"{f' and {len(merged) - 3} more' if len(merged) > 3 else ''} "
                     f"{'are' if len(merged) > 1 else 'is'} merged into the base weights on one side and not on "
                     f"the other (merge_and_unload): those weights may differ by the merge, and the modules are "
                     f"judged by their outputs")
    changed_config = config_changes(manifest.get("config"), model_config(model))
    if changed_config and not problems:
        # the weights are the golden's, the configuration is not: what that changes is no backend's doing
        notes.append(f"the model's config differs from the golden's ({'; '.join(changed_config[:4])}"
                     f"{' ...' if len(changed_config) > 4 else ''}): what it computes differently comes from the "
                     f"configuration, not the backend; if the change is intended, regenerate: {regen}")
    selected = [s.name for s in select(model, spec.layers, spec.drill)]
    old_layers = [l["name"] for l in manifest.get("layers", [])]
    gd = manifest.get("drill")
    if selected != old_layers and isinstance(gd, int) and gd != spec.drill and not problems \
            and [s.name for s in select(model, spec.layers, gd)] == old_layers:
        # the same model judged at another depth: a setting to change, not a golden to regenerate
        if spec.drill < gd:   # a shallower golden is a subset of this one
            other = (f"derive a golden at drill {spec.drill} from this one, no GPU needed: rocm-parity golden derive "
                     f"{shell_quote(str(Path(golden_path).parent.parent))} {shell_quote(spec.name)} --to NEW_NAME "
                     f"--drill {spec.drill}{' --test ' + shell_quote(spec.test) if spec.test else ''}, then name the "
                     f"check NEW_NAME (name=)")
        else:   # a deeper one holds modules this golden never recorded: only the reference can capture them
            other = f"capture drill {spec.drill} on the reference machine: {regen}"
        raise GoldenStale(
            f"golden {golden_path} for {spec.name!r} was captured at drill {gd}; this run asks for drill "
            f"{spec.drill} (--parity-drill, parity_drill or the check's drill=). Replay at drill {gd}, or {other}",
            golden_path)
    if selected != old_layers and sorted(selected) != sorted(old_layers):
        names = {n for n, _ in model.named_modules()}
        added = [n for n in selected if n not in old_layers]
        removed = [n for n in old_layers if n not in selected]
        if same_tensors and not any(n in names for n in removed):
            if removed:
                notes.append(f"module{'s' if len(removed) > 1 else ''} without parameters {removed[:5]}"
                             f"{' ...' if len(removed) > 5 else ''} of the golden {'are' if len(removed) > 1 else 'is'} "
                             f"not in the candidate (fused into its parent): judged through the parent")
            if added:
                notes.append(f"module{'s' if len(added) > 1 else ''} without parameters {added[:5]}"
                             f"{' ...' if len(added) > 5 else ''} of the candidate {'are' if len(added) > 1 else 'is'} "
                             f"not in the golden: not judged on {'their' if len(added) > 1 else 'its'} own")
        elif is_exported(model):
            # torch.export's module: the same weights under its own tree, so no regeneration is the fix
            raise GoldenStale(
                f"golden {golden_path} for {spec.name!r}: the candidate is a torch.export program's module, whose "
                f"module tree ({added[:3]} ...) is not the eager model's the golden was captured from, so its "
                f"layers cannot be matched. Check the eager model it was exported from (the exported graph runs "
                f"the same ops; to judge compiled code, torch.compile the eager model: docs/migrations.md)",
                golden_path)
        elif not added and not problems:
            # a narrower selection of the same model: the golden's own selection is a setting to keep
            was = manifest.get("layer_patterns")
            raise GoldenStale(
                f"golden {golden_path} for {spec.name!r} holds {len(old_layers)} modules; this check selects "
                f"{len(selected)} of them (layers={list(spec.layers) if spec.layers else None!r}, drill={spec.drill}). "
                f"A replay judges the selection its golden was captured with: give the check "
                f"layers={was!r} as at capture (every module of the golden is judged, {removed[0]!r} among them), or "
                f"capture the narrower selection on the reference machine: {regen}", golden_path)
        else:
            problems.append("the layer list changed ("
                            + ", ".join(f"{w} {v[:5]}{' ...' if len(v) > 5 else ''}"
                                        for w, v in (("added", added), ("removed", removed)) if v) + ")")
    if int(manifest.get("sketch") or 0) != int(spec.sketch or 0):
        problems.append(f"captured with sketch={manifest.get('sketch') or 0}, asked sketch={spec.sketch or 0}")
    held = list(manifest.get("rungs", {}))
    missing = [d for d in spec.dtypes if d not in held]
    if missing and not problems:
        # the same model asked at a precision its golden lacks: a setting, or new rungs to capture
        # "too" where every rung it holds is asked as well; else the asked ones stand in for some it holds
        instead = [d for d in held if d not in spec.dtypes]
        also = f" instead of {', '.join(instead)}" if instead else " too"
        owner = manifest.get("test")
        if isinstance(owner, str) and owner and spec.test and owner != spec.test:
            # that test's regeneration captures the rungs it asks for, not this one's
            capture = (f"or capture the new ones on the reference machine from the test that captured it, {owner}, "
                       f"once it asks for {', '.join(missing)} too: {regen}; or give this check its own name= and "
                       f"capture that")
        else:
            capture = f"or capture the new ones on the reference machine: {regen}"
        raise GoldenStale(
            f"golden {golden_path} for {spec.name!r} holds the rungs {', '.join(held)}; this run asks for "
            f"{', '.join(missing)}{also} ({_dtypes_advice(spec, held)}, {capture}", golden_path)
    if missing:
        problems.append(f"dtypes {missing} were not captured (golden holds {held})")
    if problems:
        # the command last, so that it can be copied whole
        raise GoldenStale(f"stale golden {golden_path} for {spec.name!r}: " + "; ".join(problems)
                          + captured_elsewhere(manifest, spec)
                          + f". Regenerate this model's golden on the reference machine: {regen}", golden_path)
    return notes


def _quantized(model: Any, manifest: dict[str, Any]) -> bool:
    return (any(r.get("quant") for r in manifest.get("rungs", {}).values() if isinstance(r, dict))
            or bool(quantized_tensor_ids(model.modules())))


# Hugging Face call flags that change which optional outputs a model returns, not what it computes
CONVENTION_FLAGS = frozenset({"use_cache", "output_attentions", "output_hidden_states", "return_dict"})


def convention_changes(meta: dict[str, Any], inputs: Any) -> list[str]:
    """The calling-convention flags the candidate's inputs set otherwise than the reference's, in words."""
    import json as _json

    now = _json.loads(_json.dumps(constant_leaves(inputs), default=str))
    old = meta.get("inputs", {}).get("const", {})
    return [f"{p.rsplit('.', 1)[-1]}={now.get(p)} (reference: {old.get(p)})"
            for p in sorted(set(now) | set(old))
            if p.rsplit(".", 1)[-1] in CONVENTION_FLAGS and now.get(p) != old.get(p)]


def convention_note(meta: dict[str, Any], inputs: Any) -> list[str]:
    """The note on the call flags the candidate is called with otherwise than the reference (none: [])."""
    flags = convention_changes(meta, inputs)
    return [f"the candidate is called with {', '.join(flags)}: a calling convention; the outputs it adds or "
            f"drops are notes, what it computes is judged"] if flags else []


def _inputs_changed(args0: Any, kwargs0: Any, reader: RungReader, rung: str, meta: dict[str, Any] | None = None) -> str:
    import json as _json

    import torch

    dtype = dt.to_torch(rung)
    args, kwargs = cast_inputs(args0, kwargs0, dtype, "cpu")
    if meta is not None:
        now = _json.loads(_json.dumps(constant_leaves({"args": args, "kwargs": kwargs}), default=str))
        old = meta.get("inputs", {}).get("const", {})
        for p in sorted(set(now) | set(old)):
            if p.rsplit(".", 1)[-1] in CONVENTION_FLAGS:
                continue   # the candidate's own calling convention (replay notes the change)
            a, b = old.get(p), now.get(p)
            if not same_constant(a, b):
                return f"non-tensor input {p} changed ({a!r} -> {b!r})"
    given = tensor_leaves({"args": args, "kwargs": kwargs})
    stored = {k[len("input/"):] for k in reader.keys if k.startswith("input/")}
    if set(given) != stored:
        why = f"input names changed ({sorted(given)} vs stored {sorted(stored)})"
        moved = {p.split(".", 1)[0] for p in set(given) ^ stored}
        if moved == {"args", "kwargs"} and len(set(given) - stored) == len(stored - set(given)):
            kw = sorted(p.split(".", 2)[1] for p in stored if p.startswith("kwargs."))
            why += (f": given by position where the capture passed {', '.join(kw)} by keyword; pass "
                    f"{'them' if len(kw) > 1 else 'it'} as the capture did" if kw else
                    ": given by keyword where the capture passed them by position; pass them as the capture did")
        return why
    for p, t in given.items():
        g = reader.get(f"input/{p}").to("cpu")
        if g.shape != t.shape:
            return f"input {p}: shape {tuple(t.shape)} vs stored {tuple(g.shape)}"
        if g.dtype != t.dtype:   # both as cast for the rung: a float input is the rung's dtype on both sides
            return f"input {p}: dtype {t.dtype} vs stored {g.dtype}"
        if not torch.equal(g, t) and not (t.is_floating_point() and torch.equal(g.isnan(), t.isnan())
                                          and torch.equal(g.nan_to_num(), t.nan_to_num())):
            return f"input {p}: values differ from the stored inputs"
    return ""


def _refuse_changed_inputs(why: str, spec: CheckSpec, mpath: str, manifest: dict[str, Any]) -> None:
    if why:
        # values that differ may be a backend's RNG; a shape, a dtype or a name is the test's own code
        rng = (" If they differ only by backend RNG, build them on the CPU with a seeded torch.Generator;"
               if why.endswith("values differ from the stored inputs") else "")
        raise GoldenStale(
            f"stale golden {mpath} for {spec.name!r}: {why}{captured_elsewhere(manifest, spec)}. A replay judges "
            f"the candidate on the inputs the golden stored, so the test must build the same ones.{rng} If the "
            f"test's inputs changed on purpose, regenerate: {golden_regen_command(manifest, spec)}", mpath)


def check_inputs(inputs: Any, spec: CheckSpec, store: GoldenStore, manifest: dict[str, Any]) -> None:
    """GoldenStale where ``inputs`` are not those the golden stored, as a replay would raise it: a
    capture run that keeps the golden says so then, not only the next replay."""
    mpath = str(store.manifest_path(spec.name))
    rung = next(iter(manifest["rungs"]))
    args0, kwargs0 = normalize_inputs(inputs)
    reader = RungReader(store.rung_file(spec.name, manifest, rung), "cpu")
    try:
        _refuse_changed_inputs(_inputs_changed(args0, kwargs0, reader, rung, manifest["rungs"][rung]), spec, mpath,
                               manifest)
    finally:
        reader.release()


@inlines_compiled_children
def replay(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
           env: dict[str, Any] | None = None) -> list[CheckResult]:
    """Judge the candidate against the golden, one CheckResult per rung."""
    from pytest_rocm_parity.guards import require_inputs
    from pytest_rocm_parity.migration.backend import collect_env

    require_inputs(inputs)
    inner = unwrap(model)
    manifest = store.read_manifest(spec.name)
    mpath = str(store.manifest_path(spec.name))
    tree_notes = check_stale(inner, inputs, spec, manifest, mpath)
    autocast = autocast_note(manifest, home_device(inner, device))
    tree_notes += [autocast] if autocast else []
    args0, kwargs0 = normalize_inputs(inputs)
    cand_env = env or collect_env(str(home_device(inner, device)))
    judged: dict[str, CheckResult] = {}
    corrupt: GoldenCorrupt | None = None
    # float32 first: state a module builds on its first long input (a rotary cache grown in the
    # input's dtype) is then built at full precision, and kept for the other rungs (cast_in_place)
    for rung in sorted(spec.dtypes, key=lambda r: r != "float32"):
        try:
            judged[rung] = _replay_one(model, inner, spec, store, manifest, mpath, rung, device, args0, kwargs0,
                                       autocast, tree_notes, cand_env)
        except GoldenCorrupt as exc:   # the other rungs are judged all the same: the error says what they found
            corrupt = corrupt or exc
    results = [judged[r] for r in spec.dtypes if r in judged]
    if corrupt is not None:
        if results:
            raise GoldenCorrupt(f"{corrupt}. The intact rungs were judged: " + "; ".join(
                f"{r.dtype} {'passed' if r.passed else 'FAILED' + (f' (culprit {r.culprit})' if r.culprit else '')}"
                for r in results), corrupt.path) from corrupt
        raise corrupt
    return where_unjudged(inner, spec, results)


def where_unjudged(model: Any, spec: CheckSpec, results: list[CheckResult]) -> list[CheckResult]:
    """Failing results say where a fault the selection did not judge lies: the region between the last
    agreeing and the first divergent selected module and the ``layers=`` globs that would judge it
    (extra["unselected_region"], shown by assertion.message), or the culprit's unselected sub-modules."""
    for r in results:
        if r.passed:
            continue
        region = unselected_region(model, r, spec.layers)
        if region is not None:
            region["padded"] = any(n.endswith("not judged") and "padded" in n for n in r.notes)
            r.extra["unselected_region"] = region
            if region["modules"] or _jumps(r):   # not "no single layer" accumulating drift
                r.notes = [n for n in r.notes if "accumulated drift" not in n]
            else:   # either, and the culprit line names the code: the note says both
                after, before = region["after"] or "the model's inputs", region["before"] or "the model's outputs"
                r.notes = [f"{n}, or the code between {after} and {before} that the culprit line names"
                           if "accumulated drift" in n else n for n in r.notes]
        note = unselected_children(model, r, spec.drill) if not spec.layers else ""
        if note:
            r.notes.append(note)
    return results


def _jumps(r: CheckResult) -> bool:
    """Whether the propagated error leaps where it first diverges: the first divergent layer, or else
    a failing model output, is over judge.JUMP times its budget."""
    rows = [l for l in r.layers if l.name == r.first_divergent] or [o for o in r.outputs if not o.prop_passed]
    return any(jumped(l) for l in rows)


def _replay_one(model: Any, inner: Any, spec: CheckSpec, store: GoldenStore, manifest: dict[str, Any], mpath: str,
                rung: str, device: str, args0: Any, kwargs0: Any, autocast: str | None, tree_notes: list[str],
                cand_env: dict[str, Any]) -> CheckResult:
    """One rung of replay(): its file read, checked and judged."""
    meta = manifest["rungs"][rung]
    path = store.rung_file(spec.name, manifest, rung)
    reader = RungReader(path, str(home_device(inner, device)), expected_digest(meta), background_verify=True)
    try:
        _preload(reader, spec, meta)
        _refuse_changed_inputs(_inputs_changed(args0, kwargs0, reader, rung, meta), spec, mpath, manifest)
        changed: list[str] = []
        # a differing autocast explains mixed dtypes first (the inner one names it; the outer leaves ours be)
        with explained_by(spec.name, lambda: _dtype_changes_text(changed)), explained_by(spec.name, autocast):
            result = _replay_rung(model, spec, meta, reader, rung, device, {"args": args0, "kwargs": kwargs0},
                                  changed)
    except Exception:
        reader.verification.result()   # a damaged file is named before the error it caused
        raise
    finally:
        reader.release()
    reader.verification.result()
    result.notes.extend(tree_notes)
    if autocast and not result.passed:
        # a setting that differs from the capture's explains a failure before any module does
        result.extra["setting"] = autocast
    result.reference_env = manifest.get("reference_env", {})
    result.candidate_env = cand_env
    result.golden = str(path)
    result.regen = golden_regen_command(manifest, spec)
    return result


def _dtype_changes_text(changed: list[str]) -> str | None:
    """Why a replay raised, where a judged module returned another dtype than the golden's first."""
    if not changed:
        return None
    return (f"{changed[0]}{f' (and {len(changed) - 1} more)' if len(changed) > 1 else ''}, and the operations "
            f"after it got mixed dtypes: a kernel or wrapper that returns another dtype than its input (cast its "
            f"result back: out.to(x.dtype))")


PRELOAD_FRACTION = 0.5
CPU_PRELOAD_BYTES = 256 << 20


def _preload(reader: RungReader, spec: CheckSpec, meta: dict[str, Any]) -> None:
    """The goldens the passes read, loaded in a thread while the forward runs (RungReader.preload),
    in the order the passes ask for them (``meta``: the rung's): on a GPU up to half its free memory,
    on the CPU up to CPU_PRELOAD_BYTES.

    Why: a lazy load inside a hook is a blocking host-to-device copy per module, which stalls the
    device's queue. On the CPU a golden read lazily is freed once judged, so a large one is never
    resident whole; a small one is loaded up front, so that CPU and GPU replays take one path.
    """
    import torch

    dev = torch.device(reader.device)
    keys = preload_order(meta, sorted(reader.keys), fast_pass(spec))
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        reader.preload(keys, int(free * PRELOAD_FRACTION), background=True)
    elif dev.type == "cpu" and sum(reader.nbytes(k) for k in keys) <= CPU_PRELOAD_BYTES:
        reader.preload(keys, CPU_PRELOAD_BYTES, background=True)


def fast_pass(spec: CheckSpec) -> bool:
    """Whether a replay runs the fast passes: asked for, and no extra judge (a language model's
    check) that needs the propagated pass's outputs."""
    return spec.replay == "fast" and spec.extra_judge is None


def preload_order(meta: dict[str, Any], keys: list[str], fast: bool) -> list[str]:
    """The ``keys`` a replay of rung ``meta`` reads, in the order it first reads them: the model's
    inputs, then each pass's reads as its hooks make them, a call's activation inputs as it starts
    and its outputs and truth as it returns (the choices of a watched call inside a judged one with
    them): in a full replay first the propagated pass, then one pass per level; in a fast one the
    first level's pass, the model's outputs, then the deeper levels. Keys no pass names (a language
    model's extra tensors) come last.

    Left out, read only if asked for: what a passing replay never reads. That is an input its
    caller builds (position ids, a mask: compared only to explain a failure), and in a fast replay
    the propagated truth, even a model output's where the output is a first-level module's own
    tensor (a head's logits), which that module's verdict judges.
    """
    rank: dict[str, int] = {}

    def add(*ks: str) -> None:
        for k in ks:
            rank.setdefault(k, len(rank))
    add(*sorted(k for k in keys if k.startswith("input/")))
    judged = {e["key"]: e for e in meta.get("layers", [])}
    watched = {e["key"]: e for e in meta.get("watch", [])}
    acts = activation_paths(judged)   # the inputs a pass swaps in; the others are the candidate's
    events: list[tuple[bool, dict[str, Any]]] = []   # (returns, entry) in the order the hooks see them
    open_: list[dict[str, Any]] = []
    unplaced = [e for k, e in watched.items() if k not in judged]   # no place in the order: in their caller

    def close() -> None:
        done = open_.pop()
        for w in [w for w in unplaced if inside(w, done)]:
            events.extend([(False, w), (True, w)])
            unplaced.remove(w)
        events.append((True, done))

    def inside(e: dict[str, Any], outer: dict[str, Any]) -> bool:
        return not outer["name"] or e["name"].startswith(outer["name"] + ".")
    for key in meta.get("order", list(judged)):
        if key not in judged:
            continue
        while open_ and not inside(judged[key], open_[-1]):
            close()
        events.append((False, judged[key]))
        open_.append(judged[key])
    while open_:
        close()
    first = min((int(e.get("level", 0)) for e in judged.values()), default=0)
    theirs = {gk for e in judged.values() if int(e.get("level", 0)) == first for gk in e.get("out", {}).values()}
    outputs = [k for p, gk in meta.get("outputs", {}).get("out", {}).items()
               for k in ((gk, f"gtruth/{OUTPUT}/{p}") if not (fast and gk in theirs) else (gk,))]
    if not fast:   # the propagated pass: each judged call's outputs and their truth as it returns
        for returns, e in events:
            if returns and e["key"] in judged:
                add(*(k for p, gk in e.get("out", {}).items() for k in (gk, f"gtruth/{e['key']}/{p}")))
        add(*outputs)
    for level in sorted({int(e.get("level", 0)) for e in judged.values()}):
        for returns, e in events:
            here = int(e.get("level", 0)) == level and e["key"] in judged
            if not returns and here:
                add(*acts.get(e["key"], {}).values())
            elif returns and here:
                add(*(k for p, gk in e.get("out", {}).items() for k in (gk, f"truth/{e['key']}/{p}")))
            elif returns and (e["key"] in watched or e.get("decides")) and int(e.get("level", 0)) > level:
                add(*e.get("out", {}).values())
        add(*outputs)   # the fast pass reads them after its first level
    held = set(keys)
    rest = [k for k in keys if k not in rank and not k.startswith(("t/", "truth/", "gtruth/"))]
    return [k for k in rank if k in held] + rest   # a dict keeps the order of its keys' first add


def activation_paths(layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per module call, the input leaves fed from the golden in the isolated pass: those that carry
    activations, as capture recorded them (``act``, capture.DataFlow). Anything else (an attention
    mask in whatever form the attention implementation wants, position ids, rotary tables built
    outside a selected module, a cache) was built by the model's own glue and comes from the
    candidate's run. A golden without ``act`` (captured before it was recorded) feeds every recorded
    input, as it was judged then: recapture it to judge another attention implementation fairly.
    """
    return {key: {p: e.get("in", {}).get(p, p) for p in (e["act"] if "act" in e else e.get("in", {}))}
            for key, e in layers.items()}


class _Judge:
    """Comparisons of one pass, judged after it with one wait for the device (flush).

    On a GPU with Triton each output is snapshotted (a later in-place write, a parent's ``+=``, must
    not change what is judged) and the flush computes every leaf's statistics in one batched launch
    (kernels.block_stats_many), or with torch ops until the kernel pays for its start-up
    (kernels.kernel_route); elsewhere the statistics start as each output appears, reading it
    before any later write.
    """

    def __init__(self, rung: str, u: float, padding: Padding | None, obtained: dict[str, Any] | None,
                 noise: dict[str, float] | None = None) -> None:
        self.rung, self.u, self.padding, self.obtained = rung, u, padding, obtained
        self.noise = noise or {}   # tag -> activation-quantization noise allowed (quant/allowance.py)
        # (sink, index, leaf, stats or None for the batched launch, c, ref, res, tolerance, isolated, tag)
        self.items: list[tuple[list[Any], int, str, Any, Any, Any, Any, Tolerance, bool, str]] = []
        from pytest_rocm_parity.runner import kernels

        self.codes = kernels.dtype_codes() if kernels.triton_usable() else {}   # dtypes of the batched launch

    def leaf(self, sink: list[Any], key: str, leaf: str, c: Any, ref: Any, res: Any | None, tol: Tolerance,
             isolated: bool, tag: str) -> None:
        """Judge output ``leaf`` of call ``key`` into ``sink``; ``res``: its stored truth residual,
        None for an exact (integer, bool) leaf, or "" when only its presence is checked."""
        if c.requires_grad:
            c = c.detach()
        pad = self.padding
        if res is None:
            c2, r2 = pad.unpadded(key, leaf, c, ref) if pad is not None else (c, ref)
            sink.append(exact_metrics(leaf, c2, r2))
            self.keep_if_failing(sink[-1], c, tol, isolated, tag, ref)
            return
        if isinstance(res, str):
            return
        if res.device != ref.device:
            res = res.to(ref.device)
        if pad is not None:
            c, ref, res = pad.unpadded(key, leaf, c, ref, res)
        quick = (c.shape == ref.shape == res.shape and ref.numel() > 0 and c.device == ref.device
                 and not (c.is_complex() or ref.is_complex() or res.is_complex()))
        if not quick:
            sink.append(residual_metrics(leaf, c, ref, res, self.u, tol.confidence, tol.nan))
            sink[-1].allow_noise(self.noise.get(tag, 0.0))
            self.keep_if_failing(sink[-1], c, tol, isolated, tag, ref, res)
            return
        sink.append(None)
        codes = self.codes
        if c.is_cuda and c.dtype in codes and ref.dtype in codes and res.dtype in codes \
                and ref.is_contiguous() and res.is_contiguous():
            import torch

            c = c.clone(memory_format=torch.contiguous_format)
            self.items.append((sink, len(sink) - 1, leaf, None, c, ref, res, tol, isolated, tag))
            return
        st = block_stats(c, ref, res)
        self.items.append((sink, len(sink) - 1, leaf, st, c, ref, res, tol, isolated, tag))

    def _stats(self) -> list[Any]:
        """Every item's (nb, len(Stat)) host statistics: the batched ones in one launch, then one wait."""
        import torch

        from pytest_rocm_parity.runner import kernels
        from pytest_rocm_parity.judging.compare import Stat, block_layout

        batch = [i for i, it in enumerate(self.items) if it[3] is None]
        started = [it[3] for it in self.items if it[3] is not None]
        if batch:
            layouts = [block_layout(int(self.items[i][5].numel())) for i in batch]
            leaves = [self.items[i][4:7] for i in batch]
            stats = None
            if kernels.kernel_route(sum(int(leaf[0].numel()) for leaf in leaves)):
                try:
                    stats = kernels.block_stats_many(leaves, layouts)
                except Exception as exc:   # a Triton that cannot compile the kernel here: the torch path
                    kernels.disable_triton(exc)
                    self.codes = {}
            if stats is None:
                stats = kernels.block_stats_torch_many(leaves, layouts)
            started.append(stats)
        host: Any = torch.cat([t.reshape(-1, len(Stat)).to(torch.float64) for t in started]).to("cpu").numpy()
        out: list[Any] = [None] * len(self.items)
        row = 0
        for i, it in enumerate(self.items):   # the started ones first, in order, then the batch
            if it[3] is not None:
                n = int(it[3].shape[0])
                out[i] = host[row:row + n]
                row += n
        for i in batch:
            n = block_layout(int(self.items[i][5].numel()))[0]
            out[i] = host[row:row + n]
            row += n
        return out

    def flush(self) -> None:
        """Every queued leaf judged into its sink."""
        if not self.items:
            return
        stats = self._stats()
        done = metrics_many([(it[2], int(it[5].numel()), st, it[7].confidence)
                             for it, st in zip(self.items, stats)], self.u)
        for (sink, i, leaf, _st, c, ref, res, tol, isolated, tag), m in zip(self.items, done):
            if m is None:   # a sum met a NaN/Inf: the masked float64 path
                m = residual_metrics(leaf, c, ref, res, self.u, tol.confidence, tol.nan)
            m.allow_noise(self.noise.get(tag, 0.0))
            sink[i] = m
            self.keep_if_failing(m, c, tol, isolated, tag, ref, res)
        self.items.clear()

    def keep_if_failing(self, m: LeafMetrics, c: Any, tol: Tolerance, isolated: bool, tag: str, ref: Any,
                        res: Any = None) -> None:
        """Keep host copies of a leaf that fails, for the failing-tensor export (--parity-report): the
        candidate's output under ``<layer>/<leaf>/<run>``, beside it the reference's
        (``<layer>/<leaf>/reference``) and the float64 truth the run judged against
        (``<layer>/<leaf>/<run>_truth``), so the file alone compares the three."""
        if self.obtained is None or not may_fail(m, tol, self.rung, isolated):
            return
        # under its record's name: a model output's tag "<output>/<leaf>/..." is "<output>.<leaf>/..."
        key = f"{OUTPUT}.{tag[len(OUTPUT) + 1:]}" if tag.startswith(OUTPUT + "/") else tag
        self.obtained[key] = c.detach().to("cpu").contiguous()
        leaf_key = key.rsplit("/", 1)[0]
        self.obtained[f"{leaf_key}/reference"] = ref.detach().to("cpu").contiguous()
        if res is not None and not isinstance(res, str) and tuple(res.shape) == tuple(ref.shape):
            import torch

            wide = torch.complex128 if ref.is_complex() else torch.float64
            self.obtained[f"{key}_truth"] = (ref.to("cpu", wide) + res.to("cpu", wide)).contiguous()


# Hugging Face output fields a model returns depending on flags and implementation (use_cache,
# output_attentions, output_hidden_states, an attention implementation that returns no weights)
OPTIONAL_FIELDS = frozenset({"past_key_values", "hidden_states", "attentions", "cross_attentions",
                             "encoder_hidden_states", "encoder_attentions", "decoder_hidden_states",
                             "decoder_attentions", "router_logits", "aux_loss"})


def optional_notes(by_leaf: dict[str, list[str]], outputs: list[str]) -> list[str]:
    """Notes on the optional outputs only the reference produced: ``by_leaf``, a module output leaf ->
    the calls that lacked it; ``outputs``, the model's own such outputs (optional_leaf)."""
    notes = [f"optional output {p!r} of {keys[0]}{f' and {len(keys) - 1} more' if len(keys) > 1 else ''} "
             f"is produced by the reference only (another implementation's calling convention): not judged"
             for p, keys in by_leaf.items() if keys]
    if outputs:
        notes.append(f"model output{'s' if len(outputs) > 1 else ''} {', '.join(outputs[:4])}"
                     f"{'...' if len(outputs) > 4 else ''} produced by the reference only: not judged")
    return notes


def optional_leaf(path: str) -> bool:
    """Whether an output leaf may be absent on one side without failing: a tuple's later items (an
    attention's weights, a block's cache) and the optional fields of a Hugging Face output. The first
    item of a tuple and any other field are the output itself."""
    head = path.split(".", 1)[0]
    # output_hidden_states= and output_attentions= add fields of these names in every family
    # (Swin's reshaped_hidden_states, a vision-language model's vision_attentions)
    flagged = head.endswith(("hidden_states", "attentions")) and not head.startswith("last_")
    return head in OPTIONAL_FIELDS or flagged or head.isdigit() and head != "0"


_PLAIN_CONSTS = (type(None), bool, int, float, str)


def _callable_again(obj: Any) -> bool:
    """Whether a recorded call can be made again as it is: tensors and plain constants in tuples,
    lists and dicts. Anything else (a KV cache the first call appended to, a BlockMask, a dataclass)
    is state of the candidate's run, so that level runs through the hooked forward instead."""
    import torch

    t = type(obj)
    if t is torch.Tensor or t in _PLAIN_CONSTS or isinstance(obj, (torch.dtype, torch.device)):
        return True
    if t in (tuple, list):
        return all(_callable_again(x) for x in obj)
    if t is dict:
        return all(type(k) is str and _callable_again(v) for k, v in obj.items())
    return False


def _replay_rung(model: Any, spec: CheckSpec, meta: dict[str, Any], reader: RungReader, rung: str,
                 device: str, inputs_template: Any, dtype_changes: list[str] | None = None) -> CheckResult:
    """The passes of one rung on the candidate's own model object (wrappers, compiled code and all).

    Propagated: the candidate's forward on the stored inputs, every selected module's output judged
    against the float64 truth of the whole model, each call's inputs kept. Isolated, one nesting
    level at a time so no module's own computation is bypassed: each module called again with its
    activation inputs replaced by the golden ones and its side inputs (masks, positions, tables) as
    the candidate built them, judged against the float64 truth of that module on the golden inputs.
    """
    import torch

    dtype = dt.to_torch(rung)
    tol = spec.tolerance
    inner = unwrap(model)
    walk = walk_model(inner)
    selected = select(inner, spec.layers, spec.drill, walk)
    by_name = {s.name: s for s in selected}
    layers = {e["key"]: e for e in meta["layers"]}
    acts = activation_paths(layers)
    tols = {k: tol.for_layer(e["name"]) for k, e in layers.items()}
    rules = {k: Rule.of(t, rung) for k, t in tols.items()}
    place = None if device == KEEP_PLACEMENT else device
    home = home_device(inner, device)

    def stored_inputs() -> tuple[tuple[Any, ...], dict[str, Any]]:
        # the template gives structure and constants; every tensor leaf is the stored one (a copy:
        # the model may write its inputs)
        tmpl = map_tensors(inputs_template, lambda p, t: laid_out_as(reader.get(f"input/{p}").clone(), t))
        return tuple(tmpl["args"]), tmpl["kwargs"]

    def golden(key: str, path: str) -> Any:
        # a copy of what the reader holds (a module may write its input, by torch ops or through a
        # raw pointer no version counter sees); a tensor read for this call alone is its own
        gk = layers[key]["in"][path]
        t = reader.get(gk)
        return t.clone() if reader.holds(gk) else t

    if meta.get("sketch"):
        with cast_in_place(inner, place, dtype, walk.modules, walk.stamp()), eval_mode(inner, walk), \
                numerics(rung, tol.tf32), BufferState(walk.modules):
            sketched = _replay_rung_sketch(model, spec, meta, reader, rung, *stored_inputs(), selected)
        sketched.notes += convention_note(meta, inputs_template)
        return sketched

    fast = fast_pass(spec)
    args, kwargs = stored_inputs()
    padding = Padding.of(inner, args, kwargs, unread=frozenset(meta.get("inputs", {}).get("unread", ())))
    if padding is not None:
        padding = dataclasses.replace(padding, flat_keys=frozenset(k for k, e in layers.items() if e.get("decides")))
    obtained: dict[str, Any] | None = {} if spec.report_dir is not None else None
    decisions = Decisions(layers, selected, reader, tol.unit_roundoff(rung), present(inner, meta.get("watch", [])),
                          padding)
    judge = _Judge(rung, tol.unit_roundoff(rung), padding, obtained, noise_allowance(meta, inner))
    prop: dict[str, list[LeafMetrics]] = {}
    iso: dict[str, list[LeafMetrics]] = {}
    notes: list[str] = []
    rerouted: list[str] = []
    optional: dict[str, list[str]] = {}
    pos_err: dict[str, tuple[Any, Any]] = {}

    recorded_names = {e["name"] for e in layers.values()}
    beyond: dict[str, None] = {}   # calls of a recorded module past the golden's count of them
    # a MoE experts module's isolated output, kept to say which expert's tokens hold a failure's excess
    # (the walk's module classes first: a handful, where the modules are hundreds on every pass)
    experts = {s.name for s in selected if is_dispatched_experts(submodule(inner, s.name))} \
        if any(hasattr(t, "_apply_gate") for t in set(walk.structure[2])) else set()
    experts_out: dict[str, tuple[Any, Any, str]] = {}

    def compare(key: str, out: Any, prefix: str, sink: dict[str, list[LeafMetrics]]) -> None:
        e = layers.get(key)
        if e is None:
            if key.split("#", 1)[0] in recorded_names:
                beyond[key] = None
            return
        got = {"0": out} if isinstance(out, torch.Tensor) else aligned_leaves(tensor_leaves(out), e)
        res: list[Any] = []
        isolated = prefix == "truth"
        drop = decisions.take(key) if isolated and decisions.flips else None
        for p, gk in e["out"].items():
            ref = reader.get(gk)
            c = got.get(p)
            if dtype_changes is not None and c is not None and c.dtype != ref.dtype and c.is_floating_point() \
                    and ref.is_floating_point():
                # what the forward may then fail on, in an operation that names no module
                dtype_changes.append(f"{key} returned {c.dtype} where the golden recorded {ref.dtype}"
                                     f"{f' (output {p})' if p != '0' else ''}")
            if c is None:
                if not optional_leaf(p):
                    res.append(LeafMetrics(leaf=p, numel=int(ref.numel()), ratio=float("inf"), ratio_lo=float("inf"),
                                           note=f"shape: the module's main output {p!r} is missing on the candidate"))
                else:
                    optional.setdefault(p, []).append(key)
                continue
            if drop is not None and tuple(c.shape) == tuple(ref.shape):
                c = decisions.scored_as_reference(drop, c, ref)
            tname = f"{prefix}/{key}/{p}"
            truth: Any = None
            if ref.is_floating_point() or ref.is_complex():
                truth = reader.get(tname) if tname in reader.keys else ""
            elif not isolated and e["level"] > 0:
                # the propagated verdict is the outermost modules' (their float64 truth is the only
                # one kept): an index a router picks inside them differs with the drift they judge
                truth = ""
            judge.leaf(res, key, p, c, ref, truth, tols[key], isolated,
                       f"{key}/{p}/{'isolated' if isolated else 'propagated'}")
            if isolated and e["name"] in experts and truth is not None and not isinstance(truth, str) and p == "0":
                experts_out[key] = (c.detach().clone(), ref, tname)
            if truth is None and isolated and e.get("decides") and res[-1] is not None and res[-1].mismatches:
                # a choice that differs where the reference's own scores do not tie is no near-tie
                n = decisions.untied(key, p, c, ref)
                if n:
                    res[-1].untied = n
                    res[-1].note += (f", {n} token{'s' if n > 1 else ''} of them where the reference's own scores "
                                     f"do not tie")
            if (spec.positions is not None and not isolated and not isinstance(truth, str) and truth is not None
                    and ref.dim() >= 2 and tuple(ref.shape[:2]) == spec.positions
                    and tuple(c.shape) == tuple(ref.shape) and not ref.is_complex() and key not in pos_err):
                pos_err[key] = _per_position(c.detach(), ref, load_truth(reader, tname, ref))
        sink[key] = res

    calls: dict[str, tuple[Any, Any]] = {}
    plain: dict[str, bool] = {}
    # call key -> the torch.autocast state it ran under, which its direct call re-enters: an autocast
    # the model opens in its own forward is off outside it
    amp: dict[str, Any] = {}

    def keep_call(key: str, sel: Selected, a: Any, kw: Any) -> None:
        if key in layers:
            again = _callable_again(a) and _callable_again(kw)
            plain[key] = again
            if again:
                calls[key] = (a, kw)
                amp[key] = autocast_state()
        return None

    def keep_only(key: str, sel: Selected, a: Any, kw: Any) -> None:
        # what the caller built (masks, positions); not the activations, which the golden's replace,
        # so the pass holds none of the candidate's own outputs past their judging
        drop = acts.get(key)
        if drop is not None:
            calls[key] = (tuple(None if f"args.{i}" in drop else x for i, x in enumerate(a)),
                          {k: None if f"kwargs.{k}" in drop else v for k, v in kw.items()})
            amp[key] = autocast_state()

    def on_prop(key: str, sel: Selected, out: Any) -> None:
        compare(key, out, "gtruth", prop)

    levels = sorted({s.level for s in selected})
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True)
    # only the modules whose training forward differs: a Linear left in training mode computes the same
    training = training_paths(inner, walk.modules) if walk.training else []
    if training:
        some = f"{', '.join(training[:3])}{'...' if len(training) > 3 else ''}"
        # a module swapped in after model.eval() is built in training mode: name it, not the model
        notes.append(f"the model was in training mode ({some}); judged in eval mode, as it was captured"
                     if inner.training else
                     f"{'modules' if len(training) > 1 else 'module'} {some} of the model in eval mode "
                     f"{'were' if len(training) > 1 else 'was'} in training mode (built after model.eval()?); "
                     f"judged in eval mode, as the golden was captured")
        # a passing check shows no notes: a port that serves them so must hear of it. A whole model
        # left in training mode is named where torch.nn's own modules differ there (BatchNorm,
        # dropout with p > 0): a Hugging Face attention reads .training for a dropout that is
        # mostly 0, and would name every model built from a config
        differs = training if not inner.training else \
            [n for n, m in inner.named_modules() if n in training and isinstance(m, torch_training_kinds())]
        if differs:
            import warnings

            some = f"{', '.join(differs[:3])}{' ...' if len(differs) > 3 else ''}"
            are = "are" if len(differs) > 1 else "is"
            warnings.warn(f"rocm-parity: {spec.name}: {some} of a model in eval mode {are} in training mode (swapped "
                          f"in after model.eval()?), where their forward differs (BatchNorm on the batch's statistics, "
                          f"dropout on); the replay judged eval mode only. If the served model runs them so, call "
                          f".eval() after the swap" if not inner.training else
                          f"rocm-parity: {spec.name}: the model is in training mode (model.eval() not called?), where "
                          f"{some} compute otherwise (BatchNorm on the batch's statistics, dropout on); the replay "
                          f"judged eval mode, as the golden was captured. If the served model runs in training mode, "
                          f"its outputs are not what was judged: call model.eval() before serving and before the check "
                          f"(a training step's parity is check_train's)", stacklevel=2)
    with cast_in_place(inner, place, dtype, walk.modules, walk.stamp()), eval_mode(inner, walk), \
            numerics(rung, tol.tf32), BufferState(walk.modules) as state:
        outs: list[LayerRecord] = []
        pending = None
        if fast:
            # one teacher-forced forward: the outermost level judged in isolation, in the candidate's
            # own (compiled) forward, and every call kept for the deeper levels
            seen: set[int] = set()
            # every call kept: the deeper levels call them again, and at one level too the culprit's
            # note compares the inputs its caller built (a mask) with the golden's
            out = _hooked_level(model, inner, selected, levels[0], layers, acts, golden, compare, iso, judge, notes,
                                rerouted, lambda: (args, kwargs), keep_call if len(levels) > 1 else keep_only,
                                seen, decisions)
            # A model output that is no judged module's own tensor was computed by code outside them
            # (a final logit softcap, a scale after the head): judged teacher-forced, against the
            # propagated truth, which the reference's own propagated error dominates for a correct
            # candidate. One that is a judged module's output was judged with it.
            got = aligned_leaves(tensor_leaves(out), meta["outputs"])
            outs = _compare_outputs(out, meta, reader, judge, tol, notes,
                                    skip={p for p, t in got.items() if id(t) in seen})
            del out, got
            deeper = levels[1:]
        else:
            with Hooks(inner, selected, keep_call, on_prop, golden=layers):
                out = _run(model, args, kwargs)
            judge.flush()
            outs = _compare_outputs(out, meta, reader, judge, tol, notes)
            pending = out if spec.extra_judge is not None else None
            del out
            deeper = levels

        # Compiled code runs only inside the compiled module's own call: a sub-module of a compiled
        # model or block, called on its own, would run eagerly and judge code the candidate does not
        # run (every child of a miscompiled block scored as the reference). Its levels go through the
        # forward, where the hooks break the compiled graph at each judged module.
        compiled = model is not inner or any(getattr(m, "_compiled_call_impl", None) is not None for m in walk.modules)
        for level in deeper:
            keys = [k for k in meta.get("order", list(layers)) if k in layers and layers[k]["level"] == level]
            state.restore()
            if compiled or not _direct_level(inner, keys, layers, acts, calls, amp, plain, golden, compare, iso, judge,
                                             notes, rerouted, level, decisions):
                _hooked_level(model, inner, selected, level, layers, acts, golden, compare, iso, judge, notes, rerouted,
                              stored_inputs, decisions=decisions)
        if beyond:
            calls_past = list(beyond)
            notes.append(f"{len(calls_past)} call{'s' if len(calls_past) > 1 else ''} the golden does not hold "
                         f"({', '.join(calls_past[:3])}{'...' if len(calls_past) > 3 else ''}): the candidate called "
                         f"{'these modules' if len({k.split('#', 1)[0] for k in calls_past}) > 1 else 'the module'} "
                         f"more often than the reference did; those calls are not judged, their effect on the "
                         f"outputs is")
        if rerouted:
            notes.append(f"{len(rerouted)} module call{'s' if len(rerouted) > 1 else ''} ({', '.join(rerouted[:3])}"
                         f"{'...' if len(rerouted) > 3 else ''}) had inputs of other shapes on the candidate than in "
                         f"the golden (a router that sent them other tokens): each was judged on the golden "
                         f"inputs, called on its own")

        for key, rec in _records_in_order(meta, layers):
            judge_layer(rec, iso.get(key, []), prop.get(key, []), rules[key])
            if key not in iso:
                # A fused or bypassed sub-module (e.g. q/k/v fused into one GEMM) is judged through its
                # parent; a missing top-level module changes the model's outputs, which are judged too.
                rec.reason = NOT_CALLED
            result.layers.append(rec)
        fail_moved_choices(result.layers, decisions.moved_without_tie())
        result.outputs = outs
        notes += optional_notes(optional, [])
        notes += decisions.notes()
        if padding is not None:
            notes.append(padding.note())
        unread = [p for p in meta.get("inputs", {}).get("unread", ()) if isinstance(p, str)]
        if unread:   # a mask given and judged past: say so, or a failure there reads as padding
            notes.append(f"{', '.join(unread)} {'were' if len(unread) > 1 else 'was'} given but no operation of "
                         f"the reference's forward read {'them' if len(unread) > 1 else 'it'} (Whisper's encoder "
                         f"ignores its attention_mask): the positions {'they mark' if len(unread) > 1 else 'it marks'} "
                         f"as padding are judged like the others")
        notes += convention_note(meta, inputs_template)
        if layers and not any("act" in e for e in layers.values()):
            notes.append("golden without recorded data flow: the isolated pass fed every module input from the "
                         "golden, masks and position tables included; recapture it so that a candidate with another "
                         f"attention implementation builds its own ({spec.regen_command})")
        result.notes.extend(notes)
        if fast:
            result.notes.append("fast replay (--parity-replay=fast): every module judged in isolation, the outermost "
                                "ones inside one teacher-forced run of the candidate's forward, and the model outputs "
                                "that code outside them computes; propagated drift not judged")
        finish(result, tol)
        result.notes += [n for rec in result.layers if not rec.iso_passed and rec.name in experts_out
                         for n in [_experts_note(rec, layers[rec.name], reader, *experts_out[rec.name])] if n]
        experts_out.clear()
        if beyond and fast and result.passed:   # a passing check shows no notes
            import warnings

            warnings.warn(f"rocm-parity: {spec.name}: the candidate made {len(beyond)} call"
                          f"{'s' if len(beyond) > 1 else ''} the golden does not hold ({', '.join(list(beyond)[:3])}): "
                          f"it called {'those modules' if len(beyond) > 1 else 'the module'} more often than the "
                          f"reference did. The fast replay judged each call on golden inputs, so what the extra "
                          f"ones change downstream was not judged: replay with --parity-replay=full", stacklevel=2)
        built = _caller_built_inputs(result.culprit, layers, acts, calls, reader.get, padded=padding is not None)
        if not built and result.culprit is not None:
            built = _writes_its_input(result, layers, acts, calls, inner, golden, reader)
            state.restore()
        calls.clear()
        if built:
            result.notes.append(built)
        state.restore()   # what follows runs the model again
        # on every check, failing or not: an FP8 candidate of an unquantized golden has no meta["quant"],
        # and a module served unquantized against a quantized golden passes
        result.notes.extend(quant_notes(result, meta, reader.get, inner,
                                        lambda key: golden(key, next(iter(acts[key]))) if acts.get(key) else None))
        if spec.profile and not isinstance(meta.get("extra", {}).get("profile"), dict):
            result.notes.append("profiler parity (--parity-profile) not compared: the golden holds no operator "
                                "profile; capture it with --parity-profile on the reference machine")
        elif spec.profile:
            from pytest_rocm_parity.reports.profiling import compare_shares, profile_shares, totals_note

            state.restore()
            cand_prof = profile_shares(model, *stored_inputs(), home)
            ref_prof = meta["extra"]["profile"]
            result.extra["profile"] = {"flags": compare_shares(ref_prof, cand_prof),
                                       "reference": ref_prof, "candidate": cand_prof}
            slower = totals_note(ref_prof, cand_prof)
            if slower:
                result.notes.append(slower)
        if spec.report_dir is not None and not result.passed and obtained:
            from pytest_rocm_parity.reports.report import save_failing_tensors

            save_failing_tensors(result, obtained, spec.report_dir)
        if spec.extra_judge is not None:
            result.extra["_pos_err"] = pos_err
            state.restore()
            try:
                spec.extra_judge(rung, model, *stored_inputs(), pending, reader, meta, result)
            finally:
                result.extra.pop("_pos_err", None)
    return result


def _writes_its_input(result: CheckResult, layers: dict[str, dict[str, Any]], acts: dict[str, dict[str, str]],
                      calls: dict[str, tuple[Any, Any]], inner: Any, golden: Callable[[str, str], Any],
                      reader: RungReader) -> str:
    """A note where the culprit's judged modules all pass and one of them writes its activation input
    in place: called again on copies of the golden inputs, the copy it was handed changed. The
    culprit's own code that reads that tensor after the call (a residual add) sees the written value,
    so the fault starts in that module though its output is right (a kernel wrapper that stores its
    result into its input)."""
    import torch

    rec = next((l for l in result.layers if l.name == result.culprit), None)
    inside = [l.name for l in result.layers if rec is not None and rec.holds(l) and l.iso is not None]
    if rec is None or not inside or any(not l.iso_passed for l in result.layers if l.name in inside):
        return ""
    found = []
    with torch.inference_mode():
        for key in inside:
            if key not in calls or key not in acts:
                continue
            a, kw = calls[key]
            sa, skw, reshaped = _swap(key, a, kw, acts[key], golden, [], standalone=True)
            if reshaped:
                continue
            handed = {p: t for p, t in tensor_leaves({"args": sa, "kwargs": skw}).items() if p in acts[key]}
            try:
                submodule(inner, layers[key]["name"])(*sa, **skw)
            except Exception:   # a call that needs its caller's context tells nothing here
                continue
            wrote = [p for p, t in handed.items()
                     if not torch.equal(t, reader.get(layers[key]["in"][p]).to(t.device, t.dtype))]
            if wrote:
                found.append(f"{key} ({', '.join(wrote)})")
    if not found:
        return ""
    return (f"{', '.join(found[:3])} {'write their' if len(found) > 1 else 'writes its'} activation input in place "
            f"(called on a copy of the golden's, the copy changed): {rec.name}'s code that reads that tensor after the "
            f"call (a residual add) sees the written value. Unless the reference's module writes it too, the fault "
            f"starts there, in a kernel or wrapper that stores its result into its input, though its own output is right")


def _experts_note(rec: LayerRecord, entry: dict[str, Any], reader: RungReader, c: Any, ref: Any, tname: str) -> str:
    """Which expert's tokens hold a failing experts module's excess (choices.expert_errors): the one
    whose tokens, left out, leave an error within the budget; or every expert's, a fault common to all."""
    routed = next((t for t in (reader.get(gk) for gk in entry["in"].values())
                   if not (t.is_floating_point() or t.is_complex()) and t.dim() == 2 and t.shape[0] == c.shape[0]), None)
    if routed is None or c.shape != ref.shape:
        return ""
    ranked = expert_errors(c, ref, load_truth(reader, tname, ref), routed)
    if len(ranked) < 2:
        return ""
    (best, without, n), others = ranked[0], ranked[1:]
    if without <= rec.budget < others[0][1]:
        return (f"{rec.name}: the excess is on the {n} tokens routed to expert {best}: without them the error is "
                f"{without:.3g}x the reference's, without any other expert's tokens still {others[0][1]:.3g}x or "
                f"more. Look at expert {best} (its slice of the weights, its part of a grouped GEMM)")
    if without > rec.budget:
        return (f"{rec.name}: the excess is on the tokens of every expert (without any one expert's tokens the "
                f"error is still {without:.3g}x the reference's or more): a fault common to the experts (the GEMM "
                f"they share, the activation, the weighting or the combine), not one expert's")
    return ""


def _direct_level(inner: Any, keys: list[str], layers: dict[str, dict[str, Any]], acts: dict[str, dict[str, str]],
                  calls: dict[str, tuple[Any, Any]], amp: dict[str, Any], plain: dict[str, bool],
                  golden: Callable[[str, str], Any],
                  compare: Callable[..., None], iso: dict[str, list[LeafMetrics]], judge: _Judge,
                  notes: list[str], rerouted: list[str], level: int, decisions: Decisions | None = None) -> bool:
    """One level by direct calls on the candidate's own calls, activations swapped for the golden
    ones; False (nothing judged) where a call cannot be made again or raised: the hooked forward then.
    ``decisions``: sees the choices that the calls make inside them (Decisions)."""
    import torch

    if not all(plain.get(k) for k in keys if k in plain):
        return False
    todo = [k for k in keys if k in calls]
    before = set(iso)
    watched = decisions.deeper(level) if decisions is not None else []
    seen = (lambda key, sel, out: decisions.saw(key, out)) if decisions is not None else None
    try:
        with torch.inference_mode(), Hooks(inner, watched, None, seen) if watched else contextlib.nullcontext():
            for key in todo:
                a, kw = calls[key]
                mod = submodule(inner, layers[key]["name"])
                sa, skw, reshaped = _swap(key, a, kw, acts[key], golden, notes, standalone=True)
                with autocast_as(amp.get(key)):
                    try:
                        out = mod(*sa, **skw)
                        if reshaped:
                            rerouted.append(key)
                    except Exception:
                        if not reshaped:
                            raise
                        sa, skw, _ = _swap(key, a, kw, acts[key], golden, notes)
                        out = mod(*sa, **skw)
                compare(key, out, "truth", iso)
                if decisions is not None:
                    decisions.run_done()
        judge.flush()
    except Exception as exc:   # a module that needs its caller's context
        judge.items.clear()
        if decisions is not None:
            decisions.run_done()
            decisions.forget(todo)
        rerouted[:] = [k for k in rerouted if k not in todo]
        for k in set(iso) - before:
            del iso[k]
        notes.append(f"isolated level {level}: a direct call failed ({type(exc).__name__}: {str(exc)[:200]}); "
                     f"judged through the hooked forward instead")
        return False
    return True


class _SharedCopies:
    """The golden copies handed out in one run of the candidate's forward: one per candidate tensor
    object and golden tensor. Modules the candidate hands one tensor (a Llama's rotary tables, given
    to every block) share one copy, as they share that tensor in its own run: a module that writes it
    in place is seen by the next one as there, and each block does not pay for a copy of its own.
    An entry lives as long as the candidate's tensor (a weak reference), so no copy outlives it."""

    def __init__(self) -> None:
        self._by: dict[tuple[int, str], tuple[Any, Any]] = {}

    def get(self, t: Any, gkey: str) -> Any | None:
        hit = self._by.get((id(t), gkey))
        return hit[1] if hit is not None and hit[0]() is t else None

    def put(self, t: Any, gkey: str, g: Any) -> None:
        import weakref

        k, by = (id(t), gkey), self._by
        by[k] = (weakref.ref(t, lambda _r: by.pop(k, None)), g)

    def clear(self) -> None:
        """Every copy let go (the forward has returned)."""
        self._by.clear()


def _swap(key: str, a: Any, kw: Any, paths: dict[str, str], golden: Callable[[str, str], Any],
          notes: list[str], standalone: bool = False,
          shared: _SharedCopies | None = None) -> tuple[Any, Any, list[str]]:
    """The call ``(a, kw)`` with each activation leaf (``paths``: path -> its golden tensor's key)
    replaced by its golden value, and the paths whose golden value has another shape than the
    candidate's.

    Such a leaf keeps the candidate's value, unless the call is ``standalone`` (made on its own, not
    inside its caller's forward): a router that sent the module other tokens changes the shape of
    what it is called with, and the module on the golden inputs is what its truth is of.

    One tensor passed at several paths whose golden is one stored tensor (``attn(h, h, h)``) is
    replaced by one copy: a module may choose its kernel by that identity (nn.MultiheadAttention
    takes its fused self-attention path only when query is key is value); ``shared``: the copies
    of the earlier calls of one forward, for a tensor the candidate hands several modules."""
    import torch

    reshaped: list[str] = []
    same = shared if shared is not None else _SharedCopies()

    def fn(p: str, t: Any) -> Any:
        hit = same.get(t, paths[p])
        if hit is not None:
            return hit
        g = golden(key, p)
        if g.shape != t.shape:
            reshaped.append(p)
            if not standalone:
                notes.append(f"{key}: input {p} is {tuple(t.shape)} on the candidate, {tuple(g.shape)} in the "
                             f"golden; the candidate's value was used")
                return t
        g = laid_out_as(g if g.device == t.device else g.to(t.device), t)
        same.put(t, paths[p], g)
        return g
    try:   # the usual calls (tensors in plain tuples, lists and dicts): every planned path is found
        root = _patch({"args": a, "kwargs": kw}, _plan(paths), fn, torch.Tensor)
    except _NotPlain:
        found: set[str] = set()

        def walked(p: str, t: Any) -> Any:
            if p not in paths:
                return t
            found.add(p)
            return fn(p, t)
        root = map_tensors({"args": a, "kwargs": kw}, walked)
        missing = sorted(set(paths) - found)
        if missing:
            notes.append(f"{key}: activation input {', '.join(missing)} is not where the golden recorded it on "
                         f"the candidate's call; the candidate's own inputs were used there")
    return tuple(root["args"]), root["kwargs"], reshaped


def laid_out_as(g: Any, t: Any) -> Any:
    """The golden value ``g`` in the memory layout of the candidate's ``t`` (channels_last, a transposed
    view): a kernel may take another path on another layout, or be wrong on one only, and a module is
    judged on what the candidate gives it. A golden is stored contiguous."""
    if t.is_contiguous() or g.shape != t.shape:
        return g
    import torch

    return torch.empty_like(t, dtype=g.dtype, device=g.device).copy_(g)   # t's strides where t is dense


def _hooked_level(model: Any, inner: Any, selected: list[Selected], level: int, layers: dict[str, dict[str, Any]],
                  acts: dict[str, dict[str, str]], golden: Callable[[str, str], Any], compare: Callable[..., None],
                  iso: dict[str, list[LeafMetrics]], judge: _Judge, notes: list[str], rerouted: list[str],
                  stored_inputs: Callable[[], tuple[Any, Any]],
                  keep_call: Callable[[str, Selected, Any, Any], None] | None = None,
                  outputs_seen: set[int] | None = None, decisions: Decisions | None = None) -> Any:
    """One level through the candidate's whole forward: every module runs in its caller's context
    (a cache, a BlockMask built by that forward), its activation inputs swapped by a pre-hook; returns
    the forward's output. ``keep_call``: also sees every selected call as the candidate made it;
    ``outputs_seen``: gets the ids of the judged modules' output tensors."""
    def sub(key: str, sel: Selected, a: Any, kw: Any) -> Any:
        if keep_call is not None:
            keep_call(key, sel, a, kw)
        if sel.level != level or key not in layers:
            return None
        sa, skw, reshaped = _swap(key, a, kw, acts[key], golden, notes, standalone=True, shared=shared)
        if not reshaped:
            return sa, skw
        # The golden inputs have other shapes than the candidate's call (a router that chose other
        # tokens): the module is called on them on its own, and the forward goes on with the
        # candidate's values, whose shapes the rest of it expects.
        try:
            direct[key] = hooks.standalone(submodule(inner, sel.name), sa, skw)
            rerouted.append(key)
        except Exception:
            sa, skw, _ = _swap(key, a, kw, acts[key], golden, notes, shared=shared)
            return sa, skw
        return None

    direct: dict[str, Any] = {}
    shared = _SharedCopies()

    def keep(key: str, sel: Selected, out: Any) -> None:
        if decisions is not None and sel.level > level:
            decisions.saw(key, out)
        if sel.level == level and key in layers:
            if outputs_seen is not None:
                outputs_seen.update(id(t) for t in tensor_leaves(out).values())
            compare(key, direct.pop(key, out), "truth", iso)
        elif sel.level == level:
            compare(key, out, "truth", iso)   # a call the golden does not hold: named, not judged

    try:
        with Hooks(inner, selected + decisions.extra if decisions is not None else selected, sub, keep,
                   golden=layers) as hooks:
            out = _run(model, *stored_inputs())
    finally:
        shared.clear()
        if decisions is not None:
            decisions.run_done()
    judge.flush()
    return out


# A float input that its caller builds (an ALiBi bias, a rotary table, an additive mask) differs
# from the golden's where it differs by more than this many roundings of its dtype: a correct other
# implementation computes it alike to a rounding or two, or in another form that is not compared (a
# bool mask, another shape) or compared as masked (an infinity or the dtype's lowest for a masked
# position, beyond half its range, on both sides).
BUILT_ROUNDINGS = 8.0


def _caller_built_inputs(culprit: str | None, layers: dict[str, dict[str, Any]], acts: dict[str, dict[str, str]],
                         calls: dict[str, tuple[Any, Any]], get: Callable[[str], Any], padded: bool = False) -> str:
    """A note when the culprit's inputs that its caller builds (positions, masks, bucket indices,
    an ALiBi bias: not computed from the model's inputs, so the isolated call keeps the candidate's)
    differ from the golden's: the difference starts in the code that builds them, not in the module
    named.

    Integer and bool inputs must be equal; a float one must agree within BUILT_ROUNDINGS where
    neither holds a masked value (an infinity, or beyond half the dtype's range). ``padded``: the
    model's inputs pad positions, so a mask tensor the reference's call had and the candidate's lacks
    is one that ignores the padding (unpadded, another attention implementation may rightly pass none
    and mask causally inside its kernel)."""
    import torch

    e = layers.get(culprit or "")
    if culprit is None or e is None or culprit not in calls or "act" not in e:
        return ""
    leaves, _ = split_leaves({"args": calls[culprit][0], "kwargs": calls[culprit][1]})
    differ = []
    for p, key in e["in"].items():
        c = leaves.get(p)
        if p in acts.get(culprit, {}):
            continue
        if c is None and padded and "mask" in p.rsplit(".", 1)[-1].lower():
            differ.append(f"{p} (none on the candidate's call, where the reference's had one and the inputs are "
                          f"padded: the padding is not masked)")
            continue
        if not isinstance(c, torch.Tensor) or c.is_complex():
            continue
        g = get(key)
        if g.is_complex() or g.is_floating_point() != c.is_floating_point() or tuple(c.shape) != tuple(g.shape):
            continue
        c = c.detach().to(g.device)
        if g.is_floating_point():
            bad = _beyond_rounding(c, g)
        else:
            bad = int((c != g.to(c.dtype)).sum())
        if bad:
            differ.append(f"{p} ({bad} of {g.numel()} elements)")
    if not differ:
        return ""
    return (f"{culprit}: its input{'s' if len(differ) > 1 else ''} {', '.join(differ[:3])} "
            f"{'are' if len(differ) > 1 else 'is'} built by its caller, not computed from the model's inputs, and "
            f"differ{'' if len(differ) > 1 else 's'} from the golden's: the difference starts in the code that builds "
            f"{'them' if len(differ) > 1 else 'it'}, before this module")


def _beyond_rounding(c: Any, g: Any) -> int:
    """How many elements of float tensors ``c`` and ``g`` differ by more than BUILT_ROUNDINGS roundings
    of the coarser dtype (of the element's magnitude plus the tensor's RMS), or are masked in one
    and not the other."""
    import torch

    u = max(torch.finfo(c.dtype).eps, torch.finfo(g.dtype).eps) / 2
    c64, g64 = c.to(torch.float64), g.to(torch.float64)
    big = min(torch.finfo(c.dtype).max, torch.finfo(g.dtype).max) / 2
    mc, mg = ~torch.isfinite(c64) | (c64.abs() > big), ~torch.isfinite(g64) | (g64.abs() > big)
    both = ~mc & ~mg
    if not bool(both.any()):
        return int((mc != mg).sum())
    rms = float(g64[both].square().mean().sqrt())
    far = (c64 - g64).abs() > BUILT_ROUNDINGS * u * (g64.abs() + rms)
    return int((mc != mg).sum() + (far & both).sum())


def _per_position(c: Any, r: Any, t: Any) -> tuple[Any, Any]:
    """RMSE over the feature dims at each (batch, position): where along the sequence a layer drifts."""
    import torch

    dims = tuple(range(2, c.dim()))
    c64, r64, t64 = (x.to(torch.float64) for x in (c, r.to(c.device), t.to(c.device)))
    if not dims:
        return (c64 - t64).abs().cpu(), (r64 - t64).abs().cpu()
    return ((c64 - t64).square().mean(dims).sqrt().cpu(), (r64 - t64).square().mean(dims).sqrt().cpu())


def _compare_outputs(out: Any, meta: dict[str, Any], reader: RungReader, judge: _Judge, tol: Tolerance,
                     notes: list[str], skip: set[str] | frozenset[str] = frozenset()) -> list[LayerRecord]:
    """The model's outputs (but those in ``skip``) judged against the float64 truth of the whole
    model, in one flush. An optional output that only the reference produces (optional_leaf: caches,
    attention weights, hidden-state tuples) is a note; any other missing output fails."""
    recs = []
    leaves = tensor_leaves(out)
    got = aligned_leaves(leaves, meta["outputs"])
    notes += _convention_mismatch(leaves, meta["outputs"]) + _unjudged_numbers(meta["outputs"])
    rung = _rung_of(reader)
    missing = []
    sinks: list[tuple[LayerRecord, list[Any]]] = []
    for p, gk in meta["outputs"]["out"].items():
        if p in skip:
            continue
        ref = reader.get(gk)
        c = got.get(p)
        rec = LayerRecord(name=f"{OUTPUT}.{p}")
        if c is None:
            if optional_leaf(p):
                missing.append(p)
                continue
            rec.passed = rec.prop_passed = False
            rec.reason = f"the model's main output {p!r} is missing on the candidate"
        else:
            sink: list[Any] = []
            truth = reader.get(f"gtruth/{OUTPUT}/{p}") if ref.is_floating_point() or ref.is_complex() else None
            judge.leaf(sink, OUTPUT, p, c.detach(), ref, truth, tol, False, f"{OUTPUT}/{p}/propagated")
            sinks.append((rec, sink))
        recs.append(rec)
    judge.flush()
    for rec, sink in sinks:
        judge_layer(rec, [], sink, Rule.of(tol.for_layer(rec.name), rung))
        rec.passed = rec.prop_passed
    notes += optional_notes({}, missing)
    return recs


def _convention_mismatch(leaves: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """A note where the candidate returns its outputs by position and the reference by name (or the
    reverse) and the two count other numbers of them: matched by position, some have no counterpart,
    which reads as outputs missing rather than as the return type changed."""
    got = top_level(leaves)
    want = recorded.get("fields") or top_level(recorded["out"])
    if bool(named_fields(leaves)) == bool(named_fields(recorded["out"])) or len(got) == len(want):
        return []
    how = ("by position" if not named_fields(leaves) else "by name")
    return [f"the candidate returns {len(got)} output{'s' if len(got) != 1 else ''} {how} where the reference "
            f"returned {len(want)} {'by name' if how == 'by position' else 'by position'} "
            f"({', '.join(map(str, want[:6]))}{'...' if len(want) > 6 else ''}): its return type changed; they are "
            f"matched by position, so the ones past the shorter list have no counterpart"]


def _unjudged_numbers(recorded: dict[str, Any]) -> list[str]:
    """A note where a golden holds Python floats among the model's outputs as constants, as goldens
    captured before such numbers were judged do: they go unchecked until recaptured."""
    numbers = [p for p, v in (recorded.get("const") or {}).items() if isinstance(v, float)]
    if not numbers:
        return []
    return [f"the golden holds the model output{'s' if len(numbers) > 1 else ''} {', '.join(numbers[:4])}"
            f"{'...' if len(numbers) > 4 else ''} as {'Python numbers' if len(numbers) > 1 else 'a Python number'} "
            f"recorded unjudged (a golden captured before such outputs were judged); regenerate the golden to judge "
            f"{'them' if len(numbers) > 1 else 'it'}"]


def _rung_of(reader: RungReader) -> str:
    return str(reader.metadata.get("dtype", "float32"))
