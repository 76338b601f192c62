"""Which modules of a model are captured, and how they nest.

Default (docs/judging.md, "Which modules are judged"): every stack of repeated blocks (a
ModuleList of >= 2 children with parameters, or a Sequential of >= 2 of one class), outermost
stacks only, plus every maximal module outside the stacks (embeddings, projections, norms, heads),
found by walking from the root. With drill-down N, N levels of children below each of those, so a
failing block is narrowed to the smallest failing module; the default N is the deepest whose
golden fits the golden-size budget (api.default_drill, estimated here by ``golden_bytes``).
"""
from __future__ import annotations

import difflib
import fnmatch
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_rocm_parity.errors import LayerSelectionError
from pytest_rocm_parity.judging.records import module_of


@dataclass(frozen=True)
class Selected:
    name: str
    level: int      # number of selected proper ancestors: modules of one level never nest
    primary: str    # the level-0 ancestor (itself at level 0)


def _has_params(mod: Any) -> bool:
    return any(True for _ in mod.parameters())


def _is_stack(mod: Any) -> bool:
    """A stack of repeated blocks: a ModuleList of >= 2 children that all hold parameters (classes may
    differ, as a UNet's down blocks do), or a Sequential of >= 2 of one class (a Sequential of mixed
    classes is one sub-network, e.g. Linear-GELU-Linear, not a stack)."""
    import torch.nn as nn

    if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
        return False
    kids = [m for m in mod._modules.values() if m is not None]
    if len(kids) < 2 or not all(_has_params(k) for k in kids):
        return False
    return isinstance(mod, nn.ModuleList) or len({type(k) for k in kids}) == 1


def _never_called(mod: Any) -> bool:
    """Containers a forward iterates or indexes but never calls: their hooks would never fire."""
    import torch.nn as nn

    return isinstance(mod, (nn.ModuleList, nn.ModuleDict))


def _named(model: Any) -> list[tuple[str, Any]]:
    """(name, module) in registration order, each module once under its first name: a module reachable
    by two names (T5's shared embedding is also encoder.embed_tokens) would otherwise get two hooks."""
    return [(n, m) for n, m in model.named_modules() if n]


def stacks(model: Any) -> list[tuple[str, list[str]]]:
    """Every stack of repeated blocks (outermost or nested): (its name, its children's names)."""
    found = []
    for name, mod in [("", model), *_named(model)]:
        if _is_stack(mod):
            found.append((name, [f"{name}.{k}" if name else k for k, c in mod._modules.items() if c is not None]))
    return found


def default_primary(model: Any) -> list[str]:
    """The level-0 selection: the blocks of every outermost stack and every maximal module outside them."""
    stack_names = {n for n, _ in stacks(model)}
    first = {id(m): n for n, m in reversed(_named(model))}   # each module's first name
    out: list[str] = []

    def holds_stack(name: str) -> bool:
        return any(s.startswith(name + ".") for s in stack_names)

    def walk(prefix: str, mod: Any, in_stack: bool) -> None:
        for child_name, child in mod._modules.items():
            if child is None:
                continue
            full = f"{prefix}.{child_name}" if prefix else child_name
            if first.get(id(child)) != full:
                continue            # the same module under an earlier name
            if _never_called(child) and full not in stack_names:
                walk(full, child, in_stack)
            elif in_stack:
                out.append(full)
            elif full in stack_names:
                walk(full, child, True)
            elif holds_stack(full):
                walk(full, child, False)
            elif _has_params(child) or any(True for _ in child.buffers()) or not child._modules:
                out.append(full)

    if _is_stack(model):
        walk("", model, True)
    else:
        walk("", model, False)
    return out or [""]


def _drill_children(model: Any, name: str, first: dict[int, str]) -> list[str]:
    """The children drill-down selects below ``name``: those with parameters, and parameter-free leaves
    (activations, pooling), each module once under its first name."""
    from pytest_rocm_parity.runner.wrappers import is_adapter_layer, is_dispatched_experts

    mod = model.get_submodule(name) if name else model
    if is_adapter_layer(mod):
        return []     # a PEFT layer is judged as the module it replaced, adapter included
    if is_dispatched_experts(mod):
        return []     # what it calls below depends on the experts implementation, not on the model
    out = []
    for k, c in mod._modules.items():
        full = f"{name}.{k}" if name else k
        if c is None or first.get(id(c)) != full:
            continue
        if _never_called(c):
            out += _drill_children(model, full, first)
        elif _has_params(c) or not c._modules:
            out.append(full)
    return out


def _drilled(model: Any, drill: int) -> list[list[str]]:
    """The default selection level by level: [primary, their drill children, ...], at most drill+1 levels,
    fewer where nothing is left below."""
    first = {id(m): n for n, m in reversed(_named(model))}
    levels = [default_primary(model)]
    frontier = [n for n in levels[0] if n]
    for _ in range(drill):
        nxt = [c for b in frontier for c in _drill_children(model, b, first)]
        if not nxt:
            break
        levels.append(nxt)
        frontier = nxt
    return levels


def max_drill(model: Any) -> int:
    """The drill depth past which the default selection grows no more (every leaf module selected)."""
    return len(_drilled(model, 1 << 30)) - 1


_CACHE: Any = None


def select(model: Any, layers: Sequence[str] | None = None, drill: int = 2, walk: Any = None) -> list[Selected]:
    """Resolve ``layers`` globs (or the default) into an ordered, levelled selection.

    Remembered per model object and module tree (child names, module objects and classes, from
    ``walk``, an engine.ModelWalk of this model, made here if not given): a replay selects once per
    pass, and walking a large model's blocks costs a millisecond of every pass.
    """
    global _CACHE
    import weakref

    if _CACHE is None:
        _CACHE = weakref.WeakKeyDictionary()
    if walk is None:
        from pytest_rocm_parity.runner.engine import walk_model

        walk = walk_model(model)
    tree = walk.structure
    key = (tree, tuple(layers) if layers else None, drill)
    try:
        hit = _CACHE.get(model)
    except TypeError:   # an unhashable or non-weakrefable model: no cache
        hit = None
    if hit is not None and hit[0] == key:
        return list(hit[1])
    result = _select(model, layers, drill)
    try:
        _CACHE[model] = (key, tuple(result))
    except TypeError:
        pass
    return result


def _no_module_matches(model: Any, pattern: str, all_names: list[str], what: str) -> LayerSelectionError:
    # a glob is compared with the names' own globs (each index a '*': 'vit.layers.*'), where one
    # wrong word in it ('encoder.layer.*') still finds the stack; a name with the names
    stacks = list(dict.fromkeys(_INDEX.sub("*", n) for n in all_names))
    close = difflib.get_close_matches(pattern, stacks, n=3, cutoff=0.5) if any(c in pattern for c in "*?[") \
        else difflib.get_close_matches(pattern, all_names, n=3) or difflib.get_close_matches(pattern, stacks, n=3)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    return LayerSelectionError(
        f"{what}: pattern {pattern!r} matches no module of {type(model).__name__}{hint}. "
        f"Module names look like {all_names[:3]}; list them with [n for n, _ in model.named_modules()]")


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def check_tolerance_layers(model: Any, patterns: Sequence[str]) -> None:
    """LayerSelectionError for a per-layer tolerance pattern that matches no module (nor a model
    output, ``<output>.NAME``): an override that silently applies nowhere is a typo the run hides."""
    all_names = [n for n, _ in model.named_modules() if n]
    for pattern in patterns:
        if not pattern.startswith("<") and not any(fnmatch.fnmatchcase(n, pattern) for n in all_names):
            raise _no_module_matches(model, pattern, all_names, "tolerance layers")


def _select(model: Any, layers: Sequence[str] | None, drill: int) -> list[Selected]:
    from pytest_rocm_parity.runner.wrappers import is_dispatched_experts

    all_names = [n for n, _ in model.named_modules() if n]
    if layers:
        # below an experts module the calls are its implementation's (one grouped GEMM, or a loop
        # over experts with each one's tokens), not the model's: a golden of them cannot judge another
        experts = [n for n, m in model.named_modules() if n and is_dispatched_experts(m)]
        chosen: list[str] = []
        for pattern in layers:
            hits = [n for n in all_names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise _no_module_matches(model, pattern, all_names, "layers")
            inside = {h: e for h in hits for e in experts if h.startswith(e + ".")}
            if len(inside) == len(hits):
                h, e = next(iter(inside.items()))
                raise LayerSelectionError(
                    f"layers: {pattern!r} selects only modules inside an experts module ({h} inside {e}): what "
                    f"runs below it depends on its experts implementation (a grouped GEMM, or a loop over the "
                    f"experts with each one's tokens), not on the model, so no golden of it could judge another "
                    f"implementation. Select the experts module itself: {e!r}")
            chosen.extend(h for h in hits if h not in chosen and h not in inside)
    else:
        chosen = [n for level in _drilled(model, drill) for n in level]
    order = {n: i for i, n in enumerate(all_names)}
    chosen = sorted(set(chosen), key=lambda n: order.get(n, -1))
    chosen_set = set(chosen)
    result = []
    for n in chosen:
        parts = n.split(".")
        ancestors = [".".join(parts[:i]) for i in range(1, len(parts))]
        sel_anc = [a for a in ancestors if a in chosen_set]
        result.append(Selected(name=n, level=len(sel_anc), primary=sel_anc[0] if sel_anc else n))
    return result


# ---------------------------------------------------------------------------------------------
# golden size of a selection, estimated from one shape pass

# a leaf: (token, elements, bytes per element; 0 for a floating or complex leaf, whose size is the
# rung's, x2 for complex). Tokens name distinct tensor objects: the capture stores each once.
Leaf = tuple[int, int, int]

# the manifest's entry and the file header's keys of one recorded call, per rung (1.5-1.6 KB measured
# on the family matrix's models, tests/families)
PER_CALL_BYTES = 1600


@dataclass
class Activations:
    """Every module call's input and output tensor leaves in one forward (sizes only), per module name."""

    calls: dict[str, list[tuple[list[Leaf], list[Leaf]]]] = field(default_factory=dict)
    model_in: list[Leaf] = field(default_factory=list)
    model_out: list[Leaf] = field(default_factory=list)
    where: str = "meta"     # "meta": a shape-only pass; "forward": the model's own forward


class _Tokens:
    """A token per distinct tensor object alive in the pass (an id may be reused after a tensor dies)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, int]] = {}
        self._count = 0

    def leaves(self, obj: Any) -> list[Leaf]:
        from pytest_rocm_parity.runner.tree import tensor_leaves

        out = []
        for t in tensor_leaves(obj).values():
            hit = self._by_id.get(id(t))
            if hit is None or hit[0]() is not t:
                ref: Any
                try:
                    ref = weakref.ref(t)
                except TypeError:   # a tensor subclass without weak references: kept alive instead
                    ref = (lambda t=t: t)
                self._count += 1
                hit = (ref, self._count)
                self._by_id[id(t)] = hit
            per = 0 if (t.is_floating_point() or t.is_complex()) else t.element_size()
            out.append((hit[1], t.numel() * (2 if t.is_complex() else 1), per))
        return out


def activation_sizes(model: Any, inputs: Any) -> Activations:
    """Sizes of every module call's inputs and outputs: from a pass on the meta device (no arithmetic,
    no memory), else, where the model cannot run on meta tensors (data-dependent control flow,
    ``.item()``), from its own forward in eval mode without gradients."""
    import torch

    from pytest_rocm_parity.runner.engine import eval_mode, normalize_inputs
    from pytest_rocm_parity.runner.tree import map_tensors

    args, kwargs = normalize_inputs(inputs)
    floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
    if floats:   # float inputs in the model's dtype, as the capture casts them with it to each rung
        args, kwargs = (map_tensors(x, lambda _p, t: t.to(floats[0]) if t.is_floating_point() else t)
                        for x in (args, kwargs))
    try:
        meta = {n: torch.empty_like(t, device="meta") for n, t in
                [*model.named_parameters(), *model.named_buffers()]}   # a tied weight once: call ties the rest
        margs, mkwargs = (map_tensors(x, lambda _p, t: torch.empty_like(t, device="meta")) for x in (args, kwargs))
        return _sizes_pass(model, lambda: torch.func.functional_call(model, meta, tuple(margs), dict(mkwargs)),
                           margs, mkwargs, "meta")
    except Exception:   # anything a meta tensor cannot do: measure the real forward instead
        with eval_mode(model), torch.inference_mode():
            return _sizes_pass(model, lambda: model(*args, **kwargs), args, kwargs, "forward")


def _sizes_pass(model: Any, run: Any, args: Any, kwargs: Any, where: str) -> Activations:
    from pytest_rocm_parity.runner.engine import eval_mode

    tokens = _Tokens()
    acts = Activations(where=where)
    acts.model_in = tokens.leaves({"args": args, "kwargs": kwargs})
    pending: dict[str, list[list[Leaf]]] = {}
    handles = []

    def pre(name: str) -> Any:
        def hook(_m: Any, a: Any, kw: Any) -> None:
            pending.setdefault(name, []).append(tokens.leaves({"args": a, "kwargs": kw}))
        return hook

    def post(name: str) -> Any:
        def hook(_m: Any, _a: Any, _kw: Any, out: Any) -> None:
            acts.calls.setdefault(name, []).append((pending[name].pop(), tokens.leaves(out)))
        return hook

    try:
        for name, mod in _named(model):
            handles.append(mod.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(mod.register_forward_hook(post(name), with_kwargs=True))
        with eval_mode(model):
            out = run()
        acts.model_out = tokens.leaves(out)
    finally:
        for h in handles:
            h.remove()
    return acts


def golden_bytes(acts: Activations, selected: Sequence[Selected], rungs: Sequence[str], sketch: int = 0) -> int:
    """Estimated bytes of a golden of ``selected`` over ``rungs``: per rung, each distinct recorded tensor
    (a selected call's inputs and outputs, the model's inputs and outputs) once, plus the float64
    truth's residual of every selected output (twice at level 0: local and global truth) and of the
    model's outputs, in the rung's residual dtype (capture._capture_rung). ``sketch``: the group of a
    sketch golden, which keeps the model's inputs and, per floating output, a float64 sketch of the
    reference and one of the truth (capture._capture_rung_sketch)."""
    from pytest_rocm_parity.judging import dtypes as dt

    if sketch:
        from pytest_rocm_parity.golden.sketch import leaf_group

        def sketched(leaves: list[Leaf]) -> int:   # a reference and a truth sketch, float64, per floating leaf
            return sum(2 * 8 * -(-n // leaf_group(n, sketch)) if per == 0 else n * per for _, n, per in leaves)
        outs_of = [outs for s in selected for _ins, outs in acts.calls.get(s.name, [])]
        kept = sum(sketched(outs) for outs in outs_of) + sketched(acts.model_out) + len(outs_of) * PER_CALL_BYTES
        return sum(kept + sum(n * (per or dt.to_torch(rung).itemsize) for _, n, per in acts.model_in)
                   for rung in rungs)
    total = 0
    for rung in rungs:
        size = dt.to_torch(rung).itemsize
        rsize = dt.to_torch(dt.residual_dtype_name(rung)).itemsize
        distinct: dict[int, int] = {}
        residual = 0

        def add(leaves: list[Leaf], fresh: set[int] = set()) -> None:
            for tok, n, per in leaves:
                # an output that is its own call's input (an identity, an eval-mode dropout) is stored
                # apart from it (capture's fresh copy)
                distinct[-len(distinct) - 1 if tok in fresh else tok] = n * (per or size)

        def truth(leaves: list[Leaf], times: int) -> int:
            return sum(n * rsize * times for _, n, per in leaves if per == 0)

        calls = 0
        for s in selected:
            for ins, outs in acts.calls.get(s.name, []):
                calls += 1
                add(ins)
                add(outs, {tok for tok, _, _ in ins})
                residual += truth(outs, 2 if s.level == 0 else 1)
        add(acts.model_in)
        add(acts.model_out)
        residual += truth(acts.model_out, 1)
        stored_inputs = sum(n * (per or size) for _, n, per in acts.model_in)   # kept apart as "input/..."
        total += sum(distinct.values()) + residual + stored_inputs + calls * PER_CALL_BYTES
    return total


def deepest_drill(model: Any, acts: Activations | None, rungs: Sequence[str], limit: int | None,
                  sketch: int = 0, scale: float = 1.0) -> int:
    """The deepest drill whose estimated golden (a sketch golden's, with ``sketch`` its group; times
    ``scale``) fits ``limit`` bytes (all the way down when ``limit`` is None); 0 where even the blocks
    alone exceed it (the golden-size warning then names the budget)."""
    deepest = max_drill(model)
    if limit is None or acts is None:
        return deepest
    best = 0
    for d in range(deepest + 1):
        if golden_bytes(acts, select(model, None, d), rungs, sketch) * scale > limit:
            break
        best = d
    return best


# ---------------------------------------------------------------------------------------------
# where a fault lies that the selection did not cover

def _globs_for(model: Any, name: str) -> list[str]:
    """The ``layers=`` globs that judge ``name`` and everything below it."""
    mod = model.get_submodule(name)
    if not mod._modules:
        return [name]
    return [f"{name}.*"] if _never_called(mod) else [name, f"{name}.*"]


def unselected_region(model: Any, result: Any, patterns: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Where a divergence that no selected module explains in isolation comes from, or None.

    When no selected module fails in isolation but the propagated run diverges (or the model's outputs
    do), the fault lies in computation the golden did not judge in isolation: between the last
    selected module that agreed and the first that diverged. Returns {"after", "before", "modules",
    "layers"}: the two modules bounding the region (None: the model's inputs / outputs), the maximal
    modules in it that no selection covers (in registration order, the closest proxy for execution
    order a result holds), and the ``layers=`` globs (added to ``patterns``) that would judge them.
    Empty "modules": the region holds no module, so the fault is in a parent's own forward code.
    """
    if result.culprit is not None:
        return None
    top = [l for l in result.layers if l.level == 0]
    bad = next((i for i, l in enumerate(top) if not l.prop_passed), None)
    outputs_bad = any(not o.prop_passed for o in result.outputs)
    if bad is None and not outputs_bad:
        return None
    end = bad if bad is not None else len(top)
    # a module the candidate never called agreed with nothing: the last agreeing one was judged
    i_ok = next((i for i in range(end - 1, -1, -1) if top[i].prop_passed and not top[i].not_called), None)
    ok = top[i_ok] if i_ok is not None else None
    skipped = [module_of(l.name) for l in top[(i_ok if i_ok is not None else -1) + 1:end] if l.not_called]
    after = module_of(ok.name) if ok is not None else None
    before = module_of(top[bad].name) if bad is not None else None
    region = region_between(model, after, before, {module_of(l.name) for l in result.layers}, patterns)
    return {**region, **({"not_called": skipped} if skipped else {})}


def region_between(model: Any, after: str | None, before: str | None, selected: set[str],
                   patterns: Sequence[str] | None = None) -> dict[str, Any]:
    """The region between two modules (None: the model's inputs / outputs) as region_text shows it:
    the maximal modules in it, in registration order, that no selected module covers, and the
    ``layers=`` globs (added to ``patterns``) that would judge them."""
    named = _named(model)
    order = {n: i for i, (n, _) in enumerate(named)}
    lo = order.get(after, -1) if after is not None else -1
    hi = order.get(before, len(named)) if before is not None else len(named)
    if lo >= hi:     # executed out of registration order: everything registered before the divergent one
        lo = -1

    def covered(n: str) -> bool:
        return any(n == s or n.startswith(s + ".") or s.startswith(n + ".") for s in selected)

    region: list[str] = []
    for n, mod in named:
        if not (lo < order[n] < hi) or covered(n) or (_never_called(mod) and not mod._modules):
            continue
        parent = n.rpartition(".")[0]
        if parent and not covered(parent) and any(r == parent or parent.startswith(r + ".") for r in region):
            continue   # inside a module already named
        region.append(n)
    globs = [g for n in region for g in _globs_for(model, n)]
    return {"after": after, "before": before, "modules": region,
            "layers": list(dict.fromkeys([*(patterns or []), *globs])) if globs else []}


def region_text(region: dict[str, Any]) -> str:
    """One line of a failure message: where the unjudged fault lies and the selection that localizes it."""
    after = region["after"] or "the model's inputs"
    before = region["before"] or "the model's outputs"
    if region.get("not_called"):
        gone = region["not_called"]
        return (f"the fault lies between {after} (last agreeing) and {before} (first divergent), where the "
                f"candidate called none of the selected {'modules' if len(gone) > 1 else 'module'} "
                f"{', '.join(gone[:4])}{'...' if len(gone) > 4 else ''} (fused, bypassed, or a copy made in its "
                f"forward ran instead): what runs in their place is judged only through the modules and outputs "
                f"after it")
    if not region["modules"]:
        return (f"the fault lies between {after} (last agreeing) and {before} (first divergent), in no module: "
                f"the forward code of their parent that runs between them"
                + (f", or padded positions, left out of every verdict, that {before} reads (a pooler's first "
                   f"token under left padding: whatever an attention leaves at padding reaches it)"
                   if region.get("padded") else ""))
    return (f"the fault lies between {after} (last agreeing) and {before} (first divergent), in modules the "
            f"golden did not select: {', '.join(region['modules'])}; layers={region['layers']!r} would judge "
            f"them (or leave layers= out for the default selection)")


def unselected_children(model: Any, result: Any, drill: int) -> str:
    """A note when the culprit has sub-modules the golden did not select: the culprit could be narrower."""
    if result.culprit is None:
        return ""
    name = module_of(result.culprit)
    try:
        mod = model.get_submodule(name)
    except AttributeError:
        return ""
    # the golden's selection, not only the judged records: a selected module neither side called (a
    # dropout under sdpa) has no record, and drilling deeper would not judge it either
    selected = {s.name for s in select(model, None, drill)} | {module_of(l.name) for l in result.layers}
    first = {id(m): n for n, m in reversed(_named(model))}
    kids = [c for c in _drill_children(model, name, first) if c not in selected]
    if not kids or not mod._modules:
        return ""
    return (f"{name} has {len(kids)} sub-module(s) the golden did not select ({', '.join(kids[:8])}"
            f"{', ...' if len(kids) > 8 else ''}): the fault may lie in one of them; drill={drill + 1} or "
            f"layers={_globs_for(model, name)!r} (a golden-size limit permitting) would narrow it, in a golden "
            f"captured with that selection on the reference machine (--parity-regen)")


# ---------------------------------------------------------------------------------------------
# what a golden selects, compactly (rocm-parity show)

_INDEX = re.compile(r"(?<![^.])(\d+)(?![^.])")


def describe(layers: Sequence[dict[str, Any]]) -> list[tuple[int, int, list[str]]]:
    """A golden manifest's layer entries ({name, level}) as (level, modules, names) per nesting level,
    the members of a stack folded into one name: encoder.block.[0-5].layer.0 for six blocks."""
    out = []
    for level in sorted({int(e.get("level", 0)) for e in layers}):
        names = [str(e["name"]) for e in layers if int(e.get("level", 0)) == level]
        groups: dict[str, list[int]] = {}
        for n in names:
            m = _INDEX.search(n)
            key = f"{n[:m.start()]}{{}}{n[m.end():]}" if m else n
            groups.setdefault(key, []).append(int(m.group(1)) if m else -1)
        shown = []
        for key, idx in groups.items():
            if idx == [-1]:
                shown.append(key)
                continue
            idx = sorted(set(idx))
            run = f"[{idx[0]}-{idx[-1]}]" if idx == list(range(idx[0], idx[-1] + 1)) and len(idx) > 1 else \
                (str(idx[0]) if len(idx) == 1 else "[" + ",".join(map(str, idx)) + "]")
            shown.append(key.replace("{}", run, 1))
        out.append((level, len(names), shown))
    return out
