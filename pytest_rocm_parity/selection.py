"""Which modules of a model are captured, and how they nest.

Default: the repeated blocks (the longest ModuleList/Sequential of same-class
children) plus every maximal module outside them (embeddings, final norm,
head).  With drill-down, the children and grandchildren of each block too, so
a blamed block can be narrowed to its attention, MLP, norm or projection.
"""
from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_rocm_parity.errors import LayerSelectionError


@dataclass(frozen=True)
class Selected:
    name: str
    level: int      # number of selected proper ancestors: modules of one level never nest
    primary: str    # the level-0 ancestor (itself at level 0)


def _block_lists(model: Any) -> list[tuple[str, list[str]]]:
    import torch.nn as nn

    found = []
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.ModuleList, nn.Sequential)) and len(mod) >= 2:
            kids = list(mod.named_children())
            classes = {type(m) for _, m in kids}
            if len(classes) == 1 and any(True for _ in kids[0][1].parameters()):
                found.append((name, [f"{name}.{k}" if name else k for k, _ in kids]))
    return found


def default_primary(model: Any) -> list[str]:
    blocks = _block_lists(model)
    if not blocks:
        kids = [n for n, _ in model.named_children()]
        return kids or [""]
    best_name, best = max(blocks, key=lambda b: len(b[1]))
    block_set = set(best)

    def contains_blocks(name: str) -> bool:
        return best_name == name or best_name.startswith(name + ".") if name else True

    out: list[str] = []

    def walk(prefix: str, mod: Any) -> None:
        for child_name, child in mod.named_children():
            full = f"{prefix}.{child_name}" if prefix else child_name
            if full in block_set:
                out.append(full)
            elif full == best_name or contains_blocks(full):
                walk(full, child)
            elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()) or not list(child.children()):
                out.append(full)

    walk("", model)
    return out


def _children(model: Any, name: str) -> list[str]:
    mod = model.get_submodule(name) if name else model
    return [f"{name}.{k}" if name else k for k, _ in mod.named_children()]


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
        from pytest_rocm_parity.engine import walk_model

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


def _select(model: Any, layers: Sequence[str] | None, drill: int) -> list[Selected]:
    all_names = [n for n, _ in model.named_modules() if n]
    if layers:
        chosen: list[str] = []
        for pattern in layers:
            hits = [n for n in all_names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                close = difflib.get_close_matches(pattern, all_names, n=3)
                hint = f"; close matches: {', '.join(close)}" if close else ""
                raise LayerSelectionError(
                    f"layers: pattern {pattern!r} matches no module of {type(model).__name__}{hint}. "
                    f"Module names look like {all_names[:3]}; list them with [n for n, _ in model.named_modules()]"
                )
            chosen.extend(h for h in hits if h not in chosen)
    else:
        chosen = default_primary(model)
        if drill > 0:
            blocks = {n for _, bl in _block_lists(model) for n in bl} & set(chosen)
            frontier = sorted(blocks)
            for _ in range(drill):
                nxt = []
                for b in frontier:
                    for c in _children(model, b):
                        mod = model.get_submodule(c)
                        if any(True for _ in mod.parameters()) or not list(mod.children()):
                            nxt.append(c)
                chosen.extend(nxt)
                frontier = nxt
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
