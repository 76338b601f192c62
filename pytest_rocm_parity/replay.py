"""Replay: judge a candidate against a golden on the candidate device.

The model runs propagated (each module's output compared as it appears) and isolated (each module
fed the golden inputs), comparing on the device against goldens loaded straight to it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from pytest_rocm_parity import dtypes as dt
from pytest_rocm_parity.compare import (block_stats, exact_metrics, float_metrics, metrics_from_columns, metrics_many,
                                        residual_metrics)
from pytest_rocm_parity.engine import (
    KEEP_PLACEMENT,
    OUTPUT,
    CheckSpec,
    eval_mode,
    Hooks,
    _run,
    _substitute,
    cast_inputs,
    fingerprint,
    home_device,
    normalize_inputs,
    numerics,
    prepare_model,
    shell_quote,
    walk_model,
)
from pytest_rocm_parity.direct import DirectCall, plan_level, resolve_modules, run_level
from pytest_rocm_parity.errors import GoldenStale
from pytest_rocm_parity.golden import GoldenStore, RungReader
from pytest_rocm_parity.judge import Rule, finish, judge_layer, leaf_failure
from pytest_rocm_parity.records import CheckResult, LayerRecord, LeafMetrics
from pytest_rocm_parity.selection import Selected, select
from pytest_rocm_parity.tolerance import Tolerance
from pytest_rocm_parity.tree import constant_leaves, map_tensors, tensor_leaves

VERIFY_HASH_MAX_BYTES = 512 * 1024 * 1024
# Isolated passes by direct module calls where the golden allows (direct.py); tests compare both routes.
DIRECT = True
# A level's direct calls given the inputs kept from the pass before where that pass handed out only
# watched goldens and none was written (RungReader.rehand); tests compare both routes.
KEEP_INPUTS = True
# A direct call's output queued through the slot made from its first output (_slot, add_slot), not
# compare()'s general walk; tests compare both routes.
SLOTS = True
# A level's direct-call outputs that have slots queued together after its calls (_StatsQueue.add_slots),
# not one by one as each call returns; tests compare both routes.
DEFER_SLOTS = True


def _replay_rung_sketch(m: Any, spec: CheckSpec, meta: dict[str, Any], reader: RungReader, rung: str,
                        args0: Any, kwargs0: Any, selected: list[Selected]) -> CheckResult:
    """Propagated replay against sketches: every module's output sketched on the device as it appears."""
    from pytest_rocm_parity.sketch import sketch

    group = int(meta["sketch"])
    tol = spec.tolerance
    u = tol.unit_roundoff(rung)
    layers = {e["key"]: e for e in meta["layers"]}

    def judge_leaves(key: str, out: Any, names: dict[str, str]) -> list[LeafMetrics]:
        got = tensor_leaves(out)
        res = []
        for p, gk in names.items():
            c = got.get(p)
            if c is None:
                res.append(LeafMetrics(leaf=p, numel=0, ratio=float("inf"), ratio_lo=float("inf"),
                                       note=f"shape: output leaf {p!r} missing on the candidate"))
            elif gk.startswith("x/"):
                res.append(exact_metrics(p, c.detach(), reader.get(gk)))
            else:
                ref_s = reader.get(gk)
                t_s = reader.get(f"skt/{key}/{p}").to(ref_s.device)
                c_s = sketch(c, group, f"{key}/{p}").to(ref_s.device)
                mm = float_metrics(p, c_s, ref_s, t_s, u, tol.confidence, tol.nan)
                mm.numel = int(c.numel())
                res.append(mm)
        return res

    prop: dict[str, list[LeafMetrics]] = {}
    with Hooks(m, selected, None, lambda k, s, o: prop.__setitem__(k, judge_leaves(k, o, layers[k]["out"]))
               if k in layers else None):
        out = _run(m, args0, kwargs0)
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True)
    for key, rec in _records_in_order(meta, layers):
        t = tol.for_layer(layers[key]["name"])    # the module's tolerance, for each of its calls
        judge_layer(rec, [], prop.get(key, []), Rule.of(t, rung))
        # No inputs in a sketch golden: the propagated verdict is the verdict, judged like an isolated
        # one (jackknife bound and sign test over the sketch entries, which are few) against the larger
        # of the ratio budget and Dynamo's multiplier.
        budget = max(t.ratio_for(rung), t.propagated_for(rung))
        reasons = [_sketch_failure(mm, t, rung, budget) for mm in prop.get(key, [])]
        rec.prop_passed = rec.iso_passed = rec.passed = not any(reasons)
        rec.budget = budget
        rec.reason = next((r for r in reasons if r), "")
        result.layers.append(rec)
    for p, mm in zip(meta["outputs"]["out"], judge_leaves(OUTPUT, out, meta["outputs"]["out"])):
        rec = LayerRecord(name=f"{OUTPUT}.{p}")
        judge_layer(rec, [], [mm], Rule.of(tol.for_layer(rec.name), rung))
        budget = max(tol.ratio_for(rung), tol.propagated_for(rung))
        rec.reason = _sketch_failure(mm, tol, rung, budget)
        rec.passed = rec.prop_passed = not rec.reason
        result.outputs.append(rec)
    result.notes.append(f"sketch golden (groups of {group}): propagated judgement only; the culprit is the "
                        f"smallest module where the candidate first drifts")
    return finish(result, tol)


def _records_in_order(meta: dict[str, Any], layers: dict[str, dict[str, Any]]) -> Iterator[tuple[str, LayerRecord]]:
    """An empty record for every captured module call, in execution order."""
    for key in meta.get("order", list(layers)):
        e = layers.get(key)
        if e is not None:
            yield key, _record(key, e)


def _record(key: str, e: dict[str, Any]) -> LayerRecord:
    """An empty record of the captured call ``key`` (its golden entry ``e``)."""
    return LayerRecord(name=key, level=e["level"], primary=e["primary"])


def _sketch_failure(m: LeafMetrics, tol: Tolerance, rung: str, budget: float) -> str:
    if m.note.startswith("shape") or m.kind == "exact" or m.nonfinite:
        return leaf_failure(m, tol, rung, isolated=True)
    if m.ratio_lo > budget and m.z > tol.z:
        return (f"drift {m.ratio:.3g}x the reference's error (>= {m.ratio_lo:.3g}x at {tol.confidence:g} sigma over "
                f"the sketch; budget {budget:g}x; sign test z={m.z:+.1f})")
    return ""


def load_truth(reader: RungReader, name: str, ref: Any) -> Any:
    """Rebuild a float64 truth from its stored residual (see _residual)."""
    import torch

    if ref.is_complex():
        return ref.to(torch.complex128) + reader.get(name).to(ref.device, torch.complex128)
    return ref.to(torch.float64) + reader.get(name).to(ref.device, torch.float64)


# ---------------------------------------------------------------------------------------------
# replay

def check_stale(model: Any, inputs: Any, spec: CheckSpec, manifest: dict[str, Any], golden_path: str) -> None:
    regen = spec.regen_command or f"pytest --rocm-parity --parity-regen={shell_quote(spec.name)}"
    fp = fingerprint(model)
    old = manifest.get("fingerprint", {})
    problems = []
    if fp.get("structure") != old.get("structure"):
        problems.append("the model's structure (modules or parameter shapes) changed")
    elif fp.get("weights") != old.get("weights"):
        problems.append("the model's weights changed")
    selected = [s.name for s in select(model, spec.layers, spec.drill)]
    old_layers = [l["name"] for l in manifest.get("layers", [])]
    if selected != old_layers:
        added = [n for n in selected if n not in old_layers]
        removed = [n for n in old_layers if n not in selected]
        problems.append(f"the layer list changed (added {added[:5]}, removed {removed[:5]})")
    if int(manifest.get("sketch") or 0) != int(spec.sketch or 0):
        problems.append(f"captured with sketch={manifest.get('sketch') or 0}, asked sketch={spec.sketch or 0}")
    missing = [d for d in spec.dtypes if d not in manifest.get("rungs", {})]
    if missing:
        problems.append(f"dtypes {missing} were not captured (golden holds {list(manifest.get('rungs', {}))})")
    if problems:
        raise GoldenStale(f"stale golden {golden_path} for {spec.name!r}: " + "; ".join(problems)
                          + f". Regenerate this model's golden on the reference machine: {regen}", golden_path)


def _inputs_changed(args0: Any, kwargs0: Any, reader: RungReader, rung: str, meta: dict[str, Any] | None = None) -> str:
    import json as _json

    import torch

    dtype = dt.to_torch(rung)
    args, kwargs = cast_inputs(args0, kwargs0, dtype, "cpu")
    if meta is not None:
        now = _json.loads(_json.dumps(constant_leaves({"args": args, "kwargs": kwargs}), default=str))
        old = meta.get("inputs", {}).get("const", {})
        for p in sorted(set(now) | set(old)):
            a, b = old.get(p), now.get(p)
            same = a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
            if not same:
                return f"non-tensor input {p} changed ({a!r} -> {b!r})"
    given = tensor_leaves({"args": args, "kwargs": kwargs})
    stored = {k[len("input/"):] for k in reader.keys if k.startswith("input/")}
    if set(given) != stored:
        return f"input names changed ({sorted(given)} vs stored {sorted(stored)})"
    for p, t in given.items():
        g = reader.get(f"input/{p}").to("cpu")
        if g.shape != t.shape or g.dtype != t.dtype:
            return f"input {p}: shape/dtype {tuple(t.shape)}/{t.dtype} vs stored {tuple(g.shape)}/{g.dtype}"
        if not torch.equal(g, t) and not (t.is_floating_point() and torch.equal(g.isnan(), t.isnan())
                                          and torch.equal(g.nan_to_num(), t.nan_to_num())):
            return f"input {p}: values differ from the stored inputs"
    return ""


def replay(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
           env: dict[str, Any] | None = None) -> list[CheckResult]:
    """Judge the candidate against the golden, one CheckResult per rung."""
    from pytest_rocm_parity.backend import collect_env

    manifest = store.read_manifest(spec.name)
    mpath = str(store.manifest_path(spec.name))
    check_stale(model, inputs, spec, manifest, mpath)
    args0, kwargs0 = normalize_inputs(inputs)
    cand_env = env or collect_env(str(home_device(model, device)))
    results = []
    for rung in spec.dtypes:
        meta = manifest["rungs"][rung]
        path = store.rung_file(spec.name, manifest, rung)
        sha = meta.get("sha256") if int(meta.get("bytes", 0)) <= VERIFY_HASH_MAX_BYTES else None
        reader = RungReader(path, str(home_device(model, device)), sha, background_verify=True)
        try:
            why = _inputs_changed(args0, kwargs0, reader, rung, meta)
            if why:
                raise GoldenStale(
                    f"stale golden {mpath} for {spec.name!r}: {why}. The replay uses the stored inputs; if the "
                    f"test's inputs changed on purpose, regenerate: {spec.regen_command or 'pytest --rocm-parity --parity-regen=' + shell_quote(spec.name)}. "
                    f"If they differ only by backend RNG, build them on the CPU with a seeded torch.Generator.", mpath)
            result = _replay_rung(model, spec, manifest, meta, reader, rung, device, {"args": args0, "kwargs": kwargs0})
        except Exception:
            reader.verification.result()   # a damaged file is named before the error it caused
            raise
        reader.verification.result()
        result.reference_env = manifest.get("reference_env", {})
        result.candidate_env = cand_env
        result.golden = str(path)
        results.append(result)
        del reader
    return results


def _replay_rung(model: Any, spec: CheckSpec, manifest: dict[str, Any], meta: dict[str, Any],
                 reader: RungReader, rung: str, device: str, inputs_template: Any,
                 keep_loaded: bool = False) -> CheckResult:
    """The passes of one rung. ``keep_loaded``: leave the preloaded goldens on the device (bench/)."""
    return prepare_rung(model, spec, manifest, meta, reader, rung, device, inputs_template, keep_loaded)()


def prepare_rung(model: Any, spec: CheckSpec, manifest: dict[str, Any], meta: dict[str, Any],
                 reader: RungReader, rung: str, device: str, inputs_template: Any,
                 keep_loaded: bool = False) -> Callable[[], CheckResult]:
    """One rung's replay set up (model placed, layers selected, goldens on the device, direct calls
    planned); calling the result runs its passes and judges them.

    Why two steps: the set-up is paid once per loaded golden, like the load itself; bench/ times the
    passes apart from it (docs/benchmarks.md says which figure is which). The model must not change
    between set-up and run; ``keep_loaded``: leave the goldens loaded after a run, to run again.
    """
    from torch import Tensor

    dtype = dt.to_torch(rung)
    tol = spec.tolerance
    walk = walk_model(model)
    selected = select(model, spec.layers, spec.drill, walk)
    layers = {e["key"]: e for e in meta["layers"]}
    tols = {k: tol.for_layer(e["name"]) for k, e in layers.items()}
    rules = {k: Rule.of(t, rung) for k, t in tols.items()}

    def stored_inputs() -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The test's inputs are the template (structure and constants); every tensor leaf is the stored one.
        tmpl = map_tensors(inputs_template, lambda p, _t: reader.get_fresh(f"input/{p}"))
        return tuple(tmpl["args"]), tmpl["kwargs"]
    m = prepare_model(model, device, dtype, walk)
    mwalk = walk if m is model else None
    if meta.get("sketch"):
        def sketched() -> CheckResult:
            with eval_mode(m, mwalk), numerics(rung, tol.tf32):
                return _replay_rung_sketch(m, spec, meta, reader, rung, *stored_inputs(), selected)
        return sketched
    fast = spec.replay == "fast" and spec.extra_judge is None
    _preload(reader, meta, fast, device)
    levels = sorted({s.level for s in selected})
    # per level: its direct calls, or why the hooked forward judges it (a split model: always)
    plans = {lv: plan_level(meta, layers, lv) for lv in levels} if DIRECT and device != KEEP_PLACEMENT else {}
    plan_notes = [f"isolated level {lv}: judged through the hooked forward, not by direct calls: {why}"
                  + (" (give the model use_cache=False: one forward needs no KV cache)" if "Cache>" in why else "")
                  for lv, why in plans.items() if isinstance(why, str)]

    # kept across passes (the model and golden do not change between them)
    out_plans: dict[tuple[str, str], list[tuple[str, str, str | None, str]]] = {}
    level_mods: dict[int, list[Any]] = {}
    known: dict[int, tuple[Any, Any, tuple[int, int], bool]] = {}   # _StatsQueue's, per golden tensor
    slots: dict[str, _Slot | None] = {}    # per direct call: its output's judging, checked once (_slot)
    prepared: dict[tuple[int, ...], Any] = {}   # _StatsQueue's statistics starts, per run of slots
    # per level: its calls' inputs kept from a pass that handed out only watched goldens and wrote
    # none (the goldens by key, for RungReader.rehand; each call's (args, kwargs))
    inputs_kept: dict[int, tuple[dict[str, Any], list[tuple[Any, Any]]]] = {}

    def run() -> CheckResult:
        u = tol.unit_roundoff(rung)
        prop: dict[str, list[LeafMetrics]] = {}
        iso: dict[str, list[LeafMetrics]] = {}
        pos_err: dict[str, tuple[Any, Any]] = {}
        obtained: dict[str, Any] = {}
        queue = _StatsQueue(rung, u, obtained if spec.report_dir is not None else None, known, prepared)

        def compare(key: str, out: Any, truth_prefix: str, sink: dict[str, list[LeafMetrics]],
                    snapshot: bool = True) -> None:
            rows = out_plans.get((key, truth_prefix))
            if rows is None:
                if key not in layers:
                    return
                rows = out_plans[(key, truth_prefix)] = _out_plan(key, layers[key], truth_prefix, reader)
            t = tols[key]
            got = {"0": out} if isinstance(out, Tensor) else tensor_leaves(out)
            res: list[Any] = []
            isolated = truth_prefix == "truth"
            for p, gk, tname, tag in rows:
                ref = reader.get(gk)
                c = got.get(p)
                if c is None:
                    res.append(LeafMetrics(leaf=p, numel=int(ref.numel()), ratio=float("inf"), ratio_lo=float("inf"),
                                           note=f"shape: output leaf {p!r} missing on the candidate"))
                    continue
                if c.requires_grad:    # a new tensor object per leaf otherwise, for nothing
                    c = c.detach()
                if tname:
                    queue.add(res, p, c, ref, reader.get(tname), t, isolated, tag, snapshot)
                    if (spec.positions is not None and truth_prefix == "gtruth" and ref.dim() >= 2
                            and tuple(ref.shape[:2]) == spec.positions and tuple(c.shape) == tuple(ref.shape)
                            and not ref.is_complex() and key not in pos_err):
                        pos_err[key] = _per_position(c, ref, load_truth(reader, tname, ref))
                elif tname is None:
                    res.append(exact_metrics(p, c, ref))
                    queue.keep_if_failing(res[-1], c, t, isolated, tag)
            sink[key] = res

        # direct calls' outputs that have slots, queued at once by drain() after the level's calls
        deferred: list[tuple[str, Any, Any]] = []
        deferred_bytes = [0]

        def direct_out(key: str, out: Any, snapshot: bool) -> None:
            """A direct call's output: deferred to drain() when it has a slot (or queued through it at
            once, for a ``snapshot``), else compare()'s, after which the slot is made once."""
            s = slots.get(key)
            if s is not None:
                if not snapshot and DEFER_SLOTS and not queue.LAUNCH_BYTES:
                    deferred.append((key, out, s))
                    deferred_bytes[0] += s[3]
                    if deferred_bytes[0] + queue.held > queue.HOLD_BYTES:
                        drain()    # the queue's early flush frees held outputs as it did call by call
                    return
                if queue.add_slot(iso, key, out, s, snapshot):
                    return
            compare(key, out, "truth", iso, snapshot)
            if SLOTS and key not in slots:
                slots[key] = _slot(out, out_plans.get((key, "truth")), reader, tols.get(key), queue)

        def drain() -> None:
            """The deferred outputs queued through their slots; one that is not what its slot expects
            goes to compare()."""
            if deferred:
                for key, out in queue.add_slots(iso, deferred):
                    compare(key, out, "truth", iso, False)
                deferred.clear()
                deferred_bytes[0] = 0

        def start_part() -> None:
            drain()
            queue.start_part()

        outs: list[LayerRecord] = []
        notes: list[str] = []
        # every captured call's record, made while the device computes a level's statistics (the
        # host waits for them anyway); a key in ``judged`` has its final verdict already
        records: dict[str, LayerRecord] = {}
        judged: set[str] = set()

        def make_records() -> None:
            if not records:
                records.update(_records_in_order(meta, layers))

        fetched: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

        def model_inputs() -> tuple[tuple[Any, ...], dict[str, Any]]:
            """The model's stored inputs, fetched when a pass first needs them (a pass of direct
            calls alone needs none) and again after each pass, so every pass that runs the whole
            model has them handed out watched (RungReader.get_fresh)."""
            if not fetched:
                fetched.append(stored_inputs())
            return fetched[0]

        def watched(one: Callable[[], Any], sink: dict[str, list[LeafMetrics]]) -> Any:
            """One pass; repeated while the model writes a golden tensor handed to it. Each repeat hands
            the written keys out as copies from then on, so it ends within as many repeats as keys."""
            while True:
                mark, before = len(queue.items), set(sink)
                out = one()
                changed = reader.changed_in_place()
                fetched.clear()      # the watch ended: the next pass fetches (and watches) them again
                if not changed:
                    return out
                queue.discard(mark)
                for k in set(sink) - before:
                    del sink[k]

        def direct_level(level: int, calls: list[DirectCall]) -> set[str] | None:
            """One level by direct calls; the keys that failed (then confirmed through the hooked
            forward by the caller), or None when a call raised (the hooked forward judges instead)."""
            mark, before = len(queue.items), set(iso)
            try:
                mods = level_mods.get(level)
                if mods is None:
                    mods = level_mods[level] = resolve_modules(m, calls)
                timing: list[Callable[[], None] | None] = []
                part = start_part if queue.PART_BEFORE_BLOCKS else None
                made: list[tuple[dict[str, Any], list[tuple[Any, Any]]] | None] = []

                def one() -> None:
                    deferred.clear()
                    deferred_bytes[0] = 0
                    kept = inputs_kept.get(level) if KEEP_INPUTS else None
                    if kept is not None and reader.rehand(kept[0]):
                        built = kept[1]
                        made.append(None)
                    else:
                        inputs_kept.pop(level, None)
                        memo: dict[str, Any] = {}
                        fetch = reader.fetcher(memo)
                        built = [c.make(fetch) for c in calls]
                        keys = {k for c in calls for k in layers[c.key]["in"].values()}
                        made.append(({k: memo[k] for k in keys}, built)
                                    if keys <= memo.keys() and all(c.flat for c in calls) else None)
                    timing.append(run_level(m, calls, built, direct_out, spec.threads, mods, part))
                    drain()
                watched(one, iso)
                if made[-1] is not None:   # its last try wrote no golden: the next pass may keep them
                    inputs_kept[level] = made[-1]
                queue.flush(meanwhile=make_records)
                if timing and timing[-1] is not None:
                    timing[-1]()    # the --parity-threads=auto choice, timed to the judged outputs
            except Exception as exc:   # a module that needs its caller's context
                deferred.clear()
                queue.discard(mark)
                for k in set(iso) - before:
                    del iso[k]
                notes.append(f"isolated level {level}: a direct call failed "
                             f"({type(exc).__name__}: {str(exc)[:200]}); judged through the hooked forward instead")
                return None
            failing: set[str] = set()
            for c in calls:     # judged once: a failing call's verdict is the hooked forward's
                rec = records[c.key]
                judge_layer(rec, iso.get(c.key, []), prop.get(c.key, []), rules[c.key])
                (judged if rec.iso_passed else failing).add(c.key)
            for k in failing:   # judged again by the hooked forward (save_failing_tensors exports only what fails)
                del iso[k]
                records[k] = _record(k, layers[k])
            return failing

        def hooked_level(level: int) -> None:
            """One level through the whole model's forward, each selected module's inputs swapped for
            the golden ones by a hook: every module runs in its caller's context."""
            def sub(key: str, sel: Selected, a: Any, kw: Any) -> Any:
                if sel.level != level or key not in layers:
                    return None
                return _substitute(a, kw, layers[key]["in"], reader.get_fresh, None, KEEP_PLACEMENT)

            def keep(key: str, sel: Selected, o: Any) -> None:
                if sel.level == level:
                    compare(key, o, "truth", iso)

            def isolated() -> None:
                with Hooks(m, selected, sub, keep):
                    _run(m, *model_inputs())
            watched(isolated, iso)
            queue.flush()

        try:
            with eval_mode(m, mwalk), numerics(rung, tol.tf32):
                if not fast:   # propagated
                    def propagated() -> Any:
                        with Hooks(m, selected, None, lambda k, s, o: compare(k, o, "gtruth", prop)):
                            return _run(m, *model_inputs())
                    out = watched(propagated, prop)
                    queue.flush()
                    outs = _compare_outputs(out, meta, reader, u, tol)
                    if spec.extra_judge is not None:
                        pending = out
                    del out
                # isolated, one nesting level at a time so no module's own computation is bypassed
                for level in levels:
                    calls = plans.get(level)
                    failing = direct_level(level, calls) if isinstance(calls, list) else None
                    if failing == set():
                        continue
                    hooked_level(level)
                    if failing:
                        confirmed = {k for k in failing if rules[k].fails(iso.get(k, []))}
                        if confirmed != failing:
                            differ = ", ".join(sorted(failing ^ confirmed)[:5])
                            notes.append(f"isolated level {level}: modules called directly on their golden inputs "
                                         f"disagreed with the hooked forward ({differ}); judged through the hooked "
                                         f"forward, where each module runs in its caller's context")
        finally:
            if not keep_loaded:
                reader.release()
        result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True)
        make_records()
        for key, rec in records.items():
            if key not in judged:
                judge_layer(rec, iso.get(key, []), prop.get(key, []), rules[key])
            if key not in iso:
                # A fused or bypassed sub-module (e.g. q/k/v fused into one GEMM) is judged through its
                # parent; a missing top-level module changes the model's outputs, which are judged too.
                rec.reason = "not called in the candidate (fused or bypassed): judged through its parent and the outputs"
            result.layers.append(rec)
        result.outputs = outs
        result.notes.extend(plan_notes + notes)
        if fast:
            result.notes.append("fast replay (--parity-replay=fast): one isolated pass per nesting level; "
                                "propagated drift and the model outputs were not judged")
        finish(result, tol)
        if spec.profile and isinstance(meta.get("extra", {}).get("profile"), dict):
            from pytest_rocm_parity.profiling import compare_shares, profile_shares

            with eval_mode(m, mwalk), numerics(rung, tol.tf32):
                cand_prof = profile_shares(m, *model_inputs(), home_device(m, device))
            result.extra["profile"] = {"flags": compare_shares(meta["extra"]["profile"], cand_prof),
                                       "reference": meta["extra"]["profile"], "candidate": cand_prof}
        if spec.report_dir is not None and not result.passed and obtained:
            from pytest_rocm_parity.report import save_failing_tensors

            save_failing_tensors(result, obtained, spec.report_dir)
        obtained.clear()
        if spec.extra_judge is not None:
            result.extra["_pos_err"] = pos_err
            try:
                with eval_mode(m, mwalk), numerics(rung, tol.tf32):
                    spec.extra_judge(rung, m, *model_inputs(), pending, reader, meta, result)
            finally:
                result.extra.pop("_pos_err", None)
        return result
    return run


# (the output's type: Tensor, tuple or list; per leaf, in order: (shape, dtype, device index, leaf,
# reference, residual, tolerance, report tag, bytes); the Tensor type; the leaves' bytes)
_Slot = tuple[type, list[tuple[Any, Any, int, str, Any, Any, Tolerance, str, int]], Any, int]


def _slot(out: Any, rows: list[tuple[str, str, str | None, str]] | None, reader: RungReader,
          t: Tolerance | None, queue: _StatsQueue) -> _Slot | None:
    """What _StatsQueue.add_slot needs to queue a direct call's output without compare()'s general
    walk, or None where that walk is needed (an exact or unjudged leaf, a nested output, a shape
    or device the quick statistics path does not take, a queue that judges at once).

    Why: on the H200's host a pass's comparisons after each call cost 0.77 ms of a 1.1B pass
    (session 12, under cProfile), most of it checks whose answer depends on the golden alone,
    asked again on every call of every pass. Made once from the first output seen; add_slot then
    checks only what the candidate may change (its type, shapes, dtypes, devices, layouts). A
    tuple or list of tensors (a rotary embedding's cos and sin) has a slot too: a level whose
    every output went through slots restarts its statistics (_StatsQueue._launch).
    """
    import torch

    leaves = [out] if type(out) is torch.Tensor else list(out) if type(out) in (tuple, list) else None
    if rows is None or t is None or leaves is None or len(rows) != len(leaves) or not leaves:
        return None
    specs = []
    for i, (o, (p, gk, tname, tag)) in enumerate(zip(leaves, rows)):
        if p != str(i) or not tname or type(o) is not torch.Tensor:
            return None
        ref, res = reader.get(gk), reader.get(tname)
        if (not o.shape == ref.shape == res.shape or ref.numel() == 0 or o.is_complex() or ref.is_complex()
                or res.is_complex() or o.requires_grad or not o.is_contiguous()
                or not (o.is_cuda or queue.DEFER_ON_CPU) or not o.get_device() == ref.get_device() == res.get_device()):
            return None
        specs.append((o.shape, o.dtype, o.get_device(), p, ref, res, t, tag, o.numel() * o.element_size()))
    return (type(out), specs, torch.Tensor, sum(sp[-1] for sp in specs))


def _out_plan(key: str, e: dict[str, Any], truth_prefix: str, reader: RungReader) -> list[tuple[str, str, str | None, str]]:
    """(leaf, golden key, truth key, report tag) of each output leaf of a layer, made once per rung:
    the strings and lookups a comparison needs are host time on every module of every pass.

    The truth key is None for an exact (integer, bool) leaf and "" for a floating leaf without
    propagated truth (kept for top-level modules only): its presence is still checked, not judged.
    """
    isolated = truth_prefix == "truth"
    rows: list[tuple[str, str, str | None, str]] = []
    for p, gk in e["out"].items():
        ref = reader.get(gk)
        tname: str | None = None
        if ref.is_floating_point() or ref.is_complex():
            tname = f"{truth_prefix}/{key}/{p}"
            if tname not in reader.keys and not isolated:
                tname = ""
        rows.append((p, gk, tname, f"{key}/{p}/{'isolated' if isolated else 'propagated'}"))
    return rows


class _StatsQueue:
    """Module outputs queued during the forward, judged after it with one synchronisation.

    Why: a large model's forward is often bound by the host launching kernels, so every microsecond
    a hook spends is a microsecond of replay. A hook only records what to compare (references, no
    copies, no kernels). flush(), after the pass, starts the statistics on the device
    (stats_graph.start: the statistics kernel and, on a GPU, the judging formulas, as one CUDA graph
    from the third time a signature is seen in this process), waits once and reads every result.
    With LAUNCH_BYTES set, a part starts whenever that many candidate bytes wait, so the device
    works through it while later modules are still being launched. Measured on the H200 (session 6,
    docs/benchmarks.md) that hid half the wait at the flush (0.84 -> 0.37 ms at 1.1B) but each part
    cost about 0.2 ms of host time to start, so parts of 16-32 MiB made the pass slower and 128 MiB
    gained nothing. Session 8 made a start cheaper (host address tables: 0.2 ms with its
    preparation) and measured parts of 64-128 MiB again: no arm ahead beyond the noise. A part
    started during the pass runs on a side stream beside the later calls (SIDE_STREAM); session 9
    measured that too, no gain beyond the noise either: the flush's own part holds the logits
    whatever the part size. Off (0) until a part starts for well under 0.1 ms. The candidate
    tensors stay referenced until the flush (also for the masked path of non-finite values and
    the failing-tensor export), up to HOLD_BYTES, past which the queue flushes early. On the CPU
    there is nothing to overlap: each leaf is judged at once.
    """

    HOLD_BYTES = 2 << 30
    LAUNCH_BYTES = 0         # candidate bytes that start a part's statistics during the pass (0: all at the flush)
    # a part started during the pass runs on a side stream, beside the calls that follow it (on the
    # main stream a part's device time is added to the calls'); the flush's own start stays on main
    SIDE_STREAM = True
    DEFER_ON_CPU = False     # tests set it to run the queued path without a GPU
    # a part started before a level's repeated blocks (direct.run_level's before_rest): the other
    # calls' statistics, the 1.1B's logits among them, run beside the blocks instead of after them.
    # Off: on the H200 (session 12, docs/benchmarks.md) the device's tail after the last call fell
    # (0.40 -> 0.31 ms in one timeline) but the second start's host time took it back: paired
    # pass ratios on/off 0.977-1.010 at 1.1B and 0.998-1.006 at 8B, no gain beyond the noise
    PART_BEFORE_BLOCKS = False

    # a run of slotted items (add_slot) started again through its stats_graph.Restart, made the
    # first time that run was graphed (tests switch it off to compare with the general start)
    RESTARTS = True

    def __init__(self, rung: str, u: float, obtained: dict[str, Any] | None,
                 known: dict[int, tuple[Any, Any, tuple[int, int], bool]] | None = None,
                 prepared: dict[tuple[int, ...], Any] | None = None) -> None:
        """``known``: what _launch learns of each golden (its layout, whether the kernel reads it);
        ``prepared``: the restarts of runs of slotted items; both kept by the caller across the
        passes over one loaded golden (prepare_rung)."""
        self.rung, self.u, self.obtained = rung, u, obtained
        self.known = {} if known is None else known
        self.prepared = {} if prepared is None else prepared
        self.items: list[tuple[list[Any], int, str, Any, Any, Any, Any, bool, str]] = []
        # per item, id() of the slot it was queued through (0: add); the slots outlive the queue
        # (prepare_rung keeps them), so an id names one slot across passes
        self.slot_ids: list[int] = []
        self.held = 0
        self.waiting = 0    # candidate bytes queued since the last part started
        # (first item, end, results): parts started; results() gives each item's metrics (None:
        # sums not finite, the masked path's) once the device is done
        self.parts: list[tuple[int, int, Callable[[], list[LeafMetrics | None]]]] = []

    def add(self, sink: list[Any], leaf: str, c: Any, ref: Any, res: Any, tol: Tolerance, isolated: bool,
            tag: str, snapshot: bool = True) -> None:
        """Queue one leaf. ``snapshot``: copy ``c`` first, since code that runs before the flush may write
        it (not so for a module called directly, whose output nothing else sees: direct.py)."""
        quick = (c.shape == ref.shape == res.shape and ref.numel() > 0
                 and not (c.is_complex() or ref.is_complex() or res.is_complex()))
        if not quick or not (c.is_cuda or self.DEFER_ON_CPU):
            sink.append(residual_metrics(leaf, c, ref, res, self.u, tol.confidence, tol.nan))
            self.keep_if_failing(sink[-1], c, tol, isolated, tag)
            return
        sink.append(None)
        # A snapshot in stream order: the model may still write this output in place (a parent's
        # `x += ...`, an inplace activation) before flush() reads it.
        if snapshot or not c.is_contiguous():
            import torch

            c = c.clone(memory_format=torch.contiguous_format)
        self.items.append((sink, len(sink) - 1, leaf, c, ref, res, tol, isolated, tag))
        self.slot_ids.append(0)
        self._queued(c.numel() * c.element_size())

    def add_slot(self, sink: dict[str, Any], key: str, c: Any, slot: Any, snapshot: bool) -> bool:
        """Queue a direct call's output ``c`` as ``sink[key]`` through its slot (replay._slot), which
        checked once what depends on the golden alone; False, nothing queued, where ``c`` is not the
        output the slot expects (the caller's general comparison takes it then)."""
        return not self.add_slots(sink, [(key, c, slot)], snapshot)

    def add_slots(self, sink: dict[str, Any], batch: list[tuple[str, Any, Any]],
                  snapshot: bool = False) -> list[tuple[str, Any]]:
        """add_slot for many (key, output, slot) at once; the (key, output) pairs not queued.

        Why at once: replay defers a level's outputs to here (DEFER_SLOTS). On the H200's host the
        queueing cost 25-36 us per direct call, one Python call after another (session 14,
        bench/bench_host_overhead.py's ``queue``); a loop over the level pays the calls' overhead once.
        Each candidate is still checked for what it may change: its type, shapes, dtypes, devices
        and layouts (the statistics kernel reads it flat, at the golden's size).
        """
        items, ids, missed, total = self.items, self.slot_ids, [], 0
        for key, c, slot in batch:
            kind, specs, tensor, size = slot
            outs = (c,) if kind is tensor else c
            if type(c) is not kind or len(outs) != len(specs):
                missed.append((key, c))
                continue
            for o, (shape, dtype, dev, *_rest) in zip(outs, specs):
                if (type(o) is not tensor or o.shape != shape or o.dtype is not dtype or o.get_device() != dev
                        or not o.is_contiguous()):
                    break
            else:
                row: list[Any] = [None] * len(specs)
                sink[key] = row
                sid = id(slot)
                for i, (o, (_s, _d, _v, leaf, ref, res, tol, tag, _n)) in enumerate(zip(outs, specs)):
                    items.append((row, i, leaf, o.clone() if snapshot else o, ref, res, tol, True, tag))
                    ids.append(sid)
                total += size
                continue
            missed.append((key, c))
        if total:
            self._queued(total)
        return missed

    def _queued(self, size: int) -> None:
        self.held += size
        self.waiting += size
        if self.held > self.HOLD_BYTES:
            self.flush()
        elif self.LAUNCH_BYTES and self.waiting >= self.LAUNCH_BYTES:
            self.start_part()

    def start_part(self) -> None:
        """Start the statistics queued so far as a part, beside the calls that follow (SIDE_STREAM)."""
        self._start(beside=self.SIDE_STREAM)

    def discard(self, mark: int) -> None:
        """Forget the items queued since ``mark`` (their pass is repeated)."""
        if self.parts and self.parts[-1][1] > mark:
            # a part reading them is under way: let it finish before they may be freed (a part
            # keeps its results for the items before mark)
            self._wait()
            self.parts = [(a, min(b, mark), got) for a, b, got in self.parts if a < mark]
        for it in self.items[mark:]:
            self.held -= it[3].numel() * it[3].element_size()
        del self.items[mark:]
        del self.slot_ids[mark:]
        self.waiting = sum(it[3].numel() * it[3].element_size() for it in self.items[self._started():])

    def _started(self) -> int:
        return self.parts[-1][1] if self.parts else 0

    def _wait(self) -> None:
        import torch

        dev = self.items[0][4].device
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()
            side = _SIDE_STREAMS.get(dev)
            if side is not None:
                side.synchronize()

    def _start(self, beside: bool = False) -> None:
        """Start the statistics of the items queued since the last part (nothing waits). ``beside``:
        on a side stream that waits for what the current stream has queued so far, so the part
        runs while the calls after it are launched and run. Its tensors stay held until the flush
        has waited for every part, so the caching allocator cannot hand their blocks out under it."""
        a, b = self._started(), len(self.items)
        if a < b:
            dev = self.items[a][4].device
            with _side_stream(dev) if beside and dev.type == "cuda" else contextlib.nullcontext():
                self.parts.append((a, b, self._launch(self.items[a:b], self.slot_ids[a:b])))
        self.waiting = 0

    def _launch(self, items: list[Any], slot_ids: list[int] | None = None) -> Callable[[], list[LeafMetrics | None]]:
        """The statistics of ``items`` started; the function that reads their metrics. On a GPU the
        statistics and the judging formulas run on the device (stats_graph.py); elsewhere the
        statistics are computed here and the formulas run in numpy (compare.metrics_many).

        ``slot_ids`` (add_slot's, per item): a run of items all queued through slots whose
        statistics were graphed before starts through its Restart: only the candidates' addresses
        are new, every other check was made when the run was first graphed (on the H200's host a
        start cost 0.37 ms of a 1.1B pass in checks and lookups, session 12)."""
        import torch

        from pytest_rocm_parity import kernels
        from pytest_rocm_parity.compare import block_layout

        run = tuple(slot_ids) if slot_ids and self.RESTARTS and all(slot_ids) else None
        if run is not None:
            restart = self.prepared.get(run)
            if restart is not None and kernels.triton_usable():
                pending = restart.start([it[3] for it in items])
                if pending is not None:
                    return _reader(pending, restart.names, restart.numels)
        dev = items[0][4].device
        # c is contiguous (add); the kernel reads each leaf flat through its pointer, so contiguous
        # leaves go as they are (a view per tensor is host time on every module). What depends on
        # the golden alone is worked out once per loaded golden (inside a pass on the H200 this
        # preparation cost 0.18 ms per start, session 8)
        known = self.known
        flat, layouts, on_device = [], [], dev.type == "cuda" and kernels.triton_usable()
        for _s, _i, _l, c, ref, res, *_ in items:
            k = known.get(id(ref))
            if k is None or k[0] is not ref or k[1] is not res:
                k = known[id(ref)] = (ref, res, block_layout(int(ref.numel())),
                                      res.device == ref.device == dev and kernels.readable(ref) and kernels.readable(res))
            if c.device != dev:
                c = c.to(dev)
            flat.append((c, ref, res))
            layouts.append(k[2])
            on_device = on_device and k[3] and kernels.readable(c)
        if on_device:
            from pytest_rocm_parity import stats_graph

            try:
                pending = stats_graph.start(flat, layouts, [it[6].confidence for it in items], self.u,
                                            slot=len(self.parts))
            except Exception as exc:   # a Triton that cannot compile the kernel here: the torch path
                kernels.disable_triton(exc)
            else:
                names, numels = [it[2] for it in items], [int(it[4].numel()) for it in items]
                if run is not None:
                    restart = stats_graph.restarter(flat, layouts, [it[6].confidence for it in items], self.u,
                                                    len(self.parts), names, numels)
                    if restart is not None:
                        self.prepared[run] = restart
                return _reader(pending, names, numels)
        stats = torch.cat([block_stats(c.reshape(-1), r.reshape(-1), e.reshape(-1)).to(dev) for c, r, e in flat])

        def on_host() -> list[LeafMetrics | None]:   # read back at the flush: one wait per pass here too
            host = stats.to("cpu").numpy()
            parts, row = [], 0
            for nb, _ in layouts:
                parts.append(host[row:row + nb])
                row += nb
            return metrics_many([(it[2], int(it[4].numel()), part, it[6].confidence)
                                 for it, part in zip(items, parts)], self.u)
        return on_host

    def flush(self, meanwhile: Callable[[], None] | None = None) -> None:
        """Every queued leaf judged into its sink. ``meanwhile``: host work that needs no result,
        done while the device computes them (the host would wait for the device there)."""
        if not self.items:
            if meanwhile is not None:
                meanwhile()
            return
        self._start()
        if meanwhile is not None:
            meanwhile()
        done: list[LeafMetrics | None] = []
        for a, b, results in self.parts:
            done += results()[:b - a]
        for (sink, i, leaf, c, ref, res, tol, isolated, tag), m in zip(self.items, done):
            if m is None:   # a non-finite sum: the masked path, on the tensors still held
                m = residual_metrics(leaf, c, ref, res, self.u, tol.confidence, tol.nan)
            sink[i] = m
            self.keep_if_failing(m, c, tol, isolated, tag)
        self.items.clear()
        self.slot_ids.clear()
        self.parts.clear()
        self.held = self.waiting = 0

    def keep_if_failing(self, m: LeafMetrics, c: Any, tol: Tolerance, isolated: bool, tag: str) -> None:
        """Keep a host copy of a leaf that fails, for the failing-tensor export (--parity-report)."""
        if self.obtained is not None and leaf_failure(m, tol, self.rung, isolated):
            self.obtained[tag] = c.detach().to("cpu")


def _reader(pending: Any, names: list[str], numels: list[int]) -> Callable[[], list[LeafMetrics | None]]:
    """The function that reads a started device judgement's metrics (None: sums not finite)."""
    def results() -> list[LeafMetrics | None]:
        cols = pending.columns()
        done = metrics_from_columns(names, numels, cols[:, :8])
        return [m if ok else None for m, ok in zip(done, (cols[:, 8] > 0).tolist())]
    return results


_SIDE_STREAMS: dict[Any, Any] = {}


@contextlib.contextmanager
def _side_stream(dev: Any) -> Iterator[None]:
    """The current stream switched to this device's side stream, after what is queued so far."""
    import torch

    side = _SIDE_STREAMS.get(dev)
    if side is None:
        side = _SIDE_STREAMS[dev] = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        yield


PRELOAD_FRACTION = 0.5


def _preload(reader: RungReader, meta: dict[str, Any], fast: bool, device: str) -> None:
    """Goldens the passes will read, loaded onto the device before the forward (see RungReader.preload)."""
    import torch

    keys = [k for k in reader.keys if not (fast and k.startswith("gtruth/"))]
    dev = torch.device(reader.device)
    if dev.type != "cuda":
        return    # a CPU reader maps the file: nothing to move
    free, _ = torch.cuda.mem_get_info(dev)
    reader.preload(sorted(keys), int(free * PRELOAD_FRACTION))


def _per_position(c: Any, r: Any, t: Any) -> tuple[Any, Any]:
    """RMSE over the feature dims at each (batch, position): where along the sequence a layer drifts."""
    import torch

    dims = tuple(range(2, c.dim()))
    c64, r64, t64 = (x.to(torch.float64) for x in (c, r.to(c.device), t.to(c.device)))
    if not dims:
        return (c64 - t64).abs().cpu(), (r64 - t64).abs().cpu()
    return ((c64 - t64).square().mean(dims).sqrt().cpu(), (r64 - t64).square().mean(dims).sqrt().cpu())


def _compare_outputs(out: Any, meta: dict[str, Any], reader: RungReader, u: float, tol: Tolerance) -> list[LayerRecord]:
    recs = []
    got = tensor_leaves(out)
    for p, gk in meta["outputs"]["out"].items():
        ref = reader.get(gk)
        c = got.get(p)
        rec = LayerRecord(name=f"{OUTPUT}.{p}")
        if c is None:
            rec.passed = rec.prop_passed = False
            rec.reason = f"output leaf {p!r} missing on the candidate"
        else:
            if ref.is_floating_point() or ref.is_complex():
                mm = residual_metrics(p, c.detach(), ref, reader.get(f"gtruth/{OUTPUT}/{p}"), u, tol.confidence, tol.nan)
            else:
                mm = exact_metrics(p, c.detach(), ref)
            judge_layer(rec, [], [mm], Rule.of(tol.for_layer(rec.name), _rung_of(reader)))
            rec.passed = rec.prop_passed
        recs.append(rec)
    return recs


def _rung_of(reader: RungReader) -> str:
    return str(reader.header.get("__metadata__", {}).get("dtype", "float32"))

